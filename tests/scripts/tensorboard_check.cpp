// tensorboard_check METRICS_JSONL EVENT_DIR: every scalar of every line of metrics.jsonl is in the
// directory's TensorBoard event file, tagged by its key, at the line's step, with the same value as
// float32 (null: a NaN or infinity; true: 1; an array's entries as KEY/INDEX); and the file holds
// nothing else. The file is read by the tests' own reader (tests/common/tfevents_reader.hpp), which
// checks both CRCs of every record. Exit 0 with one summary line; 1 with a line per problem.
//
// tensorboard_check --subset METRICS_JSONL EVENT_DIR: after a full disk, when both files lost steps
// at different points: only the steps both hold are compared (at least one), and the event file
// must still end in a whole record.
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "tfevents_reader.hpp"

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  const bool subset = argc == 4 && std::string(argv[1]) == "--subset";
  if (subset) ++argv;
  if (argc != 3 + subset) {
    std::fprintf(stderr, "usage: tensorboard_check [--subset] METRICS_JSONL EVENT_DIR\n");
    return 2;
  }
  int problems = 0;
  auto problem = [&](const std::string& what) {
    std::printf("%s\n", what.c_str());
    ++problems;
  };
  try {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(argv[2]))
      if (e.path().filename().string().find("tfevents") != std::string::npos) files.push_back(e.path());
    if (files.size() != 1) {
      std::printf("%s: %zu event files, expected 1 (rank 0 writes one per run)\n", argv[2], files.size());
      return 1;
    }
    const tfevents::File file = tfevents::read_file(files[0].string());
    if (file.truncated_tail != 0) problem(files[0].string() + ": ends in half a record");
    if (file.events.empty() || file.events[0].file_version != "brain.Event:2")
      problem("the first event is not file_version brain.Event:2");
    // (step, tag) -> value, from every event with a summary.
    std::map<std::pair<int64_t, std::string>, float> written;
    std::map<int64_t, bool> steps_written;
    for (const tfevents::Event& e : file.events)
      if (e.has_summary) steps_written[e.step] = true;
    for (const tfevents::Event& e : file.events)
      for (const auto& [tag, value] : e.scalars)
        if (!written.emplace(std::make_pair(e.step, tag), value).second)
          problem("step " + std::to_string(e.step) + " has " + tag + " twice");

    std::ifstream in(argv[1]);
    if (!in) throw std::runtime_error(std::string("cannot read ") + argv[1]);
    std::size_t lines = 0, matched = 0;
    std::map<std::pair<int64_t, std::string>, bool> expected;
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line);
      const int64_t step = j.at("step").get<int64_t>();
      if (subset && !steps_written.count(step)) continue;
      ++lines;
      auto check = [&](const std::string& tag, const nlohmann::json& v) {
        expected[{step, tag}] = true;
        const auto it = written.find({step, tag});
        if (it == written.end())
          return problem("step " + std::to_string(step) + ": " + tag + " is not in the event file");
        const float got = it->second;
        const bool same = v.is_null()      ? !std::isfinite(got)
                          : v.is_boolean() ? got == (v.get<bool>() ? 1.0f : 0.0f)
                                           : got == static_cast<float>(v.get<double>());
        if (!same)
          return problem("step " + std::to_string(step) + ": " + tag + " = " + std::to_string(got) +
                         " in the event file, " + v.dump() + " in metrics.jsonl");
        ++matched;
      };
      for (const auto& [key, value] : j.items()) {
        if (key == "step" || value.is_string()) continue;  // skip_reason: not a scalar
        if (value.is_array()) {
          for (std::size_t i = 0; i < value.size(); ++i) check(key + "/" + std::to_string(i), value[i]);
        } else {
          check(key, value);
        }
      }
    }
    for (const auto& [at, value] : written)
      if (!expected.count(at) && !subset)
        problem("step " + std::to_string(at.first) + ": " + at.second +
                " is in the event file, not in metrics.jsonl");
    if (lines == 0)
      problem(std::string(argv[1]) + (subset ? " shares no step with the event file" : " is empty"));
    if (problems) return 1;
    std::printf("%s: all %zu scalars of %zu metrics.jsonl lines, same steps and values, in %zu events\n",
                files[0].filename().c_str(), matched, lines, file.events.size());
    return 0;
  } catch (const std::exception& e) {
    std::printf("tensorboard_check: %s\n", e.what());
    return 1;
  }
}
