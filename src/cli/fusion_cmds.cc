// `autofusion analyze`, `estimate`, `fuse`, `explain`: views of GraphAutoFusion and its decision
// log (report fields documented in docs/report_format.md).
#include <fmt/format.h>

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/inputs.h"
#include "fusion/auto_fusion.h"
#include "fusion/report_json.h"
#include "codegen/safe_fusion.h"
#include "models/generate.h"
#include "ir/error.h"
#include "onnx_io/onnx_io.h"
#include "runtime/plan_calls.h"
#include "ir/output_file.h"

namespace gaf::cli {
namespace fs = std::filesystem;

namespace {

using json = nlohmann::json;

// The generation fuse --safe measures decoders on when no -i is given.

struct FusionArgs {
  std::string model;
  std::string preset = "transformer";
  std::string rules_file;
  std::vector<std::string> fuse_rules;
  std::string profile = "host-cpu";
  double threshold = -1;
  std::vector<std::string> dims;
  std::vector<std::string> inputs;  // -i
  bool no_auto = false;
  bool no_chains = false;
  bool json = false;
  // fuse
  std::string output;
  bool safe = false, no_speed_gate = false, half_weights = false;
  double min_gain = 0.05;
  bool remeasure = false;
  double min_cosine = 0.999, max_abs_error = 1e-3;
  int repeats = 15, threads = 0;
  std::string report;
  bool overwrite = false;
  // explain
  std::string node, rule;
};

void AddCommonOptions(CLI::App* cmd, FusionArgs* a) {
  cmd->add_option("model", a->model, "ONNX model file, or a TorchScript file (with -i)")->required();
  cmd->add_option("--preset", a->preset, "rule preset: transformer, cnn, rnn, all, none (default transformer)");
  cmd->add_option("--rules", a->rules_file, "extra rules from a rule file (docs/rule_format.md)");
  cmd->add_option("--fuse-rules", a->fuse_rules, "use only these rules (names, or chains like MatMul+Relu)");
  cmd->add_option("--profile", a->profile, "hardware profile: host-cpu, ascend910, h200, or a JSON file");
  cmd->add_option("--benefit-threshold", a->threshold, "minimum predicted saving (0.1 = 10%), overrides every rule's");
  cmd->add_option("--dim", a->dims,
                  "NAME=VALUE binding of a symbolic dimension for the cost model (default: bound consistently with "
                  "the graph; 8 for sequence lengths, else 1)");
  cmd->add_option("-i,--input", a->inputs, kInputHelp);
  cmd->add_flag("--no-auto", a->no_auto, "disable the automatic (op-kind) fuser");
  cmd->add_flag("--no-blocked-chains", a->no_chains,
                "do not group CNN operators into blocked-layout chains (oneDNN's channel-blocked layout kept from "
                "one convolution to the next)");
  cmd->add_flag("--json", a->json, "machine-readable output");
}

std::unique_ptr<SafeGraphAutoFusion> MakeFuser(const FusionArgs& a) {
  FusionOptions o;
  o.preset = a.preset;
  o.rules_file = a.rules_file;
  o.fuse_rules = a.fuse_rules;
  o.profile = a.profile;
  o.benefit_threshold = a.threshold;
  o.auto_fuse = !a.no_auto;
  o.layout_chains = !a.no_chains;
  o.dims = ParseDimBindings(a.dims);
  Model model = LoadModelArg(a.model, a.inputs);
  o.workload = LoadWorkload(model, a.inputs, o.dims);
  // fuse --safe on a decoder without -i: the gates measure a short generation (prefill and decode
  // steps with a growing past), which is what `generate` runs.
  if (o.workload.empty() && a.safe && o.dims.empty()) {
    o.workload = DecoderWorkload(model);
    if (!o.workload.empty() && !a.json)
      fmt::print("{} is a decoder: safe fusion measures on {} (what generate runs; -i gives other inputs)\n", a.model,
                 o.workload.source);
  }
  o.safe_mode = a.safe;
  return std::make_unique<SafeGraphAutoFusion>(model, o);
}

std::string WorkloadOf(const FusionArgs& a) {
  return a.inputs.empty() ? "random inputs (symbolic dims bound consistently with the graph)"
                          : "inputs given with -i";
}

std::string Join(const std::vector<std::string>& v, const char* sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

std::string Operators(const FusionCandidate& c, size_t max_len = 44) {
  std::string ops = Join(c.op_types, "+");
  if (ops.size() > max_len) ops = ops.substr(0, max_len - 3) + fmt::format("...({} ops)", c.op_types.size());
  return ops;
}

std::string SummaryLine(const FusionEstimate& e) {
  std::string s = fmt::format("{} candidates: {} to fuse", e.candidates, e.fused);
  for (const auto& [k, v] : e.skipped_by_reason) s += fmt::format(", {} {}", v, k);
  if (e.time_before_us > 0)
    s += fmt::format("; whole model {:.1f} -> {:.1f} us ({:+.1f}%), memory traffic {:.2f} -> {:.2f} MB ({:+.1f}%)",
                     e.time_before_us, e.time_after_us, -100 * (1 - e.time_after_us / e.time_before_us),
                     e.bytes_before / 1e6, e.bytes_after / 1e6,
                     e.bytes_before > 0 ? -100 * (1 - e.bytes_after / e.bytes_before) : 0.0);
  s += fmt::format("; profile {}", e.profile);
  if (!e.note.empty()) s += " (" + e.note + ")";
  return s;
}

void RunAnalyze(const FusionArgs& a) {
  auto f = MakeFuser(a);
  const auto& cands = f->AnalyzeFusionBenefit();
  const FusionEstimate e = f->EstimateFusionBenefit();
  const HardwareProfile& hw = f->profile();
  if (a.json) {
    json arr = json::array();
    for (const FusionCandidate& c : cands) arr.push_back(CandidateJson(c, hw));
    json out{{"model", a.model},
             {"profile", {{"name", hw.name}, {"local_memory_bytes", hw.local_memory_bytes}, {"source", hw.source}}},
             {"rules", static_cast<int>(f->rules().size())},
             {"shapes_known", f->shapes_known()},
             {"shapes_error", f->shapes_error()},
             {"workload", WorkloadOf(a)},
             {"canonicalization", f->canonicalization_log()},
             {"candidates", arr},
             {"summary", EstimateJson(e)}};
    fmt::print("{}\n", out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
    return;
  }
  fmt::print("Fusion benefit analysis of {} (profile {}: local memory {:.0f} KB; {} rules; {} canonicalization changes)\n",
             a.model, hw.name, hw.local_memory_bytes / 1024, f->rules().size(), f->canonicalization_log().size());
  if (!f->shapes_known())
    fmt::print("note: no shapes, so no estimates (verdicts Maybe): {}\n", f->shapes_error());
  fmt::print("{:>4}  {:<26} {:<46} {:<22} {:>6}  {:<17} {:<20} {}\n", "id", "rule", "operators",
             "memory MB", "trips", "GFLOPS", "local mem KB", "verdict");
  for (const FusionCandidate& c : cands) {
    std::string mem = "-", trips = "-", gf = "-", local = "-";
    if (HasEstimate(c)) {
      const GroupCost& k = c.cost;
      mem = fmt::format("{:.4g} -> {:.4g}", k.bytes_before / 1e6, k.bytes_after / 1e6);
      trips = fmt::format("{}->{}", k.round_trips_before, k.round_trips_after);
      gf = fmt::format("{:.3g} -> {:.3g}", k.gflops_before, k.gflops_after);
      local = fmt::format("{:.1f}/{:.0f} {}", k.footprint_bytes / 1024, hw.local_memory_bytes / 1024,
                          k.fits_local_memory ? "fit" : "OVER");
    }
    fmt::print("{:>4}  {:<26} {:<46} {:<22} {:>6}  {:<17} {:<20} {}\n", c.id, c.rule, Operators(c), mem, trips, gf,
               local, VerdictName(c.verdict));
    fmt::print("      first node {}; {}\n", c.node_names.empty() ? "-" : c.node_names[0], c.reason);
  }
  fmt::print("Summary: {}\n", SummaryLine(e));
}

void RunEstimate(const FusionArgs& a) {
  auto f = MakeFuser(a);
  const FusionEstimate e = f->EstimateFusionBenefit();
  if (a.json) {
    json j = EstimateJson(e);
    j["model"] = a.model;
    j["shapes_known"] = f->shapes_known();
    j["shapes_error"] = f->shapes_error();
    j["workload"] = WorkloadOf(a);
    fmt::print("{}\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
    return;
  }
  fmt::print("Whole-model estimate for {} (profile {}, cost model: roofline + per-kernel overhead)\n", a.model, e.profile);
  if (e.time_before_us > 0) {
    fmt::print("  predicted time:         {:.1f} us -> {:.1f} us ({:.1f}% faster, speedup {:.3f}x)\n", e.time_before_us,
               e.time_after_us, 100 * (1 - e.time_after_us / e.time_before_us), e.predicted_speedup);
    fmt::print("  memory traffic:         {:.3f} MB -> {:.3f} MB ({:.1f}% less)\n", e.bytes_before / 1e6,
               e.bytes_after / 1e6, e.bytes_before > 0 ? 100 * (1 - e.bytes_after / e.bytes_before) : 0.0);
  }
  fmt::print("  nodes:                  {} -> {}\n", e.nodes_before, e.nodes_after);
  fmt::print("  candidates:             {} ({} to fuse)\n", e.candidates, e.fused);
  for (const auto& [k, v] : e.skipped_by_reason) fmt::print("  {:<23} {}\n", k + ":", v);
  if (!e.note.empty()) fmt::print("  note: {}\n", e.note);
}

void RunFuse(const FusionArgs& a) {
  GAF_CHECK(!a.output.empty(), "fuse needs an output file (-o OUT.onnx)");
  GAF_CHECK(!a.half_weights || a.safe, "--half-weights needs --safe (float16 weight storage is kept only when its precision gate passes)");
  // Destinations are checked before any work: nothing is written when one of them is refused.
  const std::vector<std::string> inputs = {a.model, a.rules_file, a.profile};
  CheckOutputPath(a.output, inputs, a.overwrite, "-o");
  if (!a.report.empty()) {
    CheckOutputPath(a.report, inputs, a.overwrite, "--report");
    GAF_CHECK(!fs::exists(a.output) || !fs::exists(a.report) || !fs::equivalent(a.output, a.report),
              "--report {}: is the same file as -o", a.report);
    GAF_CHECK(fs::absolute(a.output).lexically_normal() != fs::absolute(a.report).lexically_normal(),
              "--report {}: is the same file as -o", a.report);
  }
  auto f = MakeFuser(a);
  if (a.safe) {
    SafeFusionOptions so;
    so.min_cosine = a.min_cosine;
    so.max_abs_error = a.max_abs_error;
    so.check_speed = !a.no_speed_gate;
    so.repeats = a.repeats;
    so.min_gain = a.min_gain;
    so.reuse_measurements = !a.remeasure;
    so.threads = a.threads;
    so.half_weights = a.half_weights;
    so.half_weights_check = [threads = a.threads](const Model& fused, std::string* what) {
      return HalfWeightsKeepGreedyTokens(fused, threads, what);
    };
    f->FuseAsConfigured(so);
    if (!a.report.empty()) WriteFileAtomic(a.report, f->GetSafeFusionReport().ToJson() + "\n");
  }
  f->Save(a.output);
  const FuseSummary& s = f->fuse_summary();
  if (a.json && a.safe) {
    fmt::print("{}\n", f->GetSafeFusionReport().ToJson());
    return;
  }
  if (a.safe) fmt::print("{}", f->GetSafeFusionReport().ToText());
  if (a.json) {
    json j{{"model", a.model},
           {"output", a.output},
           {"fused_groups", s.groups},
           {"functions", s.functions},
           {"per_rule", s.per_rule},
           {"nodes_original", s.nodes_original},
           {"nodes_before", s.nodes_before},
           {"nodes_after", s.nodes_after},
           {"checker_passed", s.checker_passed},
           {"checker_message", s.checker_message},
           {"profile", f->profile().name}};
    fmt::print("{}\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
    return;
  }
  if (a.safe && f->GetSafeFusionReport().original_kept) {
    fmt::print("Kept the model as given ({}); wrote it to {}\n", f->GetSafeFusionReport().end_to_end_verdict, a.output);
    return;
  }
  fmt::print("Fused {} group(s) into {} model-local function(s) in domain {}:\n", s.groups, s.functions, kFusedDomain);
  for (const auto& [rule, n] : s.per_rule) fmt::print("  {:<28} {}\n", rule, n);
  fmt::print("Nodes: {} -> {} ({} after canonicalization)\n", s.nodes_original, s.nodes_after, s.nodes_before);
  if (s.checker_passed) fmt::print("ONNX checker: passed\n");
  else fmt::print("ONNX checker: fails, as the input model does: {}\n", s.checker_message);
  fmt::print("Wrote {}\n", a.output);
  // Ungated: nothing above was measured. Calls whose operators the runtime's plan runs as its own
  // (attention with its KV cache, sibling products: runtime/plan_calls.h) are inlined when the
  // model runs here; say which, since their functions then fuse nothing.
  if (!a.safe && s.groups > 0) {
    const Model fused = f->Fuse();
    const std::map<std::string, std::string> planned = CallsThePlanRewrites(fused, /*group_siblings=*/true);
    std::map<std::string, int> per_function;
    std::string why;
    for (const Node& n : fused.graph.nodes) {
      auto it = planned.find(n.outputs.empty() ? n.name : n.outputs[0]);
      if (it == planned.end()) continue;
      per_function[n.op_type]++;
      if (why.find(it->second) == std::string::npos) why += (why.empty() ? "" : "; ") + it->second;
    }
    if (!per_function.empty()) {
      std::string list;
      for (const auto& [fn, n] : per_function) list += fmt::format("{}{} x{}", list.empty() ? "" : ", ", fn, n);
      fmt::print("Run here, these calls run as the runtime's own operators instead of their functions ({}): {}. "
                 "`fuse --safe` rolls them back.\n",
                 list, why);
    }
  }
  if (!a.safe && s.groups > 0)
    fmt::print("Not measured: the groups were fused without the precision and speed gates; the fused model may run "
               "slower than the model as given. `fuse --safe` keeps only what measures faster, and the model as "
               "given when the fused one is not faster end to end.\n");
}

void RunExplain(const FusionArgs& a) {
  auto f = MakeFuser(a);
  f->Fuse();  // plan and rewrite, so the log holds every stage
  const DecisionLog& log = f->decision_log();
  std::vector<DecisionRecord> recs;
  if (!a.node.empty()) recs = log.ForNode(a.node);
  else if (!a.rule.empty()) recs = log.ForRule(a.rule);
  else recs = log.records();
  if (a.json) {
    fmt::print("{}\n", DecisionLog::ToJson(recs));
    return;
  }
  if (recs.empty()) {
    if (!a.node.empty()) fmt::print("No fusion attempt involves node '{}'.\n", a.node);
    else if (!a.rule.empty()) fmt::print("Rule '{}' made no attempt (no match, or not among the {} rules loaded).\n", a.rule, f->rules().size());
    else fmt::print("The decision log is empty.\n");
    return;
  }
  for (const DecisionRecord& r : recs) fmt::print("{}", DecisionLog::Format(r));
}

}  // namespace

std::map<std::string, int64_t> ParseDimBindings(const std::vector<std::string>& dims) {
  std::map<std::string, int64_t> out;
  for (const std::string& d : dims) {
    const size_t eq = d.find('=');
    GAF_CHECK(eq != std::string::npos && eq > 0, "--dim '{}' is not NAME=VALUE", d);
    try {
      out[d.substr(0, eq)] = std::stoll(d.substr(eq + 1));
    } catch (const std::exception&) {
      throw Error(fmt::format("--dim '{}': '{}' is not an integer", d, d.substr(eq + 1)));
    }
  }
  return out;
}

void AddFusionCommands(CLI::App& app) {
  {
    auto a = std::make_shared<FusionArgs>();
    auto* cmd = app.add_subcommand("analyze", "Per-candidate fusion benefit: traffic, GFLOPS, local-memory fit, verdict");
    AddCommonOptions(cmd, a.get());
    cmd->callback([a] { RunAnalyze(*a); });
  }
  {
    auto a = std::make_shared<FusionArgs>();
    auto* cmd = app.add_subcommand("estimate", "Whole-model predicted improvement without fusing");
    AddCommonOptions(cmd, a.get());
    cmd->callback([a] { RunEstimate(*a); });
  }
  {
    auto a = std::make_shared<FusionArgs>();
    auto* cmd = app.add_subcommand("fuse", "Fuse and write the fused model (standard ONNX with model-local functions)");
    AddCommonOptions(cmd, a.get());
    cmd->add_option("-o,--output", a->output, "output .onnx file")->required();
    cmd->add_flag("--overwrite", a->overwrite, "allow -o (or --report) to replace one of the input files");
    cmd->add_flag("--safe", a->safe, "safe fusion: per-group precision and speed gates, failures rolled back");
    cmd->add_option("--min-cosine", a->min_cosine, "safe: minimum cosine similarity per group (default 0.999)");
    cmd->add_option("--max-abs-error", a->max_abs_error, "safe: maximum absolute error per group (default 1e-3)");
    cmd->add_flag("--no-speed-gate", a->no_speed_gate, "safe: keep groups whose kernel is not measurably faster");
    cmd->add_flag("--remeasure", a->remeasure,
                  "safe: measure speed again instead of reusing verdicts measured before on this machine for the "
                  "same kernels and inputs (and replace them)");
    cmd->add_option("--min-gain", a->min_gain,
                    "safe: a kept group must also be this much faster, median ratio - 1 (default 0.05)");
    cmd->add_option("--repeats", a->repeats,
                    "safe: interleaved timed pairs of the speed gate (sign test at 1%; default 15, at least 7)");
    cmd->add_option("--threads", a->threads, "safe: threads for the gates (default: all cores)");
    cmd->add_option("--report", a->report, "safe: also write the safe-fusion report as JSON to this file");
    cmd->add_flag("--half-weights", a->half_weights,
                  "safe: also gate float16 storage of constant MatMul weights end to end; when it passes, the model "
                  "records it (metadata) and generate and run use float16 weights for every product");
    cmd->callback([a] { RunFuse(*a); });
  }
  {
    auto a = std::make_shared<FusionArgs>();
    auto* cmd = app.add_subcommand("explain", "The decision log: every fusion attempt with its reason and estimates");
    AddCommonOptions(cmd, a.get());
    cmd->add_option("--node", a->node, "only attempts involving this node (original name)");
    cmd->add_option("--rule", a->rule, "only attempts of this rule");
    cmd->callback([a] { RunExplain(*a); });
  }
}

}  // namespace gaf::cli
