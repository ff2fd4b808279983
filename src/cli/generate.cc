// `autofusion generate`: greedy decoding with the KV cache, timed.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "cli/commands.h"
#include "cli/inputs.h"
#include "codegen/fused_session.h"
#include "codegen/verify.h"
#include "codegen/half_weights.h"
#include "models/generate.h"
#include "onnx_io/onnx_io.h"
#include "ops/fused_attention.h"

namespace gaf::cli {

namespace {

using json = nlohmann::json;

struct GenerateArgs {
  std::string model;
  int prompt_len = 8;
  std::string prompt_ids;
  std::vector<std::string> inputs;  // -i input_ids=FILE: the prompt
  int max_new_tokens = 50;
  int threads = 0;
  bool reference_kernels = false;
  bool no_cache_in_place = false;
  bool no_task_team = false;
  bool no_read_ahead = false;
  bool no_shape_memo = false;
  bool half_weights = false, float32_weights = false;
  int repeat = 1;
  uint32_t seed = 0;
  int64_t eos = -1;
  bool json = false;
  bool profile = false;    // --profile: time per op type over the last generation's decode steps
  int profile_nodes = 0;   // --profile-nodes N: the N slowest nodes too
};

std::vector<int64_t> ParseIds(const std::string& s) {
  std::vector<int64_t> ids;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    try {
      size_t used = 0;
      ids.push_back(std::stoll(item, &used));
      GAF_CHECK(used == item.size(), "");
    } catch (const std::exception&) {
      throw Error(fmt::format("--prompt-ids: '{}' is not an integer", item));
    }
  }
  GAF_CHECK(!ids.empty(), "--prompt-ids: no token ids given");
  return ids;
}

void RunGenerate(const GenerateArgs& a) {
  Model m = LoadModelArg(a.model, a.inputs);
  SessionOptions so;
  so.num_threads = a.threads;
  // Fused operators run with generated kernels unless --reference-kernels; models without fused
  // operators are unaffected.
  std::shared_ptr<FusedKernelSet> kernels;
  // float16 weight storage: asked for, or recorded by `fuse --safe --half-weights` after its gate.
  const HalfWeights half = ChooseHalfWeights(m, a.half_weights, a.float32_weights, a.reference_kernels, a.json);
  bool has_fused = false;
  for (const Function& f : m.functions) has_fused |= f.domain == "ai.graph_autofusion";
  if (has_fused && !a.reference_kernels) {
    KernelCompiler compiler;
    // Kernels for what generate runs: the variants of a prefill and of decode steps, recorded on a
    // short generation of the model itself (its fused calls running their bodies), in one batch.
    // (a prompt of any length > 1 takes the same classes as the real one).
    const int trace_prompt = std::max(2, a.prompt_len);
    kernels = CompileFusedKernels(m, compiler, DecoderTraceWorkload(m, trace_prompt, 2, 0), "ai.graph_autofusion", half);
    so.function_kernels = kernels->Provider();
  }
  UseHalfWeights(so, half);
  so.cache_in_place = !a.no_cache_in_place;
  so.task_team = !a.no_task_team;
  so.read_ahead = !a.no_read_ahead;
  so.memo_shapes = !a.no_shape_memo;
  GAF_CHECK(a.profile_nodes >= 0, "generate: --profile-nodes must be at least 0, got {}", a.profile_nodes);
  so.profile = a.profile || a.profile_nodes > 0;
  Session session(m, so);
  DecoderSignature sig = DecoderSignature::Discover(session.inputs(), session.outputs());
  const int64_t vocab = DecoderVocabSize(m, sig);

  GenerateOptions opt;
  opt.max_new_tokens = a.max_new_tokens;
  opt.eos_token_id = a.eos;
  if (!a.inputs.empty()) {
    GAF_CHECK(a.prompt_ids.empty(), "-i and --prompt-ids both give the prompt; give one");
    const std::vector<Feeds> samples = ParseInputSpecs(m, a.inputs);
    GAF_CHECK(samples.size() == 1, "generate takes one prompt; -i gives {} samples", samples.size());
    for (const auto& [name, t] : samples[0])
      GAF_CHECK(name == sig.input_ids, "-i {}: generate takes only the prompt (-i {}=FILE); it makes the other inputs",
                name, sig.input_ids);
    auto it = samples[0].find(sig.input_ids);
    GAF_CHECK(it != samples[0].end(), "-i: no {} given (generate takes the prompt as -i {}=FILE)", sig.input_ids,
              sig.input_ids);
    const Tensor& ids = it->second;
    GAF_CHECK((ids.dtype() == DataType::kInt64 || ids.dtype() == DataType::kInt32) && ids.numel() > 0 && (ids.rank() == 1 || (ids.rank() == 2 && ids.dim(0) == 1)),
              "-i {}: the prompt must be integer token ids of shape [n] or [1, n], got {} {}", sig.input_ids,
              DataTypeName(ids.dtype()), ShapeToString(ids.shape()));
    for (int64_t i = 0; i < ids.numel(); ++i) opt.prompt_ids.push_back(static_cast<int64_t>(ids.DoubleAt(i)));
    for (int64_t id : opt.prompt_ids)
      GAF_CHECK(id >= 0 && id < vocab, "-i {}: token id {} is outside the vocabulary [0, {})", sig.input_ids, id, vocab);
  } else if (!a.prompt_ids.empty()) {
    opt.prompt_ids = ParseIds(a.prompt_ids);
    for (int64_t id : opt.prompt_ids)
      GAF_CHECK(id >= 0 && id < vocab, "--prompt-ids: {} is outside the vocabulary [0, {})", id, vocab);
  } else {
    GAF_CHECK(a.prompt_len > 0, "--prompt-len must be positive");
    std::mt19937 rng(a.seed);
    std::uniform_int_distribution<int64_t> dist(0, vocab - 1);
    for (int i = 0; i < a.prompt_len; ++i) opt.prompt_ids.push_back(dist(rng));
  }

  const int repeats = std::max(1, a.repeat);
  const CacheAppendCounts before = CacheAppendTotals();
  std::vector<GenerateResult> runs;
  if (repeats > 1) Generate(session, sig, opt);  // warm-up
  // With a profile, each generation forgets the totals after its prefill: what is left at the end
  // is the last generation's decode steps. Without a warm-up generation (--repeat 1), after its
  // first decode step too: that step moves every cache into storage with room, whose pages are
  // touched for the first time (on the virtual machines we run on, about 4 ms a 2 MiB page: 100 ms
  // for the bench Llama's 24 caches, which `--profile` showed as 2.7 ms a step of attention).
  int64_t memo_hits_before = 0;  // shape steps shared before the profiled decode steps
  const bool skip_first_step = so.profile && repeats == 1;
  auto reset = [&session, &memo_hits_before] {
    session.ResetProfile();
    memo_hits_before = session.shape_memo_hits();
  };
  if (so.profile) opt.after_prefill = reset;
  if (skip_first_step) opt.after_first_step = reset;
  for (int r = 0; r < repeats; ++r) runs.push_back(Generate(session, sig, opt));
  const int64_t profiled_steps =
      static_cast<int64_t>(runs.back().step_seconds.size()) - (skip_first_step && !runs.back().step_seconds.empty());
  const double shared_per_step = static_cast<double>(session.shape_memo_hits() - memo_hits_before) /
                                 static_cast<double>(std::max<int64_t>(profiled_steps, 1));
  const CacheAppendCounts after = CacheAppendTotals();
  const CacheAppendCounts appends{after.in_place - before.in_place, after.new_room - before.new_room,
                                  after.copied - before.copied};
  bool deterministic = true;
  for (const GenerateResult& r : runs) deterministic &= r.tokens == runs[0].tokens;

  // The first decode step and the slowest, beside the median: a step that pays a one-time cost
  // (the prompt's caches moved into storage with room, fresh pages faulted in) shows here.
  auto first_step = [](const GenerateResult& r) { return r.step_seconds.empty() ? 0.0 : r.step_seconds[0]; };
  auto slowest_step = [](const GenerateResult& r) {
    return r.step_seconds.empty() ? 0.0 : *std::max_element(r.step_seconds.begin(), r.step_seconds.end());
  };
  std::vector<double> prefill, step, firsts, slowests;
  for (const GenerateResult& r : runs) {
    prefill.push_back(r.prefill_seconds);
    step.push_back(r.MedianStepSeconds());
    firsts.push_back(first_step(r));
    slowests.push_back(slowest_step(r));
  }
  const double prefill_s = Median(prefill), step_s = Median(step), first_s = Median(firsts),
               slowest_s = Median(slowests);
  const double tps = step_s > 0 ? 1.0 / step_s : 0.0;
  const int threads = a.threads > 0 ? a.threads : static_cast<int>(std::thread::hardware_concurrency());
  const GenerateResult& first = runs[0];

  if (a.json) {
    json j;
    j["model"] = a.model;
    j["threads"] = threads;
    j["prompt_ids"] = opt.prompt_ids;
    j["tokens"] = first.tokens;
    j["new_tokens"] = first.tokens.size();
    j["repeats"] = repeats;
    j["prefill_ms"] = prefill_s * 1e3;
    j["decode_ms_per_token"] = step_s * 1e3;
    j["first_decode_step_ms"] = first_s * 1e3;
    j["slowest_decode_step_ms"] = slowest_s * 1e3;
    j["decode_tokens_per_second"] = tps;
    j["prefill_tokens_per_second"] = prefill_s > 0 ? static_cast<double>(opt.prompt_ids.size()) / prefill_s : 0.0;
    j["deterministic"] = deterministic;
    j["cache_in_place"] = so.cache_in_place;
    j["task_team"] = so.task_team;
    j["shape_memo"] = so.memo_shapes;
    j["read_ahead"] = so.read_ahead;
    j["cache_appends"] = {{"in_place", appends.in_place}, {"new_storage_with_room", appends.new_room},
                          {"copied", appends.copied}};
    json per_run = json::array();
    for (const GenerateResult& r : runs)
      per_run.push_back({{"prefill_ms", r.prefill_seconds * 1e3},
                         {"decode_ms_per_token", r.MedianStepSeconds() * 1e3},
                         {"first_decode_step_ms", first_step(r) * 1e3},
                         {"slowest_decode_step_ms", slowest_step(r) * 1e3},
                         {"decode_steps", r.step_seconds.size()}});
    j["runs"] = per_run;
    if (so.profile) {  // the last generation's decode steps
      json types = json::array(), nodes = json::array();
      for (const OpProfile& p : session.Profile())
        types.push_back({{"op_type", p.op_type}, {"calls", p.calls}, {"ms", p.seconds * 1e3}});
      const std::vector<OpProfile> slow = session.NodeProfile();
      for (size_t i = 0; i < slow.size() && i < static_cast<size_t>(a.profile_nodes); ++i)
        nodes.push_back({{"node", slow[i].node}, {"op_type", slow[i].op_type}, {"calls", slow[i].calls},
                         {"ms", slow[i].seconds * 1e3}});
      j["profile"] = {{"decode_steps", profiled_steps},
                      {"op_types", types},
                      {"nodes", nodes},
                      {"shape_steps_shared_per_step", shared_per_step}};
    }
    fmt::print("{}\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
    return;
  }
  fmt::print("model    {} ({} cache tensors, vocab {}, {} thread(s))\n", a.model, sig.cache.size(), vocab, threads);
  fmt::print("prompt   {} tokens: [{}]\n", opt.prompt_ids.size(), fmt::join(opt.prompt_ids, ", "));
  fmt::print("tokens   {} new: [{}]\n", first.tokens.size(), fmt::join(first.tokens, ", "));
  fmt::print("prefill  {:.3f} ms ({} tokens)\n", prefill_s * 1e3, opt.prompt_ids.size());
  if (!first.step_seconds.empty())
    fmt::print("decode   {:.3f} ms/token (median of {} steps), {:.1f} tokens/s; the first step {:.3f} ms, the slowest "
               "{:.3f} ms\n",
               step_s * 1e3, first.step_seconds.size(), tps, first_s * 1e3, slowest_s * 1e3);
  if (appends.total() == 0)
    fmt::print("kv cache no decode step ran the attention as one node: each present is made by the model's own "
               "operators (a copy a step)\n");
  else
    fmt::print("kv cache of {} present caches the decode steps' attention made: {} appended in place, {} moved into new "
               "storage with room, {} copied{}\n",
               appends.total(), appends.in_place, appends.new_room, appends.copied,
               so.cache_in_place ? "" : " (--no-cache-in-place)");
  if (repeats > 1)
    fmt::print("timings are medians over {} generations after one warm-up{}\n", repeats,
               deterministic ? "" : " (WARNING: the generated tokens differed between runs)");
  else
    fmt::print("(one cold run: the prefill includes one-time setup; use --repeat R for steady-state timings)\n");
  if (so.profile) {
    const std::string what =
        fmt::format("the last generation's {} decode steps{}", profiled_steps,
                    skip_first_step ? " after its first (one-time set-up: --repeat R profiles warm generations)" : "");
    fmt::print("time per op type ({}; calls and ms a step):\n", what);
    const double steps = static_cast<double>(std::max<int64_t>(profiled_steps, 1));
    for (const OpProfile& p : session.Profile())
      fmt::print("  {:<24} {:>8.1f} calls {:>10.3f} ms\n", p.op_type, static_cast<double>(p.calls) / steps,
                 p.seconds * 1e3 / steps);
    if (a.profile_nodes > 0) PrintSlowestNodes(session, a.profile_nodes, what);
    fmt::print("shape steps that took the outputs of an earlier one with the same operator and inputs (a layer's "
               "shapes): {:.1f} a step{}\n",
               shared_per_step, so.memo_shapes ? "" : " (--no-shape-memo)");
    fmt::print("(each node timed: the profiled steps run a little slower than unprofiled ones)\n");
  }
  if (kernels) fmt::print("fused operators (generated kernels):\n{}", DescribeFusedKernels(*kernels));
  else if (has_fused) fmt::print("fused operators run through their function bodies (--reference-kernels)\n");
}

}  // namespace

void AddGenerateCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("generate", "Greedy decoding with the KV cache on an Optimum-layout decoder, timed");
  auto a = std::make_shared<GenerateArgs>();
  cmd->add_option("model", a->model, "ONNX decoder (input_ids, attention_mask, past_key_values.* -> logits, present.*)")
      ->required();
  cmd->add_option("--prompt-len", a->prompt_len, "random prompt of N tokens (seeded)")->capture_default_str();
  cmd->add_option("--prompt-ids", a->prompt_ids, "prompt token ids, comma separated (overrides --prompt-len)");
  cmd->add_option("-i,--input", a->inputs, "input_ids=FILE.npy|FILE.pb: the prompt, token ids [n] or [1, n]");
  cmd->add_option("--max-new-tokens,-n", a->max_new_tokens, "tokens to generate")->capture_default_str();
  cmd->add_option("--threads", a->threads, "threads (default: all cores)");
  cmd->add_option("--repeat", a->repeat, "repeat the generation R times after one warm-up; report medians");
  cmd->add_option("--seed", a->seed, "seed of the random prompt")->capture_default_str();
  cmd->add_option("--eos", a->eos, "stop after generating this token id");
  cmd->add_flag("--json", a->json, "machine-readable output");
  cmd->add_flag("--profile", a->profile, "time per op type over the last generation's decode steps (ms a step)");
  cmd->add_option("--profile-nodes", a->profile_nodes,
                  "--profile, and the N slowest nodes of those steps (rewritten nodes under their plan names)");
  cmd->add_flag("--no-cache-in-place", a->no_cache_in_place,
                "copy each step's key/value cache into a new present tensor instead of appending the new rows in "
                "place (for comparison)");
  cmd->add_flag("--no-task-team", a->no_task_team,
                "open a parallel region per product in decode steps instead of holding the threads for the whole "
                "step (for comparison)");
  cmd->add_flag("--no-read-ahead", a->no_read_ahead,
                "in decode steps, let the threads with no task left in a weight product wait instead of prefetching "
                "what they read first in the next one (for comparison)");
  cmd->add_flag("--no-shape-memo", a->no_shape_memo,
                "run every shape step of a decode step, instead of taking the outputs of an earlier one with the same "
                "operator and inputs in the same step (a decoder's layers compute the same shapes; for comparison)");
  cmd->add_flag("--half-weights", a->half_weights,
                "float16 storage of constant MatMul weights (half the bytes; changes numerics slightly)");
  cmd->add_flag("--float32-weights", a->float32_weights,
                "keep float32 weights even when the model records float16 storage (fuse --safe --half-weights)");
  cmd->add_flag("--reference-kernels", a->reference_kernels,
                "run fused operators through their function bodies instead of generated kernels");
  cmd->callback([a] { RunGenerate(*a); });
}

}  // namespace gaf::cli
