#pragma once
// A record of the communication one rank issues, in issue order: what RecordingCommunicator
// (recording_communicator.hpp) sees a real communicator do, and what MetaCommunicator
// (meta_communicator.hpp) records in its place. Two logs of one rank compare field by field.
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "parallel/dtype.hpp"

namespace parallel {

struct CommEvent {
  // all_reduce, reduce_scatter, all_gather, broadcast, all_to_all, all_to_allv, send, recv,
  // batch_p2p, barrier
  std::string kind;
  std::string group;       // the communicator's name() ("tp", "dp", "pp", ...)
  std::vector<int> ranks;  // the group's members as world ranks (world_ranks())
  // Bytes this rank contributes: the tensor (all_reduce, broadcast, send, recv), `in`
  // (reduce_scatter, all_to_all, all_to_allv), `out` (all_gather); a batch_p2p's sum over its ops.
  int64_t bytes = 0;
  DType dtype = DType::F32;
  // Peers of point-to-point transfers as world ranks (send, recv: one; batch_p2p: one per op, in
  // order); the root of a broadcast.
  std::vector<int> peers;
  // The reduce op (sum, max, min); for batch_p2p each op's direction and bytes, in order
  // ("send 65536,recv 65536"); else empty.
  std::string detail;
  bool async = false;

  bool operator==(const CommEvent&) const = default;
  std::string str() const;  // "all_reduce sum 4096 B f32 on tp [0, 1]"
};

// Writes str(): what GoogleTest prints for a CommEvent in a failed comparison (else raw bytes).
std::ostream& operator<<(std::ostream& os, const CommEvent& e);

// Shared by a communicator and the groups split from it.
class CommLog {
 public:
  void add(CommEvent e) { events_.push_back(std::move(e)); }
  const std::vector<CommEvent>& events() const { return events_; }
  void clear() { events_.clear(); }

 private:
  std::vector<CommEvent> events_;
};

}  // namespace parallel
