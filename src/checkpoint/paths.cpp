// Where checkpoints live: step directory names, the `latest` pointer, and turning what a user
// typed (a root, a step directory, "latest") into one complete step directory.
#include <algorithm>
#include <cctype>
#include <filesystem>

#include "checkpoint/internal.hpp"
#include "parallel/log.hpp"

namespace parallel::checkpoint {
namespace {

namespace fs = std::filesystem;

// "step_<digits>" -> the step; false for anything else (".tmp_step_...", "latest", ...).
bool parse_step_name(const std::string& name, int64_t& step) {
  constexpr std::string_view kPrefix = "step_";
  if (!name.starts_with(kPrefix) || name.size() == kPrefix.size() || name.size() > kPrefix.size() + 18)
    return false;
  const std::string digits = name.substr(kPrefix.size());
  if (digits.find_first_not_of("0123456789") != std::string::npos) return false;
  step = std::stoll(digits);
  return true;
}

bool is_complete_step(const fs::path& dir) {
  std::error_code ec;
  return fs::is_regular_file(dir / detail::kIndexFile, ec);
}

std::string trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  std::size_t b = 0;
  while (b < s.size() && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  return s.substr(b);
}

}  // namespace

std::string step_dir_name(int64_t step) {
  PARALLEL_CHECK(step >= 0, "checkpoint: step {} is negative", step);
  return fmt::format("step_{:08d}", step);
}

std::vector<StepDir> list_steps(const std::string& root) {
  std::vector<StepDir> out;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return out;
  for (const fs::directory_entry& e : fs::directory_iterator(root, ec)) {
    int64_t step = 0;
    if (!e.is_directory(ec) || !parse_step_name(e.path().filename().string(), step)) continue;
    if (is_complete_step(e.path())) out.push_back({step, e.path().string()});
  }
  std::sort(out.begin(), out.end(), [](const StepDir& a, const StepDir& b) { return a.step < b.step; });
  return out;
}

std::string resolve(const std::string& path, const std::string& default_root) {
  std::string where = path;
  if (path == "latest") {
    PARALLEL_CHECK(!default_root.empty(),
                   "checkpoint: 'latest' needs a checkpoint root (checkpoint.dir) to look in");
    where = default_root;
  }
  std::error_code ec;
  const fs::path p(where);
  if (!fs::exists(p, ec)) PARALLEL_FAIL("checkpoint: {} does not exist", where);
  if (!fs::is_directory(p, ec)) PARALLEL_FAIL("checkpoint: {} is not a directory", where);

  const std::string base = p.filename().string();
  if (base.starts_with(".tmp_step_") || base.starts_with(".trash_"))
    PARALLEL_FAIL("checkpoint: {} is an incomplete (crashed or removed) checkpoint", where);
  if (is_complete_step(p)) return p.string();
  int64_t step = 0;
  if (parse_step_name(base, step))
    PARALLEL_FAIL("checkpoint: step directory {} has no {}: incomplete checkpoint", where,
                  detail::kIndexFile);

  // A root: its `latest`, else the highest complete step.
  const fs::path latest = p / detail::kLatestFile;
  if (fs::exists(latest, ec)) {
    const std::string name = trim(detail::read_text_file(latest.string()));
    if (parse_step_name(name, step) && is_complete_step(p / name)) return (p / name).string();
    logger().warn("checkpoint: {} names '{}', which is not a complete step directory; using the highest step",
                  latest.string(), name);
  }
  const std::vector<StepDir> steps = list_steps(p.string());
  if (steps.empty())
    PARALLEL_FAIL("checkpoint: no complete checkpoint (step_<N>/{}) under {}", detail::kIndexFile, where);
  return steps.back().path;
}

}  // namespace parallel::checkpoint
