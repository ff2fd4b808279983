// A static memory plan for the repeated runs of one graph (a session's decode steps, a service's
// inferences): the first run takes its buffers from the allocator as usual (a graph run once pays
// nothing); the tensor buffers the second run allocates on its thread are recorded (size, when each
// is allocated and when freed), given offsets in one arena by their lifetimes (two buffers share
// memory only when their lifetimes do not overlap: greedy by size, as TFLite's and ONNX Runtime's
// planners do), and later runs take their k-th buffer at the k-th offset instead of from the
// allocator. Buffers that outlived the recorded run (graph outputs, cached values) keep coming
// from the allocator.
//
// Safety does not depend on the runs repeating exactly: a buffer is served from the arena only
// when its size fits the recorded slot and its range overlaps no arena buffer still alive, and an
// arena is reused only when no tensor references it any more (a tensor kept by the caller keeps
// its arena, and the next run gets another). A run that asked for something the plan could not
// serve (a larger size: a growing KV cache's mask; a different sequence) is recorded again the
// next run; slots carry an eighth of headroom, so a slowly growing shape re-plans rarely. After
// kMaxReplans plans in a row that each missed, the plan stops (the allocator serves everything).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace gaf {

struct MemoryPlanStats {
  int64_t runs = 0;            // runs begun with the plan
  int64_t plans = 0;           // times the offsets were computed (recordings)
  int64_t arena_bytes = 0;     // the arena's size in the current plan
  int64_t arenas = 0;          // arenas allocated (a new one when tensors still hold the last)
  int64_t planned = 0;         // buffers the current plan places in the arena
  int64_t last_requests = 0;   // buffers the last run allocated on its thread
  int64_t last_served = 0;     // of them from the arena
  bool stopped = false;        // too many plans missed: the allocator serves everything
};

// One line for a report: what the last run took from the arena, the arena's size, the plans made.
std::string DescribeMemoryPlan(const MemoryPlanStats& s);

class MemoryPlan {
 public:
  static constexpr int kMaxReplans = 6;
  // A run's requests beyond this many are not planned (placing n buffers costs up to n^2 steps).
  static constexpr size_t kMaxRequests = size_t{1} << 12;

  MemoryPlan();
  ~MemoryPlan();
  MemoryPlan(const MemoryPlan&) = delete;
  MemoryPlan& operator=(const MemoryPlan&) = delete;

  // While a Scope is alive, the tensor buffers allocated on its thread go through `plan` (none:
  // null). Scopes nest (the inner plan serves until it ends).
  class Scope {
   public:
    explicit Scope(MemoryPlan* plan);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    MemoryPlan* plan_;
    MemoryPlan* outer_;
  };

  MemoryPlanStats stats() const;

  // For Tensor's allocation: the plan active on this thread (null: none), and a buffer of `bytes`
  // (a multiple of 64) from it; `fallback` makes one from the allocator. Sets *data.
  using Fallback = std::shared_ptr<void> (*)(size_t bytes);
  static MemoryPlan* Active();
  std::shared_ptr<void> Allocate(size_t bytes, Fallback fallback, void** data);

  struct Impl;

 private:
  void Begin();
  void End();
  std::shared_ptr<Impl> impl_;
};

}  // namespace gaf
