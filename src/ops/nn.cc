// Contraction and pooling kernels: MatMul, Gemm, MatMulInteger, Einsum, Conv, ConvTranspose,
// MaxPool, AveragePool, LpPool and their global variants, and the quantized ConvInteger,
// QLinearConv and QLinearMatMul. This file registers them; they live by family in
//   gemv.cc    the streaming GEMV (ops/gemv.h) and the float16-weight MatMul
//   gemm.cc    Sgemm (oneDNN's dnnl_sgemm, or the GEMV for a few rows by a row-major weight)
//   matmul.cc  MatMul, Gemm, MatMulInteger, QLinearMatMul
//   einsum.cc  Einsum
//   conv.cc    Conv geometry, im2col, tiled and depthwise Conv, ConvInteger, QLinearConv,
//              ConvTranspose (ops/conv.h)
//   pool.cc    pooling
// with what they share in ops/nn_internal.h.
#include "ops/kernel.h"
#include "ops/nn_internal.h"

namespace gaf {

using namespace nn_detail;

void RegisterNnKernels(OpRegistry& r) {
  r.Register({"", "MatMul", OpKind::kContraction, MatMulKernel, true});
  r.Register({"", "Gemm", OpKind::kContraction, GemmKernel, true});
  r.Register({"", "MatMulInteger", OpKind::kContraction, MatMulIntegerKernel, false});
  r.Register({"", "Einsum", OpKind::kContraction, EinsumKernel, true});
  r.Register({"", "Conv", OpKind::kContraction, ConvKernel, true});
  r.Register({"", "ConvTranspose", OpKind::kContraction, ConvTransposeKernel, true});
  r.Register({"", "MaxPool", OpKind::kReduction, MaxPoolKernel, true});
  r.Register({"", "AveragePool", OpKind::kReduction, AveragePoolKernel, true});
  r.Register({"", "LpPool", OpKind::kReduction, LpPoolKernel, true});
  r.Register({"", "GlobalAveragePool", OpKind::kReduction, GlobalPoolKernel<GlobalMode::kAvg>, true});
  r.Register({"", "GlobalMaxPool", OpKind::kReduction, GlobalPoolKernel<GlobalMode::kMax>, true});
  r.Register({"", "ConvInteger", OpKind::kContraction, ConvIntegerKernel, false});
  r.Register({"", "QLinearConv", OpKind::kContraction, QLinearConvKernel, false});
  r.Register({"", "QLinearMatMul", OpKind::kContraction, QLinearMatMulKernel, false});
  r.Register({"", "MaxUnpool", OpKind::kInjective, MaxUnpoolKernel, false});
  r.Register({"", "GlobalLpPool", OpKind::kReduction, GlobalPoolKernel<GlobalMode::kLp>, true});
}

}  // namespace gaf
