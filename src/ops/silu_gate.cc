// SiLUGate (domain ai.graph_autofusion.plan): SiLU and the gated SiLU of SwiGLU MLPs as one
// elementwise pass, as the plan rewrite makes them from
//
//   Mul(G, Sigmoid(G))              -> SiLUGate(G)          (either Mul order)
//   Mul(Mul(G, Sigmoid(G)), U)      -> SiLUGate(G, U)       (either order of either Mul)
//
//   inputs  G [, U]     U of G's shape (a broadcasting U runs the fallback)
//   attrs   fallback    the original nodes, as a graph on the node's inputs
//
// One read of G (and U) and one write instead of the original's three passes, which write the
// sigmoid and the SiLU out in full (a 256-token prefill's gate is 2.9 MB per layer at the bench
// Llama's dims). The arithmetic is the original's, operator by operator: the Sigmoid kernel's
// function (ops/fast_math.h), then the float products in the same order, so results are
// bit-identical. Types other than float32 run the fallback.
#include "ops/fast_math.h"
#include "ops/kernel.h"
#include "ops/kernel_util.h"

namespace gaf {
namespace {

constexpr int64_t kGrain = 1 << 14;  // elements per task

void SiLUGateKernel(KernelContext& ctx) {
  const size_t n_in = ctx.num_inputs();
  if (n_in < 1 || n_in > 2) return RunPlanFallback(ctx);
  for (size_t i = 0; i < n_in; ++i)
    if (!ctx.has_input(i) || ctx.input(i).dtype() != DataType::kFloat) return RunPlanFallback(ctx);
  const Tensor& G = ctx.input(0);
  if (n_in == 2 && ctx.input(1).shape() != G.shape()) return RunPlanFallback(ctx);
  Tensor Y = Tensor::Uninitialized(DataType::kFloat, G.shape());
  const float* g = G.data<float>();
  const float* u = n_in == 2 ? ctx.input(1).data<float>() : nullptr;
  float* y = Y.data<float>();
  ParallelFor(G.numel(), kGrain, [&](int64_t b, int64_t e) {
    if (u != nullptr) {
#pragma omp simd
      for (int64_t i = b; i < e; ++i) {
        const float silu = g[i] * gaf_fast::FastSigmoid(g[i]);
        y[i] = silu * u[i];
      }
    } else {
#pragma omp simd
      for (int64_t i = b; i < e; ++i) y[i] = g[i] * gaf_fast::FastSigmoid(g[i]);
    }
  });
  ctx.outputs[0] = std::move(Y);
}

}  // namespace

void RegisterSiLUGateKernels(OpRegistry& r) {
  // Not upcast: float16/bfloat16 run the fallback, whose operators round each step in their type.
  r.Register({"ai.graph_autofusion.plan", "SiLUGate", OpKind::kElementwise, SiLUGateKernel, false});
}

}  // namespace gaf
