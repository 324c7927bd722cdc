// MetaTimeline (meta_timeline.hpp): the innermost live one receives a meta rank's ops, calls and waits.
#include "parallel/meta_timeline.hpp"

namespace parallel {
namespace {
MetaTimeline* g_timeline = nullptr;
}  // namespace

MetaTimeline::MetaTimeline() : outer_(g_timeline) { g_timeline = this; }
MetaTimeline::~MetaTimeline() { g_timeline = outer_; }

void MetaTimeline::add_op(const OpEvent& e) {
  TimelineEntry t;
  t.kind = TimelineEntry::Kind::Op;
  t.op = e;
  entries_.push_back(std::move(t));
}

int64_t MetaTimeline::add_comm(const CommEvent& e) {
  TimelineEntry t;
  t.kind = TimelineEntry::Kind::Comm;
  t.comm = e;
  t.call = calls_++;
  entries_.push_back(std::move(t));
  return entries_.back().call;
}

void MetaTimeline::add_wait(int64_t call) {
  TimelineEntry t;
  t.kind = TimelineEntry::Kind::Wait;
  t.call = call;
  entries_.push_back(std::move(t));
}

namespace meta {
MetaTimeline* live_timeline() { return g_timeline; }
}  // namespace meta
}  // namespace parallel
