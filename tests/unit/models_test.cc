// The example models (llama, cnn) and greedy generation with the KV cache.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <set>

#include "models/cnn.h"
#include "models/generate.h"
#include "models/llama.h"
#include "onnx_io/onnx_io.h"
#include "runtime/session.h"

namespace gaf {
namespace {

namespace fs = std::filesystem;

const Model& TinyLlama() {
  static const Model m = BuildLlamaModel(LlamaPreset("tiny"));
  return m;
}

std::vector<std::string> Names(const std::vector<ValueInfo>& v) {
  std::vector<std::string> out;
  for (const ValueInfo& x : v) out.push_back(x.name);
  return out;
}

TEST(LlamaModel, PassesCheckerAndVerifier) {
  const Model& m = TinyLlama();
  EXPECT_EQ(CheckModel(m), "");
  EXPECT_TRUE(VerifyModel(m).empty());
  EXPECT_EQ(m.ir_version, 8);
  EXPECT_EQ(m.OpsetVersion(""), 17);
  Model inferred = m;
  EXPECT_EQ(InferShapes(inferred), "");
}

TEST(LlamaModel, InputsOutputsInOptimumLayout) {
  const Model& m = TinyLlama();
  const LlamaConfig c = LlamaPreset("tiny");
  std::vector<std::string> want_in{"input_ids", "attention_mask", "position_ids"};
  std::vector<std::string> want_out{"logits"};
  for (int i = 0; i < c.num_layers; ++i) {
    want_in.push_back(fmt::format("past_key_values.{}.key", i));
    want_in.push_back(fmt::format("past_key_values.{}.value", i));
    want_out.push_back(fmt::format("present.{}.key", i));
    want_out.push_back(fmt::format("present.{}.value", i));
  }
  EXPECT_EQ(Names(m.graph.inputs), want_in);
  EXPECT_EQ(Names(m.graph.outputs), want_out);
  EXPECT_EQ(DimsToString(m.graph.inputs[0].dims), "[batch_size,sequence_length]");
  EXPECT_EQ(m.graph.inputs[0].dtype, DataType::kInt64);
  EXPECT_EQ(DimsToString(m.graph.inputs[3].dims), "[batch_size,2,past_sequence_length,16]");
  EXPECT_EQ(DimsToString(m.graph.outputs[1].dims), "[batch_size,2,past_sequence_length + sequence_length,16]");
  EXPECT_EQ(DimsToString(m.graph.outputs[0].dims), "[batch_size,sequence_length,256]");

  int64_t params = 0;
  for (const auto& [name, t] : m.graph.initializers)
    if (t.dtype() == DataType::kFloat && t.rank() > 0) params += t.numel();
  EXPECT_EQ(params, LlamaParameterCount(c));

  std::set<std::string> ops;
  for (const Node& n : m.graph.nodes) ops.insert(n.op_type);
  for (const char* op : {"Gather", "Pow", "ReduceMean", "Sqrt", "Div", "Neg", "Slice", "Concat", "Expand", "Softmax",
                         "Sigmoid", "MatMul", "Where"})
    EXPECT_TRUE(ops.count(op)) << op;
  bool found = false;
  for (const Node& n : m.graph.nodes) found |= n.name == "/model/layers.0/self_attn/q_proj/MatMul";
  EXPECT_TRUE(found);
  bool generator = false;
  for (const auto& [k, v] : m.metadata_props) generator |= k == "generator" && v == "graph-autofusion example llama";
  EXPECT_TRUE(generator);
}

TEST(LlamaModel, PresetSizes) {
  EXPECT_LT(LlamaParameterCount(LlamaPreset("tiny")), 200'000);
  const int64_t small = LlamaParameterCount(LlamaPreset("small"));
  EXPECT_GT(small, 13'000'000);
  EXPECT_LT(small, 17'000'000);
  const int64_t bench = LlamaParameterCount(LlamaPreset("bench"));
  EXPECT_GT(bench, 180'000'000);
  EXPECT_LT(bench, 220'000'000);
  EXPECT_THROW(LlamaPreset("huge"), Error);
}

TEST(LlamaModel, Deterministic) {
  Model a = BuildLlamaModel(LlamaPreset("tiny"));
  const Tensor* w = a.graph.FindInitializer("model.layers.1.mlp.down_proj.weight");
  const Tensor* w0 = TinyLlama().graph.FindInitializer("model.layers.1.mlp.down_proj.weight");
  ASSERT_TRUE(w != nullptr && w0 != nullptr);
  EXPECT_EQ(w->ToDoubles(), w0->ToDoubles());
}

TEST(LlamaModel, SaveLoadRoundTrip) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("gaf_models_test_{}", ::getpid());
  fs::create_directories(dir);
  const std::string path = (dir / "model.onnx").string();
  SaveModel(TinyLlama(), path);
  Model back = LoadModel(path);
  EXPECT_EQ(CheckModel(back), "");
  EXPECT_EQ(back.graph.nodes.size(), TinyLlama().graph.nodes.size());
  fs::remove_all(dir);
}

TEST(LlamaModel, PrefillAndDecodeShapes) {
  Session s(TinyLlama());
  DecoderSignature sig = DecoderSignature::Discover(s.inputs(), s.outputs());
  EXPECT_EQ(sig.input_ids, "input_ids");
  EXPECT_EQ(sig.attention_mask, "attention_mask");
  EXPECT_EQ(sig.position_ids, "position_ids");
  ASSERT_EQ(sig.cache.size(), 4u);
  EXPECT_EQ(sig.cache[1], std::make_pair(std::string("past_key_values.0.value"), std::string("present.0.value")));

  // Prefill 5 tokens with an empty past.
  std::map<std::string, Tensor> feeds;
  feeds["input_ids"] = Tensor::FromVector<int64_t>({1, 2, 3, 4, 5}, {1, 5});
  feeds["attention_mask"] = Tensor::FromVector<int64_t>({1, 1, 1, 1, 1}, {1, 5});
  feeds["position_ids"] = Tensor::FromVector<int64_t>({0, 1, 2, 3, 4}, {1, 5});
  for (const auto& [past, present] : sig.cache) feeds[past] = Tensor(DataType::kFloat, {1, 2, 0, 16});
  std::vector<Tensor> outs = s.Run(feeds);
  ASSERT_EQ(outs.size(), 5u);
  EXPECT_EQ(outs[0].shape(), (Shape{1, 5, 256}));
  for (size_t i = 1; i < outs.size(); ++i) EXPECT_EQ(outs[i].shape(), (Shape{1, 2, 5, 16}));
  for (double v : outs[0].ToDoubles()) ASSERT_TRUE(std::isfinite(v));

  // One decode step.
  feeds["input_ids"] = Tensor::FromVector<int64_t>({7}, {1, 1});
  feeds["attention_mask"] = Tensor::FromVector<int64_t>({1, 1, 1, 1, 1, 1}, {1, 6});
  feeds["position_ids"] = Tensor::FromVector<int64_t>({5}, {1, 1});
  for (size_t i = 0; i < sig.cache.size(); ++i) feeds[sig.cache[i].first] = outs[1 + i];
  std::vector<Tensor> step = s.Run(feeds);
  EXPECT_EQ(step[0].shape(), (Shape{1, 1, 256}));
  for (size_t i = 1; i < step.size(); ++i) EXPECT_EQ(step[i].shape(), (Shape{1, 2, 6, 16}));

  // The decode step's logits equal the last position of a 6-token pass without cache.
  Tensor full = ForwardNoCache(s, sig, {1, 2, 3, 4, 5, 7});
  ASSERT_EQ(full.shape(), (Shape{1, 6, 256}));
  const float* a = step[0].data<float>();
  const float* b = full.data<float>() + 5 * 256;
  for (int v = 0; v < 256; ++v) ASSERT_NEAR(a[v], b[v], 1e-4f) << v;
}

TEST(LlamaModel, PaddedMaskIgnoresMaskedKeys) {
  // A masked-out (padding) first token must not change the later positions' logits.
  Session s(TinyLlama());
  auto run = [&](std::vector<int64_t> ids, std::vector<int64_t> mask) {
    std::map<std::string, Tensor> feeds;
    const int64_t n = static_cast<int64_t>(ids.size());
    feeds["input_ids"] = Tensor::FromVector<int64_t>(ids, {1, n});
    feeds["attention_mask"] = Tensor::FromVector<int64_t>(mask, {1, n});
    std::vector<int64_t> pos(ids.size());
    for (int64_t i = 0; i < n; ++i) pos[i] = i;
    feeds["position_ids"] = Tensor::FromVector<int64_t>(pos, {1, n});
    for (const ValueInfo& v : s.inputs())
      if (v.name.rfind("past", 0) == 0) feeds[v.name] = Tensor(DataType::kFloat, {1, 2, 0, 16});
    return s.Run(feeds, {"logits"})[0];
  };
  Tensor a = run({9, 4, 5}, {0, 1, 1});
  Tensor b = run({200, 4, 5}, {0, 1, 1});
  for (int64_t i = 256; i < 3 * 256; ++i) ASSERT_NEAR(a.data<float>()[i], b.data<float>()[i], 1e-5f);
}

TEST(Generate, KvCacheMatchesRecompute) {
  Session s(TinyLlama());
  DecoderSignature sig = DecoderSignature::Discover(s.inputs(), s.outputs());
  GenerateOptions opt;
  opt.prompt_ids = {17, 3, 250, 96, 41};
  opt.max_new_tokens = 12;
  GenerateResult r = Generate(s, sig, opt);
  ASSERT_EQ(r.tokens.size(), 12u);
  EXPECT_EQ(r.step_seconds.size(), 11u);
  std::vector<int64_t> seq = opt.prompt_ids;
  for (int64_t t : r.tokens) {
    EXPECT_EQ(ArgmaxLastPosition(ForwardNoCache(s, sig, seq)), t) << "after " << seq.size() << " tokens";
    seq.push_back(t);
  }
  // Deterministic across runs.
  EXPECT_EQ(Generate(s, sig, opt).tokens, r.tokens);
  EXPECT_GT(r.DecodeTokensPerSecond(), 0);
}

// A prompt's step in a generation computes the logits of its last position only: the plan reads
// the vocabulary head's operand through a LastPosition node, which keeps the last position in
// runs that ask for it (DecodeLoop::set_last_position_only, which Generate sets) and passes the
// operand on otherwise.
TEST(Generate, PromptStepComputesTheLastPositionOnly) {
  Session s(TinyLlama());
  EXPECT_EQ(s.product_rewrites().last_positions, 1);
  DecoderSignature sig = DecoderSignature::Discover(s.inputs(), s.outputs());
  const std::vector<int64_t> prompt{17, 3, 250, 96, 41, 7, 9};
  DecodeLoop all(s, sig), last(s, sig);
  last.set_last_position_only(true);
  for (const std::vector<int64_t>& ids : {prompt, std::vector<int64_t>{5}, std::vector<int64_t>{8, 2}}) {
    const Tensor a = all.Step(ids), b = last.Step(ids);
    ASSERT_EQ(a.shape(), (Shape{1, static_cast<int64_t>(ids.size()), a.dim(2)}));
    ASSERT_EQ(b.shape(), (Shape{1, 1, a.dim(2)}));
    const Tensor want = LastPositionLogits(a), got = LastPositionLogits(b);
    ASSERT_EQ(want.numel(), got.numel());
    for (int64_t i = 0; i < want.numel(); ++i)
      ASSERT_NEAR(got.data<float>()[i], want.data<float>()[i], 1e-5f) << ids.size() << " ids, logit " << i;
  }
  // Runs that do not ask keep every position (ForwardNoCache: the model as it is).
  EXPECT_EQ(ForwardNoCache(s, sig, prompt).dim(1), static_cast<int64_t>(prompt.size()));
  // Without the plan's rewrites there is no LastPosition node, and a generation reads every position.
  SessionOptions plain;
  plain.rewrite_products = false;
  Session p(TinyLlama(), plain);
  EXPECT_EQ(p.product_rewrites().last_positions, 0);
  GenerateOptions opt;
  opt.prompt_ids = prompt;
  opt.max_new_tokens = 8;
  EXPECT_EQ(Generate(p, opt).tokens, Generate(s, opt).tokens);
}

// The vectorized argmax answers as std::max_element does: the first of equal maxima, a NaN
// skipped unless it comes first, on [batch, seq, vocab] (last position, batch row 0) and [b, vocab].
TEST(Generate, ArgmaxLastPositionAgreesWithMaxElement) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  auto argmax = [](std::vector<float> row) {
    Tensor t = Tensor::Uninitialized(DataType::kFloat, {1, 1, static_cast<int64_t>(row.size())});
    std::copy(row.begin(), row.end(), t.data<float>());
    return ArgmaxLastPosition(t);
  };
  auto reference = [](const std::vector<float>& row) {
    return static_cast<int64_t>(std::max_element(row.begin(), row.end()) - row.begin());
  };
  const std::vector<std::vector<float>> rows = {
      {1, 3, 2, 3}, {nan, 5, 7}, {0, nan, 7, nan, 7}, {-inf, -inf}, {nan, nan}, {-inf, nan, -inf},
      {2}, {-1, -2, inf, inf}};
  for (const auto& row : rows) EXPECT_EQ(argmax(row), reference(row)) << ::testing::PrintToString(row);
  std::vector<float> random(32000);
  uint32_t s = 7;
  for (float& v : random) v = static_cast<float>((s = s * 1664525u + 1013904223u) >> 8) / 16777216.f;
  random[31999] = 2.f;  // the maximum in the tail past every vector block
  EXPECT_EQ(argmax(random), 31999);
  random[5] = 2.f;  // and a tie before it: the first wins
  EXPECT_EQ(argmax(random), 5);
  // [batch, seq, vocab]: the last position of batch row 0; [batch, vocab]: row 0.
  Tensor t = Tensor::Uninitialized(DataType::kFloat, {2, 2, 3});
  const float v[] = {9, 0, 0, 0, 1, 0, 0, 0, 9, 9, 0, 0};
  std::copy(std::begin(v), std::end(v), t.data<float>());
  EXPECT_EQ(ArgmaxLastPosition(t), 1);
  EXPECT_EQ(ArgmaxLastPosition(t.Reshaped({4, 3})), 0);
}

TEST(Generate, StopsAtEos) {
  Session s(TinyLlama());
  GenerateOptions opt;
  opt.prompt_ids = {1, 2, 3};
  opt.max_new_tokens = 6;
  GenerateResult r = Generate(s, opt);
  ASSERT_EQ(r.tokens.size(), 6u);
  opt.eos_token_id = r.tokens[2];
  GenerateResult stopped = Generate(s, opt);
  EXPECT_LE(stopped.tokens.size(), 3u);
  EXPECT_EQ(stopped.tokens.back(), r.tokens[2]);
}

TEST(Generate, DiscoversVariantNames) {
  auto vi = [](const std::string& n) {
    ValueInfo v;
    v.name = n;
    v.dtype = DataType::kFloat;
    return v;
  };
  std::vector<ValueInfo> in{vi("input_ids"), vi("past_key_values.1"), vi("past_key_values.0")};
  std::vector<ValueInfo> out{vi("logits"), vi("present.0"), vi("present.1")};
  DecoderSignature sig = DecoderSignature::Discover(in, out);
  EXPECT_EQ(sig.attention_mask, "");
  ASSERT_EQ(sig.cache.size(), 2u);
  EXPECT_EQ(sig.cache[0].second, "present.1");
  EXPECT_EQ(sig.cache[1].second, "present.0");
  EXPECT_THROW(DecoderSignature::Discover({vi("x")}, out), Error);
  EXPECT_THROW(DecoderSignature::Discover({vi("input_ids"), vi("past_key_values.2.key")}, out), Error);
}

TEST(CnnModel, PassesCheckerAndRuns) {
  for (const std::string& preset : CnnPresetNames()) {
    const CnnConfig c = CnnPreset(preset);
    Model m = BuildCnnModel(c);
    EXPECT_EQ(CheckModel(m), "") << preset;
    EXPECT_TRUE(VerifyModel(m).empty()) << preset;
    ASSERT_EQ(m.graph.inputs.size(), 1u);
    EXPECT_EQ(m.graph.inputs[0].name, "input");
    std::set<std::string> ops;
    for (const Node& n : m.graph.nodes) ops.insert(n.op_type);
    for (const char* op : {"Conv", "BatchNormalization", "Relu", "MaxPool", "Add", "GlobalAveragePool", "Flatten", "Gemm"})
      EXPECT_TRUE(ops.count(op)) << op;
    Session s(m);
    Tensor x(DataType::kFloat, {2, 3, c.image_size, c.image_size});
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>((i * 37) % 101) / 50.f - 1.f;
    std::vector<Tensor> y = s.Run({{"input", x}});
    ASSERT_EQ(y[0].shape(), (Shape{2, c.num_classes})) << preset;
    for (double v : y[0].ToDoubles()) ASSERT_TRUE(std::isfinite(v));
  }
}

// The bytes a decode step reads (bench's bandwidth floor): every projection and the head in full
// (7 per layer and the head, [in, out] MatMul initializers), one row of each Gather's table (the
// embedding's at least, not the table), and the other initializers (the RMSNorm weights at least).
// The same Llama written for opset 23 (Attention, RMSNormalization, RotaryEmbedding) and 28 (also
// SwiGLU): the weights are drawn in the same order, so a prompt step and decode steps with the
// cache give the opset-17 model's logits and presents, and a generation the same tokens.
TEST(LlamaModel, RecentOpsetOperatorsGiveTheOpset17Results) {
  std::vector<Tensor> base;
  for (int64_t opset : {17, 23, 28}) {
    LlamaConfig c = LlamaPreset("tiny");
    c.opset = opset;
    const Model m = BuildLlamaModel(c);
    std::set<std::string> ops;
    for (const Node& n : m.graph.nodes) ops.insert(n.op_type);
    EXPECT_EQ(ops.count("Attention"), opset >= 23 ? 1u : 0u) << opset;
    EXPECT_EQ(ops.count("RMSNormalization"), opset >= 23 ? 1u : 0u) << opset;
    EXPECT_EQ(ops.count("RotaryEmbedding"), opset >= 23 ? 1u : 0u) << opset;
    EXPECT_EQ(ops.count("SwiGLU"), opset >= 28 ? 1u : 0u) << opset;
    Session s(m);
    DecoderSignature sig = DecoderSignature::Discover(s.inputs(), s.outputs());
    std::map<std::string, Tensor> feeds;
    feeds["input_ids"] = Tensor::FromVector<int64_t>({1, 2, 3, 4, 5, 9, 8, 7}, {2, 4});
    feeds["attention_mask"] = Tensor::FromVector<int64_t>({1, 1, 1, 1, 0, 1, 1, 1}, {2, 4});  // row 2 padded
    feeds["position_ids"] = Tensor::FromVector<int64_t>({0, 1, 2, 3, 0, 0, 1, 2}, {2, 4});
    for (const auto& [past, present] : sig.cache) feeds[past] = Tensor(DataType::kFloat, {2, 2, 0, 16});
    std::vector<Tensor> outs = s.Run(feeds);
    feeds["input_ids"] = Tensor::FromVector<int64_t>({11, 12}, {2, 1});
    feeds["attention_mask"] = Tensor::FromVector<int64_t>({1, 1, 1, 1, 1, 0, 1, 1, 1, 1}, {2, 5});
    feeds["position_ids"] = Tensor::FromVector<int64_t>({4, 3}, {2, 1});
    for (size_t i = 0; i < sig.cache.size(); ++i) feeds[sig.cache[i].first] = outs[1 + i];
    std::vector<Tensor> step = s.Run(feeds);
    outs.insert(outs.end(), step.begin(), step.end());
    if (opset == 17) {
      base = outs;
      continue;
    }
    // Batch row 2's first position attends nothing (padding, causal): the opset-17 form's
    // finfo.min mask spreads it evenly, Attention's bool mask gives it zeros; both are garbage the
    // generation never reads (later positions mask it), so it is left out of the comparison: its
    // logits, and from layer 1 on the cache rows computed from it.
    ASSERT_EQ(outs.size(), base.size());
    for (size_t i = 0; i < outs.size(); ++i) {
      ASSERT_EQ(outs[i].shape(), base[i].shape()) << opset << " output " << i;
      const std::vector<double> a = outs[i].ToDoubles(), b = base[i].ToDoubles();
      const Shape& sh = outs[i].shape();
      const bool logits = sh.size() == 3;  // [2, positions, vocab]; caches [2, heads, positions, d]
      const int64_t per_row = outs[i].numel() / 2;
      const int64_t pos_stride = logits ? sh[2] : sh[3];
      const int64_t positions = logits ? sh[1] : sh[2];
      const size_t k = i % (1 + sig.cache.size());  // 0 the logits, then each layer's key and value
      const bool prompt = i < 1 + sig.cache.size(), later_layer = k >= 1 && (k - 1) / 2 >= 1;
      for (size_t j = 0; j < a.size(); ++j) {
        const int64_t row = static_cast<int64_t>(j) / per_row, pos = static_cast<int64_t>(j) / pos_stride % positions;
        const bool garbage = row == 1 && pos == 0 && ((logits && prompt) || (!logits && later_layer));
        if (!garbage) ASSERT_NEAR(a[j], b[j], 2e-5) << opset << " output " << i << " at " << j;
      }
    }
    GenerateOptions opt;
    opt.prompt_ids = {17, 3, 250, 96, 41};
    opt.max_new_tokens = 10;
    Session s17(TinyLlama());
    EXPECT_EQ(Generate(s, sig, opt).tokens, Generate(s17, opt).tokens) << opset;
  }
}

TEST(LlamaModel, DecodeStepBytesCountEveryWeightOnce) {
  const LlamaConfig c = LlamaPreset("tiny");
  const Model m = BuildLlamaModel(c);
  const DecodeStepBytes b = CountDecodeStepBytes(m.graph);
  const int64_t h = c.hidden_size, kv = c.num_kv_heads * c.head_dim(), i = c.intermediate_size;
  const int64_t projections = c.num_layers * (h * h + 2 * h * kv + h * h + 3 * h * i) + h * c.vocab_size;
  EXPECT_EQ(b.matmul, 4 * projections);
  EXPECT_EQ(b.matmul_tensors, 7 * c.num_layers + 1);
  EXPECT_GE(b.gather, 4 * h);  // the embedding row at least
  EXPECT_LT(b.gather, 4 * h * c.vocab_size);  // not the whole table
  EXPECT_GT(b.other, 4 * h * (2 * c.num_layers + 1));  // the RMSNorm weights at least
  EXPECT_EQ(b.total(), b.matmul + b.gather + b.other);

  // Written with RotaryEmbedding (opset 23), the step reads one cos and one sin row per node of
  // the caches it indexes by position id, not the caches whole.
  LlamaConfig c23 = c;
  c23.opset = 23;
  const DecodeStepBytes b23 = CountDecodeStepBytes(BuildLlamaModel(c23).graph);
  const int64_t rotary_nodes = 2 * c.num_layers, half_row = 4 * c.head_dim() / 2;
  EXPECT_EQ(b23.matmul, b.matmul);
  EXPECT_EQ(b23.gather, 4 * h + rotary_nodes * 2 * half_row);  // the embedding row, cos and sin rows
  // The norm weights and a few shape constants, not the caches (each 4 * max_position * head_dim / 2
  // bytes, 8 KiB here).
  EXPECT_GE(b23.other, 4 * h * (2 * c.num_layers + 1));
  EXPECT_LT(b23.other, 4 * h * (2 * c.num_layers + 1) + 1024);
}

}  // namespace
}  // namespace gaf
