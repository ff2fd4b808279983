// SafeGraphAutoFusion: safe fusion (per-group gates, end-to-end gate, rollback) and kernel
// compilation on top of GraphAutoFusion.
#include "codegen/safe_fusion.h"

#include <filesystem>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <optional>

#include <omp.h>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "codegen/fused_kernels.h"
#include "codegen/gate_cache.h"
#include "codegen/fused_session.h"
#include "codegen/verify.h"
#include "cost/cost_model.h"
#include "runtime/plan_calls.h"
#include "runtime/session.h"

namespace gaf {

namespace {

double Micros(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

// The values one run of the workload gave the fused calls' inputs, per sample.
struct RecordedRuns {
  std::vector<CallShapes> shapes;                          // per sample, every value
  std::vector<std::map<std::string, Tensor>> call_inputs;  // per sample, the fused calls' inputs
};

RecordedRuns RecordRuns(const Model& fused, const Workload& w, int threads) {
  std::set<std::string> wanted;
  for (const Node& n : fused.graph.nodes)
    if (n.domain == kFusedDomain)
      for (const auto& in : n.inputs)
        if (!in.empty() && fused.graph.FindInitializer(in) == nullptr) wanted.insert(in);
  RecordedRuns r;
  SessionOptions so;
  so.num_threads = threads;
  std::map<std::string, Tensor>* values = nullptr;
  CallShapes* shapes = nullptr;
  auto note = [&](const std::string& name, const Tensor& t) {
    ValueType v{t.dtype(), t.shape(), nullptr};
    if ((t.dtype() == DataType::kInt64 || t.dtype() == DataType::kInt32) && t.numel() <= kMaxShapeDataElements)
      v.value = std::make_shared<const Tensor>(t);
    (*shapes)[name] = std::move(v);
    if (wanted.count(name)) (*values)[name] = t;
  };
  so.observer = note;
  Session s(fused, so);
  for (size_t k = 0; k < w.samples.size(); ++k) {
    r.shapes.emplace_back();
    r.call_inputs.emplace_back();
    shapes = &r.shapes.back();
    values = &r.call_inputs.back();
    for (const auto& [name, t] : w.samples[k]) note(name, t);
    try {
      s.Run(w.samples[k]);
    } catch (const Error& e) {
      throw Error(fmt::format("safe fusion tests each fused kernel on the values the model computes on its workload ({}), "
                              "and run {} of {} failed: {} (give sample inputs with -i, bind symbolic dims with "
                              "--dim NAME=N, or fuse without --safe)",
                              w.source.empty() ? "random inputs" : w.source, k + 1, w.samples.size(), e.what()));
    }
  }
  return r;
}

// A sign-test decision on paired timings: faster (wins >= needed), slower (losses >= needed), or
// undecided.
enum class PairVerdict { kFaster, kSlower, kUndecided };
PairVerdict Decide(int wins, int pairs, int* needed) {
  *needed = SignTestWins(pairs, 0.01);
  if (wins >= *needed) return PairVerdict::kFaster;
  if (pairs - wins >= *needed) return PairVerdict::kSlower;
  return PairVerdict::kUndecided;
}

// One group's inputs in every sample: as given (the reference stages keep float16 roundings) and
// widened (what the kernel stages take), and which variant serves each sample.
struct GroupInputs {
  std::vector<std::vector<const Tensor*>> given, widened;
  std::vector<const Tensor*> constants;  // per input: the initializer bound to it, else null
  std::deque<Tensor> storage;
};

// Precision and speed gates of one fused group on its inputs in every sample (fills r).
// Everything a speed measurement of a group depends on, for the gate cache.
std::string GateKey(const FusedKernelSet::Entry& e, const Function& f, const GroupInputs& in,
                    const SafeFusionOptions& safe) {
  const int threads = safe.threads > 0 ? safe.threads : omp_get_max_threads();
  // The gaf build (reference and library kernels) and the compiler's flags are part of the key.
  std::string k = fmt::format("gate-v2|{}|{}|build {} {}|threads {}|repeats {}|min_gain {}\n", KernelCompiler::TargetName(),
                              KernelCompiler::CompilerFlags(), __DATE__, __TIME__, threads, safe.repeats, safe.min_gain);
  k += "constants";
  for (const Tensor* c : in.constants) k += c ? " c" : " -";
  k += "\n";
  for (const auto& v : e.Bound()) {
    k += "variant\n";
    for (const auto& st : v->kernel.stages)
      k += st.library ? "library " + st.node.op_type + "\n" : fmt::format("row {:016x}\n", StableHash(st.row.source));
    for (const auto& n : v->kernel.notes) k += "note " + n + "\n";
  }
  for (const Node& n : f.nodes) {
    k += n.domain + "." + n.op_type;
    for (const Attribute& a : n.attributes) {
      k += fmt::format(" {}={}:{}:{}", a.name, a.i, a.f, a.s);
      for (int64_t x : a.ints) k += fmt::format(",{}", x);
      for (float x : a.floats) k += fmt::format(",{}", x);
    }
    k += "\n";
  }
  for (const auto& ins : in.given) {
    k += "run";
    for (const Tensor* t : ins) k += t ? fmt::format(" {}{}", static_cast<int>(t->dtype()), ShapeToString(t->shape())) : " -";
    k += "\n";
  }
  return k;
}

void GateGroup(const FusedKernelSet::Entry& e, const Function& f, int64_t opset, const GroupInputs& in,
               const SafeFusionOptions& safe, const GateCache& cache, SafeKernelResult& r) {
  r.kernel = e.kernel.Describe();
  r.samples = static_cast<int>(in.given.size());
  const int threads = safe.threads;
  // The baseline is what the session runs for these nodes in the model as given (prepared convs).
  StagedKernel reference = ReferenceStagedKernel(f, opset, in.constants);
  std::vector<std::shared_ptr<const KernelVariant>> variants;
  std::vector<size_t> used(in.given.size(), 0);
  r.cosine = 1;
  for (size_t s = 0; s < in.given.size(); ++s) {
    std::vector<Tensor> want = RunStagedKernel(reference, in.given[s], threads), got;
    std::string why;
    if (!e.Run(in.given[s], threads, /*generate=*/false, &got, &why, &used[s])) {
      r.reason_kind = "compile";
      r.reason = fmt::format("no variant of the kernel runs sample {} of {}: {}", s + 1, in.given.size(), why);
      return;
    }
    for (size_t o = 0; o < want.size(); ++o) {
      double cs = -1, err = INFINITY;
      if (o < got.size() && want[o].shape() == got[o].shape()) CompareTensors(want[o], got[o], &cs, &err);
      r.cosine = std::min(r.cosine, cs);
      r.max_abs_error = std::max(r.max_abs_error, err);
    }
  }
  variants = e.Bound();
  if (!(r.cosine >= safe.min_cosine) || !(r.max_abs_error <= safe.max_abs_error)) {
    r.reason_kind = "precision";
    r.reason = fmt::format("precision: cosine {:.6f} (gate >= {}), max abs error {:.3g} (gate <= {:.3g})", r.cosine,
                           safe.min_cosine, r.max_abs_error, safe.max_abs_error);
    return;
  }
  if (!safe.check_speed) return;
  // A verdict measured before on exactly this kernel, these operators and these inputs on this
  // machine is reused (a test hook's deliberate slowness is never cached, nor reused).
  const std::string key = safe.kernel_hook ? std::string() : GateKey(e, f, in, safe);
  if (!key.empty())
    if (std::optional<nlohmann::json> c = cache.Get(key)) {
      try {
        r.pairs = c->at("pairs").get<int>();
        r.pairs_won = c->at("pairs_won").get<int>();
        r.pairs_needed = c->at("pairs_needed").get<int>();
        r.measured_unfused_us = c->at("measured_unfused_us").get<double>();
        r.measured_fused_us = c->at("measured_fused_us").get<double>();
        r.noise = c->at("noise").get<double>();
        r.reason_kind = c->at("reason_kind").get<std::string>();
        r.reason = c->at("reason").get<std::string>();
        r.speed_measured_at = c->at("measured_at").get<std::string>();
        return;
      } catch (const std::exception&) {
        r.speed_measured_at.clear();  // a malformed entry: measure
        r.reason_kind.clear();
        r.reason.clear();
      }
    }
  // One repeat: every sample through the reference, then through the kernel (the variant that
  // serves it), back to back; the first pair is a warm-up.
  std::vector<double> tu, tf;
  auto pairs = [&](int n) {
    for (int i = 0; i < n; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      for (const auto& ins : in.given) RunStagedKernel(reference, ins, threads);
      const double u = Micros(t0);
      t0 = std::chrono::steady_clock::now();
      for (size_t s = 0; s < in.widened.size(); ++s) {
        if (safe.kernel_hook) safe.kernel_hook(e.function, false);
        RunStagedKernel(variants[used[s]]->kernel, in.widened[s], threads);
      }
      tu.push_back(u);
      tf.push_back(Micros(t0));
    }
  };
  pairs(1);
  tu.clear();
  tf.clear();
  pairs(safe.repeats);
  auto wins = [&] {
    int w = 0;
    for (size_t i = 0; i < tu.size(); ++i) w += tf[i] < tu[i];
    return w;
  };
  PairVerdict v = Decide(wins(), static_cast<int>(tu.size()), &r.pairs_needed);
  if (v == PairVerdict::kUndecided) {  // measure again, longer, before deciding
    pairs(2 * safe.repeats);
    v = Decide(wins(), static_cast<int>(tu.size()), &r.pairs_needed);
  }
  r.pairs = static_cast<int>(tu.size());
  r.pairs_won = wins();
  r.measured_unfused_us = Median(tu);
  r.measured_fused_us = Median(tf);
  r.noise = std::min(0.5, std::max(RelativeIqr(tu), RelativeIqr(tf)));
  if (v != PairVerdict::kFaster) {
    r.reason_kind = "speed";
    r.reason = fmt::format("speed: fused kernel faster in {} of {} interleaved pairs, {} needed (sign test, p <= 1%); "
                           "medians {:.2f} us fused, {:.2f} us unfused",
                           r.pairs_won, r.pairs, r.pairs_needed, r.measured_fused_us, r.measured_unfused_us);
  } else {
    // The gain is judged on the fastest run of each side: load from other processes only ever adds
    // time, so the minimum is the steadiest estimate of what the code costs (medians are reported).
    const double best_u = *std::min_element(tu.begin(), tu.end()), best_f = *std::min_element(tf.begin(), tf.end());
    if (best_u < (1 + safe.min_gain) * best_f) {
      r.reason_kind = "speed";
      r.reason = fmt::format("speed: fused kernel {:.1f}% faster (fastest runs {:.2f} us fused, {:.2f} us unfused; won "
                             "{} of {} pairs), below the {:.0f}% a group must gain to be kept reliably",
                             100 * (best_u / std::max(best_f, 1e-9) - 1), best_f, best_u, r.pairs_won, r.pairs,
                             100 * safe.min_gain);
    }
  }
  // Stored only here, after a complete measurement (a measurement that threw stores nothing).
  if (!key.empty())
    cache.Put(key, {{"pairs", r.pairs}, {"pairs_won", r.pairs_won}, {"pairs_needed", r.pairs_needed},
                    {"measured_unfused_us", r.measured_unfused_us}, {"measured_fused_us", r.measured_fused_us},
                    {"noise", r.noise}, {"reason_kind", r.reason_kind}, {"reason", r.reason}});
}

// The key under which identical groups (same function, variants, shapes in every sample and, for
// kernels that fold constants into their own, the constants) are measured once.
std::string GroupKey(const Node& call, const FusedKernelSet::Entry* e, const Model& fused,
                     const std::vector<std::map<std::string, Tensor>>& call_inputs) {
  std::string key = call.op_type;
  if (e != nullptr)
    for (const auto& v : e->Bound())
      for (const auto& st : v->kernel.stages) key += "|" + (st.library ? st.node.op_type : st.row.symbol);
  for (const auto& in : call.inputs) {
    const bool constant = !in.empty() && fused.graph.FindInitializer(in) != nullptr;
    if (constant) {
      const Tensor* c = fused.graph.FindInitializer(in);
      key += fmt::format("|c{}{}", static_cast<int>(c->dtype()), ShapeToString(c->shape()));
      if (e == nullptr || !e->kernel.owned_constants.empty()) key += "=" + in;
      continue;
    }
    for (const auto& values : call_inputs) {
      auto it = values.find(in);
      key += "|" + (it != values.end() ? ShapeToString(it->second.shape()) : std::string("-"));
    }
  }
  return key;
}

// The end-to-end gate: the fused model (with its kernels, in the session `run` and `generate`
// use) against the model as given, on the workload, interleaved pairs and a sign test. Not faster:
// roll back the kept groups that gained least (measured per group: unfused minus fused time over
// the workload), half of them at a time, and measure again; when nothing fused is faster, the
// model as given is the result. Also rolls back groups whose kernel never ran end to end.
// Everything an end-to-end measurement depends on: the machine, the settings, the fused model's
// main graph (which groups are fused, how they are wired) and functions, and the workload's shapes.
std::string EndToEndKey(const Model& fused, const VerifyOptions& vo, const SafeFusionOptions& safe) {
  const int threads = safe.threads > 0 ? safe.threads : omp_get_max_threads();
  std::string k = fmt::format("e2e-v2|{}|{}|build {} {}|threads {}|repeats {}|plan {}\n", KernelCompiler::TargetName(),
                              KernelCompiler::CompilerFlags(), __DATE__, __TIME__, threads, vo.repeats,
                              vo.plan_rewrites ? 1 : 0);
  auto node_line = [&k](const Node& n) {
    k += n.domain + "." + n.op_type + "(";
    for (const auto& in : n.inputs) k += in + ",";
    k += ")->";
    for (const auto& o : n.outputs) k += o + ",";
    k += "\n";
  };
  k += "baseline\n";
  if (vo.original != nullptr)
    for (const Node& n : vo.original->graph.nodes) node_line(n);
  k += "fused\n";
  for (const Node& n : fused.graph.nodes) node_line(n);
  for (const Function& f : fused.functions) {
    k += "function " + f.domain + "." + f.name + "\n";
    for (const Node& n : f.nodes) node_line(n);
  }
  for (const auto& [name, t] : fused.graph.initializers)
    k += fmt::format("init {} {}{}\n", name, static_cast<int>(t.dtype()), ShapeToString(t.shape()));
  for (const Feeds& sample : vo.workload.samples) {
    k += "run";
    for (const auto& [name, t] : sample) k += fmt::format(" {}={}{}", name, static_cast<int>(t.dtype()), ShapeToString(t.shape()));
    k += "\n";
  }
  return k;
}

}  // namespace

Model SafeGraphAutoFusion::GateEndToEnd(Model fused, const SafeFusionOptions& safe, const VerifyOptions& vo,
                                        std::map<int, std::pair<Verdict, std::string>>& rollbacks) {
  const GateCache gates(KernelCompiler(safe.kernel_cache).cache_root(), safe.reuse_measurements);
  SafeFusionReport& rep = safe_report_;
  const Model& original = original_;
  VerifyOptions po = vo;
  po.original = &original;
  auto kept = [&] {
    std::vector<SafeKernelResult*> k;
    for (SafeKernelResult& r : rep.kernels)
      if (r.fused && r.candidate >= 0 && !rollbacks.count(r.candidate)) k.push_back(&r);
    return k;
  };
  const bool any_passed = !kept().empty();
  for (int round = 0; round < 4; ++round) {
    std::vector<SafeKernelResult*> groups = kept();
    if (groups.empty()) break;
    // The measurement of exactly this fused model on this workload and machine, when made before.
    const std::string key = safe.kernel_hook || !safe.check_speed ? std::string() : EndToEndKey(fused, po, safe);
    PerformanceReport perf;
    std::set<std::string> idle;
    bool reused = false;
    if (!key.empty())
      if (std::optional<nlohmann::json> c = gates.Get(key)) {
        try {
          perf.baseline_ms = c->at("baseline_ms").get<double>();
          perf.fused_ms = c->at("fused_ms").get<double>();
          perf.speedup = c->at("speedup").get<double>();
          perf.repeats = c->at("pairs").get<int>();
          perf.pairs_won = c->at("pairs_won").get<int>();
          perf.pairs_needed = c->at("pairs_needed").get<int>();
          for (const auto& f : c->at("idle")) idle.insert(f.get<std::string>());
          rep.end_to_end_reused = c->at("measured_at").get<std::string>();
          reused = true;
        } catch (const std::exception&) {
          idle.clear();
        }
      }
    if (!reused) {
      rep.end_to_end_reused.clear();
      perf = VerifyPerformance(fused, po);
      int needed = 0;
      if (safe.check_speed && Decide(perf.pairs_won, perf.repeats, &needed) == PairVerdict::kUndecided) {
        VerifyOptions longer = po;  // neither clearly faster nor clearly slower: measure longer
        longer.repeats = 3 * po.repeats;
        perf = VerifyPerformance(fused, longer);
      }
      idle.insert(perf.idle_nodes.begin(), perf.idle_nodes.end());
      if (!key.empty())
        gates.Put(key, {{"baseline_ms", perf.baseline_ms}, {"fused_ms", perf.fused_ms}, {"speedup", perf.speedup},
                        {"pairs", perf.repeats}, {"pairs_won", perf.pairs_won}, {"pairs_needed", perf.pairs_needed},
                        {"idle", idle}});
    }
    ++rep.end_to_end_rounds;
    rep.end_to_end_log.push_back(fmt::format("round {}: {} group(s) kept, original {:.3f} ms, fused {:.3f} ms ({:.2f}x), "
                                             "fused faster in {} of {} pairs ({} needed)",
                                             round + 1, groups.size(), perf.baseline_ms, perf.fused_ms, perf.speedup,
                                             perf.pairs_won, perf.repeats, perf.pairs_needed));
    rep.time_original_ms = perf.baseline_ms;
    rep.time_fused_ms = perf.fused_ms;
    rep.measured_speedup = perf.speedup;
    rep.end_to_end_pairs = perf.repeats;
    rep.end_to_end_pairs_won = perf.pairs_won;
    rep.end_to_end_pairs_needed = perf.pairs_needed;
    // A kept group whose kernel never ran end to end is not fused: roll it back and measure again.
    bool changed = false;
    for (SafeKernelResult* r : groups)
      if (idle.count(r->node)) {
        r->fused = false;
        r->rolled_back_end_to_end = true;
        r->reason_kind = "compile";
        r->reason = "end to end: the kernel never ran (every call ran the body, or the runtime's plan ran its "
                    "operators as its own)";
        rollbacks[r->candidate] = {Verdict::kSkipCompile, r->reason};
        changed = true;
      }
    if (!changed && !safe.check_speed) {
      rep.end_to_end_verdict = "not gated for speed (speed gate off)";
      return fused;
    }
    if (!changed && perf.pairs_won >= perf.pairs_needed) {
      rep.end_to_end_verdict = round == 0 ? "faster" : fmt::format("faster after {} end-to-end round(s) of rollback", round);
      return fused;
    }
    if (!changed) {
      // Roll back the half of the kept groups that gained least (at least one).
      std::sort(groups.begin(), groups.end(), [](const SafeKernelResult* a, const SafeKernelResult* b) {
        return a->measured_unfused_us - a->measured_fused_us < b->measured_unfused_us - b->measured_fused_us;
      });
      const size_t n = std::max<size_t>(1, groups.size() / 2);
      for (size_t i = 0; i < n; ++i) {
        SafeKernelResult* r = groups[i];
        r->fused = false;
        r->rolled_back_end_to_end = true;
        r->reason_kind = "speed";
        r->reason = fmt::format("end to end: the fused model was faster in only {} of {} pairs ({} needed) against the "
                                "model as given; this group gained least ({:.2f} us -> {:.2f} us)",
                                perf.pairs_won, perf.repeats, perf.pairs_needed, r->measured_unfused_us,
                                r->measured_fused_us);
        rollbacks[r->candidate] = {Verdict::kSkipSpeed, r->reason};
      }
    }
    // Identical groups measured once share the verdict.
    for (SafeKernelResult& r : rep.kernels)
      if (r.fused && r.candidate >= 0 && rollbacks.count(r.candidate)) r.fused = false;
    fused = RollBack(rollbacks);
  }
  if (kept().empty() || safe.check_speed) {  // conservative: what was not shown faster is not kept
    rep.original_kept = true;
    rep.end_to_end_verdict =
        !any_passed        ? "original kept: no fused group passed its gates"
        : kept().empty()   ? fmt::format("original kept: the end-to-end gate rolled back every group (faster in {} of {} "
                                         "pairs, {} needed, in its last round)",
                                         rep.end_to_end_pairs_won, rep.end_to_end_pairs, rep.end_to_end_pairs_needed)
                           : fmt::format("original kept: the fused model was not faster than the model as given "
                                         "(faster in {} of {} pairs, {} needed) after {} rounds of rollback",
                                         rep.end_to_end_pairs_won, rep.end_to_end_pairs, rep.end_to_end_pairs_needed,
                                         rep.end_to_end_rounds);
    for (SafeKernelResult& r : rep.kernels)
      if (r.fused) {
        r.fused = false;
        r.rolled_back_end_to_end = true;
        r.reason_kind = "speed";
        r.reason = "end to end: the model as given was kept";
        if (r.candidate >= 0) rollbacks[r.candidate] = {Verdict::kSkipSpeed, r.reason};
      }
    if (!rollbacks.empty()) RollBack(rollbacks);  // candidates' verdicts and the decision log say so too
    return original;
  }
  return fused;
}

Model SafeGraphAutoFusion::FuseSafe(const SafeFusionOptions& safe) {
  GAF_CHECK(!safe.check_speed || SignTestWins(safe.repeats, 0.01) <= safe.repeats,
            "safe fusion: {} repeats are too few for the speed gate (a sign test at 1% needs at least 7 pairs); "
            "use more repeats or turn the speed gate off", safe.repeats);
  safe_report_ = SafeFusionReport();
  SafeFusionReport& rep = safe_report_;
  Model fused = Fuse();
  const int threads = safe.threads;

  // The workload: the user's samples, else one sample of random inputs.
  Workload work = options_.workload;
  if (work.empty()) {
    work.samples.push_back(RandomFeeds(fused, options_.dims, safe.seed));
    work.source = "random inputs";
  }
  rep.workload = work.source;
  rep.samples = static_cast<int>(work.samples.size());
  // Runs of the fused model (reference path) on the workload, keeping the actual inputs of every
  // fused call: the gates test each kernel on the values it meets in the model.
  RecordedRuns runs = RecordRuns(fused, work, threads);
  KernelCompiler compiler(safe.kernel_cache);
  std::shared_ptr<FusedKernelSet> kernels = FusedKernelSet::Build(fused, runs.shapes, compiler, kFusedDomain);
  const GateCache gates(compiler.cache_root(), safe.reuse_measurements);
  if (kernels->library()) rep.kernel_library = kernels->library()->directory();

  // Groups whose operators the runtime's plan runs as its own (attention over a cache read in
  // place, products on packed weights): a kernel for the group would be slower there, so they
  // are not gated but rolled back (runtime/plan_calls.h). Float16 storage, tried below, keeps
  // the plan's sibling products (node_kernels_take_siblings), hence the same calls.
  const std::map<std::string, std::string> by_plan =
      safe.runtime_plan ? CallsThePlanRewrites(fused, /*group_siblings=*/true) : std::map<std::string, std::string>();
  std::map<std::string, int> candidate_of_node(fused_nodes_.begin(), fused_nodes_.end());
  std::map<int, const FusionCandidate*> cand;
  for (const FusionCandidate& c : candidates_) cand[c.id] = &c;
  std::map<std::string, size_t> measured;  // GroupKey -> index in rep.kernels
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
    const std::string key = GroupKey(call, e, fused, runs.call_inputs);
    auto same = measured.find(key);
    auto plan = by_plan.find(call.outputs.empty() ? call.name : call.outputs[0]);
    if (plan != by_plan.end()) {
      r.reason_kind = "runtime";
      r.reason = fmt::format("the runtime runs these operators as its own {}, which a kernel for the group cannot "
                             "match", plan->second);
    } else if (same != measured.end()) {
      const SafeKernelResult& m = rep.kernels[same->second];
      std::string keep_node = r.node;
      auto keep = std::make_tuple(r.candidate, r.rule, r.original_nodes, r.predicted_unfused_us, r.predicted_fused_us);
      r = m;
      r.node = keep_node;
      std::tie(r.candidate, r.rule, r.original_nodes, r.predicted_unfused_us, r.predicted_fused_us) = keep;
      r.same_as = m.node;
    } else {
      GroupInputs gi;
      for (const auto& in : call.inputs) gi.constants.push_back(in.empty() ? nullptr : fused.graph.FindInitializer(in));
      bool complete = true;
      for (const auto& values : runs.call_inputs) {
        std::vector<const Tensor*> ins;
        for (const auto& in : call.inputs) {
          const Tensor* t = in.empty() ? nullptr : fused.graph.FindInitializer(in);
          auto it = values.find(in);
          if (t == nullptr && it != values.end()) t = &it->second;
          complete &= t != nullptr || in.empty();
          ins.push_back(t);
        }
        std::vector<const Tensor*> wide = ins;
        for (const Tensor*& t : wide)
          if (t != nullptr && IsHalf(t->dtype())) {
            gi.storage.push_back(t->CastTo(DataType::kFloat));
            t = &gi.storage.back();
          }
        gi.given.push_back(std::move(ins));
        gi.widened.push_back(std::move(wide));
      }
      if (e == nullptr || f == nullptr || !e->bound) {
        r.reason_kind = "compile";
        r.reason = e == nullptr ? "no kernel entry" : "no generated kernel: " + e->status;
      } else if (!complete) {
        r.reason_kind = "compile";
        r.reason = "an input of the group was not produced by the recording runs";
      } else {
        try {
          GateGroup(*e, *f, opset, gi, safe, gates, r);
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
                  : r.reason_kind == "runtime" ? Verdict::kSkipRuntime
                                               : Verdict::kSkipCompile;
      rollbacks[r.candidate] = {v, r.reason};
    }
    rep.kernels.push_back(std::move(r));
  }
  if (!rollbacks.empty()) fused = RollBack(rollbacks);

  VerifyOptions vo;
  vo.workload = work;
  vo.threads = threads;
  vo.repeats = safe.repeats;
  vo.kernel_cache = safe.kernel_cache;
  vo.plan_rewrites = safe.runtime_plan;
  if (safe.kernel_hook) {
    auto hook = safe.kernel_hook;
    vo.kernel_hook = [hook](const std::string& function) { hook(function, true); };
  }
  fused = GateEndToEnd(std::move(fused), safe, vo, rollbacks);

  rep.candidates = static_cast<int>(candidates_.size());
  for (const FusionCandidate& c : candidates_) {
    if (c.verdict == Verdict::kFuse) ++rep.fused;
    else rep.skipped_by_reason[VerdictName(c.verdict)]++;
  }
  if (rep.original_kept) rep.fused = 0;
  FusionEstimate est = EstimateFusionBenefit();
  rep.predicted_speedup = rep.original_kept ? 1.0 : est.predicted_speedup;

  // End-to-end precision: the model as given against the result.
  PrecisionReport pr = VerifyPrecision(fused, original_, vo);
  for (const auto& o : pr.outputs) {
    rep.outputs.push_back(o.name);
    rep.output_cosine.push_back(o.cosine);
    rep.output_max_abs_error.push_back(o.max_abs_error);
  }

  // float16 weight storage, gated end to end on the same inputs. Every product with a constant
  // weight runs on the float16 copy here (HalfWeights::kAll), as at run time: the figure bounds the
  // error of any call, decode or prefill. Its speed is a decode-time effect, measured by `bench
  // --half-weights` and `generate`.
  auto& meta = fused.metadata_props;
  meta.erase(std::remove_if(meta.begin(), meta.end(), [](const auto& kv) { return kv.first == kHalfWeightsMetadataKey; }),
             meta.end());
  if (safe.half_weights) {
    VerifyOptions hv = vo;
    hv.half_weights = HalfWeights::kAll;
    PrecisionReport hp = VerifyPrecision(fused, original_, hv);
    rep.half_weights_tried = true;
    rep.half_weights_cosine = hp.min_cosine;
    rep.half_weights_max_abs_error = hp.max_abs_error;
    // Per output: the absolute bound, or the relative one on the output's scale, whichever is larger.
    std::string worst;
    double worst_ratio = -1;
    for (const OutputPrecision& o : hp.outputs) {
      const double bound = std::max(safe.max_abs_error, safe.half_weights_rel_error * o.max_abs_reference);
      const double ratio = o.cosine < safe.min_cosine ? INFINITY : o.max_abs_error / bound;
      if (ratio > worst_ratio) {
        worst_ratio = ratio;
        rep.half_weights_error_bound = bound;
        worst = fmt::format("output '{}': cosine {:.7f} (gate >= {}), max abs error {:.3g} (gate <= {:.3g}: the larger of "
                            "{} and {:.3g} x its largest magnitude {:.3g})",
                            o.name, o.cosine, safe.min_cosine, o.max_abs_error, bound, safe.max_abs_error,
                            safe.half_weights_rel_error, o.max_abs_reference);
      }
    }
    if (worst_ratio > 1 || !std::isfinite(worst_ratio)) {
      rep.half_weights_reason = "precision: " + worst;
    } else {
      const bool passed = !safe.half_weights_check || safe.half_weights_check(fused, &rep.half_weights_check);
      if (passed) {
        rep.half_weights_kept = true;
        meta.emplace_back(kHalfWeightsMetadataKey,
                          fmt::format("matmul weights stored as float16 at run time; gate passed with every product on "
                                      "float16 weights: min cosine {:.7f}, max abs error {:.3g}",
                                      hp.min_cosine, hp.max_abs_error));
      } else {
        rep.half_weights_reason = rep.half_weights_check;
      }
    }
  }
  if (rep.original_kept) {
    fused_ = fused;  // what Save() writes: the model as given
  } else {
    fused_.metadata_props = fused.metadata_props;
  }
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
    const bool measured = k.reason_kind != "compile" && k.reason_kind != "runtime";  // no kernel ran
    s += fmt::format("  {:<48} {:<9} {:>9} {:>10} {:>9.2f}x {:>10} {:>10}  {}\n", name, k.fused ? "fused" : "ROLLBACK",
                     measured ? fmt::format("{:.6f}", k.cosine) : "-",
                     measured ? fmt::format("{:.3g}", k.max_abs_error) : "-", pred,
                     measured && k.measured_unfused_us > 0 ? fmt::format("{:.2f}us", k.measured_unfused_us) : "-",
                     measured && k.measured_fused_us > 0 ? fmt::format("{:.2f}us", k.measured_fused_us) : "-",
                     k.fused ? (k.same_as.empty() ? k.kernel : "as " + k.same_as) : k.reason);
  }
  s += "  (pred gain: cost model time before/after, docs/cost_model.md; unfused/fused: measured medians on the group's "
       "real inputs)\n";
  s += fmt::format("Workload: {} ({} run(s)); each group was gated on every run\n",
                   workload.empty() ? "random inputs" : workload, samples);
  s += "End to end (the model as given vs fused with generated kernels, same workload):\n";
  for (size_t i = 0; i < outputs.size(); ++i)
    s += fmt::format("  {:<32} cosine {:.7f}  max abs error {:.3g}\n", outputs[i], output_cosine[i],
                     output_max_abs_error[i]);
  s += fmt::format("  time: original {:.3f} ms, fused {:.3f} ms -> measured {:.2f}x (predicted {:.2f}x); fused faster in {} "
                   "of {} interleaved pairs ({} needed)\n",
                   time_original_ms, time_fused_ms, measured_speedup, predicted_speedup, end_to_end_pairs_won,
                   end_to_end_pairs, end_to_end_pairs_needed);
  if (end_to_end_log.size() > 1)
    for (const std::string& line : end_to_end_log) s += "  " + line + "\n";
  if (!end_to_end_verdict.empty()) s += "  verdict: " + end_to_end_verdict + "\n";
  int reused = 0;
  for (const auto& k : kernels) reused += !k.speed_measured_at.empty() && k.same_as.empty();
  if (reused > 0 || !end_to_end_reused.empty())
    s += fmt::format("  speed verdicts reused from earlier measurements on this machine: {} group(s){} "
                     "(codegen/gate_cache.h; --remeasure measures again)\n",
                     reused, end_to_end_reused.empty() ? "" : ", and the end-to-end timing (measured " + end_to_end_reused + ")");
  if (!kernel_library.empty()) s += "  kernels: " + kernel_library + "\n";
  if (half_weights_tried)
    s += half_weights_kept
             ? fmt::format("float16 weight storage: kept (every product on float16 weights: min cosine {:.7f}, max abs "
                           "error {:.3g}, within {:.3g}{}); recorded in the model's metadata, `generate` and `run` use it for every product\n",
                           half_weights_cosine, half_weights_max_abs_error, half_weights_error_bound,
                           half_weights_check.empty() ? "" : "; " + half_weights_check)
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
                            {"same_as", k.same_as},
                            {"samples", k.samples},
                            {"rolled_back_end_to_end", k.rolled_back_end_to_end},
                            {"speed_measured_at", k.speed_measured_at}});
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
                     {"pairs", end_to_end_pairs},
                     {"pairs_won", end_to_end_pairs_won},
                     {"pairs_needed", end_to_end_pairs_needed},
                     {"rounds", end_to_end_rounds},
                     {"log", end_to_end_log},
                     {"verdict", end_to_end_verdict},
                     {"original_kept", original_kept},
                     {"reused_measurement_from", end_to_end_reused},
                     {"time_source", "measured: medians of interleaved runs over the workload"},
                     {"predicted_source", "cost model (docs/cost_model.md)"}};
  j["kernel_library"] = kernel_library;
  j["workload"] = {{"source", workload}, {"samples", samples}};
  if (half_weights_tried)
    j["half_weights"] = {{"kept", half_weights_kept},
                         {"error_bound", half_weights_error_bound},
                         {"check", half_weights_check},
                         {"min_cosine", half_weights_cosine},
                         {"max_abs_error", std::isfinite(half_weights_max_abs_error) ? half_weights_max_abs_error : -1.0},
                         {"reason", half_weights_reason},
                         {"source", "measured: original vs fused with every constant-weight product on float16 weights"}};
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

Model SafeGraphAutoFusion::FuseAsConfigured(const SafeFusionOptions& safe) {
  return options_.safe_mode ? FuseSafe(safe) : Fuse();
}

std::string SafeGraphAutoFusion::CompileFusedOperators(const std::string& dir) {
  Model fused = Fuse();
  // Variants for every class the workload's calls take (random inputs when there is none).
  Workload work = options_.workload;
  if (work.empty()) {
    work.samples.push_back(RandomFeeds(fused, options_.dims));
    work.source = "random inputs";
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  GAF_CHECK(!ec && std::filesystem::is_directory(dir), "CompileFusedOperators: cannot create the folder {}: {}", dir,
            ec ? ec.message() : "a file of that name exists");
  KernelCompiler compiler(dir);
  auto set = CompileFusedKernels(fused, compiler, work, kFusedDomain);
  std::string s = fmt::format("kernel library: {} ({})\n",
                              set->library() && !set->library()->directory().empty() ? set->library()->directory() : "none",
                              set->library() && set->library()->from_cache() ? "cached, nothing compiled"
                              : set->library() ? fmt::format("compiled in {:.2f} s", set->library()->compile_seconds())
                                               : "");
  s += DescribeFusedKernels(*set);
  return s;
}

}  // namespace gaf
