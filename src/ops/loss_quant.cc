// Losses (NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss), (de)quantization, detection ops
// (NonMaxSuppression, RoiAlign), GridSample, Det, signal ops (windows, DFT, STFT,
// MelWeightMatrix) and random generators. This file registers them; they live by family in
// loss.cc, quantize.cc, detection.cc (NonMaxSuppression, RoiAlign, GridSample), linalg.cc (Det),
// signal.cc and random.cc, with what they share in ops/loss_quant_internal.h.
#include <utility>

#include "ops/kernel.h"
#include "ops/loss_quant_internal.h"

namespace gaf {

using namespace loss_quant_detail;

void RegisterLossAndQuantKernels(OpRegistry& r) {
  constexpr auto kO = OpKind::kOpaque;
  auto reg = [&](const char* op, OpKind kind, KernelFn fn) { r.Register({"", op, kind, std::move(fn), true}); };
  reg("NegativeLogLikelihoodLoss", kO, NllKernel);
  reg("SoftmaxCrossEntropyLoss", kO, SoftmaxCrossEntropyKernel);
  reg("QuantizeLinear", OpKind::kElementwise, QuantizeLinearKernel);
  reg("DequantizeLinear", OpKind::kElementwise, DequantizeLinearKernel);
  reg("DynamicQuantizeLinear", kO, DynamicQuantizeLinearKernel);
  reg("NonMaxSuppression", kO, NonMaxSuppressionKernel);
  reg("RoiAlign", kO, RoiAlignKernel);
  reg("GridSample", kO, GridSampleKernel);
  reg("Det", kO, DetKernel);
  reg("HannWindow", kO, [](KernelContext& ctx) { WindowKernel(ctx, WindowKind::kHann); });
  reg("HammingWindow", kO, [](KernelContext& ctx) { WindowKernel(ctx, WindowKind::kHamming); });
  reg("BlackmanWindow", kO, [](KernelContext& ctx) { WindowKernel(ctx, WindowKind::kBlackman); });
  reg("DFT", kO, DftKernel);
  reg("STFT", kO, StftKernel);
  reg("MelWeightMatrix", kO, MelWeightMatrixKernel);
  reg("RandomUniform", kO, [](KernelContext& ctx) { RandomKernel(ctx, false, false); });
  reg("RandomNormal", kO, [](KernelContext& ctx) { RandomKernel(ctx, true, false); });
  reg("RandomUniformLike", kO, [](KernelContext& ctx) { RandomKernel(ctx, false, true); });
  reg("RandomNormalLike", kO, [](KernelContext& ctx) { RandomKernel(ctx, true, true); });
  reg("Bernoulli", kO, BernoulliKernel);
  reg("Multinomial", kO, MultinomialKernel);
}

}  // namespace gaf
