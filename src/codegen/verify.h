// Verification of a fused model: precision against the original and speed with and without the
// generated kernels, both on the same workload (the user's samples, a decoder's generation trace,
// or one sample of RandomFeeds).
//
//   VerifyPrecision(fused, original): both run on every sample; per output the lowest cosine
//   similarity and the largest abs error over the samples; per fused function the calls that ran
//   a kernel and those that ran the body (a fallback).
//   VerifyPerformance(fused): a baseline (the original model when given, else the fused model
//   with its functions inlined: exactly the unfused operators) against the fused model with its
//   generated kernels, in the session `run` and `generate` use; one repeat is one pass over the
//   workload, repeats interleaved in pairs; medians, and how many pairs the fused side won.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "codegen/compiler.h"
#include "codegen/fused_session.h"
#include "codegen/half_weights.h"
#include "cost/workload.h"
#include "ir/graph.h"

namespace gaf {

struct VerifyOptions {
  std::map<std::string, int64_t> dims;   // symbolic dims of random inputs
  std::map<std::string, Tensor> feeds;   // given inputs of one sample (missing ones are random)
  Workload workload;                     // when not empty: the samples (`feeds` and `dims` unused)
  const Model* original = nullptr;       // VerifyPerformance: time this model as the baseline
  uint32_t seed = 0;
  int threads = 0;
  int repeats = 10;
  bool use_kernels = true;               // run the fused model with its generated kernels
  // The session's plan rewrites (SessionOptions::rewrite_products). With them, calls whose
  // operators the plan runs as its own (runtime/plan_calls.h) do not run their kernels; false
  // runs every kernel (to check the kernels themselves).
  bool plan_rewrites = true;
  HalfWeights half_weights = HalfWeights::kOff;  // ... and float16 weight storage (half_weights.h)
  std::string kernel_cache;              // "" = default cache
  // Test hook for the fused runtime (FusedKernelSet::SetCallHook).
  std::function<void(const std::string& function)> kernel_hook;
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
  std::vector<FusedCallStats> calls;  // per fused function: kernel calls and fallbacks
  std::vector<std::string> never_ran; // per call site whose kernel never ran (IdleCallSites, the plan's aside)
  std::vector<std::string> run_by_plan;  // per call site run as the runtime's plan instead (PlanRunCallSites)
  int samples = 0;                    // runs compared
  std::string workload;               // how the inputs were obtained
  bool Passes(double min_cos, double max_abs) const { return min_cosine >= min_cos && max_abs_error <= max_abs; }
  // Call sites whose kernel never ran (no kernel, or every call ran the body), with the reason; the
  // sites the runtime's plan ran instead are in run_by_plan (not a failure: the plan's path is
  // the faster one, and the outputs above are compared as it runs).
  const std::vector<std::string>& NeverRan() const { return never_ran; }
};

struct PerformanceReport {
  int repeats = 0, threads = 0;
  double baseline_ms = 0, fused_ms = 0, speedup = 0;  // medians
  double baseline_noise = 0, fused_noise = 0;         // IQR / median
  int pairs_won = 0, pairs_needed = 0;                // fused faster in pairs; sign test at 1%
  std::string kernels;
  std::vector<FusedCallStats> calls;
  std::vector<std::string> idle_nodes;                // call sites whose kernel never ran
  std::string baseline;                               // "original model" or "functions inlined"
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
