// Internal to the kernels RegisterLossAndQuantKernels (loss_quant.cc) registers: loss.cc,
// quantize.cc, detection.cc, linalg.cc, signal.cc and random.cc. Not an interface of gaf_ops.
#pragma once

#include <cstdint>

#include "ir/tensor.h"
#include "ops/kernel.h"

namespace gaf::loss_quant_detail {

// The product of s[begin:end] (1 when empty; end may pass the rank).
inline int64_t Product(const Shape& s, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t i = begin; i < end && i < s.size(); ++i) p *= s[i];
  return p;
}

// A double tensor as dt (t itself for double).
inline Tensor DoublesTo(const Tensor& t, DataType dt) { return dt == DataType::kDouble ? t : t.CastTo(dt); }

void NllKernel(KernelContext& ctx);                        // loss.cc
void SoftmaxCrossEntropyKernel(KernelContext& ctx);        // loss.cc
void QuantizeLinearKernel(KernelContext& ctx);             // quantize.cc
void DequantizeLinearKernel(KernelContext& ctx);           // quantize.cc
void DynamicQuantizeLinearKernel(KernelContext& ctx);      // quantize.cc
void NonMaxSuppressionKernel(KernelContext& ctx);          // detection.cc
void RoiAlignKernel(KernelContext& ctx);                   // detection.cc
void GridSampleKernel(KernelContext& ctx);                 // detection.cc
void DetKernel(KernelContext& ctx);                        // linalg.cc
enum class WindowKind { kHann, kHamming, kBlackman };
void WindowKernel(KernelContext& ctx, WindowKind kind);    // signal.cc
void DftKernel(KernelContext& ctx);                        // signal.cc
void StftKernel(KernelContext& ctx);                       // signal.cc
void MelWeightMatrixKernel(KernelContext& ctx);            // signal.cc
// RandomUniform / RandomNormal (normal), and their *Like variants (like).
void RandomKernel(KernelContext& ctx, bool normal, bool like);  // random.cc
void BernoulliKernel(KernelContext& ctx);                  // random.cc
void MultinomialKernel(KernelContext& ctx);                // random.cc

}  // namespace gaf::loss_quant_detail
