// TensorBoard event files (include/parallel/tensorboard.hpp). The protobuf wire format by hand:
// a field is a varint key (number << 3 | wire type) and then a varint (type 0), 8 little-endian
// bytes (type 1), a varint length and that many bytes (type 2), or 4 little-endian bytes (type 5).
#include "parallel/tensorboard.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstring>
#include <filesystem>

#include "parallel/error.hpp"
#include "parallel/tfrecord.hpp"

namespace parallel {
namespace {

// tensorflow/core/util/event.proto and tensorflow/core/framework/summary.proto.
enum : uint32_t {
  kEventWallTime = 1,     // double
  kEventStep = 2,         // int64
  kEventFileVersion = 3,  // string
  kEventSummary = 5,      // Summary
  kEventSessionLog = 7,   // SessionLog
  kSummaryValue = 1,      // repeated Summary.Value
  kValueTag = 1,          // string
  kValueSimpleValue = 2,  // float
  kSessionLogStatus = 1,  // enum SessionStatus
  kSessionStart = 1,      // SessionLog.START
};
enum : uint32_t { kVarint = 0, kFixed64 = 1, kBytes = 2, kFixed32 = 5 };

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_key(std::string& out, uint32_t field, uint32_t type) {
  put_varint(out, (uint64_t{field} << 3) | type);
}

void put_fixed(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

void put_bytes(std::string& out, uint32_t field, std::string_view bytes) {
  put_key(out, field, kBytes);
  put_varint(out, bytes.size());
  out.append(bytes);
}

// wall_time and step, the fields every Event starts with.
std::string event_head(double wall_time, int64_t step) {
  std::string out;
  uint64_t bits;
  std::memcpy(&bits, &wall_time, 8);
  put_key(out, kEventWallTime, kFixed64);
  put_fixed(out, bits, 8);
  if (step != 0) {  // proto3: a zero is not written
    put_key(out, kEventStep, kVarint);
    put_varint(out, static_cast<uint64_t>(step));  // negative int64: 10 bytes, as protobuf does
  }
  return out;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char host[HOST_NAME_MAX + 1] = {};
  if (::gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') return "localhost";
  std::string out(host);
  for (char& c : out)  // a file name: no separators
    if (c == '/') c = '_';
  return out;
}

std::string new_event_file(const std::string& dir) {
  static std::atomic<int64_t> count{0};  // two writers of one process in the same second
  const auto seconds = static_cast<int64_t>(now_seconds());
  return (std::filesystem::path(dir) /
          tensorboard_event_file_name(seconds, host_name(), ::getpid(), count.fetch_add(1)))
      .string();
}

}  // namespace

std::vector<Scalar> train_scalars(const StepMetrics& m) {
  std::vector<Scalar> out = {{"loss", m.loss},
                             {"lr", m.lr},
                             {"grad_norm", m.grad_norm},
                             {"tokens_per_sec", m.tokens_per_sec},
                             {"step_time_ms", m.step_time_ms},
                             {"mfu", m.mfu},
                             {"peak_flops_per_rank", m.peak_flops_per_rank},
                             {"host_reads", static_cast<double>(m.host_reads)},
                             {"conversion_bytes", static_cast<double>(m.conversion_bytes)},
                             {"minor_faults", static_cast<double>(m.minor_faults)},
                             {"comm_wait_ms", m.comm_wait_ms},
                             {"mem_peak_bytes", static_cast<double>(m.mem_peak_bytes)}};
  if (m.loss_scale > 0) out.push_back({"loss_scale", m.loss_scale});
  if (m.skipped) out.push_back({"skipped", 1.0});  // skip_reason, a string, is metrics.jsonl's only
  out.push_back({"skipped_steps", static_cast<double>(m.skipped_steps)});
  out.push_back({"spikes", static_cast<double>(m.spikes)});
  out.push_back({"nonfinite_steps", static_cast<double>(m.nonfinite_steps)});
  if (!m.moe_tokens_per_expert.empty()) {
    out.push_back({"moe_aux_loss", m.moe_aux_loss});
    out.push_back({"moe_z_loss", m.moe_z_loss});
    for (std::size_t e = 0; e < m.moe_tokens_per_expert.size(); ++e)
      out.push_back(
          {fmt::format("moe_tokens_per_expert/{}", e), static_cast<double>(m.moe_tokens_per_expert[e])});
  }
  if (!m.mtp_losses.empty()) {
    out.push_back({"mtp_loss", m.mtp_loss});
    for (std::size_t k = 0; k < m.mtp_losses.size(); ++k)
      out.push_back({fmt::format("mtp_loss/{}", k + 1), m.mtp_losses[k]});
  }
  return out;
}

std::string tensorboard_file_version_event(double wall_time) {
  std::string out = event_head(wall_time, 0);
  put_bytes(out, kEventFileVersion, "brain.Event:2");
  return out;
}

std::string tensorboard_session_start_event(double wall_time, int64_t step) {
  std::string session;
  put_key(session, kSessionLogStatus, kVarint);
  put_varint(session, kSessionStart);
  std::string out = event_head(wall_time, step);
  put_bytes(out, kEventSessionLog, session);
  return out;
}

std::string tensorboard_scalars_event(double wall_time, int64_t step, std::span<const Scalar> scalars) {
  std::string summary, value;
  for (const Scalar& s : scalars) {
    value.clear();
    put_bytes(value, kValueTag, s.tag);
    const auto f = static_cast<float>(s.value);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    put_key(value, kValueSimpleValue, kFixed32);
    put_fixed(value, bits, 4);
    put_bytes(summary, kSummaryValue, value);
  }
  std::string out = event_head(wall_time, step);
  put_bytes(out, kEventSummary, summary);
  return out;
}

std::string tensorboard_event_file_name(int64_t unix_seconds, std::string_view host, int64_t pid, int64_t n) {
  return fmt::format("events.out.tfevents.{:010d}.{}.{}.{}", unix_seconds, host, pid, n);
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) : out_(new_event_file(dir), "record") {
  out_.append_record(tfrecord(tensorboard_file_version_event(now_seconds())));
}

bool TensorBoardWriter::write(int64_t step, std::span<const Scalar> scalars) {
  const double now = now_seconds();
  if (!started_) {
    started_ = true;
    out_.append_record(tfrecord(tensorboard_session_start_event(now, step)));
  }
  return out_.append_record(tfrecord(tensorboard_scalars_event(now, step, scalars)));
}

bool TensorBoardWriter::write_eval(int64_t step, double eval_loss) {
  const Scalar eval[] = {{"eval_loss", eval_loss}};
  return write(step, eval);
}

}  // namespace parallel
