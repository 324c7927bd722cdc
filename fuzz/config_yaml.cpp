// Fuzz target: the YAML config loader, parse_config (YAML, overrides, validation), and the round
// trip through config_to_yaml that checkpoints and run directories rely on.
// Input layout: YAML text, then optional "--set" overrides, each after a NUL byte. A first line
// "# world N" (N in 1..64) sets the world size the config is validated against (default 8).
#include <charconv>
#include <vector>

#include "fuzz_target.hpp"
#include "parallel/config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace parallel;
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> parts;
  for (std::size_t begin = 0;;) {
    const std::size_t end = input.find('\0', begin);
    parts.emplace_back(
        input.substr(begin, end == std::string_view::npos ? std::string_view::npos : end - begin));
    if (end == std::string_view::npos) break;
    begin = end + 1;
  }
  int world_size = 8;
  if (parts[0].starts_with("# world ")) {
    int n = 0;
    const char* first = parts[0].data() + 8;
    const auto [ptr, ec] = std::from_chars(first, parts[0].data() + parts[0].size(), n);
    if (ec == std::errc() && n >= 1 && n <= 64) world_size = n;
  }
  const std::vector<std::string> overrides(parts.begin() + 1, parts.end());
  return fuzz::run_guarded([&] {
    const Config config = parse_config(parts[0], overrides, world_size, "fuzz.yaml");
    // What a run directory stores must read back as the same configuration.
    const std::string yaml = config_to_yaml(config);
    Config again;
    try {
      again = parse_config(yaml, {}, world_size, "roundtrip.yaml");
    } catch (const Error& e) {
      std::fprintf(stderr, "config_to_yaml output rejected: %s\n%s\n", e.what(), yaml.c_str());
      fuzz::require(false, "config_to_yaml output does not parse");
    }
    fuzz::require(config_to_yaml(again) == yaml, "config_to_yaml does not round-trip");
  });
}
