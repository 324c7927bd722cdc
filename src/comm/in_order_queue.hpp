#pragma once
// The pending operations of one group whose work runs inside wait() / is_completed() (the two-rank
// and the ring sums): every rank of the group runs them in call order, one at a time, so waiting
// for a later operation first runs the earlier ones. Internal.
#include <algorithm>
#include <deque>

namespace parallel::detail {

// W has `bool advance(bool block)`: runs the stages of W that can run (blocking: all of them) and
// returns true once W is complete; W calls remove(this) when it completes or is destroyed.
template <class W>
class InOrderQueue {
 public:
  void push(W* work) { pending_.push_back(work); }

  void remove(const W* work) {
    if (auto it = std::find(pending_.begin(), pending_.end(), work); it != pending_.end()) pending_.erase(it);
  }

  // Advances the oldest operations, in call order, until done() holds: blocking, or without
  // blocking until the oldest can go no further now. Returns done().
  template <class Done>
  bool run_until(Done done, bool block) {
    while (!done())
      if (!pending_.front()->advance(block) && !block) break;
    return done();
  }

 private:
  std::deque<W*> pending_;  // oldest first
};

}  // namespace parallel::detail
