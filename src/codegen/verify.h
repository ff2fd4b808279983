// Verification of a fused model: precision against the original and speed with and without the
// generated kernels, both on the same inputs (given, or RandomFeeds of the model).
//
//   VerifyPrecision(fused, original): both run; per output cosine similarity and max abs error.
//   VerifyPerformance(fused): the fused model's baseline (its functions inlined: exactly the
//   unfused operators) against the fused model with its generated kernels, runs interleaved,
//   medians of `repeats`.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "codegen/compiler.h"
#include "codegen/half_weights.h"
#include "ir/graph.h"

namespace gaf {

struct VerifyOptions {
  std::map<std::string, int64_t> dims;   // symbolic dims of random inputs
  std::map<std::string, Tensor> feeds;   // given inputs (missing ones are random)
  uint32_t seed = 0;
  int threads = 0;
  int repeats = 10;
  bool use_kernels = true;               // run the fused model with its generated kernels
  HalfWeights half_weights = HalfWeights::kOff;  // ... and float16 weight storage (half_weights.h)
  std::string kernel_cache;              // "" = default cache
};

struct OutputPrecision {
  std::string name;
  bool same_shape = true;
  double cosine = 1, max_abs_error = 0, max_abs_reference = 0;
};

struct PrecisionReport {
  std::vector<OutputPrecision> outputs;
  double min_cosine = 1, max_abs_error = 0;
  std::string kernels;  // fused kernels used (DescribeFusedKernels), empty without
  bool Passes(double min_cos, double max_abs) const { return min_cosine >= min_cos && max_abs_error <= max_abs; }
};

struct PerformanceReport {
  int repeats = 0, threads = 0;
  double baseline_ms = 0, fused_ms = 0, speedup = 0;  // medians
  double baseline_noise = 0, fused_noise = 0;         // IQR / median
  std::string kernels;
};

// Cosine similarity and max abs error of two tensors (any numeric type, compared as double).
// NaN/inf where the reference has none gives cosine -1 (fails any gate).
void CompareTensors(const Tensor& reference, const Tensor& got, double* cosine, double* max_abs_error);

PrecisionReport VerifyPrecision(const Model& fused, const Model& original, const VerifyOptions& options = {});
PerformanceReport VerifyPerformance(const Model& fused, const VerifyOptions& options = {});

// One-sided sign test: the fewest wins out of n paired comparisons that a fair coin reaches with
// probability <= alpha (n + 1 when none does). 13 of 15 at alpha = 0.01.
int SignTestWins(int n, double alpha);

// Median and relative inter-quartile range of samples.
double Median(std::vector<double> v);
double RelativeIqr(std::vector<double> v);

}  // namespace gaf
