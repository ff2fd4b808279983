// GraphAutoFusion: the user-facing API (names follow the original system; see ../shared/SPEC.md).
//
//   GraphAutoFusion f(model, {.preset = "transformer"});
//   auto report = f.AnalyzeFusionBenefit();   // per-candidate verdicts with reasons
//   auto summary = f.EstimateFusionBenefit(); // whole-model prediction, nothing changed
//   Model fused = f.Fuse();                   // fused groups become model-local ONNX functions
//   f.Save("fused.onnx");
//
// Every attempt (rule, nodes, decision, reason, predicted times) is appended to one decision log;
// reports and `autofusion explain` are views of it.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "cost/cost_model.h"
#include "cost/workload.h"
#include "fusion/decision_log.h"
#include "fusion/rules.h"
#include "ir/graph.h"

namespace gaf {

inline constexpr const char* kFusedDomain = "ai.graph_autofusion";

struct FusionOptions {
  std::string preset = "transformer";          // "transformer", "cnn", "rnn", "all", "none"
  std::vector<std::string> fuse_rules;         // restrict to these rule names (empty = all of the preset)
  std::string rules_file;                      // extra user rules
  bool auto_fuse = true;                       // TVM-style fusion of what no named rule covers
  bool safe_mode = false;                      // precision/speed gates (code-generation issue)
  double benefit_threshold = -1;               // overrides every rule's threshold when >= 0
  std::string profile = "host-cpu";            // hardware profile name or JSON file
  std::map<std::string, int64_t> dims;         // bindings of symbolic dims for the cost model
  // The user's sample inputs (or a decoder's generation trace): shapes for the cost model come
  // from its first sample, safe fusion measures on all of them. Empty: random inputs (dims).
  Workload workload;
};

enum class Verdict { kFuse, kSkipLowBenefit, kSkipLocalMemory, kSkipPrecision, kSkipSpeed, kSkipCompile,
                     kSkipOverlap, kSkipIllegal, kMaybe };
const char* VerdictName(Verdict v);  // "Fuse", "Skip: low benefit", ...

struct FusionCandidate {
  int id = 0;
  std::string rule;                  // rule name ("auto" for the automatic fuser)
  std::string fused_op;              // fused op type
  std::vector<std::string> node_names;
  std::vector<std::string> op_types;
  std::vector<int> nodes;            // indices into the canonicalized graph
  std::vector<std::string> inputs, outputs;
  GroupCost cost;
  Verdict verdict = Verdict::kMaybe;
  std::string reason;                // a sentence a user reads
  std::string rule_source;
};

struct FusionEstimate {
  int candidates = 0, fused = 0;
  std::map<std::string, int> skipped_by_reason;
  double time_before_us = 0, time_after_us = 0;        // whole model, cost model
  double bytes_before = 0, bytes_after = 0;            // whole model memory traffic
  double predicted_speedup = 1;
  std::string profile;
  // Additions: how the figures were obtained ("" when every node had known shapes).
  std::string note;
  int nodes_before = 0, nodes_after = 0;  // main-graph node counts without / with the fused groups
};

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
  int threads = 0;               // 0 = all cores
  std::string kernel_cache;      // "" = $GAF_KERNEL_CACHE or ~/.cache/graph-autofusion/kernels
  uint32_t seed = 0;             // random graph inputs
  // Also gate float16 storage of constant MatMul weights (codegen/half_weights.h): end to end,
  // with every such product on float16 weights, against the same thresholds. When it passes, the
  // fused model gets the graph_autofusion.half_weights metadata and `generate` runs it so.
  bool half_weights = false;
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
  std::string reason_kind;                   // "", "precision", "speed", "compile"
  std::string reason;                        // a sentence
  double cosine = 0, max_abs_error = 0;      // measured on the group's real inputs
  double predicted_unfused_us = 0, predicted_fused_us = 0;  // cost model (per formula in docs/cost_model.md)
  double measured_unfused_us = 0, measured_fused_us = 0;    // medians of `repeats` runs
  double noise = 0;                          // larger relative spread (IQR/median) of the two sides' timings
  int pairs = 0, pairs_won = 0, pairs_needed = 0;  // speed gate: interleaved pairs, kernel wins, wins needed
  std::string same_as;                       // measured once for identical kernel+shapes: that node
  int samples = 0;                           // workload samples the group was checked on
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
  // float16 weight storage gate (SafeFusionOptions::half_weights).
  bool half_weights_tried = false, half_weights_kept = false;
  double half_weights_cosine = 0, half_weights_max_abs_error = 0;  // measured, every product on float16 weights
  std::string half_weights_reason;                                 // why it was not kept
  std::string ToText() const;
  std::string ToJson() const;
};

// What Fuse() did (additions).
struct FuseSummary {
  int groups = 0;                          // fused groups (nodes calling a function)
  int functions = 0;                       // distinct model-local functions
  std::map<std::string, int> per_rule;     // rule -> fused groups
  int nodes_before = 0, nodes_after = 0;   // main-graph node counts (canonicalized model -> fused)
  int nodes_original = 0;                  // main-graph node count of the model as given
  bool checker_passed = false;             // the ONNX checker accepted the fused model
  bool input_checker_passed = false;       // ... and the model as given (when it does not, the fused
  std::string checker_message;             //     model may fail too; the checker's message is kept here)
};

class GraphAutoFusion {
 public:
  GraphAutoFusion(const Model& model, FusionOptions options = {});

  // Adds a rule; an overlapping rule of the same priority is reported as a conflict when matching.
  void AddFusionRule(FusionRule rule);

  const std::vector<FusionCandidate>& AnalyzeFusionBenefit();
  FusionEstimate EstimateFusionBenefit();
  // Returns the fused model: each accepted group is one node calling a model-local function
  // (domain kFusedDomain) whose body is the original subgraph, original node names kept in the
  // node's doc_string and metadata.
  Model Fuse();
  void Save(const std::string& path);  // saves the fused model (fusing first if needed)

  // Fuse() plus the precision and speed gates with rollback (see SafeFusionOptions); also what
  // Fuse() does when options.safe_mode is set and FuseSafe is called.
  Model FuseSafe(const SafeFusionOptions& safe = {});
  const SafeFusionReport& GetSafeFusionReport() const { return safe_report_; }
  // Generates the kernels of the fused model's operators into `dir` (one source per kernel stage,
  // build.ninja, the shared library) in one batch build; returns a summary. Defined with FuseSafe.
  std::string CompileFusedOperators(const std::string& dir);
  // Rolls back fused candidates (candidate id -> verdict and reason) and fuses again.
  Model RollBack(const std::map<int, std::pair<Verdict, std::string>>& rollbacks);

  const Model& canonical_model() const { return model_; }
  const std::vector<std::string>& canonicalization_log() const { return canon_log_; }
  const HardwareProfile& profile() const { return hw_; }
  // Additions.
  const DecisionLog& decision_log() const { return log_; }
  const FuseSummary& fuse_summary() const { return fuse_summary_; }
  const std::vector<FusionRule>& rules() const { return rules_; }
  bool shapes_known() const { return shapes_known_; }
  const std::string& shapes_error() const { return shapes_error_; }

 private:
  Model original_;
  Model model_;  // canonicalized
  FusionOptions options_;
  HardwareProfile hw_;
  std::vector<FusionRule> rules_;
  std::vector<std::string> canon_log_;
  std::vector<FusionCandidate> candidates_;
  bool analyzed_ = false;
  Model fused_;
  bool fused_done_ = false;
  // Additions.
  void RecordShapesOnce();
  DecisionLog log_;
  ShapeMap shapes_;
  bool shapes_done_ = false, shapes_known_ = false;
  std::string shapes_error_;
  FuseSummary fuse_summary_;
  std::vector<std::pair<std::string, int>> fused_nodes_;  // fused node name -> candidate id
  SafeFusionReport safe_report_;
 public:
  // Fused node name -> candidate id of the last Fuse().
  const std::vector<std::pair<std::string, int>>& fused_nodes() const { return fused_nodes_; }
  const std::vector<FusionCandidate>& candidates() const { return candidates_; }
};

}  // namespace gaf
