#include "models/generate.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <chrono>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <utility>

#include "codegen/half_weights.h"
#include "cost/workload.h"
#include "ir/error.h"

namespace gaf {

namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// The layer index (first run of digits) and kind ("key", "value" or "") of a cache name, looking
// only after the digits so that "past_key_values.3.value" is (3, "value").
std::optional<std::pair<int64_t, std::string>> ParseCacheName(const std::string& name) {
  size_t i = 0;
  while (i < name.size() && !std::isdigit(static_cast<unsigned char>(name[i]))) ++i;
  if (i == name.size()) return std::nullopt;
  size_t j = i;
  while (j < name.size() && std::isdigit(static_cast<unsigned char>(name[j]))) ++j;
  const int64_t layer = std::stoll(name.substr(i, j - i));
  const std::string rest = Lower(name.substr(j));
  std::string kind;
  if (rest.find("key") != std::string::npos) kind = "key";
  else if (rest.find("value") != std::string::npos) kind = "value";
  return std::make_pair(layer, kind);
}

const ValueInfo* FindByName(const std::vector<ValueInfo>& values, const std::string& want) {
  for (const ValueInfo& v : values)
    if (v.name == want) return &v;
  for (const ValueInfo& v : values)
    if (Lower(v.name).find(want) != std::string::npos) return &v;
  return nullptr;
}

// Tensor of the type the model declares for `name` (int64 when it declares none): integer ids,
// and masks or positions that some exports declare float (a GPT-2 export's attention_mask) or
// int32.
Tensor IntTensor(const ValueInfo* info, const Shape& shape, const std::vector<int64_t>& values) {
  Tensor t(DataType::kInt64, shape);
  for (size_t i = 0; i < values.size(); ++i) t.data<int64_t>()[i] = values[i];
  const DataType dt = info != nullptr && info->dtype != DataType::kUndefined ? info->dtype : DataType::kInt64;
  return dt == DataType::kInt64 ? t : t.CastTo(dt);
}

// An empty cache tensor: the sequence dim 0, batch dims 1, other dims as declared. The sequence
// dim is the only symbolic non-batch dim, or the one whose name mentions "past" or "seq".
Tensor EmptyPast(const ValueInfo& v) {
  GAF_CHECK(v.has_shape, "cache input '{}' has no declared shape; cannot make an empty past for it", v.name);
  Shape shape;
  std::vector<size_t> unknown, seq_like;
  for (size_t i = 0; i < v.dims.size(); ++i) {
    const Dim& d = v.dims[i];
    const std::string p = Lower(d.param);
    shape.push_back(d.known() ? d.value : 1);
    if (d.known() || p.find("batch") != std::string::npos) continue;
    unknown.push_back(i);
    if (p.find("past") != std::string::npos || p.find("seq") != std::string::npos) seq_like.push_back(i);
  }
  if (unknown.size() == 1) {
    shape[unknown[0]] = 0;
  } else {
    GAF_CHECK(seq_like.size() == 1, "cache input '{}' {}: cannot tell which dimension is the sequence", v.name,
              DimsToString(v.dims));
    shape[seq_like[0]] = 0;
  }
  DataType dt = v.dtype == DataType::kUndefined ? DataType::kFloat : v.dtype;
  return Tensor(dt, shape);
}

const ValueInfo* InfoOf(const Session& s, const std::string& name) {
  for (const ValueInfo& v : s.inputs())
    if (v.name == name) return &v;
  return nullptr;
}

// Feeds for one forward pass: `ids` at positions past_len.., mask over past_len + ids.size().
void SetTokenFeeds(const Session& s, const DecoderSignature& sig, const std::vector<int64_t>& ids, int64_t past_len,
                   std::map<std::string, Tensor>& feeds) {
  const int64_t n = static_cast<int64_t>(ids.size());
  feeds[sig.input_ids] = IntTensor(InfoOf(s, sig.input_ids), {1, n}, ids);
  if (!sig.attention_mask.empty())
    feeds[sig.attention_mask] =
        IntTensor(InfoOf(s, sig.attention_mask), {1, past_len + n}, std::vector<int64_t>(past_len + n, 1));
  if (!sig.position_ids.empty()) {
    std::vector<int64_t> pos(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) pos[i] = past_len + i;
    feeds[sig.position_ids] = IntTensor(InfoOf(s, sig.position_ids), {1, n}, pos);
  }
  if (!sig.use_cache_branch.empty()) {
    Tensor b(DataType::kBool, {1});
    b.data<bool>()[0] = past_len > 0;
    feeds[sig.use_cache_branch] = b;
  }
}

std::vector<std::string> OutputNames(const DecoderSignature& sig) {
  std::vector<std::string> names{sig.logits};
  for (const auto& [past, present] : sig.cache) names.push_back(present);
  return names;
}

}  // namespace

DecoderSignature DecoderSignature::Discover(const std::vector<ValueInfo>& inputs,
                                            const std::vector<ValueInfo>& outputs) {
  DecoderSignature sig;
  const ValueInfo* ids = FindByName(inputs, "input_ids");
  GAF_CHECK(ids != nullptr, "the model has no input_ids input; not a decoder in the Optimum layout");
  sig.input_ids = ids->name;
  if (const ValueInfo* v = FindByName(inputs, "attention_mask")) sig.attention_mask = v->name;
  if (const ValueInfo* v = FindByName(inputs, "position_ids")) sig.position_ids = v->name;
  if (const ValueInfo* v = FindByName(inputs, "use_cache_branch")) sig.use_cache_branch = v->name;
  const ValueInfo* logits = FindByName(outputs, "logits");
  GAF_CHECK(logits != nullptr, "the model has no logits output");
  sig.logits = logits->name;

  std::map<std::pair<int64_t, std::string>, std::string> presents;
  for (const ValueInfo& v : outputs) {
    if (Lower(v.name).find("present") == std::string::npos) continue;
    if (auto key = ParseCacheName(v.name)) presents[*key] = v.name;
  }
  for (const ValueInfo& v : inputs) {
    if (Lower(v.name).rfind("past", 0) != 0) continue;
    auto key = ParseCacheName(v.name);
    GAF_CHECK(key.has_value(), "cache input '{}' names no layer index", v.name);
    auto it = presents.find(*key);
    GAF_CHECK(it != presents.end(), "cache input '{}' has no matching present output (layer {}{})", v.name,
              key->first, key->second.empty() ? "" : ", " + key->second);
    sig.cache.emplace_back(v.name, it->second);
  }
  return sig;
}

double GenerateResult::MedianStepSeconds() const {
  if (step_seconds.empty()) return 0;
  std::vector<double> s = step_seconds;
  std::nth_element(s.begin(), s.begin() + static_cast<long>(s.size() / 2), s.end());
  return s[s.size() / 2];
}

double GenerateResult::DecodeTokensPerSecond() const {
  const double m = MedianStepSeconds();
  return m > 0 ? 1.0 / m : 0.0;
}

namespace {

// The last position's row of logits [batch, seq, vocab] or [batch, vocab] for batch row 0: where it
// starts and its length; `f` holds the logits as float32 (a converted copy for other types).
std::pair<const float*, int64_t> LastRow(const Tensor& logits, Tensor& f) {
  GAF_CHECK(logits.rank() == 2 || logits.rank() == 3, "logits must be [batch, seq, vocab] or [batch, vocab], got {}",
            ShapeToString(logits.shape()));
  const int64_t vocab = logits.dim(-1);
  GAF_CHECK(vocab > 0 && logits.numel() > 0, "logits {} are empty", ShapeToString(logits.shape()));
  const int64_t offset = logits.rank() == 3 ? (logits.dim(1) - 1) * vocab : 0;
  f = logits.dtype() == DataType::kFloat ? logits : logits.CastTo(DataType::kFloat);
  return {f.data<float>() + offset, vocab};
}

}  // namespace

Tensor LastPositionLogits(const Tensor& logits) {
  Tensor f;
  const auto [p, vocab] = LastRow(logits, f);
  Tensor row = Tensor::Uninitialized(DataType::kFloat, {vocab});
  std::copy(p, p + vocab, row.data<float>());
  return row;
}

int64_t ArgmaxLastPosition(const Tensor& logits) {
  Tensor f;
  // Plain variables, not structured bindings: clang's OpenMP cannot capture those in the simd loop.
  const std::pair<const float*, int64_t> row = LastRow(logits, f);
  const float* p = row.first;
  const int64_t vocab = row.second;
  // std::max_element's answer (the first largest; a NaN never wins unless it comes first) in two
  // vectorized passes: std::max_element took 116 us over 32,000 logits here, a decode step's 1%;
  // these take 6.
  if (std::isnan(p[0])) return 0;
  float best = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : best)
  for (int64_t i = 0; i < vocab; ++i) best = p[i] > best ? p[i] : best;
  for (int64_t i = 0; i < vocab; ++i)
    if (p[i] == best) return i;
  return 0;  // every logit NaN
}

DecodeLoop::DecodeLoop(Session& session)
    : DecodeLoop(session, DecoderSignature::Discover(session.inputs(), session.outputs())) {}

DecodeLoop::DecodeLoop(Session& session, DecoderSignature sig)
    : session_(session), sig_(std::move(sig)), output_names_(OutputNames(sig_)) {}

void DecodeLoop::Reset() {
  feeds_.clear();
  presents_.clear();
  past_len_ = 0;
}

Tensor DecodeLoop::Step(const std::vector<int64_t>& ids) {
  GAF_CHECK(!ids.empty(), "decode step: no tokens");
  try {
    SetTokenFeeds(session_, sig_, ids, past_len_, feeds_);
    for (size_t i = 0; i < sig_.cache.size(); ++i)
      feeds_[sig_.cache[i].first] =
          past_len_ == 0 ? EmptyPast(*InfoOf(session_, sig_.cache[i].first)) : std::move(presents_[i]);
    // The present caches come back as caches with room where the attention appends in place
    // (SessionOptions::cache_in_place): fed back as they are, never read here.
    std::vector<Tensor> outs = session_.Run(feeds_, output_names_, /*cache_room=*/true, last_position_only_);
    presents_.assign(std::make_move_iterator(outs.begin() + 1), std::make_move_iterator(outs.end()));
    past_len_ += static_cast<int64_t>(ids.size());
    return std::move(outs[0]);
  } catch (...) {
    Reset();  // the pasts were handed to the failed run
    throw;
  }
}

Tensor ForwardNoCache(Session& session, const DecoderSignature& sig, const std::vector<int64_t>& ids) {
  GAF_CHECK(!ids.empty(), "ForwardNoCache: no tokens");
  std::map<std::string, Tensor> feeds;
  SetTokenFeeds(session, sig, ids, 0, feeds);
  for (const auto& [past, present] : sig.cache) feeds[past] = EmptyPast(*InfoOf(session, past));
  return session.Run(feeds, {sig.logits})[0];
}

GenerateResult Generate(Session& session, const GenerateOptions& options) {
  return Generate(session, DecoderSignature::Discover(session.inputs(), session.outputs()), options);
}

GenerateResult Generate(Session& session, const DecoderSignature& sig, const GenerateOptions& options) {
  GAF_CHECK(!options.prompt_ids.empty(), "generate: the prompt is empty");
  GenerateResult result;
  if (options.max_new_tokens <= 0) return result;
  DecodeLoop loop(session, sig);
  loop.set_last_position_only(true);  // the argmax reads the last position only

  // Prefill: the whole prompt, empty cache.
  auto t0 = Clock::now();
  int64_t token = ArgmaxLastPosition(loop.Step(options.prompt_ids));
  result.prefill_seconds = Since(t0);
  result.tokens.push_back(token);
  if (options.after_prefill) options.after_prefill();

  // Decode: one token per run; present becomes past (the same buffers, handed over).
  while (static_cast<int>(result.tokens.size()) < options.max_new_tokens && token != options.eos_token_id) {
    auto ts = Clock::now();
    token = ArgmaxLastPosition(loop.Step({token}));
    result.step_seconds.push_back(Since(ts));
    result.tokens.push_back(token);
    if (result.step_seconds.size() == 1 && options.after_first_step) options.after_first_step();
  }
  return result;
}

int64_t DecoderVocabSize(const Model& model, const DecoderSignature& sig) {
  for (const ValueInfo& v : model.graph.outputs)
    if (v.name == sig.logits && v.has_shape && !v.dims.empty() && v.dims.back().known()) return v.dims.back().value;
  for (const auto& [k, v] : model.metadata_props)
    if (k == "vocab_size") {
      try {
        return std::stoll(v);
      } catch (const std::exception&) {
      }
    }
  // The embedding table input_ids index (a Gather on a constant).
  const int64_t table = GatherTableSize(model, sig.input_ids);
  return table > 0 ? table : 100;
}

Workload DecoderTraceWorkload(const Model& model, int prompt_len, int decode_steps, uint32_t seed) {
  GAF_CHECK(prompt_len > 0, "DecoderTraceWorkload: the prompt length must be positive");
  Session session(model);
  const DecoderSignature sig = DecoderSignature::Discover(session.inputs(), session.outputs());
  const int64_t vocab = DecoderVocabSize(model, sig);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> dist(0, vocab - 1);
  std::vector<int64_t> prompt;
  for (int i = 0; i < prompt_len; ++i) prompt.push_back(dist(rng));

  Workload w;
  const std::vector<std::string> output_names = OutputNames(sig);
  std::map<std::string, Tensor> feeds;
  SetTokenFeeds(session, sig, prompt, 0, feeds);
  for (const auto& [past, present] : sig.cache) feeds[past] = EmptyPast(*InfoOf(session, past));
  int64_t past_len = 0, next = 0;
  std::vector<int64_t> ids = prompt;
  for (int step = 0; step <= decode_steps; ++step) {
    if (step > 0) {
      SetTokenFeeds(session, sig, ids, past_len, feeds);
    }
    w.samples.push_back(feeds);  // tensors are shared, never written: the next call's feeds are new tensors
    std::vector<Tensor> outs;
    try {
      outs = session.Run(feeds, output_names);
    } catch (const Error& e) {
      throw Error(fmt::format("the generation that records the workload failed at {} (past length {}): {}",
                              step == 0 ? "the prefill" : fmt::format("decode step {}", step), past_len, e.what()));
    }
    next = ArgmaxLastPosition(outs[0]);
    past_len += static_cast<int64_t>(ids.size());
    ids = {next};
    for (size_t i = 0; i < sig.cache.size(); ++i) feeds[sig.cache[i].first] = outs[1 + i];
  }
  w.source = fmt::format("a generation: prefill of {} tokens + {} decode steps", prompt_len, decode_steps);
  return w;
}

bool HalfWeightsKeepGreedyTokens(const Model& fused, int threads, std::string* what, int prompt_len, int new_tokens) {
  DecoderSignature sig;
  try {
    sig = DecoderSignature::Discover(fused.graph.inputs, fused.graph.outputs);
  } catch (const Error&) {
    *what = "not a decoder in the Optimum layout: no token check";
    return true;
  }
  std::vector<int64_t> want, got;
  try {
    SessionOptions so;
    so.num_threads = threads;
    Session f32(fused, so);
    UseHalfWeights(so, HalfWeights::kAll);
    Session f16(fused, so);
    GenerateOptions opt;
    opt.max_new_tokens = new_tokens;
    std::mt19937 rng(0);
    std::uniform_int_distribution<int64_t> dist(0, DecoderVocabSize(fused, sig) - 1);
    for (int i = 0; i < prompt_len; ++i) opt.prompt_ids.push_back(dist(rng));
    want = Generate(f32, sig, opt).tokens;
    got = Generate(f16, sig, opt).tokens;
  } catch (const Error& e) {  // a decoder that cannot generate: float16 storage is not kept
    *what = fmt::format("greedy tokens: the generation failed ({})", e.what());
    return false;
  }
  for (size_t i = 0; i < want.size(); ++i)
    if (i >= got.size() || got[i] != want[i]) {
      *what = fmt::format("greedy tokens: with float16 weights token {} of {} is {} instead of {} (a random prompt of {} ids)",
                          i + 1, want.size(), i < got.size() ? got[i] : -1, want[i], prompt_len);
      return false;
    }
  *what = fmt::format("the same {} greedy tokens as float32 weights on a random prompt of {} ids", want.size(), prompt_len);
  return true;
}

DecodeStepBytes CountDecodeStepBytes(const Graph& g) {
  DecodeStepBytes b;
  for (const Node& n : g.nodes) {
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      if (n.inputs[i].empty()) continue;
      const Tensor* t = g.FindInitializer(n.inputs[i]);
      if (t == nullptr) continue;
      const int64_t bytes = static_cast<int64_t>(t->nbytes());
      if (n.op_type == "MatMul" || n.op_type == "Gemm") {
        b.matmul += bytes;
        ++b.matmul_tensors;
      } else if (n.op_type == "Gather" && i == 0 && t->rank() >= 1) {
        int64_t axis = n.GetInt("axis", 0);
        if (axis < 0) axis += t->rank();
        const int64_t dim = axis >= 0 && axis < t->rank() ? t->dim(axis) : 0;
        b.gather += dim > 0 ? bytes / dim : 0;  // one slice for the one new token
        ++b.gather_tensors;
      } else if (n.op_type == "Gather" && i == 1) {
        continue;  // constant indices: negligible, and not weights
      } else if (n.op_type == "RotaryEmbedding" && (i == 1 || i == 2) && n.inputs.size() > 3 &&
                 !n.inputs[3].empty() && t->rank() == 2 && t->dim(0) > 0) {
        b.gather += bytes / t->dim(0);  // the cos/sin row at the one new token's position id
        ++b.gather_tensors;
      } else {
        b.other += bytes;
        ++b.other_tensors;
      }
    }
  }
  return b;
}

}  // namespace gaf
