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
  bool layout_chains = true;                   // blocked-layout chains of CNN operators (fusion/layout_chains.h)
  bool safe_mode = false;                      // SafeGraphAutoFusion::FuseAsConfigured runs safe fusion
  double benefit_threshold = -1;               // overrides every rule's threshold when >= 0
  std::string profile = "host-cpu";            // hardware profile name or JSON file
  std::map<std::string, int64_t> dims;         // bindings of symbolic dims for the cost model
  // The user's sample inputs (or a decoder's generation trace): shapes for the cost model come
  // from its first sample, safe fusion measures on all of them. Empty: random inputs (dims).
  Workload workload;
};

enum class Verdict { kFuse, kSkipLowBenefit, kSkipLocalMemory, kSkipPrecision, kSkipSpeed, kSkipCompile,
                     kSkipOverlap, kSkipIllegal, kSkipRuntime, kMaybe };
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

  // Safe fusion (precision and speed gates with rollback) and kernel compilation need the code
  // generator: SafeGraphAutoFusion (codegen/safe_fusion.h) adds them to this class.
  // Rolls back fused candidates (candidate id -> verdict and reason) and fuses again.
  Model RollBack(const std::map<int, std::pair<Verdict, std::string>>& rollbacks);

  const Model& canonical_model() const { return model_; }
  const Model& original_model() const { return original_; }
  const FusionOptions& options() const { return options_; }
  const std::vector<std::string>& canonicalization_log() const { return canon_log_; }
  const HardwareProfile& profile() const { return hw_; }
  // Additions.
  const DecisionLog& decision_log() const { return log_; }
  const FuseSummary& fuse_summary() const { return fuse_summary_; }
  const std::vector<FusionRule>& rules() const { return rules_; }
  bool shapes_known() const { return shapes_known_; }
  const std::string& shapes_error() const { return shapes_error_; }

 protected:
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
 public:
  // Fused node name -> candidate id of the last Fuse().
  const std::vector<std::pair<std::string, int>>& fused_nodes() const { return fused_nodes_; }
  const std::vector<FusionCandidate>& candidates() const { return candidates_; }
};

}  // namespace gaf
