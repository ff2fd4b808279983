// Helpers shared by kernels: axis handling, broadcasting, dtype dispatch, parallel loops.
#pragma once

#include <omp.h>

#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "ir/error.h"
#include "ir/tensor.h"
#include "ops/kernel.h"
#include "ops/task_team.h"

namespace gaf {

// A node's description for error messages, formatted only when a message is: kernels on a decode
// step's hot path would otherwise build the string on every call.
struct NodeDescription {
  const Node& node;
};

}  // namespace gaf

template <>
struct fmt::formatter<gaf::NodeDescription> : fmt::formatter<std::string> {
  template <class Ctx>
  auto format(const gaf::NodeDescription& d, Ctx& ctx) const {
    return fmt::formatter<std::string>::format(d.node.Describe(), ctx);
  }
};

namespace gaf {

// Normalizes a possibly negative axis into [0, rank); throws naming the node when out of range.
int64_t NormalizeAxis(int64_t axis, int64_t rank, const Node& node);

// Numpy-style multidirectional broadcast of shapes; throws when incompatible.
Shape BroadcastShapes(const Shape& a, const Shape& b, const Node& node);
Shape BroadcastShapes(const std::vector<const Tensor*>& ins, const Node& node);

// memcpy that, from kStreamingCopyMin bytes (copies larger than the caches hold for the next
// operator: the present KV cache), uses stores that bypass the caches (no read of the destination
// lines first), so the copy moves each byte once each way.
inline constexpr int64_t kStreamingCopyMin = int64_t{256} << 10;
void CopyBytes(void* dst, const void* src, int64_t n);

// Shape's output for a tensor of `shape`: its dims from the node's `start` to `end` attributes
// (opset 15; negative counts from the end, clamped to the rank).
Tensor ShapeSlice(const Shape& shape, const Node& node);

// Row-major strides (in elements).
std::vector<int64_t> Strides(const Shape& shape);
// Strides of `in_shape` broadcast to `out_shape` (0 on broadcast dims), right-aligned.
std::vector<int64_t> BroadcastStrides(const Shape& in_shape, const Shape& out_shape);

// Calls fn(T{}) with T the C++ type of dt for all numeric types (not half, not string, not bool
// unless with_bool). Throws UnsupportedError otherwise.
template <class F>
decltype(auto) DispatchNumeric(DataType dt, const Node& node, F&& fn) {
  switch (dt) {
    case DataType::kFloat: return fn(float{});
    case DataType::kDouble: return fn(double{});
    case DataType::kInt64: return fn(int64_t{});
    case DataType::kInt32: return fn(int32_t{});
    case DataType::kInt8: return fn(int8_t{});
    case DataType::kUint8: return fn(uint8_t{});
    case DataType::kInt16: return fn(int16_t{});
    case DataType::kUint16: return fn(uint16_t{});
    case DataType::kUint32: return fn(uint32_t{});
    case DataType::kUint64: return fn(uint64_t{});
    default:
      GAF_UNSUPPORTED("{}: data type {} is not supported", node.Describe(), DataTypeName(dt));
  }
}
template <class F>
decltype(auto) DispatchFloat(DataType dt, const Node& node, F&& fn) {
  switch (dt) {
    case DataType::kFloat: return fn(float{});
    case DataType::kDouble: return fn(double{});
    default:
      GAF_UNSUPPORTED("{}: data type {} is not supported", node.Describe(), DataTypeName(dt));
  }
}
// Every type with a fixed element size, dispatched by element size only (for data movement):
// calls fn(uintN_t{}) with N = 8, 16, 32, 64. Strings and bool are handled (bool as uint8).
template <class F>
decltype(auto) DispatchBySize(DataType dt, const Node& node, F&& fn) {
  switch (DataTypeSize(dt)) {
    case 1: return fn(uint8_t{});
    case 2: return fn(uint16_t{});
    case 4: return fn(uint32_t{});
    case 8: return fn(uint64_t{});
    default:
      GAF_UNSUPPORTED("{}: data type {} is not supported", node.Describe(), DataTypeName(dt));
  }
}

// The bounds of a Clip node for a fused epilogue: its min/max attributes (before opset 11) or its
// constant float32 scalar inputs (`constant` gives an input's value, null when not constant);
// unbounded sides are +-FLT_MAX. False when a given bound is not such a constant.
bool ConstantClipBounds(const Node& n, const std::function<const Tensor*(const std::string&)>& constant, float* lo,
                        float* hi);

// The shape Reshape would give `in` for target `shape` (allowzero = 0), or empty when invalid
// (a valid result has as many axes as `shape`).
Shape ResolveReshape(const Shape& in, const std::vector<int64_t>& shape);

// Softmax of one row of n floats with the Softmax kernel's arithmetic (y may be x).
void SoftmaxRowF32(const float* x, float* y, int64_t n);
// The same given the row's maximum (computed where the row was made): the same results.
void SoftmaxRowWithMaxF32(const float* x, float* y, int64_t n, float max);
// Softmax's first half over a segment of a row (attention split along the keys): *max = the
// segment's maximum, y = exp(x - max) with the Softmax kernel's exp (y may be x); returns the sum
// of y. A segment of -inf only: y = 0, sum 0 (it takes no weight when the segments combine).
float ExpRowF32(const float* x, float* y, int64_t n, float* max);
// The mean of one row of n floats with ReduceMean's arithmetic over a last axis, into *mean;
// false for rows ReduceMean would split across threads (other sums) or empty ones.
bool MeanRowF32(const float* x, int64_t n, float* mean);
// The mean of a row's squares as Mul(X, X) then ReduceMean over the last axis compute it (RMS
// normalizations): the squares into sq (n floats), then MeanRowF32; false where that refuses.
bool MeanSquareRowF32(const float* x, int64_t n, float* sq, float* mean);

// RMSNorm's one pass over a row of n floats (ops/rms_norm.cc): the mean of the squares
// (MeanSquareRowF32, sq its n floats of scratch), then x / s or x * (1 / s) (`divide`) with
// s = sqrt(mean + eps), times w when not null; the bits of the operators it replaces. y may not be x.
void RMSNormRowF32(const float* x, int64_t n, float eps, const float* w, bool divide, float* sq, float* y);
// Whether an RMSNorm of X (eps, W: null when absent; the node's `axis`) takes that row pass:
// float32, the last axis, eps one value, W of the rows' length along X's last axis; *n the length.
bool RMSNormTakes(const Node& node, const Tensor& X, const Tensor* E, const Tensor* W, int64_t* n);

// Runs a plan node's `fallback` graph (the original operators, on the node's inputs) and takes
// its outputs (runtime/plan_rewrite.h).
void RunPlanFallback(KernelContext& ctx);

// The threads parallel loops (ParallelFor, the panel task runners) may use now: the leading
// team's inside a run led by a TaskTeam, 1 inside another parallel region, else OpenMP's setting.
// Per-thread scratch for ParallelFor's chunks is indexed by omp_get_thread_num() below this count
// (0 where the loop runs inline in another region: ParallelThreadsNested()).
inline int ParallelThreads() {
  if (TaskTeam* team = TaskTeam::Active()) return team->threads();
  return omp_in_parallel() ? 1 : omp_get_max_threads();
}
// Whether ParallelFor called here runs inline inside a parallel region that is not a team's (its
// chunks then run on this thread, whatever omp_get_thread_num() says).
inline bool ParallelThreadsNested() { return TaskTeam::Active() == nullptr && omp_in_parallel(); }

// Parallel loop over [0, n) in chunks; runs serially when n < grain. fn(begin, end).
// Inside a run led by a TaskTeam (ops/task_team.h), the chunks go to the team's threads.
template <class F>
void ParallelFor(int64_t n, int64_t grain, F&& fn) {
  if (n <= 0) return;
  if (TaskTeam* team = TaskTeam::Active(); team != nullptr && n >= 2 * grain) {
    const int64_t chunks = std::min<int64_t>(team->threads() * 4, (n + grain - 1) / grain);
    team->ForEach(chunks, [&](int64_t c, int64_t) {
      const int64_t b = n * c / chunks, e = n * (c + 1) / chunks;
      if (b < e) fn(b, e);
    });
    return;
  }
  if (n < 2 * grain || omp_get_max_threads() == 1 || omp_in_parallel()) {
    fn(int64_t{0}, n);
    return;
  }
  int nt = omp_get_max_threads();
  int64_t chunks = std::min<int64_t>(nt * 4, (n + grain - 1) / grain);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    int64_t b = n * c / chunks, e = n * (c + 1) / chunks;
    if (b < e) fn(b, e);
  }
}

}  // namespace gaf
