// `autofusion info`, `run`, `dump`, `check`.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>

#include "cli/commands.h"
#include "cli/inputs.h"
#include "cost/workload.h"
#include "onnx_io/npy.h"
#include "onnx_io/onnx_io.h"
#include "ir/output_file.h"
#include "codegen/fused_session.h"
#include "codegen/half_weights.h"
#include "ops/blocked_chain.h"
#include "runtime/session.h"

namespace gaf::cli {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

void PrintChainSteps();

std::string DomainName(const std::string& d) { return d.empty() ? "ai.onnx" : d; }

void CountOps(const Graph& g, std::map<std::string, int>& hist, int64_t& nodes) {
  for (const Node& n : g.nodes) {
    hist[n.domain.empty() ? n.op_type : n.domain + "." + n.op_type]++;
    nodes++;
    for (const Attribute& a : n.attributes) {
      if (a.g) CountOps(*a.g, hist, nodes);
      for (const auto& sg : a.graphs) CountOps(*sg, hist, nodes);
    }
  }
}

json ValueInfoJson(const ValueInfo& v) {
  json j{{"name", v.name}, {"type", v.non_tensor_type.empty() ? DataTypeName(v.dtype) : v.non_tensor_type}};
  if (v.has_shape) {
    json dims = json::array();
    for (const Dim& d : v.dims) {
      if (d.known()) dims.push_back(d.value);
      else dims.push_back(d.param.empty() ? "?" : d.param);
    }
    j["shape"] = dims;
  } else {
    j["shape"] = nullptr;
  }
  return j;
}

std::string HumanBytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB"};
  int u = 0;
  while (b >= 1024 && u < 3) {
    b /= 1024;
    ++u;
  }
  return fmt::format("{:.1f} {}", b, units[u]);
}

void RunInfo(const std::string& path, const std::vector<std::string>& input_specs, bool as_json) {
  Model m = LoadModelArg(path, input_specs);
  if (!IsTorchScriptFile(path)) ParseInputSpecs(m, input_specs);  // -i of an ONNX model: checked only
  std::map<std::string, int> hist;
  int64_t nodes = 0;
  CountOps(m.graph, hist, nodes);
  int64_t params = 0, bytes = 0;
  for (const auto& [n, t] : m.graph.initializers) {
    params += t.numel();
    bytes += static_cast<int64_t>(t.nbytes());
  }
  std::set<std::string> init_names;
  for (const auto& [n, t] : m.graph.initializers) init_names.insert(n);
  std::vector<const ValueInfo*> inputs;
  for (const ValueInfo& v : m.graph.inputs)
    if (!init_names.count(v.name)) inputs.push_back(&v);
  std::vector<std::pair<int, std::string>> ops;
  for (const auto& [k, v] : hist) ops.emplace_back(v, k);
  std::sort(ops.begin(), ops.end(), [](const auto& a, const auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
  std::vector<std::string> unsupported;
  for (const auto& [k, v] : hist) {
    auto dot = k.rfind('.');
    std::string dom = dot == std::string::npos ? "" : k.substr(0, dot);
    std::string op = dot == std::string::npos ? k : k.substr(dot + 1);
    if (!OpRegistry::Global().Find(dom, op) && !m.FindFunction(dom, op)) unsupported.push_back(k);
  }
  if (as_json) {
    json j;
    j["file"] = path;
    j["ir_version"] = m.ir_version;
    j["producer"] = m.producer_name + (m.producer_version.empty() ? "" : " " + m.producer_version);
    json opsets = json::object();
    for (const OpsetImport& o : m.opset_imports) opsets[DomainName(o.domain)] = o.version;
    j["opsets"] = opsets;
    j["inputs"] = json::array();
    for (const ValueInfo* v : inputs) j["inputs"].push_back(ValueInfoJson(*v));
    j["outputs"] = json::array();
    for (const ValueInfo& v : m.graph.outputs) j["outputs"].push_back(ValueInfoJson(v));
    j["nodes"] = nodes;
    json hj = json::object();
    for (const auto& [c, k] : ops) hj[k] = c;
    j["op_histogram"] = hj;
    j["parameters"] = params;
    j["parameter_bytes"] = bytes;
    j["initializers"] = m.graph.initializers.size();
    j["functions"] = m.functions.size();
    j["unsupported_ops"] = unsupported;
    json md = json::object();
    for (const auto& [k, v] : m.metadata_props) md[k] = v;
    j["metadata"] = md;
    fmt::print("{}\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
    return;
  }
  fmt::print("model      {}\n", path);
  fmt::print("ir_version {}   producer {} {}\n", m.ir_version, m.producer_name.empty() ? "-" : m.producer_name,
             m.producer_version);
  std::vector<std::string> os;
  for (const OpsetImport& o : m.opset_imports) os.push_back(fmt::format("{} {}", DomainName(o.domain), o.version));
  fmt::print("opsets     {}\n", fmt::join(os, ", "));
  fmt::print("inputs\n");
  for (const ValueInfo* v : inputs)
    fmt::print("  {:<32} {} {}\n", v->name, v->non_tensor_type.empty() ? DataTypeName(v->dtype) : v->non_tensor_type,
               v->has_shape ? DimsToString(v->dims) : "[*]");
  fmt::print("outputs\n");
  for (const ValueInfo& v : m.graph.outputs)
    fmt::print("  {:<32} {} {}\n", v.name, v.non_tensor_type.empty() ? DataTypeName(v.dtype) : v.non_tensor_type,
               v.has_shape ? DimsToString(v.dims) : "[*]");
  fmt::print("parameters {} in {} initializers ({})\n", params, m.graph.initializers.size(), HumanBytes(bytes));
  fmt::print("nodes      {} ({} op types){}\n", nodes, hist.size(),
             m.functions.empty() ? "" : fmt::format(", {} model-local functions", m.functions.size()));
  for (const auto& [c, k] : ops) fmt::print("  {:>6}  {}\n", c, k);
  if (!unsupported.empty())
    fmt::print("unsupported by the runtime: {}\n", fmt::join(unsupported, ", "));
  for (const auto& [k, v] : m.metadata_props) fmt::print("metadata   {} = {}\n", k, v);
}

// ---- run ----

// min, max, mean over the finite values and the first six, read in place (outputs can be large).
struct OutputStats {
  double min = 0, max = 0, sum = 0;
  int64_t finite = 0, nonfinite = 0;
};

OutputStats Stats(const Tensor& t) {
  OutputStats st;
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double x = t.DoubleAt(i);
    if (!std::isfinite(x)) {
      ++st.nonfinite;
      continue;
    }
    st.min = st.finite ? std::min(st.min, x) : x;
    st.max = st.finite ? std::max(st.max, x) : x;
    st.sum += x;
    ++st.finite;
  }
  return st;
}

std::string Summarize(const Tensor& t) {
  std::string s = fmt::format("{}{}", DataTypeName(t.dtype()), ShapeToString(t.shape()));
  if (t.numel() == 0 || t.dtype() == DataType::kString) return s;
  const OutputStats st = Stats(t);
  std::vector<std::string> head;
  for (int64_t i = 0; i < std::min<int64_t>(t.numel(), 6); ++i) head.push_back(fmt::format("{:.6g}", t.DoubleAt(i)));
  s += fmt::format("  min {:.6g}  max {:.6g}  mean {:.6g}  first [{}{}]", st.min, st.max,
                   st.finite ? st.sum / static_cast<double>(st.finite) : 0.0, fmt::join(head, ", "),
                   t.numel() > 6 ? ", ..." : "");
  if (st.nonfinite) s += fmt::format("  ({} non-finite)", st.nonfinite);
  return s;
}

struct RunArgs {
  std::string model;
  std::vector<std::string> inputs;
  std::vector<std::string> dims;
  std::string output_dir;
  int threads = 0;
  int repeat = 1;
  int warmup = 0;
  int profile_nodes = 0;  // --profile-nodes N: the N slowest nodes too
  unsigned seed = 0;
  bool json = false;
  bool profile = false, no_prepared = false, reference_kernels = false, no_rewrites = false, no_memory_plan = false;
  bool half_weights = false, float32_weights = false;
};

}  // namespace

void PrintSlowestNodes(const Session& session, int count, const std::string& what) {
  const std::vector<OpProfile> nodes = session.NodeProfile();
  const size_t shown = std::min(nodes.size(), static_cast<size_t>(std::max(count, 0)));
  fmt::print("the {} slowest of {} nodes ({}; ms a call, then of all calls):\n", shown, nodes.size(), what);
  for (size_t i = 0; i < shown; ++i) {
    const OpProfile& p = nodes[i];
    fmt::print("  {:>9.3f} {:>10.3f}  {} ({}, {} calls)\n", p.seconds * 1e3 / std::max<int64_t>(p.calls, 1),
               p.seconds * 1e3, p.node, p.op_type, p.calls);
  }
}

namespace {

void RunRun(const RunArgs& a) {
  if (!a.output_dir.empty()) CheckOutputDir(a.output_dir, "-o");
  Model m = LoadModelArg(a.model, a.inputs);
  SessionOptions so;
  so.num_threads = a.threads;
  so.profile = a.profile || a.profile_nodes > 0;
  so.prepared_kernels = !a.no_prepared;
  so.rewrite_products = !a.no_rewrites;
  so.memory_plan = !a.no_memory_plan;
  // Fused operators run with their generated kernels (compiled once, cached), as in generate;
  // --reference-kernels runs their function bodies instead. `--profile` then lists each fused
  // function as one op type.
  std::shared_ptr<FusedKernelSet> kernels;
  bool has_fused = false;
  for (const Function& f : m.functions) has_fused |= f.domain == "ai.graph_autofusion";
  // One sample: the -i inputs, the rest made to match them (symbolic dims bound consistently,
  // valid token ids, positions and masks; cost/workload.h).
  const std::map<std::string, int64_t> dim_values = ParseDimBindings(a.dims);
  Workload w = LoadWorkload(m, a.inputs, dim_values, a.seed, /*allow_random=*/true);
  GAF_CHECK(w.samples.size() <= 1, "run takes one sample; -i gives {} (one test_data_set folder at most)",
            w.samples.size());
  if (w.empty()) {
    try {
      w.samples.push_back(CompleteFeeds(m, {}, dim_values, a.seed));
    } catch (const UnsupportedError&) {
      throw;
    } catch (const Error& e) {
      throw Error(fmt::format("{}: {}", a.model, e.what()));
    }
  }
  const Feeds& feeds = w.samples[0];
  // float16 weight storage as generate runs it: asked for, or recorded by `fuse --safe
  // --half-weights` after its gate (--float32-weights keeps float32).
  const HalfWeights half = ChooseHalfWeights(m, a.half_weights, a.float32_weights, a.reference_kernels, a.json);
  if (has_fused && !a.reference_kernels) {
    KernelCompiler compiler;
    kernels = CompileFusedKernels(m, compiler, w, "ai.graph_autofusion", half);
    so.function_kernels = kernels->Provider();
  }
  UseHalfWeights(so, half);
  Session session(m, so);
  std::vector<double> times;
  std::vector<Tensor> outs;
  // Warm-up runs (untimed, not profiled): the first run of a session also packs constant weights
  // for the prepared kernels, creates library primitives and touches fresh memory.
  GAF_CHECK(a.warmup >= 0, "run: --warmup must be at least 0, got {}", a.warmup);
  GAF_CHECK(a.profile_nodes >= 0, "run: --profile-nodes must be at least 0, got {}", a.profile_nodes);
  for (int r = 0; r < a.warmup; ++r) session.Run(feeds);
  // After warm-up runs, the memory plan is made over the next runs: one records the buffers, the
  // next places them in a new arena whose pages it touches for the first time (on the virtual
  // machines we run on, about 4 ms a 2 MiB page; `--profile` showed it as a 1-4 ms Gather or
  // Transpose). Those run untimed too, until a run makes no new plan or arena (at most
  // kPlanWarmupRuns), so the timed runs and the profile are the steady state.
  constexpr int kPlanWarmupRuns = 4;
  int plan_warmup = 0;
  if (a.warmup > 0 && so.memory_plan) {
    MemoryPlanStats before = session.memory_plan_stats();
    while (plan_warmup < kPlanWarmupRuns && !before.stopped) {
      session.Run(feeds);
      ++plan_warmup;
      const MemoryPlanStats now = session.memory_plan_stats();
      if (now.arenas > 0 && now.plans == before.plans && now.arenas == before.arenas) break;
      before = now;
    }
  }
  if (a.warmup > 0) session.ResetProfile();
  // The oneDNN chains' steps are timed in the same runs (listed after the fused kernels).
  if (a.profile) BlockedChain::SetStepProfiling(true);
  for (int r = 0; r < std::max(1, a.repeat); ++r) {
    // The last run's outputs go back first, as in a loop that uses each run's outputs before the
    // next: held, every other run's large outputs would come from fresh memory (a 256-token
    // prompt's 32.8 MB of logits took 10 ms more in page faults).
    outs.clear();
    auto t0 = std::chrono::steady_clock::now();
    outs = session.Run(feeds);
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  BlockedChain::SetStepProfiling(false);
  std::vector<double> sorted = times;
  std::sort(sorted.begin(), sorted.end());
  double median = sorted[sorted.size() / 2];
  std::vector<std::string> written;  // "name -> file" where the file name differs from the output's
  if (!a.output_dir.empty()) {
    fs::create_directories(a.output_dir);
    std::set<std::string> taken;
    for (size_t i = 0; i < outs.size(); ++i) {
      const std::string& name = session.outputs()[i].name;
      const std::string fname = DistinctFileName(name, taken) + ".npy";
      SaveNpy(outs[i], (fs::path(a.output_dir) / fname).string());
      if (fname != name + ".npy") written.push_back(fmt::format("{} -> {}", name, fname));
    }
  }
  if (a.json) {
    json j;
    j["model"] = a.model;
    j["runs"] = times.size();
    j["warmup_runs"] = a.warmup;
    j["memory_plan_warmup_runs"] = plan_warmup;  // more untimed runs while the memory plan was made
    j["median_seconds"] = median;
    j["run_seconds"] = times;  // each timed run's, in order
    j["outputs"] = json::array();
    for (size_t i = 0; i < outs.size(); ++i) {
      json o{{"name", session.outputs()[i].name}, {"type", DataTypeName(outs[i].dtype())}, {"shape", outs[i].shape()}};
      if (outs[i].numel() > 0 && outs[i].dtype() != DataType::kString) {
        const OutputStats st = Stats(outs[i]);
        if (st.finite) {
          o["min"] = st.min;
          o["max"] = st.max;
        }
        if (st.nonfinite) o["non_finite"] = st.nonfinite;
      }
      j["outputs"].push_back(o);
    }
    fmt::print("{}\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
    return;
  }
  fmt::print("ran {} in {:.3f} ms (median of {} run{}{}, {} thread(s))\n", a.model, median * 1e3, times.size(),
             times.size() == 1 ? "" : "s",
             a.warmup > 0 ? fmt::format(" after {} warm-up run{}{}", a.warmup, a.warmup == 1 ? "" : "s",
                                        plan_warmup > 0
                                            ? fmt::format(" and {} while the memory plan was made", plan_warmup)
                                            : "")
                          : "",
             a.threads > 0 ? a.threads : static_cast<int>(std::thread::hardware_concurrency()));
  for (size_t i = 0; i < outs.size(); ++i) fmt::print("  {:<24} {}\n", session.outputs()[i].name, Summarize(outs[i]));
  if (!a.output_dir.empty()) {
    fmt::print("outputs written to {}/ as .npy\n", a.output_dir);
    for (const std::string& w : written) fmt::print("  {}\n", w);
  }
  if (a.profile || a.profile_nodes > 0) {
    fmt::print("time per op type ({}):\n", a.warmup > 0 ? "the timed runs" : "all runs");
    for (const OpProfile& p : session.Profile())
      fmt::print("  {:<24} {:>8} calls {:>10.3f} ms\n", p.op_type, p.calls, p.seconds * 1e3);
    if (a.profile_nodes > 0) PrintSlowestNodes(session, a.profile_nodes, a.warmup > 0 ? "the timed runs" : "all runs");
    const ProductRewrites& r = session.product_rewrites();
    fmt::print("plan rewrites (--no-plan-rewrites turns them off): {} products read a transposed operand in place, {} "
               "a repeated KV cache once per cache head, {} making the present cache in the same pass, {} "
               "sibling products in {} passes, {} data-movement operators in {} single copies, {} Softmax nodes with "
               "their scale and mask in one pass ({} of them with their products as one attention node, {} writing its "
               "output with the heads and query rows swapped), {} SiLU(gate) * "
               "up and {} SiLU in one pass ({} of the gates inside their gate and up products' tasks), {} products with "
               "the Add of their result inside their tasks ({} with the RMSNorm of it), {} RMSNorms "
               "and {} rotary embeddings in one pass ({} reading their input's Transpose in place), {} elementwise operators "
               "in {} one-pass chains, {} output product(s) for the last position only in generations\n",
               r.transposed, r.kv_grouped, r.appended, r.siblings, r.sibling_groups, r.copies, r.copy_groups,
               r.softmax_epilogues, r.attention_blocks, r.attention_transposed, r.silu_gates, r.silus, r.gated_products, r.residual_products, r.residual_norms, r.rms_norms,
               r.rotaries, r.rotaries_transposed, r.chained_operators, r.elementwise_chains, r.last_positions);
    for (const std::string& n : r.notes) fmt::print("  {}\n", n);
    fmt::print("{}\n", DescribeMemoryPlan(session.memory_plan_stats()));
    fmt::print("task team: the last run {}\n",
               session.last_run_had_team()
                   ? "was led by a team of threads held for the whole run (its products took at most 4 rows)"
                   : "opened a parallel region per parallel node (a team leads runs whose products took at most 4 "
                     "rows in the last run of the same shapes)");
    if (kernels) fmt::print("fused kernels:\n{}", DescribeFusedKernels(*kernels));
    PrintChainSteps();
  }
}

// The slowest steps of the oneDNN chains timed by `run --profile` (each chain is one node in the
// per-op-type table): a step's milliseconds a call and its share of all chain steps' time.
void PrintChainSteps() {
  constexpr size_t kShown = 15;
  const std::vector<BlockedChain::StepTime> all = BlockedChain::StepProfile(SIZE_MAX);
  if (all.empty()) return;
  double total = 0;
  for (const auto& t : all) total += t.seconds;
  fmt::print("slowest steps of the oneDNN chains ({} of {}; the timed runs, ms a call, share of the chains' time):\n",
             std::min(kShown, all.size()), all.size());
  for (size_t i = 0; i < all.size() && i < kShown; ++i)
    fmt::print("  {:>8.3f} ms {:>5.1f}%  {}\n", all[i].seconds * 1e3 / static_cast<double>(std::max<int64_t>(1, all[i].calls)),
               total > 0 ? 100.0 * all[i].seconds / total : 0.0, all[i].step);
  // Where the chains' time goes by kind of step: the primitive's kind (the first word in brackets:
  // convolution, eltwise, pooling, concat, reorder, ...) or the step's operator.
  std::map<std::string, std::pair<double, int>> kinds;
  for (const auto& t : all) {
    std::string kind;
    const size_t b = t.step.find('[');
    if (b != std::string::npos) kind = t.step.substr(b + 1, t.step.find_first_of(" ]", b + 1) - b - 1);
    if (kind.empty()) {
      const size_t o = t.step.find(" ("), c = t.step.find(')', o == std::string::npos ? 0 : o);
      kind = o != std::string::npos && c != std::string::npos ? t.step.substr(o + 2, c - o - 2) : "other";
    }
    kinds[kind].first += t.seconds;
    kinds[kind].second += 1;
  }
  std::vector<std::pair<std::string, std::pair<double, int>>> by(kinds.begin(), kinds.end());
  std::sort(by.begin(), by.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  std::string line;
  for (const auto& [k, v] : by)
    line += fmt::format("{}{} {:.1f}% ({} steps)", line.empty() ? "" : ", ", k,
                        total > 0 ? 100.0 * v.first / total : 0.0, v.second);
  fmt::print("  by kind of step: {}\n", line);
}

}  // namespace

void AddInfoCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "Show a model's opsets, inputs, outputs, op histogram and parameters");
  auto path = std::make_shared<std::string>();
  auto as_json = std::make_shared<bool>(false);
  auto inputs = std::make_shared<std::vector<std::string>>();
  cmd->add_option("model", *path, "ONNX model file, or a TorchScript file (with -i)")->required();
  cmd->add_option("-i,--input", *inputs, kTorchScriptInputHelp);
  cmd->add_flag("--json", *as_json, "machine-readable output");
  cmd->callback([path, inputs, as_json] { RunInfo(*path, *inputs, *as_json); });
}

void AddRunCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("run", "Run a model on given or random inputs and summarize its outputs");
  auto a = std::make_shared<RunArgs>();
  cmd->add_option("model", a->model, "ONNX model file, or a TorchScript file (with -i)")->required();
  cmd->add_option("--input,-i", a->inputs,
                  "NAME=FILE.npy|FILE.pb|random, or a test_data_set_N folder; inputs not given are made to match "
                  "(symbolic dims bound consistently)");
  cmd->add_option("--dim", a->dims, "NAME=VALUE for a symbolic dimension of made inputs (default: bound consistently)");
  cmd->add_option("--output-dir,-o", a->output_dir, "write each output as NAME.npy");
  cmd->add_option("--threads", a->threads, "threads (default: all cores)");
  cmd->add_option("--repeat", a->repeat, "run N times and report the median time");
  cmd->add_option("--warmup", a->warmup,
                  "run N times first, untimed and not profiled (the first run packs weights and creates primitives); "
                  "with N > 0, then until the memory plan is made (at most 4 more runs, reported)");
  cmd->add_option("--seed", a->seed, "seed of random inputs");
  cmd->add_flag("--profile", a->profile, "time per op type");
  cmd->add_option("--profile-nodes", a->profile_nodes,
                  "time per op type, and the N slowest nodes of the plan (rewritten nodes under their plan names)");
  cmd->add_flag("--no-prepared-kernels", a->no_prepared,
                "run every Conv and MatMul through the registry's kernel (none prepared for its constant weight)");
  cmd->add_flag("--no-plan-rewrites", a->no_rewrites,
                "run MatMuls as written (no products reading a KV cache or transposed operand in place, no sibling "
                "products in one pass)");
  cmd->add_flag("--no-memory-plan", a->no_memory_plan,
                "tensor buffers from the allocator's size-class pool only (no static memory plan by liveness)");
  cmd->add_flag("--reference-kernels", a->reference_kernels,
                "run fused operators through their function bodies instead of generated kernels");
  cmd->add_flag("--half-weights", a->half_weights,
                "float16 storage of constant MatMul weights for every product, prompts too (half the bytes; changes "
                "numerics slightly)");
  cmd->add_flag("--float32-weights", a->float32_weights,
                "keep float32 weights even when the model records float16 storage (fuse --safe --half-weights)");
  cmd->add_flag("--json", a->json, "machine-readable output");
  cmd->callback([a] { RunRun(*a); });
}

void AddDumpCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("dump", "Print the model's graph as readable text");
  auto path = std::make_shared<std::string>();
  auto inputs = std::make_shared<std::vector<std::string>>();
  cmd->add_option("model", *path, "ONNX model file, or a TorchScript file (with -i)")->required();
  cmd->add_option("-i,--input", *inputs, kTorchScriptInputHelp);
  cmd->callback([path, inputs] { fmt::print("{}", DumpModel(LoadModelArg(*path, *inputs))); });
}

void AddCheckCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("check", "Run the ONNX checker and our verifier on a model");
  auto path = std::make_shared<std::string>();
  auto inputs = std::make_shared<std::vector<std::string>>();
  cmd->add_option("model", *path, "ONNX model file, or a TorchScript file (with -i)")->required();
  cmd->add_option("-i,--input", *inputs, kTorchScriptInputHelp);
  cmd->callback([path, inputs] {
    Model m = LoadModelArg(*path, *inputs);
    if (const std::string scope = CheckerScope(m); !scope.empty()) {
      fmt::print("{}: graph verifier passed; ONNX checker not run: {}\n", *path, scope);
      return;
    }
    std::string msg = CheckModel(m);
    GAF_CHECK(msg.empty(), "{}: ONNX checker: {}", *path, msg);
    fmt::print("{}: valid (ONNX checker and graph verifier passed)\n", *path);
  });
}

}  // namespace gaf::cli
