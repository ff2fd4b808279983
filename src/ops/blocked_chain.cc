// BlockedChain: a group of CNN operators as oneDNN primitives on one channel-blocked layout (see
// ops/blocked_chain.h). Planning a signature runs in four passes:
//   1. shapes of every value from the input shapes;
//   2. operators: each Conv takes the epilogue it can carry (folded constants, eltwise and
//      binary post-ops) and is emitted where the last absorbed node was, so a residual computed
//      after the Conv in topological order is ready; Sigmoid + Mul pairs become Swish;
//   3. memory: a buffer per produced value, assigned by liveness from a free list (elementwise
//      steps work in place when their input dies there);
//   4. primitives: created with the blocked layout for every value (region inputs stay NCHW
//      where a convolution takes them so, as the first layer of a CNN does), weights reordered
//      once into what each convolution wants.
#include "ops/blocked_chain.h"

#include <oneapi/dnnl/dnnl.hpp>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <unordered_map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ops/conv.h"
#include "ops/dnnl_util.h"
#include "ops/kernel_util.h"

namespace gaf {
namespace {

constexpr size_t kPlansKept = 4;  // input-shape signatures (x thread counts) planned per chain
constexpr int kLayoutRounds = 5;   // interleaved timed runs per layout (after a warm-up); the median decides

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;
using alg = dnnl::algorithm;

dnnl::memory::dims Dims(const Shape& s) { return dnnl::memory::dims(s.begin(), s.end()); }

std::string LayoutName(tag t) { return t == tag::nhwc ? "nhwc" : t == tag::nChw16c ? "nChw16c" : "nChw8c"; }

tag BlockTag() {
  static const tag t = __builtin_cpu_supports("avx512f") ? tag::nChw16c : tag::nChw8c;
  return t;
}

struct Act {
  alg a;
  float alpha = 0, beta = 0;
};

// The unary activation `n` as eltwise steps (HardSigmoid is linear then clip); false when it is
// not one. Clip bounds come from constants (`constant`).
bool ActivationOf(const Node& n, const std::function<const Tensor*(const std::string&)>& constant,
                  std::vector<Act>* acts, std::string* why) {
  acts->clear();
  const std::string& op = n.op_type;
  if (op == "Relu") acts->push_back({alg::eltwise_relu, 0.f, 0.f});
  else if (op == "LeakyRelu") acts->push_back({alg::eltwise_relu, n.GetFloat("alpha", 0.01f), 0.f});
  else if (op == "Sigmoid") acts->push_back({alg::eltwise_logistic});
  else if (op == "Tanh") acts->push_back({alg::eltwise_tanh});
  else if (op == "HardSwish") acts->push_back({alg::eltwise_hardswish});
  else if (op == "HardSigmoid") {
    acts->push_back({alg::eltwise_linear, n.GetFloat("alpha", 0.2f), n.GetFloat("beta", 0.5f)});
    acts->push_back({alg::eltwise_clip, 0.f, 1.f});
  } else if (op == "Clip") {
    float lo = -3.402823e38f, hi = 3.402823e38f;
    if (n.HasAttr("min") || n.HasAttr("max")) {
      lo = n.GetFloat("min", lo);
      hi = n.GetFloat("max", hi);
    }
    for (size_t i = 1; i < n.inputs.size() && i < 3; ++i) {
      if (n.inputs[i].empty()) continue;
      const Tensor* t = constant(n.inputs[i]);
      if (t == nullptr || t->numel() != 1 || t->dtype() != DataType::kFloat) {
        if (why) *why = n.Describe() + ": Clip bounds that are not constant float32 scalars";
        return false;
      }
      (i == 1 ? lo : hi) = static_cast<float>(t->ScalarAsDouble());
    }
    acts->push_back({alg::eltwise_clip, lo, hi});
  } else {
    return false;
  }
  return true;
}

bool IsUnaryActivation(const std::string& op) {
  return op == "Relu" || op == "LeakyRelu" || op == "Sigmoid" || op == "Tanh" || op == "HardSwish" ||
         op == "HardSigmoid" || op == "Clip";
}

// A constant usable as the second operand of Add/Mul on [N,C,H,W]: a scalar or one value per
// channel ([C,1,1] or [1,C,1,1]).
bool ScalarOrPerChannel(const Tensor& t, int64_t channels) {
  if (t.dtype() != DataType::kFloat) return false;
  if (t.numel() == 1) return true;
  if (channels > 0 && t.numel() != channels) return false;
  const Shape& s = t.shape();
  return (s.size() == 3 && s[1] == 1 && s[2] == 1) || (s.size() == 4 && s[0] == 1 && s[2] == 1 && s[3] == 1);
}

// Resize / Upsample nearest by integer factors [1,1,fh,fw] (false with `why` otherwise).
bool NearestFactors(const Node& n, const std::function<const Tensor*(const std::string&)>& constant,
                    const Shape* x, int64_t* fh, int64_t* fw, std::string* why) {
  auto fail = [&](const std::string& m) {
    if (why) *why = n.Describe() + ": " + m;
    return false;
  };
  if (n.GetString("mode", "nearest") != "nearest") return fail("only nearest resizing runs on blocked layouts");
  std::vector<float> scales;
  if (n.op_type == "Upsample" && n.HasAttr("scales")) {
    scales = n.GetFloats("scales");
  } else {
    const size_t si = n.op_type == "Upsample" || n.inputs.size() == 2 ? 1 : 2;
    if (n.op_type == "Resize") {
      if (n.GetInt("antialias", 0) != 0) return fail("antialiased resizing");
      const std::string ct = n.GetString("coordinate_transformation_mode", "half_pixel");
      const std::string nm = n.GetString("nearest_mode", "round_prefer_floor");
      // For integer factors these all pick source index floor(dst / factor), as oneDNN does.
      const bool ok = (ct == "asymmetric" && nm == "floor") ||
                      ((ct == "half_pixel" || ct == "pytorch_half_pixel") && nm == "round_prefer_floor");
      if (!ok) return fail("coordinate mode '" + ct + "' with nearest mode '" + nm + "'");
      if (!n.GetInts("axes").empty()) return fail("resizing with 'axes'");
    }
    const Tensor* s = si < n.inputs.size() && !n.inputs[si].empty() ? constant(n.inputs[si]) : nullptr;
    if (s != nullptr && s->numel() > 0) {
      if (s->dtype() != DataType::kFloat) return fail("scales that are not float32");
      for (int64_t i = 0; i < s->numel(); ++i) scales.push_back(s->data<float>()[i]);
    } else if (n.op_type == "Resize" && n.inputs.size() > 3 && !n.inputs[3].empty()) {
      const Tensor* sz = constant(n.inputs[3]);
      if (sz == nullptr || sz->dtype() != DataType::kInt64 || sz->numel() != 4) return fail("sizes that are not constant");
      if (x == nullptr || x->size() != 4) return fail("sizes without a known 4-D input shape");
      for (int i = 0; i < 4; ++i) {
        const int64_t o = sz->data<int64_t>()[i];
        if ((*x)[i] <= 0 || o % (*x)[i] != 0) return fail("sizes that are not integer multiples of the input");
        scales.push_back(static_cast<float>(o / (*x)[i]));
      }
    } else {
      return fail("scales that are not constant");
    }
  }
  if (scales.size() != 4 || scales[0] != 1.f || scales[1] != 1.f) return fail("resizing of batch or channels");
  for (int i = 2; i < 4; ++i)
    if (scales[i] < 1.f || scales[i] > 64.f || scales[i] != std::floor(scales[i]))
      return fail("a factor that is not an integer from 1 to 64");
  *fh = static_cast<int64_t>(scales[2]);
  *fw = static_cast<int64_t>(scales[3]);
  return true;
}

// Scratch owned by a plan: 64-byte aligned.
struct Buffer {
  std::unique_ptr<char, decltype(&std::free)> p{nullptr, &std::free};
  size_t bytes = 0;
};

// Planning fails rather than run oneDNN's reference implementation of a primitive, which is
// orders of magnitude slower than the kernels the chain is for (the caller keeps its own path).
template <class PD>
const PD& Optimized(const PD& pd, const Node& n) {
  const std::string impl = pd.impl_info_str();
  GAF_CHECK(impl.find("ref") == std::string::npos, "{}: oneDNN has only its reference implementation ({}) here",
            n.Describe(), impl);
  return pd;
}

}  // namespace

std::string BlockedChainRejects(const Node& n, const std::function<const Tensor*(const std::string&)>& constant,
                                const std::function<const Shape*(const std::string&)>& shape_of) {
  if (!n.domain.empty()) return n.Describe() + ": not an ONNX operator";
  for (const Attribute& a : n.attributes)
    if (a.g || !a.graphs.empty()) return n.Describe() + ": carries a subgraph";
  const std::string& op = n.op_type;
  auto cst = [&](size_t i) -> const Tensor* {
    return i < n.inputs.size() && !n.inputs[i].empty() ? constant(n.inputs[i]) : nullptr;
  };
  auto float_cst = [&](size_t i) {
    const Tensor* t = cst(i);
    return t != nullptr && t->dtype() == DataType::kFloat;
  };
  // Data values (non-constant inputs, the outputs) must be 4-D where their shapes are known.
  auto data_rank_ok = [&](const std::string& v) {
    if (v.empty() || constant(v) != nullptr) return true;
    const Shape* s = shape_of(v);
    return s == nullptr || s->size() == 4;
  };
  if (n.outputs.empty() || n.outputs[0].empty()) return n.Describe() + ": no output";
  if (n.inputs.empty() || n.inputs[0].empty()) return n.Describe() + ": no data input";
  for (size_t i = 1; i < n.outputs.size(); ++i)
    if (!n.outputs[i].empty()) return n.Describe() + ": a second output";
  std::string why;
  std::vector<Act> acts;
  if (op == "Conv") {
    const Tensor* w = cst(1);
    if (w == nullptr || w->dtype() != DataType::kFloat || w->rank() != 4) return n.Describe() + ": weight not a constant 4-D float32";
    if (n.HasInput(2) && !float_cst(2)) return n.Describe() + ": bias not a constant float32";
  } else if (op == "BatchNormalization") {
    if (n.GetInt("training_mode", 0) != 0) return n.Describe() + ": training mode";
    for (size_t i = 1; i < 5; ++i)
      if (!float_cst(i)) return n.Describe() + ": parameters not constant float32";
  } else if (IsUnaryActivation(op)) {
    if (!ActivationOf(n, constant, &acts, &why)) return why;
  } else if (op == "Identity") {
  } else if (op == "Add" || op == "Mul") {
    if (n.inputs.size() != 2) return n.Describe() + ": not two inputs";
    const Tensor *a = cst(0), *b = cst(1);
    if (a != nullptr && b != nullptr) return n.Describe() + ": constant operands";
    const Tensor* c = a != nullptr ? a : b;
    const Shape* xs = shape_of(n.inputs[a != nullptr ? 1 : 0]);
    if (c != nullptr) {
      if (!ScalarOrPerChannel(*c, xs != nullptr && xs->size() == 4 ? (*xs)[1] : -1))
        return n.Describe() + ": a constant operand that is neither a scalar nor per channel";
    } else {
      const Shape *sa = shape_of(n.inputs[0]), *sb = shape_of(n.inputs[1]);
      if ((sa != nullptr && sa->size() != 4) || (sb != nullptr && sb->size() != 4)) return n.Describe() + ": not 4-D";
      if (sa != nullptr && sb != nullptr && *sa != *sb) {
        const Shape& big = (*sa)[2] * (*sa)[3] >= (*sb)[2] * (*sb)[3] ? *sa : *sb;
        const Shape& small = &big == sa ? *sb : *sa;
        if (small.size() != 4 || big.size() != 4 || small[0] != big[0] || small[1] != big[1] || small[2] != 1 ||
            small[3] != 1)
          return n.Describe() + ": operand shapes " + ShapeToString(*sa) + " and " + ShapeToString(*sb) +
                 " (same shape or [N,C,1,1] broadcast only)";
      }
    }
  } else if (op == "MaxPool" || op == "AveragePool") {
    if (n.GetInts("kernel_shape").size() != 2) return n.Describe() + ": not a 2-D window";
    for (int64_t d : n.GetInts("dilations"))
      if (d != 1) return n.Describe() + ": dilated pooling";
    if (op == "MaxPool" && n.GetInt("storage_order", 0) != 0) return n.Describe() + ": storage_order";
    if (op == "AveragePool" && n.GetInt("count_include_pad", 0) != 0 && n.GetInt("ceil_mode", 0) != 0)
      return n.Describe() + ": count_include_pad with ceil_mode";
  } else if (op == "GlobalAveragePool" || op == "GlobalMaxPool") {
  } else if (op == "Concat") {
    const int64_t axis = n.GetInt("axis", 0);
    if (axis != 1 && axis != -3) return n.Describe() + ": not along channels";
    // oneDNN concatenates blocked tensors well only when each part fills whole channel blocks.
    for (const auto& in : n.inputs) {
      const Shape* s = in.empty() ? nullptr : shape_of(in);
      if (s != nullptr && s->size() == 4 && (*s)[1] % 16 != 0)
        return n.Describe() + ": input '" + in + "' has " + std::to_string((*s)[1]) +
               " channels, not a multiple of the 16-channel block";
    }
  } else if (op == "Resize" || op == "Upsample") {
    int64_t fh = 0, fw = 0;
    if (!NearestFactors(n, constant, shape_of(n.inputs[0]), &fh, &fw, &why)) return why;
  } else if (op == "ConvTranspose") {
    // oneDNN 2.6's deconvolution ran the PP-OCR-like head's 2x2 stride-2 upsampling 10-100x slower
    // than our ConvTranspose kernel: it stays outside chains.
    return n.Describe() + ": ConvTranspose is left to our own kernel (oneDNN's deconvolution is slow here)";
  } else {
    return n.Describe() + ": " + op + " does not run on blocked layouts";
  }
  if (!data_rank_ok(n.inputs[0]) || !data_rank_ok(n.outputs[0])) return n.Describe() + ": not 4-D";
  if ((op == "Add" || op == "Mul" || op == "Concat") &&
      !std::all_of(n.inputs.begin(), n.inputs.end(), data_rank_ok))
    return n.Describe() + ": not 4-D";
  return "";
}

struct BlockedChain::Impl {
  std::vector<Node> nodes;
  std::vector<std::string> inputs, outputs;
  std::map<std::string, Tensor> constants;

  const Tensor* Constant(const std::string& v) const {
    auto it = constants.find(v);
    return it == constants.end() ? nullptr : &it->second;
  }

  struct Step {
    dnnl::primitive prim;
    std::unordered_map<int, dnnl::memory> args;
  };
  struct Plan {
    std::vector<Shape> in_shapes;
    int threads = 0;
    std::vector<Buffer> buffers;
    std::vector<dnnl::memory> owned;  // weights, biases, constants in the primitives' layouts
    std::vector<Step> steps;
    std::vector<dnnl::memory> input_mem;   // user (NCHW) memory per input; handles set per call
    std::vector<dnnl::memory> output_mem;  // user memory per output
    std::vector<Shape> out_shapes;
    Stats stats;
    std::string layout;
    double measured_ms = 0;  // the median of its timed runs when the layout was chosen by measurement
  };
  std::mutex mu;
  std::shared_ptr<Plan> last;
  std::vector<std::shared_ptr<Plan>> plans;  // by input shapes and thread count, oldest first
  BlockedChain::Layout layout = BlockedChain::Layout::kMeasured;
  BlockedChain::LayoutStore store;
  // What the layout choice depends on, for the store (see LayoutStore).
  std::string ChoiceKey(const std::vector<Shape>& in_shapes, int threads) const {
    std::string k = fmt::format("blocked-chain v1 dnnl {}.{}.{} threads {} inputs", DNNL_VERSION_MAJOR,
                                DNNL_VERSION_MINOR, DNNL_VERSION_PATCH, threads);
    for (const Shape& sh : in_shapes) k += " " + ShapeToString(sh);
    for (const Node& n : nodes) {
      k += "\n" + n.op_type + "(";
      for (const auto& in : n.inputs) {
        const Tensor* c = in.empty() ? nullptr : Constant(in);
        k += c != nullptr ? "const" + ShapeToString(c->shape()) : "v";
        k += ",";
      }
      k += ")";
      for (const Attribute& a : n.attributes) {
        k += " " + a.name + "=";
        if (a.type == Attribute::Type::kInt) k += std::to_string(a.i);
        else if (a.type == Attribute::Type::kFloat) k += fmt::format("{}", a.f);
        else if (a.type == Attribute::Type::kString) k += fmt::format("{:?}", a.s);
        else if (a.type == Attribute::Type::kInts) k += fmt::format("{}", fmt::join(a.ints, ","));
        else if (a.type == Attribute::Type::kFloats) k += fmt::format("{}", fmt::join(a.floats, ","));
        else k += "?";
      }
    }
    return k;
  }
  std::string measured;       // what the last choice measured

  // `layout`: the format of every value inside the chain (a channel-blocked tag, or nhwc).
  std::shared_ptr<Plan> Build(const std::vector<Shape>& in_shapes, bool binary_post_ops, dnnl::memory::format_tag layout);
};

namespace {

// One operator of the plan: a node plus what it absorbed.
struct Op {
  enum Kind { kConv, kBatchNorm, kEltwise, kBinary, kPool, kConcat, kResize, kIdentity } kind;
  int node = -1;      // the anchor node
  int emit = -1;      // position in the node order where it runs (its last absorbed node)
  std::vector<std::string> in;  // data inputs (values of the chain or its inputs)
  std::string out;
  std::vector<Act> acts;        // eltwise post-ops (or the eltwise op itself)
  // kConv: folded per-channel scale/shift (BatchNormalization, Add/Mul of constants) and a residual.
  std::vector<float> scale, shift;
  bool folded = false;
  std::string residual;         // binary add post-op operand
  int residual_pos = -1;        // where it sits among the post-ops (index into the post-op list)
  alg binary = alg::binary_add;
  const Tensor* binary_const = nullptr;  // kBinary with a constant operand
  int absorbed = 0;
};

}  // namespace

std::shared_ptr<BlockedChain::Impl::Plan> BlockedChain::Impl::Build(const std::vector<Shape>& in_shapes,
                                                                     bool binary_post_ops, dnnl::memory::format_tag layout) {
  auto plan = std::make_shared<Plan>();
  plan->in_shapes = in_shapes;
  plan->threads = omp_get_max_threads();
  auto constant = [&](const std::string& v) { return Constant(v); };
  // 1. Shapes.
  std::map<std::string, Shape> shape;
  for (size_t i = 0; i < inputs.size(); ++i)
    if (!Constant(inputs[i])) {
      GAF_CHECK(i < in_shapes.size() && in_shapes[i].size() == 4, "blocked chain: input '{}' is not 4-D", inputs[i]);
      shape[inputs[i]] = in_shapes[i];
    }
  auto shape_of = [&](const std::string& v) -> const Shape& {
    auto it = shape.find(v);
    GAF_CHECK(it != shape.end(), "blocked chain: no shape for '{}'", v);
    return it->second;
  };
  for (const Node& n : nodes) {
    const std::string& op = n.op_type;
    const Shape& x = shape_of(n.inputs[0].empty() ? std::string("?") : (Constant(n.inputs[0]) && n.inputs.size() > 1 ? n.inputs[1] : n.inputs[0]));
    Shape y = x;
    if (op == "Conv") {
      y = ConvOutputShape(n, shape_of(n.inputs[0]), Constant(n.inputs[1])->shape());
    } else if (op == "MaxPool" || op == "AveragePool") {
      ConvGeometry g = PoolGeometryOf(n, x, n.GetInts("kernel_shape"));
      y = {x[0], x[1], g.out[1], g.out[2]};
    } else if (op == "GlobalAveragePool" || op == "GlobalMaxPool") {
      y = {x[0], x[1], 1, 1};
    } else if (op == "Concat") {
      y = shape_of(n.inputs[0]);
      y[1] = 0;
      for (const auto& in : n.inputs) {
        const Shape& s = shape_of(in);
        GAF_CHECK(s[0] == y[0] && s[2] == y[2] && s[3] == y[3], "{}: inputs differ outside the channel axis", n.Describe());
        y[1] += s[1];
      }
    } else if (op == "Resize" || op == "Upsample") {
      int64_t fh = 0, fw = 0;
      std::string why;
      GAF_CHECK(NearestFactors(n, constant, &x, &fh, &fw, &why), "{}", why);
      y = {x[0], x[1], x[2] * fh, x[3] * fw};
    } else if ((op == "Add" || op == "Mul") && !Constant(n.inputs[0]) && !Constant(n.inputs[1])) {
      const Shape &a = shape_of(n.inputs[0]), &b = shape_of(n.inputs[1]);
      y = a[2] * a[3] >= b[2] * b[3] ? a : b;
    }
    for (int64_t d : y) GAF_CHECK(d > 0, "{}: an empty output", n.Describe());
    shape[n.outputs[0]] = y;
  }
  // Uses inside the chain; outputs of the chain.
  std::map<std::string, int> uses;
  for (const Node& n : nodes)
    for (const auto& in : n.inputs)
      if (!in.empty()) uses[in]++;
  std::set<std::string> is_output(outputs.begin(), outputs.end());
  std::map<std::string, int> producer;
  for (size_t i = 0; i < nodes.size(); ++i) producer[nodes[i].outputs[0]] = static_cast<int>(i);
  auto sole_consumer = [&](const std::string& v) -> int {
    if (is_output.count(v) || uses[v] != 1) return -1;
    for (size_t i = 0; i < nodes.size(); ++i)
      for (const auto& in : nodes[i].inputs)
        if (in == v) return static_cast<int>(i);
    return -1;
  };
  auto consumers = [&](const std::string& v) {
    std::vector<int> c;
    for (size_t i = 0; i < nodes.size(); ++i)
      if (std::find(nodes[i].inputs.begin(), nodes[i].inputs.end(), v) != nodes[i].inputs.end())
        c.push_back(static_cast<int>(i));
    return c;
  };
  // x * Sigmoid(x) (SiLU / Swish) and x * HardSigmoid(x) with alpha 1/6, beta 1/2 (HardSwish, as
  // exporters write it before opset 14): the Mul node index when node s is the gate of such a
  // pair, else -1; gate_act gives the activation the pair is.
  auto gate_act = [&](int s) -> Act {
    return nodes[s].op_type == "Sigmoid" ? Act{alg::eltwise_swish, 1.f, 0.f} : Act{alg::eltwise_hardswish, 0.f, 0.f};
  };
  auto swish_mul = [&](int s) -> int {
    const Node& sig = nodes[s];
    const bool hard = sig.op_type == "HardSigmoid" && std::abs(sig.GetFloat("alpha", 0.2f) - 1.f / 6) < 1e-6f &&
                      sig.GetFloat("beta", 0.5f) == 0.5f;
    if (sig.op_type != "Sigmoid" && !hard) return -1;
    const int m = sole_consumer(sig.outputs[0]);
    if (m < 0 || nodes[m].op_type != "Mul") return -1;
    const Node& mul = nodes[m];
    const std::string& x = sig.inputs[0];
    if (!((mul.inputs[0] == x && mul.inputs[1] == sig.outputs[0]) || (mul.inputs[1] == x && mul.inputs[0] == sig.outputs[0])))
      return -1;
    return m;
  };

  // 2. Operators.
  std::vector<bool> absorbed(nodes.size(), false);
  std::vector<Op> ops;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (absorbed[i]) continue;
    const Node& n = nodes[i];
    const std::string& opt = n.op_type;
    Op op;
    op.node = static_cast<int>(i);
    op.emit = static_cast<int>(i);
    op.out = n.outputs[0];
    std::vector<Act> acts;
    if (opt == "Conv") {
      op.kind = Op::kConv;
      op.in = {n.inputs[0]};
      const int64_t M = Constant(n.inputs[1])->dim(0);
      op.scale.assign(static_cast<size_t>(M), 1.f);
      op.shift.assign(static_cast<size_t>(M), 0.f);
      if (n.HasInput(2))
        for (int64_t c = 0; c < M; ++c) op.shift[static_cast<size_t>(c)] = Constant(n.inputs[2])->data<float>()[c];
      // Absorb the epilogue while the current value has one consumer.
      std::string cur = op.out;
      int post = 0;  // post-ops so far
      for (;;) {
        const int c = sole_consumer(cur);
        int pair_mul = -1;
        if (c < 0) {
          // x * Sigmoid(x) reads x twice.
          auto cs = consumers(cur);
          if (is_output.count(cur) || cs.size() != 2) break;
          int gate = -1;
          for (int s : cs) {
            const int m = swish_mul(s);
            if (m >= 0 && std::find(cs.begin(), cs.end(), m) != cs.end()) pair_mul = m, gate = s;
          }
          if (pair_mul < 0 || absorbed[pair_mul]) break;
          op.acts.push_back(gate_act(gate));
          for (int s : cs) absorbed[s] = true;
          op.emit = std::max(op.emit, pair_mul);
          op.absorbed += 2;
          ++post;
          cur = nodes[pair_mul].outputs[0];
          continue;
        }
        if (absorbed[c]) break;  // taken by another operator's epilogue (the other side of a residual Add)
        const Node& e = nodes[c];
        const bool first = post == 0;
        if (e.op_type == "BatchNormalization" && first && e.inputs[0] == cur) {
          const float eps = e.GetFloat("epsilon", 1e-5f);
          const Tensor *g = Constant(e.inputs[1]), *b = Constant(e.inputs[2]), *mu = Constant(e.inputs[3]),
                       *var = Constant(e.inputs[4]);
          if (g->numel() != M || b->numel() != M || mu->numel() != M || var->numel() != M) break;
          for (int64_t k = 0; k < M; ++k) {
            const size_t u = static_cast<size_t>(k);
            const double a = g->data<float>()[k] / std::sqrt(static_cast<double>(var->data<float>()[k]) + eps);
            op.scale[u] = static_cast<float>(op.scale[u] * a);
            op.shift[u] = static_cast<float>((op.shift[u] - mu->data<float>()[k]) * a + b->data<float>()[k]);
          }
          op.folded = true;
        } else if ((e.op_type == "Add" || e.op_type == "Mul") && first &&
                   (Constant(e.inputs[0]) != nullptr || Constant(e.inputs[1]) != nullptr)) {
          const Tensor* t = Constant(e.inputs[0]) != nullptr ? Constant(e.inputs[0]) : Constant(e.inputs[1]);
          if (!ScalarOrPerChannel(*t, M)) break;
          for (int64_t k = 0; k < M; ++k) {
            const size_t u = static_cast<size_t>(k);
            const float v = t->data<float>()[t->numel() == 1 ? 0 : k];
            if (e.op_type == "Add") {
              op.shift[u] += v;
            } else {
              op.scale[u] *= v;
              op.shift[u] *= v;
            }
          }
          op.folded = true;
        } else if (e.op_type == "Add" && binary_post_ops && op.residual.empty()) {
          const std::string& other = e.inputs[0] == cur ? e.inputs[1] : e.inputs[0];
          if (other == cur || Constant(other) != nullptr || shape_of(other) != shape_of(cur)) break;
          op.residual = other;
          op.residual_pos = post;
          ++post;
        } else if (IsUnaryActivation(e.op_type) && e.inputs[0] == cur && ActivationOf(e, constant, &acts, nullptr)) {
          if (swish_mul(c) >= 0) break;  // handled above as a pair when the value is read twice
          op.acts.insert(op.acts.end(), acts.begin(), acts.end());
          post += static_cast<int>(acts.size());
        } else if (e.op_type == "Identity") {
        } else {
          break;
        }
        absorbed[c] = true;
        op.emit = std::max(op.emit, c);
        ++op.absorbed;
        cur = e.outputs[0];
      }
      op.out = cur;
    } else if (opt == "BatchNormalization") {
      op.kind = Op::kBatchNorm;
      op.in = {n.inputs[0]};
      const int c = sole_consumer(op.out);
      if (c >= 0 && !absorbed[c] && nodes[c].op_type == "Relu") {
        absorbed[c] = true;
        op.emit = c;
        op.out = nodes[c].outputs[0];
        op.acts.push_back({alg::eltwise_relu});
        ++op.absorbed;
      }
    } else if (swish_mul(static_cast<int>(i)) >= 0) {
      // Swish / HardSwish on its own: the Mul (later in the order) produces the value.
      const int m = swish_mul(static_cast<int>(i));
      op.kind = Op::kEltwise;
      op.in = {n.inputs[0]};
      op.acts = {gate_act(static_cast<int>(i))};
      absorbed[m] = true;
      op.emit = m;
      op.out = nodes[m].outputs[0];
      ++op.absorbed;
    } else if (ActivationOf(n, constant, &acts, nullptr)) {
      op.kind = Op::kEltwise;
      op.in = {n.inputs[0]};
      op.acts = acts;
    } else if ((opt == "Add" || opt == "Mul") &&
               ((Constant(n.inputs[0]) && Constant(n.inputs[0])->numel() == 1) ||
                (Constant(n.inputs[1]) && Constant(n.inputs[1])->numel() == 1))) {
      // By a scalar: a linear eltwise step (alpha * x + beta).
      const bool first_const = Constant(n.inputs[0]) != nullptr;
      const float v = static_cast<float>(Constant(n.inputs[first_const ? 0 : 1])->ScalarAsDouble());
      op.kind = Op::kEltwise;
      op.in = {n.inputs[first_const ? 1 : 0]};
      op.acts = {opt == "Add" ? Act{alg::eltwise_linear, 1.f, v} : Act{alg::eltwise_linear, v, 0.f}};
    } else if (opt == "Add" || opt == "Mul") {
      op.kind = Op::kBinary;
      op.binary = opt == "Add" ? alg::binary_add : alg::binary_mul;
      const Tensor *a = Constant(n.inputs[0]), *b = Constant(n.inputs[1]);
      if (a != nullptr || b != nullptr) {
        op.in = {a != nullptr ? n.inputs[1] : n.inputs[0]};
        op.binary_const = a != nullptr ? a : b;
      } else {
        // The full-size operand first: oneDNN broadcasts src1 only.
        const Shape &sa = shape_of(n.inputs[0]), &sb = shape_of(n.inputs[1]);
        op.in = sa[2] * sa[3] >= sb[2] * sb[3] ? std::vector<std::string>{n.inputs[0], n.inputs[1]}
                                               : std::vector<std::string>{n.inputs[1], n.inputs[0]};
      }
      // Activations after it as its post-ops.
      for (std::string cur = op.out;;) {
        const int c = sole_consumer(cur);
        if (c < 0 || absorbed[c] || !IsUnaryActivation(nodes[c].op_type) || swish_mul(c) >= 0 ||
            !ActivationOf(nodes[c], constant, &acts, nullptr))
          break;
        op.acts.insert(op.acts.end(), acts.begin(), acts.end());
        absorbed[c] = true;
        op.emit = c;
        ++op.absorbed;
        cur = op.out = nodes[c].outputs[0];
      }
    } else if (opt == "MaxPool" || opt == "AveragePool" || opt == "GlobalAveragePool" || opt == "GlobalMaxPool") {
      op.kind = Op::kPool;
      op.in = {n.inputs[0]};
    } else if (opt == "Concat") {
      op.kind = Op::kConcat;
      op.in = n.inputs;
    } else if (opt == "Resize" || opt == "Upsample") {
      op.kind = Op::kResize;
      op.in = {n.inputs[0]};
    } else if (opt == "Identity") {
      op.kind = Op::kIdentity;
      op.in = {n.inputs[0]};
    } else {
      throw Error(n.Describe() + ": not a blocked-chain operator");
    }
    ops.push_back(std::move(op));
  }
  std::stable_sort(ops.begin(), ops.end(), [](const Op& a, const Op& b) { return a.emit < b.emit; });

  // 3. Memory. Values: chain inputs (user memory, NCHW; a blocked copy made when an operator
  // needs one), produced values (blocked buffers by liveness).
  dnnl::engine& eng = DnnlEngine();
  const tag bt = layout;
  const bool channel_blocked = bt == tag::nChw16c || bt == tag::nChw8c;
  plan->layout = LayoutName(bt);
  auto blocked_md = [&](const Shape& s) { return dnnl::memory::desc(Dims(s), dt::f32, bt); };
  auto plain_md = [&](const Shape& s) { return dnnl::memory::desc(Dims(s), dt::f32, tag::nchw); };
  std::map<std::string, int> last_use;  // op index
  for (size_t k = 0; k < ops.size(); ++k) {
    for (const auto& in : ops[k].in) last_use[in] = static_cast<int>(k);
    if (!ops[k].residual.empty()) last_use[ops[k].residual] = static_cast<int>(k);
  }
  for (const auto& o : outputs) last_use[o] = static_cast<int>(ops.size());
  std::map<std::string, int> buffer_of;
  std::map<std::string, int> assigned;  // every blocked value's buffer (buffer_of: the live ones)
  std::vector<int> free_buffers;
  std::vector<size_t> buffer_size;
  auto new_buffer = [&](size_t bytes) {
    // Best fit among the free buffers, else a new one.
    int best = -1;
    for (size_t j = 0; j < free_buffers.size(); ++j) {
      const int b = free_buffers[j];
      if (buffer_size[b] >= bytes && (best < 0 || buffer_size[b] < buffer_size[free_buffers[best]])) best = static_cast<int>(j);
    }
    if (best >= 0) {
      const int b = free_buffers[best];
      free_buffers.erase(free_buffers.begin() + best);
      return b;
    }
    // A free buffer too small is grown rather than left unused.
    if (!free_buffers.empty()) {
      const int b = free_buffers.back();
      free_buffers.pop_back();
      buffer_size[b] = bytes;
      return b;
    }
    buffer_size.push_back(bytes);
    return static_cast<int>(buffer_size.size()) - 1;
  };
  std::map<std::string, int> input_index;
  for (size_t i = 0; i < inputs.size(); ++i)
    if (!Constant(inputs[i])) input_index[inputs[i]] = static_cast<int>(i);
  plan->input_mem.resize(inputs.size());
  for (const auto& [name, i] : input_index) plan->input_mem[i] = dnnl::memory(plain_md(shape_of(name)), eng, nullptr);

  // Concat without copies (batch 1): in the blocked layout a channel range that starts on a block
  // boundary is a contiguous slice of the buffer, so the producers of a Concat's inputs write
  // straight into their slices of its output. Concats are placed from the last to the first: the
  // inputs of a dense block's last Concat go into its buffer, and each earlier Concat of a prefix
  // of them is then a view of that buffer (DenseNet's L concats cost no copy at all). Values keep
  // one place each; an input that cannot move (a chain input, placed already) is copied in.
  std::map<std::string, std::pair<std::string, int64_t>> place;  // value -> (root value, channel offset)
  std::set<int> view_concats;                                    // ops that need no step
  for (int k = static_cast<int>(ops.size()) - 1; k >= 0; --k) {
    const Op& op = ops[static_cast<size_t>(k)];
    if (!channel_blocked || op.kind != Op::kConcat || shape_of(op.out)[0] != 1) continue;
    std::string root = op.out;
    int64_t base = 0;
    if (place.count(op.out)) std::tie(root, base) = place[op.out];
    // Already in one root, one after another: a view.
    bool consecutive = true;
    int64_t expect = -1;
    std::string r0;
    for (const auto& in : op.in) {
      auto it = place.find(in);
      if (it == place.end() || (expect >= 0 && (it->second.first != r0 || it->second.second != expect))) {
        consecutive = false;
        break;
      }
      if (expect < 0) r0 = it->second.first, expect = it->second.second;
      expect += shape_of(in)[1];
    }
    if (consecutive && !place.count(op.out)) {
      place[op.out] = {r0, place[op.in[0]].second};
      view_concats.insert(k);
      continue;
    }
    int64_t off = base;
    for (const auto& in : op.in) {
      const int64_t c = shape_of(in)[1];
      if (!place.count(in) && !input_index.count(in) && in != root && c % 16 == 0 && off % 16 == 0)
        place[in] = {root, off};
      off += c;
    }
  }
  // A root's buffer lives as long as any value placed in it.
  for (const auto& [v, where] : place) {
    auto lu = last_use.find(v);
    if (lu != last_use.end()) last_use[where.first] = std::max(last_use[where.first], lu->second);
  }
  auto placed = [&](const std::string& v) {
    if (place.count(v)) return true;
    for (const auto& [w, where] : place)
      if (where.first == v) return true;
    return false;
  };

  // Steps are recorded with buffer indices and bound to addresses once all sizes are known.
  struct PendingArg {
    int step, arg;
    std::string value;
  };
  std::vector<PendingArg> pending;
  std::map<std::string, dnnl::memory::desc> value_md;
  auto md_of = [&](const std::string& v) -> const dnnl::memory::desc& {
    auto it = value_md.find(v);
    GAF_CHECK(it != value_md.end(), "blocked chain: value '{}' is used before it is produced", v);
    return it->second;
  };
  auto add_step = [&](dnnl::primitive p, std::unordered_map<int, dnnl::memory> args) {
    plan->steps.push_back({std::move(p), std::move(args)});
    return static_cast<int>(plan->steps.size()) - 1;
  };
  // The blocked form of a value for reading: produced values are blocked; a chain input gets one
  // reorder (made on first need, its buffer live until its last reader).
  auto read_blocked = [&](const std::string& v, int step, int arg) { pending.push_back({step, arg, v}); };
  auto ensure_blocked_input = [&](const std::string& v) {
    if (value_md.count(v)) return;
    const Shape& s = shape_of(v);
    value_md[v] = blocked_md(s);
    buffer_of[v] = assigned[v] = new_buffer(value_md[v].get_size());
    auto r = dnnl::reorder(dnnl::reorder::primitive_desc(eng, plain_md(s), eng, value_md[v]));
    const int st = add_step(r, {{DNNL_ARG_FROM, plan->input_mem[input_index.at(v)]}});
    read_blocked(v, st, DNNL_ARG_TO);
    plan->stats.reorders_in++;
  };
  auto release = [&](int k) {
    for (auto it = buffer_of.begin(); it != buffer_of.end();) {
      auto lu = last_use.find(it->first);
      if (lu != last_use.end() && lu->second == k && !is_output.count(it->first)) {
        free_buffers.push_back(it->second);
        it = buffer_of.erase(it);
      } else {
        ++it;
      }
    }
  };
  auto define_output = [&](const std::string& v, int in_place_of = -1) {
    value_md[v] = blocked_md(shape_of(v));
    auto pl = place.find(v);
    const std::string& root = pl == place.end() ? v : pl->second.first;
    if (!assigned.count(root)) buffer_of[root] = assigned[root] = new_buffer(blocked_md(shape_of(root)).get_size());
    if (pl == place.end() && in_place_of >= 0) {
      free_buffers.push_back(assigned[v]);  // not used after all
      buffer_of[v] = assigned[v] = in_place_of;
    }
  };
  auto eltwise_post_ops = [](const std::vector<Act>& acts) {
    dnnl::post_ops po;
    for (const Act& a : acts) po.append_eltwise(1.f, a.a, a.alpha, a.beta);
    return po;
  };

  // 4. Primitives, in order.
  for (size_t k = 0; k < ops.size(); ++k) {
    const Op& op = ops[k];
    const Node& n = nodes[op.node];
    for (const auto& in : op.in)
      if (input_index.count(in) && !(op.kind == Op::kConv)) ensure_blocked_input(in);
    if (!op.residual.empty() && input_index.count(op.residual)) ensure_blocked_input(op.residual);
    const Shape& y = shape_of(op.out);
    if (op.kind == Op::kConv) {
      const Tensor& w = *Constant(n.inputs[1]);
      const Shape& x = shape_of(op.in[0]);
      ConvGeometry g = ConvGeometryOf(n, x, w.shape());
      const int64_t G = g.group, M = w.dim(0);
      dnnl::memory::dims wd = G == 1 ? Dims(w.shape())
                                     : dnnl::memory::dims{G, M / G, w.dim(1), w.dim(2), w.dim(3)};
      dnnl::memory::dims strides{g.s[1], g.s[2]}, dil{g.d[1] - 1, g.d[2] - 1}, pad_l{g.pb[1], g.pb[2]},
          pad_r{g.pe[1], g.pe[2]};
      // A residual that dies here is added in place: the convolution writes into its buffer with
      // a sum post-op (which every oneDNN kernel has); otherwise a binary post-op reads it.
      const bool sum_in_place = !op.residual.empty() && op.residual != op.in[0] && !input_index.count(op.residual) &&
                                !placed(op.residual) &&
                                !placed(op.out) && !is_output.count(op.residual) &&
                                last_use[op.residual] == static_cast<int>(k) && buffer_of.count(op.residual);
      if (sum_in_place) {
        value_md[op.out] = blocked_md(shape_of(op.out));
        buffer_of[op.out] = assigned[op.out] = buffer_of.at(op.residual);
        buffer_of.erase(op.residual);
      } else {
        define_output(op.out);
      }
      dnnl::primitive_attr attr;
      dnnl::post_ops po;
      int pi = 0;
      size_t ai = 0;
      for (; pi < static_cast<int>(op.acts.size()) + (op.residual.empty() ? 0 : 1); ++pi) {
        if (pi == op.residual_pos) {
          if (sum_in_place) po.append_sum(1.f);
          else po.append_binary(alg::binary_add, md_of(op.residual));
        } else {
          po.append_eltwise(1.f, op.acts[ai].a, op.acts[ai].alpha, op.acts[ai].beta), ++ai;
        }
      }
      attr.set_post_ops(po);
      const bool plain_src = input_index.count(op.in[0]) && !value_md.count(op.in[0]);
      auto make_pd = [&](const dnnl::memory::desc& src_md) {
        auto desc = dnnl::convolution_forward::desc(
            dnnl::prop_kind::forward_inference, alg::convolution_direct, src_md,
            dnnl::memory::desc(wd, dt::f32, tag::any), dnnl::memory::desc({M}, dt::f32, tag::x), md_of(op.out),
            strides, dil, pad_l, pad_r);
        return dnnl::convolution_forward::primitive_desc(desc, attr, eng);
      };
      dnnl::convolution_forward::primitive_desc pd;
      bool src_plain = false;
      if (plain_src) {
        // The chain's input as given (NCHW), as oneDNN's first-layer kernels read it, unless only
        // the reference implementation takes it.
        try {
          pd = make_pd(plain_md(x));
          src_plain = std::string(pd.impl_info_str()).find("ref") == std::string::npos;
        } catch (const dnnl::error&) {
        }
        if (!src_plain) {
          ensure_blocked_input(op.in[0]);
        }
      }
      std::string conv_src = op.in[0];
      if (!src_plain) {
        pd = make_pd(md_of(op.in[0]));
        if (std::string(pd.impl_info_str()).find("ref") != std::string::npos) {
          // No optimized kernel reads this source in the blocked layout (few channels, padded):
          // the source in the layout oneDNN picks for it, one reorder inside the chain.
          pd = make_pd(dnnl::memory::desc(Dims(x), dt::f32, tag::any));
          GAF_CHECK(std::string(pd.impl_info_str()).find("ref") == std::string::npos,
                    "{}: oneDNN has only its reference convolution for input {} (kernel {}x{}, group {})", n.Describe(),
                    ShapeToString(x), w.dim(2), w.dim(3), G);
          conv_src = op.in[0] + "#src";
          value_md[conv_src] = pd.src_desc();
          buffer_of[conv_src] = assigned[conv_src] = new_buffer(pd.src_desc().get_size());
          last_use[conv_src] = static_cast<int>(k);
          auto r = dnnl::reorder(dnnl::reorder::primitive_desc(eng, md_of(op.in[0]), eng, pd.src_desc()));
          const int rs = add_step(r, {});
          read_blocked(op.in[0], rs, DNNL_ARG_FROM);
          read_blocked(conv_src, rs, DNNL_ARG_TO);
          plan->stats.reorders_inside++;
        }
      }
      // Weights scaled by the folded per-channel factors, reordered once into the primitive's layout.
      Tensor wf(DataType::kFloat, w.shape());
      const int64_t per = w.numel() / M;
      for (int64_t o = 0; o < M; ++o)
        for (int64_t j = 0; j < per; ++j)
          wf.data<float>()[o * per + j] = w.data<float>()[o * per + j] * op.scale[static_cast<size_t>(o)];
      dnnl::stream s(eng);
      dnnl::memory user_w(dnnl::memory::desc(wd, dt::f32, G == 1 ? tag::oihw : tag::goihw), eng, wf.data<float>());
      dnnl::memory wm(pd.weights_desc(), eng);
      dnnl::reorder(user_w, wm).execute(s, user_w, wm);
      s.wait();
      dnnl::memory bm(pd.bias_desc(), eng);
      std::memcpy(bm.get_data_handle(), op.shift.data(), sizeof(float) * op.shift.size());
      plan->owned.push_back(wm);
      plan->owned.push_back(bm);
      std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_BIAS, bm}};
      if (src_plain) args[DNNL_ARG_SRC] = plan->input_mem[input_index.at(op.in[0])];
      const int st = add_step(dnnl::convolution_forward(pd), std::move(args));
      if (!src_plain) read_blocked(conv_src, st, DNNL_ARG_SRC);
      read_blocked(op.out, st, DNNL_ARG_DST);
      if (!op.residual.empty() && !sum_in_place)
        read_blocked(op.residual, st, DNNL_ARG_ATTR_MULTIPLE_POST_OP(op.residual_pos) | DNNL_ARG_SRC_1);
      if (sum_in_place) plan->stats.residuals_in_place++;
      plan->stats.convs++;
      plan->stats.post_ops += op.absorbed;
    } else if (op.kind == Op::kBatchNorm) {
      const int64_t C = shape_of(op.in[0])[1];
      const bool in_place = !input_index.count(op.in[0]) && last_use[op.in[0]] == static_cast<int>(k) &&
                            !placed(op.in[0]) && !placed(op.out) &&
                            !is_output.count(op.in[0]);
      define_output(op.out, in_place ? buffer_of.at(op.in[0]) : -1);
      if (in_place) buffer_of.erase(op.in[0]);
      auto flags = dnnl::normalization_flags::use_global_stats | dnnl::normalization_flags::use_scale |
                   dnnl::normalization_flags::use_shift;
      if (!op.acts.empty()) flags = flags | dnnl::normalization_flags::fuse_norm_relu;
      auto desc = dnnl::batch_normalization_forward::desc(dnnl::prop_kind::forward_inference, md_of(op.in[0]),
                                                          n.GetFloat("epsilon", 1e-5f), flags);
      dnnl::batch_normalization_forward::primitive_desc pd(desc, eng);
      std::unordered_map<int, dnnl::memory> args;
      const int arg_of[4] = {DNNL_ARG_SCALE, DNNL_ARG_SHIFT, DNNL_ARG_MEAN, DNNL_ARG_VARIANCE};
      for (int p = 0; p < 4; ++p) {
        const Tensor* t = Constant(n.inputs[1 + p]);
        GAF_CHECK(t->numel() == C, "{}: parameter {} has {} values for {} channels", n.Describe(), p + 1, t->numel(), C);
        dnnl::memory m(dnnl::memory::desc({C}, dt::f32, tag::x), eng);
        std::memcpy(m.get_data_handle(), t->data<float>(), sizeof(float) * static_cast<size_t>(C));
        plan->owned.push_back(m);
        args[arg_of[p]] = m;
      }
      const int st = add_step(dnnl::batch_normalization_forward(Optimized(pd, n)), std::move(args));
      read_blocked(op.in[0], st, DNNL_ARG_SRC);
      read_blocked(op.out, st, DNNL_ARG_DST);
    } else if (op.kind == Op::kEltwise) {
      const bool in_place = !input_index.count(op.in[0]) && last_use[op.in[0]] == static_cast<int>(k) &&
                            !placed(op.in[0]) && !placed(op.out) &&
                            !is_output.count(op.in[0]);
      define_output(op.out, in_place ? buffer_of.at(op.in[0]) : -1);
      if (in_place) buffer_of.erase(op.in[0]);
      for (size_t a = 0; a < op.acts.size(); ++a) {
        auto desc = dnnl::eltwise_forward::desc(dnnl::prop_kind::forward_inference, op.acts[a].a, md_of(op.out),
                                                op.acts[a].alpha, op.acts[a].beta);
        dnnl::eltwise_forward::primitive_desc pd(desc, eng);
        const int st = add_step(dnnl::eltwise_forward(Optimized(pd, n)), {});
        read_blocked(a == 0 ? op.in[0] : op.out, st, DNNL_ARG_SRC);
        read_blocked(op.out, st, DNNL_ARG_DST);
      }
    } else if (op.kind == Op::kBinary) {
      const bool in_place = !input_index.count(op.in[0]) && last_use[op.in[0]] == static_cast<int>(k) &&
                            !placed(op.in[0]) && !placed(op.out) &&
                            !is_output.count(op.in[0]);
      define_output(op.out, in_place ? buffer_of.at(op.in[0]) : -1);
      if (in_place) buffer_of.erase(op.in[0]);
      dnnl::memory::desc src1_md;
      dnnl::memory c1;
      if (op.binary_const != nullptr) {
        const Tensor& t = *op.binary_const;
        const int64_t C = y[1];
        // One value per channel, in the blocked layout (oneDNN broadcasts it over H and W).
        GAF_CHECK(t.numel() == C, "{}: a constant of {} values for {} channels", n.Describe(), t.numel(), C);
        const Shape s1{1, C, 1, 1};
        src1_md = blocked_md(s1);
        dnnl::memory plain(plain_md(s1), eng, const_cast<float*>(t.data<float>()));
        c1 = dnnl::memory(src1_md, eng);
        dnnl::stream cs(eng);
        dnnl::reorder(plain, c1).execute(cs, plain, c1);
        cs.wait();
        plan->owned.push_back(c1);
      } else {
        src1_md = md_of(op.in[1]);
      }
      dnnl::primitive_attr attr;
      if (!op.acts.empty()) attr.set_post_ops(eltwise_post_ops(op.acts));
      auto desc = dnnl::binary::desc(op.binary, md_of(op.in[0]), src1_md, md_of(op.out));
      dnnl::binary::primitive_desc pd(desc, attr, eng);
      std::unordered_map<int, dnnl::memory> args;
      if (c1) args[DNNL_ARG_SRC_1] = c1;
      const int st = add_step(dnnl::binary(Optimized(pd, n)), std::move(args));
      read_blocked(op.in[0], st, DNNL_ARG_SRC_0);
      if (!c1) read_blocked(op.in[1], st, DNNL_ARG_SRC_1);
      read_blocked(op.out, st, DNNL_ARG_DST);
      plan->stats.post_ops += op.absorbed;
    } else if (op.kind == Op::kPool) {
      const Shape& x = shape_of(op.in[0]);
      define_output(op.out);
      dnnl::memory::dims kernel, strides, pad_l, pad_r;
      alg a = n.op_type == "MaxPool" || n.op_type == "GlobalMaxPool" ? alg::pooling_max : alg::pooling_avg_exclude_padding;
      if (n.op_type == "GlobalAveragePool" || n.op_type == "GlobalMaxPool") {
        kernel = {x[2], x[3]};
        strides = {1, 1};
        pad_l = pad_r = {0, 0};
      } else {
        ConvGeometry g = PoolGeometryOf(n, x, n.GetInts("kernel_shape"));
        kernel = {g.k[1], g.k[2]};
        strides = {g.s[1], g.s[2]};
        pad_l = {g.pb[1], g.pb[2]};
        // ceil_mode: the right padding oneDNN needs for the last window.
        pad_r = {std::max<int64_t>(g.pe[1], (g.out[1] - 1) * g.s[1] + g.k[1] - g.in[1] - g.pb[1]),
                 std::max<int64_t>(g.pe[2], (g.out[2] - 1) * g.s[2] + g.k[2] - g.in[2] - g.pb[2])};
        if (n.op_type == "AveragePool" && n.GetInt("count_include_pad", 0) != 0) a = alg::pooling_avg_include_padding;
      }
      auto desc = dnnl::pooling_forward::desc(dnnl::prop_kind::forward_inference, a, md_of(op.in[0]),
                                              md_of(op.out), strides, kernel, pad_l, pad_r);
      dnnl::pooling_forward::primitive_desc pd(desc, eng);
      const int st = add_step(dnnl::pooling_forward(Optimized(pd, n)), {});
      read_blocked(op.in[0], st, DNNL_ARG_SRC);
      read_blocked(op.out, st, DNNL_ARG_DST);
    } else if (op.kind == Op::kConcat && channel_blocked &&
               (view_concats.count(static_cast<int>(k)) || place.count(op.in[0]) || shape_of(op.out)[0] == 1)) {
      define_output(op.out);
      if (!view_concats.count(static_cast<int>(k))) {
        // Inputs not produced in place are copied into their slices.
        const std::string& root = place.count(op.out) ? place[op.out].first : op.out;
        int64_t off = place.count(op.out) ? place[op.out].second : 0;
        for (size_t j = 0; j < op.in.size(); ++j) {
          const std::string& in = op.in[j];
          const int64_t c = shape_of(in)[1];
          auto pl = place.find(in);
          if (pl == place.end() || pl->second != std::make_pair(root, off)) {
            GAF_CHECK(off % 16 == 0 && (c % 16 == 0 || j + 1 == op.in.size()), "{}: a slice off the channel blocks", n.Describe());
            const std::string slot = op.out + "#slot" + std::to_string(j);
            place[slot] = {root, off};
            value_md[slot] = blocked_md(shape_of(in));
            const bool plain = input_index.count(in) && !value_md.count(in);
            auto r = dnnl::reorder(dnnl::reorder::primitive_desc(eng, plain ? plain_md(shape_of(in)) : md_of(in), eng,
                                                                 value_md[slot]));
            std::unordered_map<int, dnnl::memory> args;
            if (plain) args[DNNL_ARG_FROM] = plan->input_mem[input_index.at(in)];
            const int st = add_step(r, std::move(args));
            if (!plain) read_blocked(in, st, DNNL_ARG_FROM);
            read_blocked(slot, st, DNNL_ARG_TO);
            plan->stats.concat_copies++;
          } else {
            plan->stats.concat_in_place++;
          }
          off += c;
        }
      } else {
        plan->stats.concat_in_place += static_cast<int>(op.in.size());
      }
    } else if (op.kind == Op::kConcat) {
      define_output(op.out);
      std::vector<dnnl::memory::desc> srcs;
      for (const auto& in : op.in) srcs.push_back(md_of(in));
      dnnl::concat::primitive_desc pd(md_of(op.out), 1, srcs, eng);
      const int st = add_step(dnnl::concat(Optimized(pd, n)), {});
      for (size_t j = 0; j < op.in.size(); ++j) read_blocked(op.in[j], st, DNNL_ARG_MULTIPLE_SRC + static_cast<int>(j));
      read_blocked(op.out, st, DNNL_ARG_DST);
    } else if (op.kind == Op::kResize) {
      define_output(op.out);
      auto desc = dnnl::resampling_forward::desc(dnnl::prop_kind::forward_inference, alg::resampling_nearest,
                                                 md_of(op.in[0]), md_of(op.out));
      dnnl::resampling_forward::primitive_desc pd(desc, eng);
      const int st = add_step(dnnl::resampling_forward(Optimized(pd, n)), {});
      read_blocked(op.in[0], st, DNNL_ARG_SRC);
      read_blocked(op.out, st, DNNL_ARG_DST);
    } else {  // kIdentity: a copy (in place where the input dies)
      define_output(op.out);
      auto r = dnnl::reorder(dnnl::reorder::primitive_desc(eng, md_of(op.in[0]), eng, md_of(op.out)));
      const int st = add_step(r, {});
      read_blocked(op.in[0], st, DNNL_ARG_FROM);
      read_blocked(op.out, st, DNNL_ARG_TO);
    }
    release(static_cast<int>(k));
  }
  // Outputs back to NCHW.
  for (const auto& o : outputs) {
    GAF_CHECK(value_md.count(o) && !input_index.count(o), "blocked chain: output '{}' is not produced by the chain", o);
    const Shape& s = shape_of(o);
    plan->out_shapes.push_back(s);
    dnnl::memory user(plain_md(s), eng, nullptr);
    plan->output_mem.push_back(user);
    auto r = dnnl::reorder(dnnl::reorder::primitive_desc(eng, md_of(o), eng, plain_md(s)));
    const int st = add_step(r, {{DNNL_ARG_TO, user}});
    read_blocked(o, st, DNNL_ARG_FROM);
    plan->stats.reorders_out++;
  }
  // Bind every blocked value to its buffer.
  plan->buffers.resize(buffer_size.size());
  for (size_t b = 0; b < buffer_size.size(); ++b) {
    const size_t bytes = (buffer_size[b] + 63) / 64 * 64;
    plan->buffers[b].p.reset(static_cast<char*>(std::aligned_alloc(64, bytes)));
    GAF_CHECK(plan->buffers[b].p != nullptr, "blocked chain: cannot allocate {} bytes", bytes);
    plan->buffers[b].bytes = bytes;
    plan->stats.buffer_bytes += static_cast<int64_t>(bytes);
  }
  std::map<std::string, dnnl::memory> bound;
  for (const PendingArg& a : pending) {
    auto it = bound.find(a.value);
    if (it == bound.end())
    {
      auto pl = place.find(a.value);
      char* base;
      if (pl != place.end()) {
        // Channel offset `off` of a batch-1 blocked buffer: off*H*W floats in (off on a block boundary).
        const Shape& rs = shape_of(pl->second.first);
        base = plan->buffers[static_cast<size_t>(assigned.at(pl->second.first))].p.get() +
               sizeof(float) * static_cast<size_t>(pl->second.second * rs[2] * rs[3]);
      } else {
        base = plan->buffers[static_cast<size_t>(assigned.at(a.value))].p.get();
      }
      it = bound.emplace(a.value, dnnl::memory(md_of(a.value), eng, base)).first;
    }
    plan->steps[static_cast<size_t>(a.step)].args[a.arg] = it->second;
  }
  plan->stats.steps = static_cast<int>(plan->steps.size());
  return plan;
}

std::shared_ptr<BlockedChain> BlockedChain::Create(std::vector<Node> nodes, std::vector<std::string> inputs,
                                                   std::vector<std::string> outputs,
                                                   std::map<std::string, Tensor> constants, std::string* why) {
  auto constant = [&](const std::string& v) -> const Tensor* {
    auto it = constants.find(v);
    return it == constants.end() ? nullptr : &it->second;
  };
  auto no_shape = [](const std::string&) -> const Shape* { return nullptr; };
  for (const Node& n : nodes) {
    std::string r = BlockedChainRejects(n, constant, no_shape);
    if (!r.empty()) {
      if (why) *why = r;
      return nullptr;
    }
  }
  if (outputs.empty()) {
    if (why) *why = "no outputs";
    return nullptr;
  }
  auto c = std::shared_ptr<BlockedChain>(new BlockedChain());
  c->impl_ = std::make_unique<Impl>();
  c->impl_->nodes = std::move(nodes);
  c->impl_->inputs = std::move(inputs);
  c->impl_->outputs = std::move(outputs);
  c->impl_->constants = std::move(constants);
  return c;
}

BlockedChain::~BlockedChain() = default;

void BlockedChain::SetLayoutStore(LayoutStore store) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->store = std::move(store);
}

void BlockedChain::SetLayout(Layout layout) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->layout != layout) {
    impl_->last.reset();
    impl_->plans.clear();
  }
  impl_->layout = layout;
}

namespace {

// Runs a plan's steps on zeroed inputs and outputs of its shapes (the data does not change the
// time of these kernels).
struct TimedRun {
  std::vector<std::vector<float>> in, out;
  void Bind(BlockedChain::Impl::Plan& p, const std::vector<Shape>& in_shapes) {
    in.assign(in_shapes.size(), {});
    for (size_t i = 0; i < in_shapes.size(); ++i) {
      if (!p.input_mem[i]) continue;
      int64_t n = 1;
      for (int64_t d : in_shapes[i]) n *= d;
      in[i].assign(static_cast<size_t>(n), 0.f);
      p.input_mem[i].set_data_handle(in[i].data());
    }
    out.assign(p.out_shapes.size(), {});
    for (size_t i = 0; i < p.out_shapes.size(); ++i) {
      int64_t n = 1;
      for (int64_t d : p.out_shapes[i]) n *= d;
      out[i].assign(static_cast<size_t>(n), 0.f);
      p.output_mem[i].set_data_handle(out[i].data());
    }
  }
  static double Once(BlockedChain::Impl::Plan& p) {
    dnnl::stream s(DnnlEngine());
    const auto t0 = std::chrono::steady_clock::now();
    for (auto& st : p.steps) st.prim.execute(s, st.args);
    s.wait();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
};

}  // namespace

std::string BlockedChain::Prepare(const std::vector<Shape>& input_shapes) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  const int threads = omp_get_max_threads();
  if (impl_->last && impl_->last->in_shapes == input_shapes && impl_->last->threads == threads) return "";
  for (const auto& p : impl_->plans)
    if (p->in_shapes == input_shapes && p->threads == threads) {
      impl_->last = p;
      return "";
    }
  // The layout is chosen by measurement: a plan on the channel-blocked layout (the jit kernels;
  // Concats in place) and one on NHWC (oneDNN's brgemm kernels), timed interleaved on this
  // machine at this thread count; the faster is kept.
  std::string first;
  std::vector<std::shared_ptr<Impl::Plan>> plans;
  std::vector<tag> layouts;
  if (impl_->layout != Layout::kNhwc) layouts.push_back(BlockTag());
  if (impl_->layout != Layout::kBlocked) layouts.push_back(tag::nhwc);
  std::string key, stored;
  if (impl_->layout == Layout::kMeasured && impl_->store.get) {
    key = impl_->ChoiceKey(input_shapes, threads);
    stored = impl_->store.get(key);
    for (tag t : layouts)
      if (stored == LayoutName(t)) layouts = {t};  // anything else stored is ignored
  }
  for (tag layout : layouts) {
    // With residual Adds as post-ops first; where oneDNN has no convolution taking them, the
    // Adds run as binary steps of their own.
    for (bool binary : {true, false}) {
      try {
        plans.push_back(impl_->Build(input_shapes, binary, layout));
        break;
      } catch (const dnnl::error& e) {
        if (first.empty()) first = fmt::format("oneDNN: {} (status {})", e.what(), static_cast<int>(e.status));
      } catch (const std::exception& e) {
        if (first.empty()) first = e.what();
      }
    }
  }
  if (plans.empty()) return first;
  if (plans.size() > 1) {
    std::vector<TimedRun> runs(plans.size());
    std::vector<std::vector<double>> times(plans.size());
    for (size_t i = 0; i < plans.size(); ++i) {
      runs[i].Bind(*plans[i], input_shapes);
      TimedRun::Once(*plans[i]);  // warm-up: first touches, oneDNN's lazy initialization
    }
    for (int round = 0; round < kLayoutRounds; ++round)
      for (size_t i = 0; i < plans.size(); ++i) times[i].push_back(TimedRun::Once(*plans[i]));
    size_t best = 0;
    for (size_t i = 0; i < plans.size(); ++i) {
      std::sort(times[i].begin(), times[i].end());
      plans[i]->measured_ms = times[i][kLayoutRounds / 2];
      if (plans[i]->measured_ms < plans[best]->measured_ms) best = i;
    }
    impl_->measured.clear();
    for (const auto& p : plans)
      impl_->measured += fmt::format("{}{} {:.3f} ms", impl_->measured.empty() ? "layout measured: " : ", ", p->layout,
                                     p->measured_ms);
    impl_->last = plans[best];
    if (!key.empty() && impl_->store.put) impl_->store.put(key, plans[best]->layout);
  } else {
    impl_->last = plans[0];
    if (layouts.size() == 1 && !key.empty() && stored == plans[0]->layout)
      impl_->measured = "layout from an earlier measurement on this machine";
  }
  // A few signatures are kept (a detector fed images of several sizes does not re-plan on every
  // change), the oldest dropped first.
  impl_->plans.push_back(impl_->last);
  if (impl_->plans.size() > kPlansKept) impl_->plans.erase(impl_->plans.begin());
  return "";
}

std::vector<Tensor> BlockedChain::Run(const std::vector<const Tensor*>& inputs) {
  std::vector<Shape> shapes(impl_->inputs.size());
  for (size_t i = 0; i < impl_->inputs.size(); ++i) {
    if (impl_->Constant(impl_->inputs[i])) continue;
    GAF_CHECK(i < inputs.size() && inputs[i] != nullptr && inputs[i]->dtype() == DataType::kFloat,
              "blocked chain: input '{}' must be a float32 tensor", impl_->inputs[i]);
    shapes[i] = inputs[i]->shape();
  }
  const std::string why = Prepare(shapes);
  GAF_CHECK(why.empty(), "blocked chain: cannot plan for these shapes: {}", why);
  std::lock_guard<std::mutex> lock(impl_->mu);
  Impl::Plan& p = *impl_->last;
  std::vector<Tensor> outs;
  for (const Shape& s : p.out_shapes) outs.push_back(Tensor::Uninitialized(DataType::kFloat, s));
  for (size_t i = 0; i < impl_->inputs.size(); ++i)
    if (p.input_mem[i]) p.input_mem[i].set_data_handle(const_cast<float*>(inputs[i]->data<float>()));
  for (size_t i = 0; i < outs.size(); ++i) p.output_mem[i].set_data_handle(outs[i].data<float>());
  dnnl::stream s(DnnlEngine());
  for (Impl::Step& st : p.steps) st.prim.execute(s, st.args);
  s.wait();
  return outs;
}

BlockedChain::Stats BlockedChain::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->last ? impl_->last->stats : Stats{};
}

std::string BlockedChain::Describe() const {
  const Stats s = stats();
  std::string layout, measured;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->last) layout = impl_->last->layout;
    measured = impl_->measured;
  }
  return fmt::format("oneDNN {} chain: {} operators, {} convolutions, {} folded/post-op, {} steps, reorders {} in / {} out / "
                     "{} inside, Concat inputs {} in place / {} copied, {} residuals in place, {:.1f} MB of buffers{}",
                     layout, impl_->nodes.size(), s.convs, s.post_ops, s.steps, s.reorders_in, s.reorders_out,
                     s.reorders_inside, s.concat_in_place, s.concat_copies, s.residuals_in_place,
                     static_cast<double>(s.buffer_bytes) / 1e6, measured.empty() ? "" : " (" + measured + ")");
}

}  // namespace gaf
