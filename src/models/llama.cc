// The example Llama decoder, written node by node the way the PyTorch exporter (through Hugging
// Face Optimum, transformers 4.3x) writes LlamaForCausalLM, so that the fusion engine meets the
// same patterns it meets in real exported models.
//
// Model level:
//   /model/embed_tokens/Gather        hidden = Gather(embed_tokens [vocab, h], input_ids)
//   /model/rotary_emb/...             cos, sin = Unsqueeze(Gather(cos|sin_cached [max_pos, hd], position_ids), 1)
//                                     -> [b, 1, s, hd]
//   /model/mask/...                   mask [b, 1, s, past+s] = Where(And(k <= past+q, attention_mask), 0, finfo.min)
//                                     with Shape/Gather/Range/Unsqueeze/LessOrEqual/Cast/And/Where
//   layers 0..L-1 (below)
//   /model/norm/...                   RMSNorm
//   /lm_head/MatMul                   logits = MatMul(x, lm_head [h, vocab])
//
// One layer i (scope /model/layers.i):
//   input_layernorm   (RMSNorm)  Pow(x, 2) -> ReduceMean(axes=[-1], keepdims=1) -> Add(eps) -> Sqrt
//                                -> Div(1, .) -> Mul(x, .) -> Mul(weight, .)
//   self_attn         q|k|v = MatMul(xn, W[h, heads*hd]) -> Reshape [0,0,heads,hd] -> Transpose [0,2,1,3]
//                     rotary on q and k: Add(Mul(x, cos), Mul(Concat(Neg(Slice(x, hd/2:)), Slice(x, :hd/2)), sin))
//                     present.i.key   = Concat(past_key_values.i.key, k, axis=2)
//                     present.i.value = Concat(past_key_values.i.value, v, axis=2)
//                     repeat_kv: Unsqueeze(2) -> Expand [1,1,n_rep,1,1] -> Reshape [0, heads, -1, hd]
//                     scores = Div(MatMul(q, Transpose(k, [0,1,3,2])), sqrt(hd)) -> Add(mask) -> Softmax(-1)
//                     ctx = MatMul(scores, v) -> Transpose [0,2,1,3] -> Reshape [0,0,h] -> o_proj MatMul
//   Add               residual
//   post_attention_layernorm (RMSNorm)
//   mlp               down(Mul(Mul(gate, Sigmoid(gate)), up)) with gate|up|down = MatMul (SwiGLU)
//   Add_1             residual
//
// Weights of MatMuls are stored [in, out] (the exporter's constant-folded transpose of nn.Linear).
#include "models/llama.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "ir/error.h"
#include "models/builder.h"

namespace gaf {

using models::FloatAttr;
using models::GraphBuilder;
using models::IntAttr;
using models::IntsAttr;
using models::MakeValueInfo;

namespace {

// The built-in sizes: vocabulary, hidden, MLP, layers, heads, key/value heads, positions.
struct PresetSize {
  const char* name;
  int64_t vocab, hidden, intermediate, layers, heads, kv_heads, positions;
};
constexpr PresetSize kPresets[] = {
    {"tiny", 256, 64, 172, 2, 4, 2, 256},
    {"small", 8000, 384, 1024, 6, 6, 2, 1024},
    {"bench", 32000, 1024, 2816, 12, 16, 4, 2048},
    // Heads of 128 (as Llama-2-7B's), an MLP of 5632 (as TinyLlama-1.1B's): 1.6 GB of weights.
    {"wide", 32000, 2048, 5632, 6, 16, 4, 2048},
};

}  // namespace

LlamaConfig LlamaPreset(const std::string& name) {
  for (const PresetSize& p : kPresets) {
    if (name != p.name) continue;
    LlamaConfig c;
    c.preset = name;
    c.vocab_size = p.vocab;
    c.hidden_size = p.hidden;
    c.intermediate_size = p.intermediate;
    c.num_layers = p.layers;
    c.num_heads = p.heads;
    c.num_kv_heads = p.kv_heads;
    c.max_position_embeddings = p.positions;
    return c;
  }
  throw Error(fmt::format("unknown llama preset '{}' (expected tiny, small, bench or wide)", name));
}

std::vector<std::string> LlamaPresetNames() {
  std::vector<std::string> names;
  for (const PresetSize& p : kPresets) names.push_back(p.name);
  return names;
}

int64_t LlamaParameterCount(const LlamaConfig& c) {
  const int64_t h = c.hidden_size, hd = c.head_dim();
  const int64_t per_layer = 2 * h                                  // norms
                            + h * c.num_heads * hd * 2             // q, o
                            + h * c.num_kv_heads * hd * 2          // k, v
                            + 3 * h * c.intermediate_size;         // gate, up, down
  const int64_t rotary = c.opset >= 23 ? hd / 2 : hd;  // RotaryEmbedding's caches hold the first halves
  return c.vocab_size * h * 2 + h + c.num_layers * per_layer + 2 * c.max_position_embeddings * rotary;
}

namespace {

void ValidateConfig(const LlamaConfig& c) {
  GAF_CHECK(c.vocab_size > 0 && c.hidden_size > 0 && c.intermediate_size > 0 && c.num_layers > 0 &&
                c.max_position_embeddings > 0,
            "llama config: sizes must be positive");
  GAF_CHECK(c.num_heads > 0 && c.hidden_size % c.num_heads == 0,
            "llama config: hidden_size {} is not a multiple of num_heads {}", c.hidden_size, c.num_heads);
  GAF_CHECK(c.head_dim() % 2 == 0, "llama config: head_dim {} must be even for rotary embedding", c.head_dim());
  GAF_CHECK(c.num_kv_heads > 0 && c.num_heads % c.num_kv_heads == 0,
            "llama config: num_heads {} is not a multiple of num_kv_heads {}", c.num_heads, c.num_kv_heads);
  GAF_CHECK(c.opset == 17 || c.opset == 23 || c.opset == 28, "llama config: opset {} (17, 23 or 28)", c.opset);
}

class LlamaBuilder {
 public:
  explicit LlamaBuilder(const LlamaConfig& c) : c_(c), b_(&model_.graph), rng_(c.seed) {}

  Model Build() {
    Graph& g = model_.graph;
    g.name = "main_graph";
    model_.ir_version = c_.opset >= 23 ? 11 : 8;
    model_.opset_imports = {OpsetImport{"", c_.opset}};
    model_.producer_name = "graph-autofusion";
    model_.producer_version = "0.1";
    model_.doc_string = "Llama-architecture decoder with seeded random weights (graph-autofusion example)";
    DeclareInputsOutputs();
    MakeConstants();

    std::string x = b_.Op("/model/embed_tokens", "Gather",
                          {b_.Init("model.embed_tokens.weight", Normal({c_.vocab_size, c_.hidden_size})), "input_ids"});
    MakeRotary();
    MakeMask();
    for (int64_t i = 0; i < c_.num_layers; ++i) x = Layer(i, x);
    x = RmsNorm("/model/norm", "model.norm.weight", x);
    b_.Op("/lm_head", "MatMul", {x, b_.Init("lm_head.weight", Normal({c_.hidden_size, c_.vocab_size}))}, {},
          {"logits"});
    AddMetadata();
    return std::move(model_);
  }

 private:
  Tensor Normal(Shape shape) { return models::RandomNormal(rng_, std::move(shape), 0.f, c_.init_std); }
  // Norm weights near 1 (trained models' are not exactly 1; keeps the Mul non-trivial).
  Tensor NormWeight() { return models::RandomUniform(rng_, {c_.hidden_size}, 0.8f, 1.2f); }

  void DeclareInputsOutputs() {
    Graph& g = model_.graph;
    const Dim batch = Dim::Symbolic("batch_size"), seq = Dim::Symbolic("sequence_length"),
              past = Dim::Symbolic("past_sequence_length"),
              total = Dim::Symbolic("past_sequence_length + sequence_length");
    const Dim kv = Dim::Known(c_.num_kv_heads), hd = Dim::Known(c_.head_dim());
    g.inputs.push_back(MakeValueInfo("input_ids", DataType::kInt64, {batch, seq}));
    g.inputs.push_back(MakeValueInfo("attention_mask", DataType::kInt64, {batch, total}));
    g.inputs.push_back(MakeValueInfo("position_ids", DataType::kInt64, {batch, seq}));
    for (int64_t i = 0; i < c_.num_layers; ++i)
      for (const char* kind : {"key", "value"})
        g.inputs.push_back(
            MakeValueInfo(fmt::format("past_key_values.{}.{}", i, kind), DataType::kFloat, {batch, kv, past, hd}));
    g.outputs.push_back(MakeValueInfo("logits", DataType::kFloat, {batch, seq, Dim::Known(c_.vocab_size)}));
    for (int64_t i = 0; i < c_.num_layers; ++i)
      for (const char* kind : {"key", "value"})
        g.outputs.push_back(MakeValueInfo(fmt::format("present.{}.{}", i, kind), DataType::kFloat, {batch, kv, total, hd}));
  }

  // Constants shared by all layers (the exporter writes one Constant per use; values are equal).
  void MakeConstants() {
    const int64_t hd = c_.head_dim();
    two_ = b_.FloatScalar("/model/constants/two", 2.f);
    one_f_ = b_.FloatScalar("/model/constants/one", 1.f);
    eps_ = b_.FloatScalar("/model/constants/rms_norm_eps", c_.rms_norm_eps);
    sqrt_hd_ = b_.FloatScalar("/model/constants/sqrt_head_dim", std::sqrt(static_cast<float>(hd)));
    q_shape_ = b_.Int64s("/model/constants/q_shape", {0, 0, c_.num_heads, hd});
    kv_shape_ = b_.Int64s("/model/constants/kv_shape", {0, 0, c_.num_kv_heads, hd});
    out_shape_ = b_.Int64s("/model/constants/attn_output_shape", {0, 0, c_.hidden_size});
    expand_shape_ = b_.Int64s("/model/constants/repeat_kv_expand",
                              {1, 1, c_.num_heads / c_.num_kv_heads, 1, 1});
    repeat_shape_ = b_.Int64s("/model/constants/repeat_kv_shape", {0, c_.num_heads, -1, hd});
    axis0_ = b_.Int64s("/model/constants/axes_0", {0});
    axis1_ = b_.Int64s("/model/constants/axes_1", {1});
    axis2_ = b_.Int64s("/model/constants/axes_2", {2});
    axis3_ = b_.Int64s("/model/constants/axes_3", {3});
    axes12_ = b_.Int64s("/model/constants/axes_1_2", {1, 2});
    zero_i_ = b_.Int64s("/model/constants/zero", {0});
    half_hd_ = b_.Int64s("/model/constants/half_head_dim", {hd / 2});
    int_max_ = b_.Int64s("/model/constants/int64_max", {std::numeric_limits<int64_t>::max()});
  }

  void MakeRotary() {
    const int64_t hd = c_.head_dim(), half = hd / 2, maxpos = c_.max_position_embeddings;
    Tensor cos_t(DataType::kFloat, {maxpos, hd}), sin_t(DataType::kFloat, {maxpos, hd});
    for (int64_t p = 0; p < maxpos; ++p) {
      for (int64_t j = 0; j < half; ++j) {
        double inv_freq = 1.0 / std::pow(static_cast<double>(c_.rope_theta), 2.0 * j / static_cast<double>(hd));
        double angle = static_cast<double>(p) * inv_freq;
        // emb = cat(freqs, freqs): both halves use the same frequency.
        cos_t.data<float>()[p * hd + j] = cos_t.data<float>()[p * hd + j + half] = static_cast<float>(std::cos(angle));
        sin_t.data<float>()[p * hd + j] = sin_t.data<float>()[p * hd + j + half] = static_cast<float>(std::sin(angle));
      }
    }
    const std::string s = "/model/rotary_emb";
    if (c_.opset >= 23) {  // RotaryEmbedding reads the caches' first halves at the position ids itself
      cos_ = b_.Init("model.rotary_emb.cos_cache", HalfColumns(cos_t));
      sin_ = b_.Init("model.rotary_emb.sin_cache", HalfColumns(sin_t));
      return;
    }
    std::string cos = b_.Op(s, "Gather", {b_.Init("model.rotary_emb.cos_cached", std::move(cos_t)), "position_ids"});
    std::string sin = b_.Op(s, "Gather", {b_.Init("model.rotary_emb.sin_cached", std::move(sin_t)), "position_ids"});
    cos_ = b_.Op(s, "Unsqueeze", {cos, axis1_});
    sin_ = b_.Op(s, "Unsqueeze", {sin, axis1_});
  }

  void MakeMask() {
    const std::string s = "/model/mask";
    std::string ids_shape = b_.Op(s, "Shape", {"input_ids"});
    std::string seq = b_.Op(s, "Gather", {ids_shape, b_.Int64Scalar("/model/constants/index_1", 1)}, {IntAttr("axis", 0)});
    std::string past_shape = b_.Op(s, "Shape", {"past_key_values.0.key"});
    std::string past = b_.Op(s, "Gather", {past_shape, b_.Int64Scalar("/model/constants/index_2", 2)}, {IntAttr("axis", 0)});
    std::string total = b_.Op(s, "Add", {past, seq});
    std::string one = b_.Int64Scalar("/model/constants/scalar_one", 1);
    std::string zero = b_.Int64Scalar("/model/constants/scalar_zero", 0);
    std::string q_pos = b_.Op(s, "Range", {past, total, one});  // absolute positions of the queries
    std::string k_pos = b_.Op(s, "Range", {zero, total, one});  // positions of the keys
    std::string q_col = b_.Op(s, "Unsqueeze", {q_pos, axis1_});  // [s, 1]
    std::string k_row = b_.Op(s, "Unsqueeze", {k_pos, axis0_});  // [1, T]
    std::string causal = b_.Op(s, "LessOrEqual", {k_row, q_col});  // [s, T]
    std::string pad = b_.Op(s, "Cast", {"attention_mask"}, {IntAttr("to", static_cast<int64_t>(DataType::kBool))});
    std::string pad4 = b_.Op(s, "Unsqueeze", {pad, axes12_});  // [b, 1, 1, T]
    std::string allowed = b_.Op(s, "And", {causal, pad4});     // [b, 1, s, T]
    if (c_.opset >= 23) {  // Attention takes the bool mask (true attends), as SDPA-style exports pass it
      mask_ = allowed;
      return;
    }
    mask_ = b_.Op(s, "Where", {allowed, b_.FloatScalar("/model/constants/mask_zero", 0.f),
                               b_.FloatScalar("/model/constants/finfo_min", std::numeric_limits<float>::lowest())});
  }

  // The first half of each row of t [rows, 2h].
  static Tensor HalfColumns(const Tensor& t) {
    const int64_t rows = t.dim(0), h = t.dim(1) / 2;
    Tensor out(DataType::kFloat, {rows, h});
    for (int64_t p = 0; p < rows; ++p)
      std::copy_n(t.data<float>() + p * 2 * h, h, out.data<float>() + p * h);
    return out;
  }

  std::string RmsNorm(const std::string& s, const std::string& weight_name, const std::string& x) {
    if (c_.opset >= 23)
      return b_.Op(s, "RMSNormalization", {x, b_.Init(weight_name, NormWeight())},
                   {IntAttr("axis", -1), FloatAttr("epsilon", c_.rms_norm_eps)});
    std::string sq = b_.Op(s, "Pow", {x, two_});
    std::string var = b_.Op(s, "ReduceMean", {sq}, {IntsAttr("axes", {-1}), IntAttr("keepdims", 1)});
    std::string ve = b_.Op(s, "Add", {var, eps_});
    std::string rt = b_.Op(s, "Sqrt", {ve});
    std::string inv = b_.Op(s, "Div", {one_f_, rt});
    std::string xn = b_.Op(s, "Mul", {x, inv});
    return b_.Op(s, "Mul", {b_.Init(weight_name, NormWeight()), xn});
  }

  // x [b, heads, s, hd] -> x * cos + rotate_half(x) * sin
  std::string Rotary(const std::string& s, const std::string& x) {
    std::string xc = b_.Op(s, "Mul", {x, cos_});
    std::string x1 = b_.Op(s, "Slice", {x, zero_i_, half_hd_, axis3_});
    std::string x2 = b_.Op(s, "Slice", {x, half_hd_, int_max_, axis3_});
    std::string nx2 = b_.Op(s, "Neg", {x2});
    std::string rot = b_.Op(s, "Concat", {nx2, x1}, {IntAttr("axis", -1)});
    std::string xs = b_.Op(s, "Mul", {rot, sin_});
    return b_.Op(s, "Add", {xc, xs});
  }

  // [b, kv_heads, T, hd] -> [b, heads, T, hd] (HF repeat_kv).
  std::string RepeatKv(const std::string& s, const std::string& x) {
    if (c_.num_heads == c_.num_kv_heads) return x;
    std::string u = b_.Op(s, "Unsqueeze", {x, axis2_});
    std::string e = b_.Op(s, "Expand", {u, expand_shape_});
    return b_.Op(s, "Reshape", {e, repeat_shape_});
  }

  std::string Attention(int64_t i, const std::string& xn) {
    const std::string s = fmt::format("/model/layers.{}/self_attn", i);
    const std::string w = fmt::format("model.layers.{}.self_attn.", i);
    const int64_t h = c_.hidden_size, hd = c_.head_dim();
    std::string q = b_.Op(s + "/q_proj", "MatMul", {xn, b_.Init(w + "q_proj.weight", Normal({h, c_.num_heads * hd}))});
    std::string k = b_.Op(s + "/k_proj", "MatMul", {xn, b_.Init(w + "k_proj.weight", Normal({h, c_.num_kv_heads * hd}))});
    std::string v = b_.Op(s + "/v_proj", "MatMul", {xn, b_.Init(w + "v_proj.weight", Normal({h, c_.num_kv_heads * hd}))});
    const std::vector<int64_t> to_heads = {0, 2, 1, 3};
    q = b_.Op(s, "Transpose", {b_.Op(s, "Reshape", {q, q_shape_})}, {IntsAttr("perm", to_heads)});
    k = b_.Op(s, "Transpose", {b_.Op(s, "Reshape", {k, kv_shape_})}, {IntsAttr("perm", to_heads)});
    v = b_.Op(s, "Transpose", {b_.Op(s, "Reshape", {v, kv_shape_})}, {IntsAttr("perm", to_heads)});
    if (c_.opset >= 23) {  // RotaryEmbedding and Attention (grouped-query, past and present caches)
      q = b_.Op(s, "RotaryEmbedding", {q, cos_, sin_, "position_ids"});
      k = b_.Op(s, "RotaryEmbedding", {k, cos_, sin_, "position_ids"});
      const std::vector<std::string> outs = {s + "/Attention_output_0", fmt::format("present.{}.key", i),
                                             fmt::format("present.{}.value", i)};
      b_.Op(s, "Attention",
            {q, k, v, mask_, fmt::format("past_key_values.{}.key", i), fmt::format("past_key_values.{}.value", i)}, {},
            outs);
      std::string ctx = b_.Op(s, "Transpose", {outs[0]}, {IntsAttr("perm", to_heads)});
      ctx = b_.Op(s, "Reshape", {ctx, out_shape_});
      return b_.Op(s + "/o_proj", "MatMul", {ctx, b_.Init(w + "o_proj.weight", Normal({c_.num_heads * hd, h}))});
    }
    q = Rotary(s, q);
    k = Rotary(s, k);
    std::string present_k = b_.Op(s, "Concat", {fmt::format("past_key_values.{}.key", i), k}, {IntAttr("axis", 2)},
                                  {fmt::format("present.{}.key", i)});
    std::string present_v = b_.Op(s, "Concat", {fmt::format("past_key_values.{}.value", i), v}, {IntAttr("axis", 2)},
                                  {fmt::format("present.{}.value", i)});
    std::string kr = RepeatKv(s, present_k);
    std::string vr = RepeatKv(s, present_v);
    std::string kt = b_.Op(s, "Transpose", {kr}, {IntsAttr("perm", {0, 1, 3, 2})});
    std::string scores = b_.Op(s, "MatMul", {q, kt});
    scores = b_.Op(s, "Div", {scores, sqrt_hd_});
    scores = b_.Op(s, "Add", {scores, mask_});
    std::string probs = b_.Op(s, "Softmax", {scores}, {IntAttr("axis", -1)});
    std::string ctx = b_.Op(s, "MatMul", {probs, vr});
    ctx = b_.Op(s, "Transpose", {ctx}, {IntsAttr("perm", to_heads)});
    ctx = b_.Op(s, "Reshape", {ctx, out_shape_});
    return b_.Op(s + "/o_proj", "MatMul", {ctx, b_.Init(w + "o_proj.weight", Normal({c_.num_heads * hd, h}))});
  }

  std::string Mlp(int64_t i, const std::string& xn) {
    const std::string s = fmt::format("/model/layers.{}/mlp", i);
    const std::string w = fmt::format("model.layers.{}.mlp.", i);
    const int64_t h = c_.hidden_size, f = c_.intermediate_size;
    std::string gate = b_.Op(s + "/gate_proj", "MatMul", {xn, b_.Init(w + "gate_proj.weight", Normal({h, f}))});
    if (c_.opset >= 28) {
      std::string up = b_.Op(s + "/up_proj", "MatMul", {xn, b_.Init(w + "up_proj.weight", Normal({h, f}))});
      std::string prod = b_.Op(s + "/act_fn", "SwiGLU", {gate, up});
      return b_.Op(s + "/down_proj", "MatMul", {prod, b_.Init(w + "down_proj.weight", Normal({f, h}))});
    }
    std::string sig = b_.Op(s + "/act_fn", "Sigmoid", {gate});
    std::string act = b_.Op(s + "/act_fn", "Mul", {gate, sig});
    std::string up = b_.Op(s + "/up_proj", "MatMul", {xn, b_.Init(w + "up_proj.weight", Normal({h, f}))});
    std::string prod = b_.Op(s, "Mul", {act, up});
    return b_.Op(s + "/down_proj", "MatMul", {prod, b_.Init(w + "down_proj.weight", Normal({f, h}))});
  }

  std::string Layer(int64_t i, const std::string& x) {
    const std::string s = fmt::format("/model/layers.{}", i);
    const std::string w = fmt::format("model.layers.{}.", i);
    std::string xn = RmsNorm(s + "/input_layernorm", w + "input_layernorm.weight", x);
    std::string h = b_.Op(s, "Add", {x, Attention(i, xn)});
    std::string hn = RmsNorm(s + "/post_attention_layernorm", w + "post_attention_layernorm.weight", h);
    return b_.Op(s, "Add", {h, Mlp(i, hn)});
  }

  void AddMetadata() {
    auto& md = model_.metadata_props;
    md.emplace_back("generator", "graph-autofusion example llama");
    md.emplace_back("preset", c_.preset);
    md.emplace_back("model_type", "llama");
    md.emplace_back("vocab_size", std::to_string(c_.vocab_size));
    md.emplace_back("hidden_size", std::to_string(c_.hidden_size));
    md.emplace_back("intermediate_size", std::to_string(c_.intermediate_size));
    md.emplace_back("num_hidden_layers", std::to_string(c_.num_layers));
    md.emplace_back("num_attention_heads", std::to_string(c_.num_heads));
    md.emplace_back("num_key_value_heads", std::to_string(c_.num_kv_heads));
    md.emplace_back("head_dim", std::to_string(c_.head_dim()));
    md.emplace_back("max_position_embeddings", std::to_string(c_.max_position_embeddings));
    md.emplace_back("rms_norm_eps", fmt::format("{}", c_.rms_norm_eps));
    md.emplace_back("rope_theta", fmt::format("{}", c_.rope_theta));
    md.emplace_back("seed", std::to_string(c_.seed));
    md.emplace_back("opset", std::to_string(c_.opset));
    md.emplace_back("parameters", std::to_string(LlamaParameterCount(c_)));
  }

  const LlamaConfig& c_;
  Model model_;
  GraphBuilder b_;
  std::mt19937 rng_;
  std::string two_, one_f_, eps_, sqrt_hd_, q_shape_, kv_shape_, out_shape_, expand_shape_, repeat_shape_;
  std::string axis0_, axis1_, axis2_, axis3_, axes12_, zero_i_, half_hd_, int_max_;
  std::string cos_, sin_, mask_;
};

}  // namespace

Model BuildLlamaModel(const LlamaConfig& config) {
  ValidateConfig(config);
  return LlamaBuilder(config).Build();
}

}  // namespace gaf
