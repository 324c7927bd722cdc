// Logs never kill training: metrics.jsonl and LineFile under write failures (issue 16, item 4).
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "parallel/line_file.hpp"
#include "parallel/metrics.hpp"

using namespace parallel;
namespace fs = std::filesystem;

namespace {

StepMetrics some_step(int64_t step) {
  StepMetrics s;
  s.step = step;
  s.loss = 4.5;
  s.lr = 3e-4;
  s.grad_norm = 0.75;
  s.tokens_per_sec = 1234.5;
  s.step_time_ms = 12.25;
  s.mfu = 0.125;
  return s;
}

std::vector<std::string> lines_of(const std::string& path, std::string* all = nullptr) {
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (all) *all = text;
  std::vector<std::string> out;
  std::string line;
  std::istringstream lines(text);
  while (std::getline(lines, line)) out.push_back(line);
  return out;
}

// Lowers this process's file-size limit (RLIMIT_FSIZE) for its lifetime, with SIGXFSZ ignored so a
// write past the limit fails with EFBIG instead of killing the process: a full disk without root.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    old_handler_ = std::signal(SIGXFSZ, SIG_IGN);
    getrlimit(RLIMIT_FSIZE, &old_);
    rlimit lowered = old_;
    lowered.rlim_cur = bytes;
    ok_ = setrlimit(RLIMIT_FSIZE, &lowered) == 0;
  }
  ~FileSizeLimit() {
    setrlimit(RLIMIT_FSIZE, &old_);
    std::signal(SIGXFSZ, old_handler_);
  }
  bool ok() const { return ok_; }

 private:
  rlimit old_{};
  void (*old_handler_)(int) = nullptr;
  bool ok_ = false;
};

}  // namespace

TEST(LineFile, DevFullIsAWarningNotAnError) {
  // /dev/full fails every write with ENOSPC, like a full disk.
  LineFile f("/dev/full");
  EXPECT_FALSE(f.append("{\"step\": 1}"));
  EXPECT_FALSE(f.append("{\"step\": 2}"));
  EXPECT_EQ(f.dropped_lines(), 2);
}

TEST(LineFile, MetricsWriterGoesOnWhenTheDiskIsFull) {
  MetricsWriter w("/dev/full");
  EXPECT_NO_THROW(EXPECT_FALSE(w.write_train(some_step(1))));
  EXPECT_NO_THROW(EXPECT_FALSE(w.write_eval(1, 4.0)));
  EXPECT_EQ(w.dropped_lines(), 2);
}

TEST(LineFile, AFileThatFillsUpHoldsOnlyWholeLines) {
  const fs::path dir = fs::temp_directory_path() / ("parallel_test_line_file_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const std::string path = (dir / "metrics.jsonl").string();
  MetricsWriter w(path);
  int written = 0, failed = 0;
  {
    // Room for a few lines and a part of one more: the line that crosses the limit is written
    // short (up to the limit) and then fails; it must be cut off again.
    FileSizeLimit limit(500);
    ASSERT_TRUE(limit.ok());
    for (int step = 1; step <= 20; ++step) (w.write_train(some_step(step)) ? written : failed) += 1;
  }
  EXPECT_GT(written, 0);
  EXPECT_GT(failed, 0);
  EXPECT_EQ(w.dropped_lines(), failed);
  std::string text;
  std::vector<std::string> lines = lines_of(path, &text);
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n') << "the file ends in the middle of a line";
  EXPECT_EQ(static_cast<int>(lines.size()), written);
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const auto j = nlohmann::json::parse(lines[i]);  // throws on half a line
    EXPECT_EQ(j["step"], static_cast<int64_t>(i + 1));
  }
  // With room again, writing carries on where it stopped.
  EXPECT_TRUE(w.write_train(some_step(21)));
  lines = lines_of(path);
  ASSERT_EQ(static_cast<int>(lines.size()), written + 1);
  EXPECT_EQ(nlohmann::json::parse(lines.back())["step"], 21);
  fs::remove_all(dir);
}

TEST(LineFile, WriteWholeLineReportsTheErrno) {
  std::FILE* full = std::fopen("/dev/full", "w");
  ASSERT_NE(full, nullptr);
  EXPECT_EQ(write_whole_line(fileno(full), "x\n"), ENOSPC);
  std::fclose(full);
}
