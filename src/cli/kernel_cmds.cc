// `autofusion compile`, `verify`, `bench`: the generated kernels of a fused model, its precision
// against the original, and the stage table (baseline unfused, + fusion, + safe fusion) measured
// side by side in one run.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli/commands.h"
#include "cli/inputs.h"
#include "cli/ort_compare.h"
#include "codegen/fused_session.h"
#include "codegen/half_weights.h"
#include "codegen/verify.h"
#include "cost/cost_model.h"
#include "fusion/auto_fusion.h"
#include "codegen/safe_fusion.h"
#include "models/generate.h"
#include "onnx_io/npy.h"
#include "onnx_io/onnx_io.h"
#include "ir/output_file.h"

namespace gaf::cli {

namespace {

using json = nlohmann::json;

bool HasFusedOperators(const Model& m) {
  for (const Function& f : m.functions)
    if (f.domain == kFusedDomain) return true;
  return false;
}

// Fused kernels compiled for the workload when there is one, else for random inputs (dims).
std::shared_ptr<FusedKernelSet> Compile(const Model& m, KernelCompiler& compiler, const Workload& w,
                                        const std::map<std::string, int64_t>& dims,
                                        HalfWeights half = HalfWeights::kOff) {
  return w.empty() ? CompileFusedKernels(m, compiler, dims, kFusedDomain, half)
                   : CompileFusedKernels(m, compiler, w, kFusedDomain, half);
}

// ---- compile ----
struct CompileArgs {
  std::string model, output, preset = "transformer", rules;
  std::vector<std::string> dims, inputs;
};

void RunCompile(const CompileArgs& a) {
  GAF_CHECK(!a.output.empty(), "compile needs an output folder (-o DIR)");
  CheckOutputDir(a.output, "-o");
  Model m = LoadModelArg(a.model, a.inputs);
  const std::map<std::string, int64_t> dims = ParseDimBindings(a.dims);
  const Workload w = LoadWorkload(m, a.inputs, dims);
  if (HasFusedOperators(m)) {
    KernelCompiler compiler(a.output);
    auto set = Compile(m, compiler, w, dims);
    const KernelLibrary* lib = set->library();
    fmt::print("kernel library: {} ({})\n", lib && !lib->directory().empty() ? lib->directory() : "none (no kernels)",
               lib && lib->from_cache() ? "cached, nothing compiled" : fmt::format("compiled in {:.2f} s", lib ? lib->compile_seconds() : 0.0));
    fmt::print("{}", DescribeFusedKernels(*set));
    return;
  }
  FusionOptions o;
  o.preset = a.preset;
  o.rules_file = a.rules;
  o.dims = dims;
  o.workload = w;
  SafeGraphAutoFusion f(m, o);
  fmt::print("{} has no fused operators: fused with preset '{}' first.\n", a.model, a.preset);
  fmt::print("{}", f.CompileFusedOperators(a.output));
}

// ---- verify ----
struct VerifyArgs {
  std::string fused, original;
  std::vector<std::string> inputs, dims;
  int threads = 0, repeat = 0;
  uint32_t seed = 0;
  double min_cosine = 0.999, max_abs_error = 1e-3;
  bool json = false, half_weights = false, allow_fallback = false;
};

// Per fused function: calls that ran a kernel and calls that ran the body.
json CallsJson(const std::vector<FusedCallStats>& calls) {
  json out = json::array();
  for (const FusedCallStats& c : calls)
    out.push_back({{"function", c.function},
                   {"kernel", c.kernel},
                   {"sites", c.sites},
                   {"variants", c.variants},
                   {"calls", c.calls},
                   {"kernel_calls", c.KernelCalls()},
                   {"body_calls", c.fallbacks},
                   {"generated_at_run_time", c.generated_at_run_time},
                   {"status", c.status},
                   {"last_fallback", c.last_fallback}});
  return out;
}

void RunVerify(const VerifyArgs& a) {
  Model fused = LoadModel(a.fused);
  GAF_CHECK(HasFusedOperators(fused),
            "{}: no fused operators (domain {}) to verify; when `fuse --safe` wrote it, no fused model was faster "
            "and it kept the model as given (its report says so)",
            a.fused, kFusedDomain);
  VerifyOptions vo;
  vo.dims = ParseDimBindings(a.dims);
  vo.workload = LoadWorkload(fused, a.inputs, vo.dims, a.seed);
  // A decoder without -i is verified on what generate runs: a prefill and decode steps.
  if (vo.workload.empty() && vo.dims.empty()) vo.workload = DecoderWorkload(fused);
  vo.seed = a.seed;
  vo.threads = a.threads;
  vo.repeats = a.repeat;
  vo.half_weights = a.half_weights ? HalfWeights::kAll : HalfWeights::kOff;
  // Without --original the reference is the fused model's own bodies: the original operators.
  Model original = a.original.empty() ? fused : LoadModelArg(a.original, a.inputs);
  PrecisionReport p = VerifyPrecision(fused, original, vo);
  PerformanceReport perf;
  if (a.repeat > 0) {
    VerifyOptions po = vo;
    if (!a.original.empty()) po.original = &original;  // timed against the model the user gave
    perf = VerifyPerformance(fused, po);
  }
  const bool precise = p.Passes(a.min_cosine, a.max_abs_error);
  // A fused group whose kernel never ran is not fused: it fails unless the user allows it.
  const std::vector<std::string> never_ran = p.NeverRan();
  const bool pass = precise && (a.allow_fallback || never_ran.empty());
  if (a.json) {
    json outs = json::array();
    for (const auto& o : p.outputs)
      outs.push_back({{"name", o.name},
                      {"same_shape", o.same_shape},
                      {"cosine", o.cosine},
                      {"max_abs_error", std::isfinite(o.max_abs_error) ? o.max_abs_error : -1.0},
                      {"max_abs_reference", o.max_abs_reference}});
    json j{{"fused", a.fused},
           {"reference", a.original.empty() ? "the fused model's function bodies (unfused operators)" : a.original},
           {"outputs", outs},
           {"min_cosine", p.min_cosine},
           {"max_abs_error", std::isfinite(p.max_abs_error) ? p.max_abs_error : -1.0},
           {"gate", {{"min_cosine", a.min_cosine}, {"max_abs_error", a.max_abs_error},
                     {"allow_fallback", a.allow_fallback}}},
           {"fused_calls", CallsJson(p.calls)},
           {"never_ran", never_ran},
           {"run_by_plan", p.run_by_plan},
           {"workload", {{"source", p.workload}, {"samples", p.samples}}},
           {"pass", pass}};
    if (a.repeat > 0)
      j["performance"] = {{"baseline", perf.baseline},   {"baseline_ms", perf.baseline_ms}, {"fused_ms", perf.fused_ms},
                          {"speedup", perf.speedup},     {"repeats", perf.repeats},         {"pairs_won", perf.pairs_won},
                          {"pairs_needed", perf.pairs_needed},
                          {"source", "measured: medians of interleaved passes over the workload"}};
    fmt::print("{}\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
  } else {
    fmt::print("reference: {}\n", a.original.empty() ? "the fused model's function bodies (the unfused operators)" : a.original);
    fmt::print("{:<36} {:>12} {:>14} {:>14}\n", "output", "cosine", "max abs error", "max |ref|");
    for (const auto& o : p.outputs)
      fmt::print("{:<36} {:>12.8f} {:>14.4g} {:>14.4g}{}\n", o.name, o.cosine, o.max_abs_error, o.max_abs_reference,
                 o.same_shape ? "" : "  (shapes differ)");
    fmt::print("fused kernels:\n{}", p.kernels);
    if (a.repeat > 0)
      fmt::print("time: {} {:.3f} ms, fused {:.3f} ms -> {:.2f}x (medians of {} interleaved passes over the workload; "
                 "fused faster in {} of {} pairs, {} needed for a sign test at 1%)\n",
                 perf.baseline, perf.baseline_ms, perf.fused_ms, perf.speedup, perf.repeats, perf.pairs_won, perf.repeats,
                 perf.pairs_needed);
    for (const std::string& n : never_ran)
      fmt::print("kernel never ran: {}{}\n", n, a.allow_fallback ? " (allowed: --allow-fallback)" : "");
    for (const std::string& n : p.run_by_plan) fmt::print("run by the runtime's plan: {}\n", n);
    fmt::print("{} (gate: cosine >= {}, max abs error <= {}, every fused operator ran its kernel{} or the runtime's "
               "plan ran it; workload: {}, {} run(s))\n",
               pass ? "PASS" : "FAIL", a.min_cosine, a.max_abs_error, a.allow_fallback ? " unless --allow-fallback" : "",
               p.workload, p.samples);
  }
  GAF_CHECK(precise, "precision gate failed: min cosine {:.6f}, max abs error {:.3g}", p.min_cosine, p.max_abs_error);
  GAF_CHECK(pass, "{} fused operator(s) never ran their kernel (every call ran the function body): {} (--allow-fallback "
            "accepts this)",
            never_ran.size(), never_ran.empty() ? "" : never_ran[0]);
}

// ---- bench ----
struct BenchArgs {
  std::string model, preset = "transformer", rules;
  std::vector<std::string> dims, inputs;
  int threads = 0, repeat = 5, tokens = 30, prompt_len = 8;
  bool safe = false, json = false, half_weights = false, no_ort = false;
};

struct Stage {
  std::string name;
  Model model;
  std::shared_ptr<FusedKernelSet> kernels;
  std::unique_ptr<Session> session;
  std::vector<double> samples;  // seconds per token (decoder) or per inference
  std::vector<int64_t> tokens;
  std::string note;
  bool reuse = true;  // buffers recycled (SetBufferReuse)
  bool half = false;  // float16 weight storage: its own bandwidth floor
};

void RunBench(const BenchArgs& a) {
  Model original = LoadModelArg(a.model, a.inputs);
  GAF_CHECK(!HasFusedOperators(original), "{}: already fused; bench takes the original model and fuses it", a.model);
  FusionOptions o;
  o.preset = a.preset;
  o.rules_file = a.rules;
  o.dims = ParseDimBindings(a.dims);
  o.workload = LoadWorkload(original, a.inputs, o.dims);
  const bool decoder = IsDecoder(original);
  // Decoders without -i: kernels and gates on what generate runs (a prefill and decode steps).
  if (o.workload.empty() && decoder) o.workload = DecoderWorkload(original);
  SessionOptions so;
  so.num_threads = a.threads;
  const int threads = a.threads > 0 ? a.threads : static_cast<int>(std::thread::hardware_concurrency());

  std::vector<std::unique_ptr<Stage>> stages;
  auto add = [&](const std::string& name, const Model& m, bool kernels, const std::string& note, bool half = false,
                 bool fold = true, bool reuse = true, bool read_ahead = true) {
    auto st = std::make_unique<Stage>();
    st->name = name;
    st->model = m;
    st->note = note;
    st->reuse = reuse;
    st->half = half;
    SessionOptions s = so;
    s.fold_shapes = fold;
    s.rewrite_products = fold;
    s.task_team = fold;  // part of the scheduling stage
    s.read_ahead = fold && read_ahead;
    s.memory_plan = reuse;
    s.cache_in_place = reuse;
    if (kernels) {
      KernelCompiler compiler;
      st->kernels = Compile(st->model, compiler, o.workload, o.dims, half ? HalfWeights::kAll : HalfWeights::kOff);
      s.function_kernels = st->kernels->Provider();
    }
    if (half) UseHalfWeights(s);
    st->session = std::make_unique<Session>(st->model, s);
    stages.push_back(std::move(st));
  };
  // The stages of the original's table, each adding one mechanism: fusion, memory reuse (tensor
  // buffers recycled by size class instead of allocated and faulted in afresh), then the plan's
  // scheduling (constants folded when the session is made, shape computation cached per shape,
  // the product rewrites of runtime/plan_rewrite.h).
  add("baseline (unfused)", original, false, "reference kernels, one per operator, every node run, no buffer reuse",
      false, false, false);
  GraphAutoFusion f(original, o);
  Model fused = f.Fuse();
  add("+ fusion", fused, true,
      fmt::format("{} groups ({} functions), generated kernels", f.fuse_summary().groups, f.fuse_summary().functions),
      false, false, false);
  add("+ memory reuse", fused, true,
      "the same, tensor buffers from a static memory plan (placed once by liveness in one arena, re-planned when a "
      "shape outgrows it) or recycled by size class; KV caches appended in place once the attention is one node "
      "(from the next stage)", false, false);
  add("+ scheduling", fused, true,
      "the same, constants folded once, shape computation reused while the shapes it reads are unchanged, decode "
      "steps led by a team of threads held for the step, products "
      "reading the KV cache and transposed operands in place, sibling products in one pass",
      false, true, true, /*read_ahead=*/false);
  // The original's pipelining: the memory kept busy between a decode step's products.
  add("+ read-ahead", fused, true,
      "the same, and the threads with no task left in a decode step's weight product prefetch what they read first "
      "in the next one (through its last tasks and the one-thread work after it)");
  std::string safe_summary, half_note =
      "float16 storage of constant MatMul weights (numerics change: verify --half-weights --dim sequence_length=1)";
  if (a.safe) {
    FusionOptions safe_options = o;
    // Decoders without -i: the gates measure a short generation, as fuse --safe does.
    if (safe_options.workload.empty() && decoder) safe_options.workload = DecoderWorkload(original);
    SafeGraphAutoFusion g(original, safe_options);
    SafeFusionOptions sopt;
    sopt.threads = a.threads;
    sopt.half_weights = a.half_weights;
    Model safe = g.FuseSafe(sopt);
    const SafeFusionReport& r = g.GetSafeFusionReport();
    int rolled = 0;
    for (const auto& k : r.kernels) rolled += !k.fused;
    add("+ safe fusion (gated)", safe, true, fmt::format("{} groups kept, {} rolled back", r.fused, rolled));
    if (r.half_weights_tried)
      half_note = r.half_weights_kept
                      ? fmt::format("float16 weight storage, gate passed (every product on float16 weights: min cosine "
                                    "{:.7f}, max abs error {:.3g})",
                                    r.half_weights_cosine, r.half_weights_max_abs_error)
                      : "float16 weight storage, gate FAILED: " + r.half_weights_reason;
  }

  if (a.half_weights)
    add("+ fp16 weights", stages.back()->model, true, half_note, true);
  // What `run` and `generate` do with the model as given: unfused, but with every runtime mechanism
  // of the stages above (the plan's own rewrites fuse attention, sibling products, norms and rotary
  // embeddings). The baseline row has none of them, so this row says whether fusion pays against
  // the runtime a user gets without it.
  add("as given, full runtime", original, false,
      "the model unfused, memory plan, folding and the plan's rewrites on (what run and generate do with it)");
  DecoderSignature sig;
  if (decoder) sig = DecoderSignature::Discover(stages[0]->session->inputs(), stages[0]->session->outputs());
  GenerateOptions gen;
  std::vector<Feeds> samples;
  if (decoder) {
    // The prompt: input_ids of the first -i sample, else a fixed one.
    if (!o.workload.empty() && o.workload.samples[0].count(sig.input_ids)) {
      const Tensor& ids = o.workload.samples[0].at(sig.input_ids);
      const int64_t n = ids.rank() >= 1 ? ids.dim(-1) : ids.numel();
      for (int64_t i = 0; i < n; ++i) gen.prompt_ids.push_back(static_cast<int64_t>(ids.DoubleAt(i)));
    } else {
      for (int i = 0; i < a.prompt_len; ++i) gen.prompt_ids.push_back(1 + (i * 7) % 50);
    }
    gen.max_new_tokens = a.tokens;
  } else {
    samples = o.workload.empty() ? DefaultWorkload(original, o.dims, 0).samples : o.workload.samples;
  }
  auto run_once = [&](Stage& st) {
    SetBufferReuse(st.reuse);
    if (decoder) {
      GenerateResult g = Generate(*st.session, sig, gen);
      st.tokens = g.tokens;
      return g.MedianStepSeconds();
    }
    // Per sample: one untimed run (the caches the other stages left), then the median of three,
    // as ONNX Runtime's row is timed (bench/ort_run.js).
    double total = 0;
    for (const Feeds& feeds : samples) {
      st.session->Run(feeds);
      std::vector<double> t;
      for (int i = 0; i < 3; ++i) {
        auto t0 = std::chrono::steady_clock::now();
        st.session->Run(feeds);
        t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      total += Median(t);
    }
    return total;
  };
  // Decoders: the bandwidth floor of a decode step (the bytes of weights it reads over the
  // machine's read bandwidth), the bandwidth measured between the rounds.
  Tensor sweep;
  std::vector<double> gbs;
  DecodeStepBytes step_bytes;
  if (decoder) {
    step_bytes = CountDecodeStepBytes(original.graph);
    sweep = Tensor(DataType::kFloat, {int64_t{128} << 20});  // 512 MiB, far larger than the caches
  }
  // ONNX Runtime on the same model where it is installed (cli/ort_compare.h): a row of its own,
  // one fresh process a round between ours.
  std::optional<OrtComparison> ort;
  std::string ort_note;
  std::vector<double> ort_samples;
  std::vector<int64_t> ort_tokens;
  if (a.no_ort) {
    ort_note = "not compared (--no-ort)";
  } else if (IsTorchScriptFile(a.model)) {
    ort_note = "not compared (the model is a TorchScript file)";
  } else {
    ort.emplace(threads);
    if (!ort->available()) {
      ort_note = "not compared: " + ort->why();
      ort.reset();
    }
  }
  auto ort_once = [&] {
    double t = 0;
    std::string why;
    const bool ok = decoder ? ort->TimeDecode(a.model, gen.prompt_ids, a.tokens, &t, &ort_tokens, &why)
                            : ort->TimeRuns(a.model, samples, 3, &t, &why);
    if (ok) {
      ort_samples.push_back(t);
      return;
    }
    ort_note = "failed: " + why;
    ort_samples.clear();
    ort.reset();
  };
  for (auto& st : stages) run_once(*st);  // warm-up
  for (int r = 0; r < std::max(1, a.repeat); ++r) {  // interleaved, so load changes hit every stage alike
    for (auto& st : stages) st->samples.push_back(run_once(*st));
    if (ort) ort_once();
    if (decoder) gbs.push_back(ReadBandwidthGbs(sweep, 3));
  }
  if (ort)
    ort_note = fmt::format("onnxruntime-node {}, all graph optimizations, a fresh process a round ({}){}", ort->version(),
                           decoder ? "bench/ort_generate.js: the same greedy loop after a warm-up generation, each step from its feeds to the argmax"
                                   : "bench/ort_run.js: median of 3 session.run calls per sample",
                           decoder ? (ort_tokens == stages[0]->tokens ? "; same tokens as the baseline"
                                                                      : "; [TOKENS DIFFER from the baseline]")
                                   : "");
  // Each stage against ONNX Runtime: the median of the rounds' ratios.
  auto vs_ort = [&](const Stage& st) {
    std::vector<double> r;
    for (size_t i = 0; i < ort_samples.size() && i < st.samples.size(); ++i)
      if (st.samples[i] > 0) r.push_back(ort_samples[i] / st.samples[i]);
    return r.empty() ? 0.0 : Median(r);
  };
  SetBufferReuse(true);
  sweep = Tensor();
  const double bandwidth = decoder ? Median(gbs) : 0;
  // Seconds per token at the floor: all weight bytes, or the float16 stage's (MatMul weights halved).
  auto floor_bytes = [&](const Stage& st) {
    return static_cast<double>(st.half ? step_bytes.matmul / 2 + step_bytes.gather + step_bytes.other
                                       : step_bytes.total());
  };
  auto floor_of = [&](const Stage& st) {
    if (!decoder || bandwidth <= 0) return 0.0;
    return floor_bytes(st) / (bandwidth * 1e9);
  };
  // A stage's share of the floor: the median over the rounds of each round's floor (the bandwidth
  // read right after it) over the stage's step in that round, so a machine whose bandwidth drifts
  // compares each step with the bandwidth of its own moment.
  auto share_of_floor = [&](double bytes, const std::vector<double>& samples) {
    std::vector<double> r;
    for (size_t i = 0; decoder && i < gbs.size() && i < samples.size(); ++i)
      if (gbs[i] > 0 && samples[i] > 0) r.push_back(bytes / (gbs[i] * 1e9) / samples[i]);
    return r.empty() ? 0.0 : Median(r);
  };
  auto of_floor = [&](const Stage& st) { return share_of_floor(floor_bytes(st), st.samples); };
  for (auto& st : stages)
    if (st->reuse && st->session->memory_plan_stats().runs > 0) {
      const MemoryPlanStats ms = st->session->memory_plan_stats();
      if (ms.stopped) {
        st->note += "; memory plan stopped (runs did not repeat)";
      } else {
        st->note += fmt::format("; last run: {} of {} buffers from a {:.1f} KiB arena, {} plan(s) and {} arena(s) in {} runs",
                                ms.last_served, ms.last_requests, static_cast<double>(ms.arena_bytes) / 1024, ms.plans,
                                ms.arenas, ms.runs);
      }
    }

  const double base = Median(stages[0]->samples);
  if (a.json) {
    json j{{"model", a.model}, {"threads", threads}, {"repeats", a.repeat}, {"decoder", decoder},
           {"unit", decoder ? "tokens/s (decode, median step)" : "inferences/s"}, {"stages", json::array()}};
    for (auto& st : stages) {
      double t = Median(st->samples);
      json s{{"stage", st->name}, {"seconds", t}, {"rate", t > 0 ? 1.0 / t : 0.0}, {"speedup", t > 0 ? base / t : 0.0},
             {"noise", RelativeIqr(st->samples)}, {"note", st->note}};
      if (decoder) {
        s["same_tokens_as_baseline"] = st->tokens == stages[0]->tokens;
        s["floor_seconds"] = floor_of(*st);
        s["of_floor"] = of_floor(*st);
      }
      if (st->kernels) s["fused_calls"] = CallsJson(FusedCallSummary(*st->kernels));
      if (!ort_samples.empty()) s["vs_onnxruntime"] = vs_ort(*st);
      j["stages"].push_back(s);
    }
    json oj{{"note", ort_note}, {"rounds_seconds", ort_samples}};
    if (!ort_samples.empty()) {
      oj["seconds"] = Median(ort_samples);
      oj["noise"] = RelativeIqr(ort_samples);
      if (decoder) {
        oj["same_tokens_as_baseline"] = ort_tokens == stages[0]->tokens;
        oj["of_floor"] = share_of_floor(static_cast<double>(step_bytes.total()), ort_samples);
      }
    }
    j["onnxruntime"] = oj;
    if (decoder) {
      j["decode_step_weight_bytes"] = step_bytes.total();
      j["read_bandwidth_gbs"] = bandwidth;
      j["read_bandwidth_gbs_rounds"] = gbs;
    }
    fmt::print("{}\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
    return;
  }
  fmt::print("{} — {} thread(s), medians of {} interleaved runs{}\n", a.model, threads, a.repeat,
             decoder ? fmt::format(", decode of {} tokens after a {}-token prompt", a.tokens, a.prompt_len) : "");
  fmt::print("  {:<24} {:>14} {:>12} {:>9} {:>7}{}  {}\n", "stage", decoder ? "tokens/s" : "inferences/s",
             decoder ? "ms/token" : "ms", "speedup", "noise", decoder ? fmt::format(" {:>9}", "of floor") : "", "note");
  for (auto& st : stages) {
    double t = Median(st->samples);
    std::string note = st->note;
    if (decoder && st->tokens != stages[0]->tokens) note += " [TOKENS DIFFER from baseline]";
    std::string of_floor_col;  // decoders: a column of its own
    if (decoder)
      of_floor_col = fmt::format(" {:>9}", of_floor(*st) > 0 ? fmt::format("{:.2f}", of_floor(*st)) : "");
    fmt::print("  {:<24} {:>14.1f} {:>12.3f} {:>8.2f}x {:>6.0f}%{}  {}\n", st->name, t > 0 ? 1 / t : 0.0, t * 1e3,
               t > 0 ? base / t : 0.0, 100 * RelativeIqr(st->samples), of_floor_col, note);
  }
  if (!ort_samples.empty()) {
    const double t = Median(ort_samples);
    const double share = share_of_floor(static_cast<double>(step_bytes.total()), ort_samples);
    fmt::print("  {:<24} {:>14.1f} {:>12.3f} {:>8.2f}x {:>6.0f}%{}  {}\n", "ONNX Runtime (all)", t > 0 ? 1 / t : 0.0,
               t * 1e3, t > 0 ? base / t : 0.0, 100 * RelativeIqr(ort_samples),
               decoder ? fmt::format(" {:>9}", share > 0 ? fmt::format("{:.2f}", share) : "") : "", ort_note);
    std::string ratios;
    for (auto& st : stages) ratios += fmt::format("{}{} {:.2f}x", ratios.empty() ? "" : ", ", st->name, vs_ort(*st));
    fmt::print("against ONNX Runtime (median of the rounds' ratios, higher is faster than it): {}\n", ratios);
  } else {
    fmt::print("ONNX Runtime: {}\n", ort_note);
  }
  if (decoder && bandwidth > 0) {
    const Stage* half = nullptr;
    for (auto& st : stages)
      if (st->half) half = st.get();
    fmt::print("floor: {:.3f} ms/token = {:.2f} MB of weights a decode step reads / {:.1f} GB/s read bandwidth (median "
               "of {} sweeps of 512 MiB, one after each round; a stage's share of it is the median of its rounds' "
               "shares, each round against its own sweep){}\n",
               floor_of(*stages[0]) * 1e3, step_bytes.total() / 1e6, bandwidth, gbs.size(),
               half ? fmt::format("; float16 weights: {:.3f} ms/token", floor_of(*half) * 1e3) : "");
  }
  // Per stage with kernels: calls that ran a kernel and calls that ran the body (a fallback).
  for (auto& st : stages)
    if (st->kernels) fmt::print("fused kernels of '{}':\n{}", st->name, DescribeFusedKernels(*st->kernels));
}

}  // namespace

void AddKernelCommands(CLI::App& app) {
  {
    auto a = std::make_shared<CompileArgs>();
    auto* cmd = app.add_subcommand("compile", "Generate and batch-compile the fused kernels of a model into a folder");
    cmd->add_option("model", a->model, "fused ONNX model (or an unfused one: it is fused with --preset first; or a TorchScript file, with -i)")->required();
    cmd->add_option("-o,--output", a->output, "folder for the sources, build.ninja and the kernel library")->required();
    cmd->add_option("--preset", a->preset, "rule preset when the model is not fused yet (default transformer)");
    cmd->add_option("--rules", a->rules, "extra rules when the model is not fused yet");
    cmd->add_option("--dim", a->dims, "NAME=VALUE binding of a symbolic dimension for the recorded shapes");
    cmd->add_option("-i,--input", a->inputs, kInputHelp);
    cmd->callback([a] { RunCompile(*a); });
  }
  {
    auto a = std::make_shared<VerifyArgs>();
    auto* cmd = app.add_subcommand("verify", "Precision of a fused model run with its generated kernels (cosine, max abs error per output)");
    cmd->add_option("fused", a->fused, "fused ONNX model")->required();
    cmd->add_option("--original", a->original, "the original model (ONNX, or TorchScript with -i; default: the fused model's own function bodies)");
    cmd->add_option("-i,--input", a->inputs, kInputHelp);
    cmd->add_option("--dim", a->dims, "NAME=VALUE for a symbolic dimension of random inputs");
    cmd->add_option("--threads", a->threads, "threads (default: all cores)");
    cmd->add_option("--seed", a->seed, "seed of random inputs");
    cmd->add_option("--min-cosine", a->min_cosine, "gate: minimum cosine similarity (default 0.999)");
    cmd->add_option("--max-abs-error", a->max_abs_error, "gate: maximum absolute error (default 1e-3)");
    cmd->add_option("--repeat", a->repeat, "also time unfused vs fused, medians of N interleaved runs");
    cmd->add_flag("--half-weights", a->half_weights,
                  "run with float16 storage of constant MatMul weights (used for products of up to 4 rows: "
                  "give decode-shaped inputs, e.g. --dim sequence_length=1)");
    cmd->add_flag("--allow-fallback", a->allow_fallback,
                  "pass even when a fused operator's kernel never ran (every call ran its body)");
    cmd->add_flag("--json", a->json, "machine-readable output");
    cmd->callback([a] { RunVerify(*a); });
  }
  {
    auto a = std::make_shared<BenchArgs>();
    auto* cmd = app.add_subcommand("bench", "Stage table: baseline unfused, + fusion (+ safe fusion), measured side by side");
    cmd->add_option("model", a->model, "ONNX model (not fused), or a TorchScript file (with -i)")->required();
    cmd->add_option("--preset", a->preset, "rule preset (default transformer)");
    cmd->add_option("--rules", a->rules, "extra rules from a rule file");
    cmd->add_option("--dim", a->dims, "NAME=VALUE for a symbolic dimension of random inputs");
    cmd->add_option("-i,--input", a->inputs, std::string(kInputHelp) + "; decoders: input_ids is the prompt");
    cmd->add_option("--threads", a->threads, "threads (default: all cores)");
    cmd->add_option("--repeat", a->repeat, "interleaved runs per stage (median; default 5)");
    cmd->add_option("-n,--tokens", a->tokens, "decoders: new tokens per generation (default 30)");
    cmd->add_flag("--safe", a->safe, "add the safe-fusion stage (precision and speed gates with rollback)");
    cmd->add_flag("--half-weights", a->half_weights, "add a stage with float16 storage of constant MatMul weights");
    cmd->add_flag("--no-ort", a->no_ort,
                  "do not time ONNX Runtime on the same model (by default it is, where node and onnxruntime-node are "
                  "installed in bench/ or $GAF_BENCH_DIR)");
    cmd->add_flag("--json", a->json, "machine-readable output");
    cmd->callback([a] { RunBench(*a); });
  }
}

}  // namespace gaf::cli
