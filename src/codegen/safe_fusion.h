// Safe fusion and kernel compilation: GraphAutoFusion (fusion/auto_fusion.h) plus what needs the
// code generator. This is the API of the original system:
//
//   SafeGraphAutoFusion f(model, {.preset = "transformer", .safe_mode = true});
//   Model fused = f.FuseAsConfigured();            // FuseSafe when safe_mode, else Fuse()
//   std::cout << f.GetSafeFusionReport().ToText();
//   f.CompileFusedOperators("./fused_ops");
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "fusion/auto_fusion.h"

namespace gaf {

struct VerifyOptions;

// Safe fusion (stage 4): each fused group's generated kernel is checked against the unfused
// operators on the group's real inputs: the values it meets in runs of the model on the workload
// (FusionOptions::workload: the user's samples or a decoder's prefill and decode steps; random
// inputs when empty), every sample. Precision: cosine similarity and max abs error over every
// output of every sample. Speed: one repeat runs the group over all samples, the fused kernel
// against the same operators run one after another by the reference kernels, back to back in
// interleaved pairs; the kernel must be faster in enough pairs to pass a one-sided sign test at
// 1% (13 of 15 pairs by default); an undecided result (neither clearly faster nor clearly slower)
// is measured again with twice as many pairs before it is decided, and stays rolled back if it
// is still not clearly faster. A group that fails is rolled back to its original operators with
// the reason. Then the whole fused model is timed against the model as given on the same
// workload, in the session `run` and `generate` use, with the same sign test: if it is not
// faster, the groups that gained least are rolled back and it is measured again, and when even
// that is not faster the model as given is kept; the report says which.
// Implemented in src/codegen/safe_fusion.cc (link gaf_codegen).
struct SafeFusionOptions {
  double min_cosine = 0.999;
  double max_abs_error = 1e-3;   // absolute, per output element
  bool check_speed = true;
  int repeats = 15;              // timed pairs per side (median); undecided results get 2x more
  // A kept group must also be this much faster (ratio of the fastest runs - 1): groups near break-even are
  // then rolled back every time instead of flipping with the machine's noise from run to run.
  double min_gain = 0.05;
  // Reuse the speed verdict measured before for the same kernel, operators, inputs and machine
  // (codegen/gate_cache.h), so a model fused again keeps the same groups; false: measure again
  // and replace the stored verdicts (`--remeasure`).
  bool reuse_measurements = true;
  int threads = 0;               // 0 = all cores
  std::string kernel_cache;      // "" = $GAF_KERNEL_CACHE or ~/.cache/graph-autofusion/kernels
  uint32_t seed = 0;             // random graph inputs
  // Also gate float16 storage of constant MatMul weights (codegen/half_weights.h): end to end,
  // with every such product on float16 weights. It passes when every output keeps min_cosine and
  // stays within max_abs_error or within half_weights_rel_error of the output's largest magnitude
  // (float16 rounds each weight by up to 2^-11 of itself, so the error of an output scales with
  // it: logits of a few units move by a few 1e-3), and then half_weights_check passes (when set).
  // When it passes, the fused model gets the graph_autofusion.half_weights metadata and `generate`
  // runs it so.
  bool half_weights = false;
  // Groups whose operators the runtime's plan runs as its own (runtime/plan_calls.h: attention
  // over a key/value cache read in place, products on packed weights) are rolled back ungated
  // ("Skip: runtime"): a kernel for the group runs slower there. false: gate and keep them like
  // any group, and time every side without the plan's rewrites (to check those kernels).
  bool runtime_plan = true;
  double half_weights_rel_error = 1.0 / 512;
  // A task-level check of float16 storage on the fused model: true when it passes, with what it
  // did (or why it failed) in *what. The CLI sets one for decoders (the greedy tokens of a
  // generation with and without float16 weights must be the same), which codegen cannot run
  // itself (models is the layer above).
  std::function<bool(const Model& fused, std::string* what)> half_weights_check;
  // Test hook: called with the fused function's name before every timed kernel call, in the group
  // gates (end_to_end false) and end to end (true): a deliberately slow kernel, to test that the
  // gates catch one.
  std::function<void(const std::string& function, bool end_to_end)> kernel_hook;
};

struct SafeKernelResult {
  int candidate = -1;
  std::string node, function, rule, kernel;  // kernel: how it runs ("library MatMul + generated[...]")
  std::vector<std::string> original_nodes;
  bool fused = false;                        // kept (else rolled back)
  std::string reason_kind;                   // "", "precision", "speed", "compile", "runtime"
  std::string reason;                        // a sentence
  double cosine = 0, max_abs_error = 0;      // measured on the group's real inputs
  double predicted_unfused_us = 0, predicted_fused_us = 0;  // cost model (per formula in docs/cost_model.md)
  double measured_unfused_us = 0, measured_fused_us = 0;    // medians of `repeats` runs
  double noise = 0;                          // larger relative spread (IQR/median) of the two sides' timings
  int pairs = 0, pairs_won = 0, pairs_needed = 0;  // speed gate: interleaved pairs, kernel wins, wins needed
  std::string same_as;                       // measured once for identical kernel+shapes: that node
  int samples = 0;                           // workload samples the group was checked on
  std::string speed_measured_at;             // set when the speed verdict was reused: when it was measured
  bool rolled_back_end_to_end = false;       // passed its own gates, rolled back by the end-to-end gate
};

struct SafeFusionReport {
  int candidates = 0, fused = 0;
  std::map<std::string, int> skipped_by_reason;  // verdict name -> count (all stages)
  std::vector<SafeKernelResult> kernels;        // one per fused group tried
  // End to end, original (canonicalized) model vs the final fused model with its kernels.
  std::vector<std::string> outputs;
  std::vector<double> output_cosine, output_max_abs_error;
  double time_original_ms = 0, time_fused_ms = 0, measured_speedup = 0;  // medians of `repeats`
  double predicted_speedup = 1;                                           // cost model
  std::string kernel_library;                                              // where the compiled kernels are
  std::string workload;                    // what the gates measured on (FusionOptions::workload.source)
  int samples = 0;                         // runs in it
  // The end-to-end gate: fused faster than the model as given in pairs_won of pairs (needed).
  int end_to_end_pairs = 0, end_to_end_pairs_won = 0, end_to_end_pairs_needed = 0;
  int end_to_end_rounds = 0;               // end-to-end measurements made (each after rollbacks)
  std::vector<std::string> end_to_end_log;  // one line per round: groups kept, times, pairs
  std::string end_to_end_verdict;          // "faster", "faster after rolling back N groups", "original kept: ..."
  bool original_kept = false;              // no fused model was faster: the model as given is the result
  std::string end_to_end_reused;           // the last end-to-end timing was reused: when it was measured
  // float16 weight storage gate (SafeFusionOptions::half_weights).
  bool half_weights_tried = false, half_weights_kept = false;
  double half_weights_cosine = 0, half_weights_max_abs_error = 0;  // measured, every product on float16 weights
  double half_weights_error_bound = 0;     // the largest error allowed for the output that came closest to its bound
  std::string half_weights_check;          // what the task-level check did ("" when none ran)
  std::string half_weights_reason;                                 // why it was not kept
  std::string ToText() const;
  std::string ToJson() const;
};

class SafeGraphAutoFusion : public GraphAutoFusion {
 public:
  using GraphAutoFusion::GraphAutoFusion;

  // Fuse() plus the precision and speed gates with rollback and the end-to-end gate (see
  // SafeFusionOptions). Returns the result, which Save() then writes (the model as given when
  // the original was kept).
  Model FuseSafe(const SafeFusionOptions& safe = {});
  const SafeFusionReport& GetSafeFusionReport() const { return safe_report_; }
  // What the options ask for: FuseSafe(safe) when FusionOptions::safe_mode is set, else Fuse().
  Model FuseAsConfigured(const SafeFusionOptions& safe = {});
  // Generates the kernels of the fused model's operators into `dir` (one source per kernel stage,
  // build.ninja, the shared library) in one batch build, with a variant for each class the
  // workload's calls take; returns a summary.
  std::string CompileFusedOperators(const std::string& dir);

 private:
  Model GateEndToEnd(Model fused, const SafeFusionOptions& safe, const VerifyOptions& vo,
                     std::map<int, std::pair<Verdict, std::string>>& rollbacks);
  SafeFusionReport safe_report_;
};

}  // namespace gaf
