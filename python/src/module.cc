// graph_autofusion._core: the C++ library under the Python package (python/graph_autofusion).
// Thin on purpose: models, the fuser, runtimes and the verification functions, with reports as
// JSON text (the package turns them into report objects) and errors as graph_autofusion.Error
// carrying the library's sentence. Work that takes long (shape recording, analysis, safe fusion,
// compiling, runs, generation, verification) releases the interpreter lock.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "codegen/compiler.h"
#include "codegen/fused_session.h"
#include "codegen/half_weights.h"
#include "codegen/safe_fusion.h"
#include "codegen/verify.h"
#include "convert.h"
#include "cost/workload.h"
#include "fusion/auto_fusion.h"
#include "fusion/report_json.h"
#include "fusion/rules.h"
#include "ir/error.h"
#include "models/generate.h"
#include "models/llama.h"
#include "onnx_io/onnx_io.h"
#include "ops/kernel.h"
#include "runtime/session.h"

namespace gaf::py {
namespace {

using json = nlohmann::json;
using Release = pyb::call_guard<pyb::gil_scoped_release>;

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json ValueInfoJson(const ValueInfo& v) {
  json dims = json::array();
  for (const Dim& d : v.dims) dims.push_back(d.known() ? json(d.value) : d.param.empty() ? json(nullptr) : json(d.param));
  return {{"name", v.name}, {"dtype", DataTypeName(v.dtype)}, {"shape", v.has_shape ? dims : json(nullptr)}};
}

bool HasFusedFunctions(const Model& m) {
  for (const Function& f : m.functions)
    if (f.domain == kFusedDomain) return true;
  return false;
}

std::string ModelInfo(const Model& m) {
  json in = json::array(), out = json::array(), meta = json::object();
  std::vector<std::string> init;
  for (const auto& [name, t] : m.graph.initializers) init.push_back(name);
  for (const ValueInfo& v : m.graph.inputs)
    if (std::find(init.begin(), init.end(), v.name) == init.end()) in.push_back(ValueInfoJson(v));
  for (const ValueInfo& v : m.graph.outputs) out.push_back(ValueInfoJson(v));
  for (const auto& [k, v] : m.metadata_props) meta[k] = v;
  int fused_nodes = 0;
  for (const Node& n : m.graph.nodes) fused_nodes += n.domain == kFusedDomain;
  bool decoder = false;
  try {
    DecoderSignature::Discover(m.graph.inputs, m.graph.outputs);
    decoder = true;
  } catch (const Error&) {
  }
  return Dump({{"inputs", in},
               {"outputs", out},
               {"metadata", meta},
               {"nodes", m.graph.nodes.size()},
               {"functions", m.functions.size()},
               {"fused_nodes", fused_nodes},
               {"has_fused_operators", HasFusedFunctions(m)},
               {"decoder", decoder},
               {"opset", m.OpsetVersion("")},
               {"producer", m.producer_name}});
}

Workload MakeWorkload(const pyb::list& samples, const std::string& source) {
  Workload w;
  w.samples = ToSamples(samples);
  w.source = source.empty() ? "inputs given from Python" : source;
  return w;
}

// The fuser: SafeGraphAutoFusion with its options as keyword arguments.
struct Fuser {
  std::unique_ptr<SafeGraphAutoFusion> f;
  Model last;
};

std::unique_ptr<Fuser> MakeFuser(const Model& model, const std::string& preset, const std::vector<std::string>& fuse_rules,
                                 const std::string& rules_file, double benefit_threshold, const std::string& profile,
                                 bool safe_mode, bool auto_fuse, const std::map<std::string, int64_t>& dims,
                                 const pyb::list& samples, const std::string& source) {
  FusionOptions o;
  o.preset = preset;
  o.fuse_rules = fuse_rules;
  o.rules_file = rules_file;
  o.benefit_threshold = benefit_threshold;
  o.profile = profile;
  o.safe_mode = safe_mode;
  o.auto_fuse = auto_fuse;
  o.dims = dims;
  o.workload = MakeWorkload(samples, source);
  if (o.workload.empty()) o.workload.source.clear();
  auto out = std::make_unique<Fuser>();
  pyb::gil_scoped_release release;
  out->f = std::make_unique<SafeGraphAutoFusion>(model, o);
  return out;
}

std::string AnalyzeJson(Fuser& fu) {
  const auto& cands = fu.f->AnalyzeFusionBenefit();
  const FusionEstimate e = fu.f->EstimateFusionBenefit();
  const HardwareProfile& hw = fu.f->profile();
  json arr = json::array();
  for (const FusionCandidate& c : cands) arr.push_back(CandidateJson(c, hw));
  return Dump({{"profile", {{"name", hw.name}, {"local_memory_bytes", hw.local_memory_bytes}, {"source", hw.source}}},
               {"rules", fu.f->rules().size()},
               {"shapes_known", fu.f->shapes_known()},
               {"shapes_error", fu.f->shapes_error()},
               {"workload", fu.f->options().workload.empty() ? "random inputs (symbolic dims bound consistently with "
                                                               "the graph)"
                                                             : fu.f->options().workload.source},
               {"canonicalization", fu.f->canonicalization_log()},
               {"candidates", arr},
               {"summary", EstimateJson(e)}});
}

std::string EstimateText(Fuser& fu) {
  json j = EstimateJson(fu.f->EstimateFusionBenefit());
  j["shapes_known"] = fu.f->shapes_known();
  j["shapes_error"] = fu.f->shapes_error();
  return Dump(j);
}

std::string FuseSummaryJson(const Fuser& fu) {
  const FuseSummary& s = fu.f->fuse_summary();
  return Dump({{"groups", s.groups},
               {"functions", s.functions},
               {"per_rule", s.per_rule},
               {"nodes_before", s.nodes_before},
               {"nodes_after", s.nodes_after},
               {"nodes_original", s.nodes_original},
               {"checker_passed", s.checker_passed},
               {"checker_message", s.checker_message}});
}

Model FuseSafe(Fuser& fu, double min_cosine, double max_abs_error, bool check_speed, int repeats, double min_gain,
               bool reuse, int threads, const std::string& kernel_cache, bool half_weights) {
  SafeFusionOptions so;
  so.min_cosine = min_cosine;
  so.max_abs_error = max_abs_error;
  so.check_speed = check_speed;
  so.repeats = repeats;
  so.min_gain = min_gain;
  so.reuse_measurements = reuse;
  so.threads = threads;
  so.kernel_cache = kernel_cache;
  so.half_weights = half_weights;
  // As `fuse --safe --half-weights`: for a decoder, float16 storage is kept only when it generates
  // float32's greedy tokens.
  so.half_weights_check = [threads](const Model& fused, std::string* what) {
    return HalfWeightsKeepGreedyTokens(fused, threads, what);
  };
  fu.last = fu.f->FuseSafe(so);
  return fu.last;
}

// A runtime: a session over a model, with the generated kernels of its fused operators (compiled
// for the workload's shapes; others are generated when a call needs them).
struct Runtime {
  std::shared_ptr<FusedKernelSet> kernels;
  std::unique_ptr<Session> session;
  Model model;
};

std::unique_ptr<Runtime> MakeRuntime(const Model& model, bool use_kernels, const pyb::list& samples, int threads,
                                     bool half_weights, const std::string& kernel_cache, bool prepared_kernels) {
  Workload w = MakeWorkload(samples, "");
  auto rt = std::make_unique<Runtime>();
  rt->model = model;
  pyb::gil_scoped_release release;
  SessionOptions so;
  so.num_threads = threads;
  so.prepared_kernels = prepared_kernels;
  const HalfWeights half = half_weights ? HalfWeights::kAll : HalfWeights::kOff;
  if (use_kernels && HasFusedFunctions(model)) {
    KernelCompiler compiler(kernel_cache);
    if (w.empty()) {
      // A decoder is compiled for what generate runs; other models for one sample of random inputs.
      try {
        w = DecoderTraceWorkload(model);
      } catch (const Error&) {
        w = DefaultWorkload(model);
      }
    }
    FusedRuntime fr = MakeFusedRuntime(model, so, compiler, w, kFusedDomain, half);
    rt->kernels = fr.kernels;
    rt->session = std::move(fr.session);
  } else {
    if (half_weights) UseHalfWeights(so, HalfWeights::kAll);  // siblings grouped, residual Adds folded, as the CLI
    rt->session = std::make_unique<Session>(model, so);
  }
  return rt;
}

pyb::list RunRuntime(Runtime& rt, const pyb::dict& feeds, const std::vector<std::string>& outputs) {
  Feeds f = ToFeeds(feeds);
  std::vector<Tensor> out;
  {
    pyb::gil_scoped_release release;
    out = rt.session->Run(f, outputs);
    f.clear();
    // numpy arrays are writable: an output whose buffer the session keeps (a folded constant, a
    // cached shape value, an initializer) is copied, so writing into it cannot change later runs.
    // Outputs sharing the caller's own input arrays (a Reshape of an input) stay without a copy.
    for (Tensor& t : out)
      if (t.SharesBuffer()) t = t.Clone();
  }
  pyb::list l;
  for (const Tensor& t : out) l.append(ToNumpy(t));
  return l;
}

pyb::dict GenerateRuntime(Runtime& rt, const std::vector<int64_t>& prompt, int max_new_tokens, int64_t eos) {
  GenerateOptions g;
  g.prompt_ids = prompt;
  g.max_new_tokens = max_new_tokens;
  g.eos_token_id = eos;
  GAF_CHECK(!prompt.empty(), "generate: the prompt (input_ids) is empty");
  GAF_CHECK(max_new_tokens >= 1 && max_new_tokens <= 1000000, "generate: max_new_tokens {} is not in 1..1000000",
            max_new_tokens);
  GenerateResult r;
  {
    pyb::gil_scoped_release release;
    r = Generate(*rt.session, g);
  }
  pyb::dict d;
  d["tokens"] = r.tokens;
  d["prefill_seconds"] = r.prefill_seconds;
  d["step_seconds"] = r.step_seconds;
  d["decode_tokens_per_second"] = r.DecodeTokensPerSecond();
  return d;
}

json CallsJson(const std::vector<FusedCallStats>& calls) {
  json out = json::array();
  for (const FusedCallStats& c : calls)
    out.push_back({{"function", c.function}, {"kernel", c.kernel}, {"status", c.status}, {"sites", c.sites},
                   {"variants", c.variants}, {"calls", c.calls}, {"kernel_calls", c.KernelCalls()},
                   {"fallbacks", c.fallbacks}, {"generated_at_run_time", c.generated_at_run_time},
                   {"last_fallback", c.last_fallback}});
  return out;
}

std::string RuntimeKernels(const Runtime& rt) {
  if (!rt.kernels)
    return Dump({{"text", ""}, {"calls", json::array()}, {"never_ran", json::array()}, {"run_by_plan", json::array()}});
  return Dump({{"text", DescribeFusedKernels(*rt.kernels)},
               {"calls", CallsJson(FusedCallSummary(*rt.kernels))},
               {"never_ran", IdleCallSites(*rt.kernels, nullptr, /*with_plan=*/false)},
               {"run_by_plan", PlanRunCallSites(*rt.kernels)}});
}

VerifyOptions MakeVerifyOptions(const pyb::list& samples, const std::map<std::string, int64_t>& dims, int threads,
                                int repeats, uint32_t seed, bool half_weights, const std::string& kernel_cache) {
  VerifyOptions vo;
  vo.workload = MakeWorkload(samples, "");
  vo.dims = dims;
  vo.threads = threads;
  vo.repeats = repeats;
  vo.seed = seed;
  vo.half_weights = half_weights ? HalfWeights::kAll : HalfWeights::kOff;
  vo.kernel_cache = kernel_cache;
  return vo;
}

std::string PrecisionJson(const PrecisionReport& p) {
  json outs = json::array();
  for (const auto& o : p.outputs)
    outs.push_back({{"name", o.name}, {"same_shape", o.same_shape}, {"cosine", o.cosine},
                    {"max_abs_error", std::isfinite(o.max_abs_error) ? o.max_abs_error : -1.0},
                    {"max_abs_reference", o.max_abs_reference}});
  return Dump({{"outputs", outs},
               {"cosine_similarity", p.min_cosine},
               {"max_abs_error", std::isfinite(p.max_abs_error) ? p.max_abs_error : -1.0},
               {"kernels", p.kernels},
               {"fused_calls", CallsJson(p.calls)},
               {"never_ran", p.never_ran},
               {"run_by_plan", p.run_by_plan},
               {"samples", p.samples},
               {"workload", p.workload}});
}

std::string PerformanceJson(const PerformanceReport& r) {
  return Dump({{"repeats", r.repeats}, {"threads", r.threads}, {"baseline_ms", r.baseline_ms}, {"fused_ms", r.fused_ms},
               {"speedup", r.speedup}, {"baseline_noise", r.baseline_noise}, {"fused_noise", r.fused_noise},
               {"pairs_won", r.pairs_won}, {"pairs_needed", r.pairs_needed}, {"kernels", r.kernels},
               {"fused_calls", CallsJson(r.calls)}, {"idle_nodes", r.idle_nodes}, {"baseline", r.baseline}});
}

FusionRule ChainRule(const std::string& chain, const std::string& name, const std::string& fuse_pattern,
                     double threshold, int priority) {
  FusionRule r;
  r.pattern = ChainPattern(chain);
  r.name = name.empty() ? chain : name;
  r.fuse_pattern = fuse_pattern.empty() ? "Fused" + r.name : fuse_pattern;
  r.benefit_threshold = threshold;
  r.priority = priority;
  r.preset = "user";
  r.source = "AddFusionRule";
  return r;
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "graph-autofusion's C++ library (use the graph_autofusion package, not this module)";
  static pyb::exception<Error> error(m, "Error", PyExc_ValueError);
  static pyb::exception<UnsupportedError> unsupported(m, "UnsupportedError", error.ptr());
  pyb::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const UnsupportedError& e) {
      PyErr_SetString(unsupported.ptr(), e.what());
    } catch (const Error& e) {
      PyErr_SetString(error.ptr(), e.what());
    }
  });

  pyb::class_<Model>(m, "Model")
      .def_static("load", &LoadModel, pyb::arg("path"), Release())
      .def_static(
          "from_bytes",
          [](const pyb::bytes& b, const std::string& base_dir, const std::string& what) {
            std::string s = b;
            pyb::gil_scoped_release release;
            return ModelFromBytes(s, base_dir, what);
          },
          pyb::arg("data"), pyb::arg("base_dir") = "", pyb::arg("what") = "model bytes")
      .def("to_bytes", [](const Model& m) { return pyb::bytes(ModelToBytes(m)); })
      .def(
          "save",
          [](const Model& m, const std::string& path, bool external) {
            SaveOptions so;
            so.external_data = external;
            return SaveModel(m, path, so);
          },
          pyb::arg("path"), pyb::arg("external_data") = false, Release())
      .def("info", &ModelInfo)
      .def("check", &CheckModel, Release())
      .def(
          "inlined",
          [](const Model& m) {
            Model copy = m;
            InlineFunctions(copy);
            return copy;
          },
          Release())
      .def("set_metadata", [](Model& m, const std::string& k, const std::string& v) {
        for (auto& [key, val] : m.metadata_props)
          if (key == k) {
            val = v;
            return;
          }
        m.metadata_props.emplace_back(k, v);
      });

  m.def(
      "llama_model",
      [](const std::string& preset) { return BuildLlamaModel(LlamaPreset(preset)); }, pyb::arg("preset") = "tiny",
      Release());

  pyb::class_<FusionRule>(m, "Rule")
      .def_readonly("name", &FusionRule::name)
      .def_readonly("fuse_pattern", &FusionRule::fuse_pattern)
      .def_readonly("priority", &FusionRule::priority)
      .def_readonly("benefit_threshold", &FusionRule::benefit_threshold)
      .def_readonly("preset", &FusionRule::preset)
      .def_readonly("source", &FusionRule::source)
      .def_readonly("formula", &FusionRule::formula);
  m.def("chain_rule", &ChainRule, pyb::arg("chain"), pyb::arg("name"), pyb::arg("fuse_pattern"), pyb::arg("threshold"),
        pyb::arg("priority"));
  m.def("parse_rules", &ParseRules, pyb::arg("text"), pyb::arg("source"));
  // Op types a rule names that no operator of the runtime has (after the short aliases).
  m.def("unknown_ops", [](const FusionRule& r) {
    std::vector<std::string> out;
    for (const PatternNode& n : r.pattern.nodes)
      for (const std::string& op : n.ops)
        if (OpRegistry::Global().Find("", op) == nullptr && std::find(out.begin(), out.end(), op) == out.end())
          out.push_back(op);
    return out;
  });
  m.def("preset_rules", &PresetRules, pyb::arg("preset"));

  pyb::class_<Fuser>(m, "Fuser")
      .def(pyb::init(&MakeFuser), pyb::arg("model"), pyb::arg("preset"), pyb::arg("fuse_rules"), pyb::arg("rules_file"),
           pyb::arg("benefit_threshold"), pyb::arg("profile"), pyb::arg("safe_mode"), pyb::arg("auto_fuse"),
           pyb::arg("dims"), pyb::arg("samples"), pyb::arg("source"))
      .def("add_rule", [](Fuser& fu, const FusionRule& r) { fu.f->AddFusionRule(r); })
      .def("analyze", &AnalyzeJson, Release())
      .def("estimate", &EstimateText, Release())
      .def(
          "fuse", [](Fuser& fu) { return fu.last = fu.f->Fuse(); }, Release())
      .def("fuse_safe", &FuseSafe, pyb::arg("min_cosine"), pyb::arg("max_abs_error"), pyb::arg("check_speed"),
           pyb::arg("repeats"), pyb::arg("min_gain"), pyb::arg("reuse_measurements"), pyb::arg("threads"),
           pyb::arg("kernel_cache"), pyb::arg("half_weights"), Release())
      .def("safe_report_text", [](const Fuser& fu) { return fu.f->GetSafeFusionReport().ToText(); })
      .def("safe_report_json", [](const Fuser& fu) { return fu.f->GetSafeFusionReport().ToJson(); })
      .def("compile", [](Fuser& fu, const std::string& dir) { return fu.f->CompileFusedOperators(dir); }, Release())
      .def("fuse_summary", &FuseSummaryJson)
      .def("decision_log", [](const Fuser& fu) { return DecisionLog::ToJson(fu.f->decision_log().records(), -1); })
      .def("rules", [](const Fuser& fu) { return fu.f->rules(); })
      .def("canonical_model", [](const Fuser& fu) { return fu.f->canonical_model(); })
      .def("original_model", [](const Fuser& fu) { return fu.f->original_model(); });

  // A generation driven one step at a time from Python (models/generate.h DecodeLoop): the caches
  // stay in C++ (appended in place), each step returns the last position's logits (and computes
  // only those where the plan can: DecodeLoop::set_last_position_only).
  pyb::class_<DecodeLoop>(m, "DecodeLoop")
      .def(
          "step",
          [](DecodeLoop& loop, const std::vector<int64_t>& ids) {
            Tensor row;
            {
              pyb::gil_scoped_release release;
              row = LastPositionLogits(loop.Step(ids));
            }
            return ToNumpy(row);
          },
          pyb::arg("ids"))
      .def("reset", &DecodeLoop::Reset)
      .def_property_readonly("past_length", &DecodeLoop::past_length);

  pyb::class_<Runtime>(m, "Runtime")
      .def(pyb::init(&MakeRuntime), pyb::arg("model"), pyb::arg("use_kernels") = true,
           pyb::arg("samples") = pyb::list(), pyb::arg("threads") = 0, pyb::arg("half_weights") = false,
           pyb::arg("kernel_cache") = "", pyb::arg("prepared_kernels") = true)
      .def("run", &RunRuntime, pyb::arg("feeds"), pyb::arg("outputs") = std::vector<std::string>{})
      .def("generate", &GenerateRuntime, pyb::arg("prompt"), pyb::arg("max_new_tokens"), pyb::arg("eos_token_id") = -1)
      .def(
          "decode_loop",
          [](Runtime& rt) {
            auto loop = std::make_unique<DecodeLoop>(*rt.session);
            loop->set_last_position_only(true);  // step returns the last position's logits only
            return loop;
          },
          pyb::keep_alive<0, 1>())
      .def("kernels", &RuntimeKernels)
      .def("input_names",
           [](const Runtime& rt) {
             std::vector<std::string> n;
             for (const ValueInfo& v : rt.session->inputs()) n.push_back(v.name);
             return n;
           })
      .def("output_names", [](const Runtime& rt) {
        std::vector<std::string> n;
        for (const ValueInfo& v : rt.session->outputs()) n.push_back(v.name);
        return n;
      });

  m.def(
      "verify_precision",
      [](const Model& fused, const Model& original, const pyb::list& samples, const std::map<std::string, int64_t>& dims,
         int threads, uint32_t seed, bool half_weights, const std::string& kernel_cache) {
        VerifyOptions vo = MakeVerifyOptions(samples, dims, threads, 0, seed, half_weights, kernel_cache);
        pyb::gil_scoped_release release;
        return PrecisionJson(VerifyPrecision(fused, original, vo));
      },
      pyb::arg("fused"), pyb::arg("original"), pyb::arg("samples"), pyb::arg("dims"), pyb::arg("threads"),
      pyb::arg("seed"), pyb::arg("half_weights"), pyb::arg("kernel_cache"));
  m.def(
      "verify_performance",
      [](const Model& fused, const Model* original, const pyb::list& samples, const std::map<std::string, int64_t>& dims,
         int threads, int repeats, uint32_t seed, bool half_weights, const std::string& kernel_cache) {
        VerifyOptions vo = MakeVerifyOptions(samples, dims, threads, repeats, seed, half_weights, kernel_cache);
        vo.original = original;
        pyb::gil_scoped_release release;
        return PerformanceJson(VerifyPerformance(fused, vo));
      },
      pyb::arg("fused"), pyb::arg("original"), pyb::arg("samples"), pyb::arg("dims"), pyb::arg("threads"),
      pyb::arg("repeats"), pyb::arg("seed"), pyb::arg("half_weights"), pyb::arg("kernel_cache"));

  m.def(
      "decoder_workload",
      [](const Model& model, int prompt_len, int steps, uint32_t seed) {
        Workload w;
        {
          pyb::gil_scoped_release release;
          w = DecoderTraceWorkload(model, prompt_len, steps, seed);
        }
        pyb::list l;
        for (const Feeds& f : w.samples) l.append(FeedsToDict(f));
        return l;
      },
      pyb::arg("model"), pyb::arg("prompt_len") = 8, pyb::arg("decode_steps") = 3, pyb::arg("seed") = 0);
  m.def(
      "complete_feeds",
      [](const Model& model, const pyb::dict& given, const std::map<std::string, int64_t>& dims, uint32_t seed) {
        Feeds g = ToFeeds(given);
        Feeds f;
        {
          pyb::gil_scoped_release release;
          f = CompleteFeeds(model, g, dims, seed);
        }
        return FeedsToDict(f);
      },
      pyb::arg("model"), pyb::arg("given"), pyb::arg("dims") = std::map<std::string, int64_t>{}, pyb::arg("seed") = 0);
  m.def("kernel_target", &KernelCompiler::TargetName);
}

}  // namespace gaf::py
