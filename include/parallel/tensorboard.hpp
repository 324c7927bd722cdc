#pragma once
// TensorBoard event files, written without TensorFlow: what `train.tensorboard_dir` turns on.
//
// An event file is a sequence of TFRecords (tfrecord.hpp), each a serialized `tensorflow.Event`
// protobuf, encoded here by hand: the first holds file_version "brain.Event:2", the second a
// SessionLog START at the first step written (TensorBoard drops the events of an earlier run in the
// same directory from that step on, so a resumed run's curves do not double back), then one Event
// per logged step holding a Summary of `simple_value` scalars (float32, as TensorBoard stores them).
//
// Each record goes out in one write() and a write that fails part-way is cut off again (LineFile), so
// the file only ever holds whole records; a failed write is a warning and never ends training.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "parallel/line_file.hpp"
#include "parallel/metrics.hpp"

namespace parallel {

// One scalar of a step: its TensorBoard tag and value (written as float32; NaN and infinities too).
struct Scalar {
  std::string tag;
  double value = 0.0;
};

// Every scalar of a train line of metrics.jsonl (MetricsWriter::write_train), tagged by its key:
// the same keys, present under the same conditions (loss_scale on fp16, skipped as 1 when true, the
// MoE terms on MoE models), moe_tokens_per_expert's entries as "moe_tokens_per_expert/<expert>".
std::vector<Scalar> train_scalars(const StepMetrics& m);

// Serialized Event protobufs (the record payloads).
std::string tensorboard_file_version_event(double wall_time);
std::string tensorboard_session_start_event(double wall_time, int64_t step);
std::string tensorboard_scalars_event(double wall_time, int64_t step, std::span<const Scalar> scalars);

// "events.out.tfevents.<seconds, 10 digits>.<host>.<pid>.<n>", as TensorBoard's own writer names
// them (TensorBoard reads every file with "tfevents" in its name, in name order).
std::string tensorboard_event_file_name(int64_t unix_seconds, std::string_view host, int64_t pid, int64_t n);

class TensorBoardWriter {
 public:
  // Creates `dir` and a new event file in it, and writes the file_version record. Not being able to
  // create them is an error (at start-up); later write failures are warnings.
  explicit TensorBoardWriter(const std::string& dir);
  // One Event record with `scalars` at `step` (preceded, the first time, by the SessionLog START).
  // false: the record was dropped (see LineFile).
  bool write(int64_t step, std::span<const Scalar> scalars);
  bool write_train(const StepMetrics& m) { return write(m.step, train_scalars(m)); }
  bool write_eval(int64_t step, double eval_loss);  // tag "eval_loss", as in metrics.jsonl
  const std::string& path() const { return out_.path(); }
  int64_t dropped_records() const { return out_.dropped_lines(); }

 private:
  LineFile out_;
  bool started_ = false;
};

}  // namespace parallel
