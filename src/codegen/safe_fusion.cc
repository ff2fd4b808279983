// GraphAutoFusion::FuseSafe and CompileFusedOperators (declared in fusion/auto_fusion.h; they
// need the code generator, so they live in this library).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "codegen/fused_kernels.h"
#include "codegen/fused_session.h"
#include "codegen/verify.h"
#include "cost/cost_model.h"
#include "fusion/auto_fusion.h"
#include "runtime/session.h"

namespace gaf {

namespace {

double Micros(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Model GraphAutoFusion::FuseSafe(const SafeFusionOptions& safe) {
  GAF_CHECK(!safe.check_speed || SignTestWins(safe.repeats, 0.01) <= safe.repeats,
            "safe fusion: {} repeats are too few for the speed gate (a sign test at 1% needs at least 7 pairs); "
            "use more repeats or turn the speed gate off", safe.repeats);
  safe_report_ = SafeFusionReport();
  SafeFusionReport& rep = safe_report_;
  Model fused = Fuse();
  const int threads = safe.threads;

  // One run of the fused model (reference path) on random inputs, keeping the actual inputs of
  // every fused call: the gates test each kernel on the values it meets in the model.
  std::set<std::string> wanted;
  for (const Node& n : fused.graph.nodes)
    if (n.domain == kFusedDomain)
      for (const auto& in : n.inputs)
        if (!in.empty() && fused.graph.FindInitializer(in) == nullptr) wanted.insert(in);
  std::map<std::string, Tensor> values;
  std::map<std::string, ValueType> shapes;
  std::map<std::string, Tensor> feeds = RandomFeeds(fused, options_.dims, safe.seed);
  {
    SessionOptions so;
    so.num_threads = threads;
    so.observer = [&](const std::string& name, const Tensor& t) {
      shapes[name] = ValueType{t.dtype(), t.shape()};
      if (wanted.count(name)) values[name] = t;
    };
    try {
      Session s(fused, so);
      s.Run(feeds);
    } catch (const Error& e) {
      throw Error(fmt::format("safe fusion tests each fused kernel on the values of one run of the model on random "
                              "inputs, and that run failed: {} (bind symbolic dims with --dim NAME=N, or fuse without --safe)",
                              e.what()));
    }
    for (const auto& [name, t] : feeds) {
      shapes[name] = ValueType{t.dtype(), t.shape()};
      if (wanted.count(name)) values[name] = t;
    }
  }
  KernelCompiler compiler(safe.kernel_cache);
  std::shared_ptr<FusedKernelSet> kernels = FusedKernelSet::Build(fused, shapes, compiler, kFusedDomain);
  if (kernels->library()) rep.kernel_library = kernels->library()->directory();

  std::map<std::string, int> candidate_of_node(fused_nodes_.begin(), fused_nodes_.end());
  std::map<int, const FusionCandidate*> cand;
  for (const FusionCandidate& c : candidates_) cand[c.id] = &c;
  std::map<std::string, size_t> measured;  // function + input shapes -> index in rep.kernels
  std::map<int, std::pair<Verdict, std::string>> rollbacks;
  const int64_t opset = fused.OpsetVersion("");

  for (const Node& call : fused.graph.nodes) {
    if (call.domain != kFusedDomain) continue;
    SafeKernelResult r;
    r.node = call.name;
    r.function = call.op_type;
    r.candidate = candidate_of_node.count(call.name) ? candidate_of_node[call.name] : -1;
    if (cand.count(r.candidate)) {
      const FusionCandidate& c = *cand[r.candidate];
      r.rule = c.rule;
      r.original_nodes = c.node_names;
      r.predicted_unfused_us = c.cost.time_before_us;
      r.predicted_fused_us = c.cost.time_after_us;
    }
    const FusedKernelSet::Entry* e = kernels->EntryForNode(call.name);
    const Function* f = fused.FindFunction(call.domain, call.op_type);
    std::vector<const Tensor*> ins;
    // Call sites with the same generated code, shapes and constants are measured once.
    std::string key = call.op_type;
    if (e != nullptr)
      for (const auto& st : e->kernel.stages) key += "|" + (st.library ? st.node.op_type : st.row.symbol);
    for (const auto& in : call.inputs) {
      const Tensor* t = in.empty() ? nullptr : fused.graph.FindInitializer(in);
      const bool constant = t != nullptr;
      if (t == nullptr && values.count(in)) t = &values[in];
      ins.push_back(t);
      key += "|" + (t ? ShapeToString(t->shape()) : std::string("-"));
      if (constant && (e == nullptr || !e->kernel.owned_constants.empty())) key += "=" + in;
    }
    // Half-precision values are widened as the fused kernel's entry does; the reference stages get
    // the values as they are (each operator widens and narrows like the session, so the reference
    // keeps the graph's float16 roundings).
    const std::vector<const Tensor*> as_given = ins;
    std::vector<Tensor> widened;
    widened.reserve(ins.size());
    for (const Tensor*& t : ins)
      if (t != nullptr && (t->dtype() == DataType::kFloat16 || t->dtype() == DataType::kBFloat16)) {
        widened.push_back(t->CastTo(DataType::kFloat));
        t = &widened.back();
      }
    auto same = measured.find(key);
    if (same != measured.end()) {
      const SafeKernelResult& m = rep.kernels[same->second];
      std::string keep_node = r.node;
      auto keep = std::make_tuple(r.candidate, r.rule, r.original_nodes, r.predicted_unfused_us, r.predicted_fused_us);
      r = m;
      r.node = keep_node;
      std::tie(r.candidate, r.rule, r.original_nodes, r.predicted_unfused_us, r.predicted_fused_us) = keep;
      r.same_as = m.node;
    } else {
      if (e == nullptr || f == nullptr || !e->bound) {
        r.reason_kind = "compile";
        r.reason = e == nullptr ? "no kernel entry" : "no generated kernel: " + e->status;
      } else if (std::find(ins.begin(), ins.end(), nullptr) != ins.end()) {
        r.reason_kind = "compile";
        r.reason = "an input of the group was not produced by the test run";
      } else {
        r.kernel = e->kernel.Describe();
        StagedKernel reference = ReferenceStagedKernel(*f, opset);
        try {
          std::vector<Tensor> want = RunStagedKernel(reference, as_given, threads);
          std::vector<Tensor> got = RunStagedKernel(e->kernel, ins, threads);
          r.cosine = 1;
          for (size_t o = 0; o < want.size(); ++o) {
            double cs = 0, err = 0;
            if (want[o].shape() != got[o].shape()) {
              cs = -1;
              err = INFINITY;
            } else {
              CompareTensors(want[o], got[o], &cs, &err);
            }
            r.cosine = std::min(r.cosine, cs);
            r.max_abs_error = std::max(r.max_abs_error, err);
          }
          if (safe.check_speed) {
            std::vector<double> tu, tf;
            for (int i = 0; i < safe.repeats + 1; ++i) {  // first pair is a warm-up
              auto t0 = std::chrono::steady_clock::now();
              RunStagedKernel(reference, as_given, threads);
              double u = Micros(t0);
              t0 = std::chrono::steady_clock::now();
              RunStagedKernel(e->kernel, ins, threads);
              double fu = Micros(t0);
              if (i > 0) {
                tu.push_back(u);
                tf.push_back(fu);
              }
            }
            r.measured_unfused_us = Median(tu);
            r.measured_fused_us = Median(tf);
            // The spread of each side (reported): the larger relative inter-quartile range.
            r.noise = std::min(0.5, std::max(RelativeIqr(tu), RelativeIqr(tf)));
            // The decision is paired: each repeat runs both sides back to back, so load from other
            // processes hits both alike; the kernel must win in enough pairs that chance (a fair
            // coin per pair) would give that many wins with probability <= 1% (one-sided sign test).
            r.pairs = static_cast<int>(tu.size());
            r.pairs_won = 0;
            for (size_t i = 0; i < tu.size(); ++i) r.pairs_won += tf[i] < tu[i];
            r.pairs_needed = SignTestWins(r.pairs, 0.01);
          }
          if (!(r.cosine >= safe.min_cosine) || !(r.max_abs_error <= safe.max_abs_error)) {
            r.reason_kind = "precision";
            r.reason = fmt::format("precision: cosine {:.6f} (gate >= {}), max abs error {:.3g} (gate <= {:.3g})", r.cosine,
                                   safe.min_cosine, r.max_abs_error, safe.max_abs_error);
          } else if (safe.check_speed && r.pairs_won < r.pairs_needed) {
            r.reason_kind = "speed";
            r.reason = fmt::format("speed: fused kernel faster in {} of {} interleaved pairs, {} needed (sign test, "
                                   "p <= 1%); medians {:.2f} us fused, {:.2f} us unfused",
                                   r.pairs_won, r.pairs, r.pairs_needed, r.measured_fused_us, r.measured_unfused_us);
          }
        } catch (const Error& ex) {
          r.reason_kind = "compile";
          r.reason = std::string("the kernel does not run on the group's inputs: ") + ex.what();
        }
      }
      measured[key] = rep.kernels.size();
    }
    r.fused = r.reason_kind.empty();
    if (!r.fused && r.candidate >= 0) {
      Verdict v = r.reason_kind == "precision" ? Verdict::kSkipPrecision
                  : r.reason_kind == "speed"   ? Verdict::kSkipSpeed
                                               : Verdict::kSkipCompile;
      rollbacks[r.candidate] = {v, r.reason};
    }
    rep.kernels.push_back(std::move(r));
  }
  if (!rollbacks.empty()) fused = RollBack(rollbacks);

  rep.candidates = static_cast<int>(candidates_.size());
  for (const FusionCandidate& c : candidates_) {
    if (c.verdict == Verdict::kFuse) ++rep.fused;
    else rep.skipped_by_reason[VerdictName(c.verdict)]++;
  }
  FusionEstimate est = EstimateFusionBenefit();
  rep.predicted_speedup = est.predicted_speedup;

  // End to end: the original (canonicalized) model against the final fused model with its kernels.
  VerifyOptions vo;
  vo.dims = options_.dims;
  vo.seed = safe.seed;
  vo.threads = threads;
  vo.repeats = safe.repeats;
  vo.kernel_cache = safe.kernel_cache;
  PrecisionReport pr = VerifyPrecision(fused, model_, vo);
  for (const auto& o : pr.outputs) {
    rep.outputs.push_back(o.name);
    rep.output_cosine.push_back(o.cosine);
    rep.output_max_abs_error.push_back(o.max_abs_error);
  }
  PerformanceReport perf = VerifyPerformance(fused, vo);
  rep.time_original_ms = perf.baseline_ms;
  rep.time_fused_ms = perf.fused_ms;
  rep.measured_speedup = perf.speedup;

  // float16 weight storage, gated end to end on the same inputs. Every product with a constant
  // weight runs on the float16 copy here (HalfWeights::kAll), although at run time only products
  // of at most 4 rows do: the figure bounds the error of any call, decode or prefill. Its speed
  // is a decode-time effect, measured by `bench --half-weights` and `generate`.
  auto& meta = fused.metadata_props;
  meta.erase(std::remove_if(meta.begin(), meta.end(), [](const auto& kv) { return kv.first == kHalfWeightsMetadataKey; }),
             meta.end());
  if (safe.half_weights) {
    VerifyOptions hv = vo;
    hv.half_weights = HalfWeights::kAll;
    PrecisionReport hp = VerifyPrecision(fused, model_, hv);
    rep.half_weights_tried = true;
    rep.half_weights_cosine = hp.min_cosine;
    rep.half_weights_max_abs_error = hp.max_abs_error;
    if (hp.Passes(safe.min_cosine, safe.max_abs_error)) {
      rep.half_weights_kept = true;
      meta.emplace_back(kHalfWeightsMetadataKey,
                        fmt::format("matmul weights stored as float16 at run time; gate passed with every product on "
                                    "float16 weights: min cosine {:.7f}, max abs error {:.3g}",
                                    hp.min_cosine, hp.max_abs_error));
    } else {
      rep.half_weights_reason = fmt::format("precision: min cosine {:.7f} (gate >= {}), max abs error {:.3g} (gate <= {})",
                                            hp.min_cosine, safe.min_cosine, hp.max_abs_error, safe.max_abs_error);
    }
  }
  fused_.metadata_props = fused.metadata_props;  // what Save() writes
  return fused;
}

std::string SafeFusionReport::ToText() const {
  std::string s = fmt::format("Safe fusion: {} candidates, {} fused", candidates, fused);
  for (const auto& [k, n] : skipped_by_reason) s += fmt::format(", {} {}", n, k);
  s += "\n";
  s += fmt::format("  {:<48} {:<9} {:>9} {:>10} {:>10} {:>10} {:>10}  {}\n", "fused node (rule)", "verdict", "cosine",
                   "max|err|", "pred gain", "unfused", "fused", "reason / kernel");
  for (const auto& k : kernels) {
    std::string name = fmt::format("{} ({})", k.node, k.rule);
    if (name.size() > 48) name = "..." + name.substr(name.size() - 45);
    double pred = k.predicted_unfused_us > 0 ? k.predicted_unfused_us / std::max(k.predicted_fused_us, 1e-9) : 0;
    const bool measured = k.reason_kind != "compile";  // no kernel ran: nothing measured
    s += fmt::format("  {:<48} {:<9} {:>9} {:>10} {:>9.2f}x {:>10} {:>10}  {}\n", name, k.fused ? "fused" : "ROLLBACK",
                     measured ? fmt::format("{:.6f}", k.cosine) : "-",
                     measured ? fmt::format("{:.3g}", k.max_abs_error) : "-", pred,
                     measured && k.measured_unfused_us > 0 ? fmt::format("{:.2f}us", k.measured_unfused_us) : "-",
                     measured && k.measured_fused_us > 0 ? fmt::format("{:.2f}us", k.measured_fused_us) : "-",
                     k.fused ? (k.same_as.empty() ? k.kernel : "as " + k.same_as) : k.reason);
  }
  s += "  (pred gain: cost model time before/after, docs/cost_model.md; unfused/fused: measured medians on the group's "
       "real inputs)\n";
  s += "End to end (original vs fused with generated kernels, same random inputs):\n";
  for (size_t i = 0; i < outputs.size(); ++i)
    s += fmt::format("  {:<32} cosine {:.7f}  max abs error {:.3g}\n", outputs[i], output_cosine[i],
                     output_max_abs_error[i]);
  s += fmt::format("  time: original {:.3f} ms, fused {:.3f} ms -> measured {:.2f}x (predicted {:.2f}x)\n",
                   time_original_ms, time_fused_ms, measured_speedup, predicted_speedup);
  if (!kernel_library.empty()) s += "  kernels: " + kernel_library + "\n";
  if (half_weights_tried)
    s += half_weights_kept
             ? fmt::format("float16 weight storage: kept (every product on float16 weights: min cosine {:.7f}, max abs "
                           "error {:.3g}); recorded in the model's metadata, `generate` uses it for decode\n",
                           half_weights_cosine, half_weights_max_abs_error)
             : fmt::format("float16 weight storage: ROLLBACK ({})\n", half_weights_reason);
  return s;
}

std::string SafeFusionReport::ToJson() const {
  nlohmann::json j;
  j["candidates"] = candidates;
  j["fused"] = fused;
  j["skipped_by_reason"] = skipped_by_reason;
  j["kernels"] = nlohmann::json::array();
  for (const auto& k : kernels)
    j["kernels"].push_back({{"node", k.node},
                            {"function", k.function},
                            {"rule", k.rule},
                            {"candidate", k.candidate},
                            {"original_nodes", k.original_nodes},
                            {"fused", k.fused},
                            {"reason_kind", k.reason_kind},
                            {"reason", k.reason},
                            {"kernel", k.kernel},
                            {"cosine", k.cosine},
                            {"max_abs_error", std::isfinite(k.max_abs_error) ? k.max_abs_error : -1.0},
                            {"predicted_unfused_us", k.predicted_unfused_us},
                            {"predicted_fused_us", k.predicted_fused_us},
                            {"measured_unfused_us", k.measured_unfused_us},
                            {"measured_fused_us", k.measured_fused_us},
                            {"noise", k.noise},
                            {"pairs", k.pairs},
                            {"pairs_won", k.pairs_won},
                            {"pairs_needed", k.pairs_needed},
                            {"same_as", k.same_as}});
  nlohmann::json e = nlohmann::json::array();
  for (size_t i = 0; i < outputs.size(); ++i)
    e.push_back({{"output", outputs[i]},
                 {"cosine", output_cosine[i]},
                 {"max_abs_error", std::isfinite(output_max_abs_error[i]) ? output_max_abs_error[i] : -1.0}});
  j["end_to_end"] = {{"outputs", e},
                     {"time_original_ms", time_original_ms},
                     {"time_fused_ms", time_fused_ms},
                     {"measured_speedup", measured_speedup},
                     {"predicted_speedup", predicted_speedup},
                     {"time_source", "measured: medians of interleaved runs"},
                     {"predicted_source", "cost model (docs/cost_model.md)"}};
  j["kernel_library"] = kernel_library;
  if (half_weights_tried)
    j["half_weights"] = {{"kept", half_weights_kept},
                         {"min_cosine", half_weights_cosine},
                         {"max_abs_error", std::isfinite(half_weights_max_abs_error) ? half_weights_max_abs_error : -1.0},
                         {"reason", half_weights_reason},
                         {"source", "measured: original vs fused with every constant-weight product on float16 weights"}};
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string GraphAutoFusion::CompileFusedOperators(const std::string& dir) {
  Model fused = Fuse();
  std::map<std::string, ValueType> shapes;
  for (const auto& [name, vs] : RecordShapes(fused, options_.dims))
    if (vs.known) shapes[name] = ValueType{vs.dtype, vs.shape};
  KernelCompiler compiler(dir);
  auto set = FusedKernelSet::Build(fused, shapes, compiler, kFusedDomain);
  std::string s = fmt::format("kernel library: {} ({})\n",
                              set->library() && !set->library()->directory().empty() ? set->library()->directory() : "none",
                              set->library() && set->library()->from_cache() ? "cached, nothing compiled"
                              : set->library() ? fmt::format("compiled in {:.2f} s", set->library()->compile_seconds())
                                               : "");
  s += DescribeFusedKernels(*set);
  return s;
}

}  // namespace gaf
