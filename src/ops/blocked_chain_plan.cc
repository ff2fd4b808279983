// ChainPlanner (ops/blocked_chain_plan.h): how BlockedChain plans one input-shape signature as
// oneDNN primitives on one channel-blocked layout (see ops/blocked_chain.h). Planning runs in four
// passes:
//   1. shapes of every value from the input shapes;
//   2. operators: each Conv takes the epilogue it can carry (folded constants, eltwise and
//      binary post-ops) and is emitted where the last absorbed node was, so a residual computed
//      after the Conv in topological order is ready; Sigmoid + Mul pairs become Swish;
//   3. memory: a buffer per produced value, assigned by liveness from a free list (elementwise
//      steps work in place when their input dies there);
//   4. primitives: created with the blocked layout for every value (region inputs stay NCHW
//      where a convolution takes them so, as the first layer of a CNN does), weights reordered
//      once into what each convolution wants.
#include "ops/blocked_chain_plan.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ops/conv.h"
#include "ops/dnnl_util.h"
#include "ops/kernel_util.h"

namespace gaf::blocked_chain_internal {
namespace {

dnnl::memory::dims Dims(const Shape& s) { return dnnl::memory::dims(s.begin(), s.end()); }

// Planning fails rather than run oneDNN's reference implementation of a primitive, which is
// orders of magnitude slower than the kernels the chain is for (the caller keeps its own path).
template <class PD>
const PD& Optimized(const PD& pd, const Node& n) {
  const std::string impl = pd.impl_info_str();
  GAF_CHECK(impl.find("ref") == std::string::npos, "{}: oneDNN has only its reference implementation ({}) here",
            n.Describe(), impl);
  return pd;
}

dnnl::post_ops EltwisePostOps(const std::vector<Act>& acts) {
  dnnl::post_ops po;
  for (const Act& a : acts) po.append_eltwise(1.f, a.a, a.alpha, a.beta);
  return po;
}

}  // namespace

ChainPlanner::ChainPlanner(const std::vector<Node>& nodes, const std::vector<std::string>& inputs,
                           const std::vector<std::string>& outputs, const std::map<std::string, Tensor>& constants,
                           bool binary_post_ops, tag layout, ConvImplChoice conv_choice, Boundary boundary)
    : nodes_(nodes),
      inputs_(inputs),
      outputs_(outputs),
      constants_(constants),
      binary_post_ops_(binary_post_ops),
      constant_([this](const std::string& v) { return Constant(v); }),
      eng_(DnnlEngine()),
      bt_(layout),
      channel_blocked_(layout == tag::nChw16c || layout == tag::nChw8c),
      conv_choice_(std::move(conv_choice)),
      boundary_(std::move(boundary)) {}

const Tensor* ChainPlanner::Constant(const std::string& v) const {
  auto it = constants_.find(v);
  return it == constants_.end() ? nullptr : &it->second;
}

std::shared_ptr<Plan> ChainPlanner::Build(const std::vector<Shape>& in_shapes) {
  plan_ = std::make_shared<Plan>();
  plan_->in_shapes = in_shapes;
  plan_->threads = omp_get_max_threads();
  // 1. Shapes.
  InferShapes(in_shapes);
  // 2. Operators.
  CountUses();
  FormOperators();
  // 3. Memory. Values: chain inputs (user memory, NCHW; a blocked copy made when an operator
  // needs one), produced values (blocked buffers by liveness).
  plan_->layout = LayoutName(bt_);
  ComputeLastUses();
  DefineInputs();
  PlaceConcats();
  // 4. Primitives, in order.
  EmitSteps();
  EmitOutputs();
  Bind();
  plan_->stats.steps = static_cast<int>(plan_->steps.size());
  plan_->step_seconds.assign(plan_->steps.size(), 0.0);
  return plan_;
}

// ---------------------------------------------------------------------------------------------
// 1. Shapes.

void ChainPlanner::InferShapes(const std::vector<Shape>& in_shapes) {
  for (size_t i = 0; i < inputs_.size(); ++i)
    if (!Constant(inputs_[i])) {
      GAF_CHECK(i < in_shapes.size() && in_shapes[i].size() == 4, "blocked chain: input '{}' is not 4-D", inputs_[i]);
      shape_[inputs_[i]] = in_shapes[i];
    }
  for (const Node& n : nodes_) {
    const std::string& op = n.op_type;
    const Shape& x = ShapeOf(n.inputs[0].empty() ? std::string("?") : (Constant(n.inputs[0]) && n.inputs.size() > 1 ? n.inputs[1] : n.inputs[0]));
    Shape y = x;
    if (op == "Conv") {
      y = ConvOutputShape(n, ShapeOf(n.inputs[0]), Constant(n.inputs[1])->shape());
    } else if (op == "MaxPool" || op == "AveragePool") {
      ConvGeometry g = PoolGeometryOf(n, x, n.GetInts("kernel_shape"));
      y = {x[0], x[1], g.out[1], g.out[2]};
    } else if (op == "GlobalAveragePool" || op == "GlobalMaxPool") {
      y = {x[0], x[1], 1, 1};
    } else if (op == "Concat") {
      y = ShapeOf(n.inputs[0]);
      y[1] = 0;
      for (const auto& in : n.inputs) {
        const Shape& s = ShapeOf(in);
        GAF_CHECK(s[0] == y[0] && s[2] == y[2] && s[3] == y[3], "{}: inputs differ outside the channel axis", n.Describe());
        y[1] = CheckedAdd(y[1], s[1], "Concat channels");
      }
    } else if (op == "Resize" || op == "Upsample") {
      int64_t fh = 0, fw = 0;
      std::string why;
      GAF_CHECK(NearestFactors(n, constant_, &x, &fh, &fw, &why), "{}", why);
      y = {x[0], x[1], x[2] * fh, x[3] * fw};
    } else if ((op == "Add" || op == "Mul") && !Constant(n.inputs[0]) && !Constant(n.inputs[1])) {
      const Shape &a = ShapeOf(n.inputs[0]), &b = ShapeOf(n.inputs[1]);
      const bool a_full = a[2] * a[3] >= b[2] * b[3];
      y = a_full ? a : b;
      const Shape& small = a_full ? b : a;
      GAF_CHECK(a == b || (small[0] == y[0] && small[1] == y[1] && small[2] == 1 && small[3] == 1),
                "{}: operand shapes {} and {} (same shape or [N,C,1,1] broadcast only)", n.Describe(),
                ShapeToString(a), ShapeToString(b));
    }
    for (int64_t d : y) GAF_CHECK(d > 0, "{}: an empty output", n.Describe());
    // Overflow and the memory limit (--max-memory) before any buffer is sized from it.
    TensorBytes(DataType::kFloat, y, n.Describe() + " output");
    shape_[n.outputs[0]] = y;
  }
}

const Shape& ChainPlanner::ShapeOf(const std::string& v) const {
  auto it = shape_.find(v);
  GAF_CHECK(it != shape_.end(), "blocked chain: no shape for '{}'", v);
  return it->second;
}

// ---------------------------------------------------------------------------------------------
// 2. Operators.

void ChainPlanner::CountUses() {
  // Uses inside the chain; outputs of the chain.
  for (const Node& n : nodes_)
    for (const auto& in : n.inputs)
      if (!in.empty()) uses_[in]++;
  is_output_ = std::set<std::string>(outputs_.begin(), outputs_.end());
}

int ChainPlanner::SoleConsumer(const std::string& v) {
  if (is_output_.count(v) || uses_[v] != 1) return -1;
  for (size_t i = 0; i < nodes_.size(); ++i)
    for (const auto& in : nodes_[i].inputs)
      if (in == v) return static_cast<int>(i);
  return -1;
}

std::vector<int> ChainPlanner::Consumers(const std::string& v) const {
  std::vector<int> c;
  for (size_t i = 0; i < nodes_.size(); ++i)
    if (std::find(nodes_[i].inputs.begin(), nodes_[i].inputs.end(), v) != nodes_[i].inputs.end())
      c.push_back(static_cast<int>(i));
  return c;
}

// x * Sigmoid(x) (SiLU / Swish) and x * HardSigmoid(x) with alpha 1/6, beta 1/2 (HardSwish, as
// exporters write it before opset 14): the Mul node index when node s is the gate of such a
// pair, else -1 (SwishMul); GateAct gives the activation the pair is.
Act ChainPlanner::GateAct(int s) const {
  return nodes_[s].op_type == "Sigmoid" ? Act{alg::eltwise_swish, 1.f, 0.f} : Act{alg::eltwise_hardswish, 0.f, 0.f};
}

int ChainPlanner::SwishMul(int s) {
  const Node& sig = nodes_[s];
  const bool hard = sig.op_type == "HardSigmoid" && std::abs(sig.GetFloat("alpha", 0.2f) - 1.f / 6) < 1e-6f &&
                    sig.GetFloat("beta", 0.5f) == 0.5f;
  if (sig.op_type != "Sigmoid" && !hard) return -1;
  const int m = SoleConsumer(sig.outputs[0]);
  if (m < 0 || nodes_[m].op_type != "Mul") return -1;
  const Node& mul = nodes_[m];
  const std::string& x = sig.inputs[0];
  if (!((mul.inputs[0] == x && mul.inputs[1] == sig.outputs[0]) || (mul.inputs[1] == x && mul.inputs[0] == sig.outputs[0])))
    return -1;
  return m;
}

void ChainPlanner::FormOperators() {
  absorbed_.assign(nodes_.size(), false);
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (absorbed_[i]) continue;
    ops_.push_back(FormOperator(i));
  }
  std::stable_sort(ops_.begin(), ops_.end(), [](const Op& a, const Op& b) { return a.emit < b.emit; });
}

// The operator anchored at node i (not absorbed by an earlier one), with what it absorbs.
Op ChainPlanner::FormOperator(size_t i) {
  const Node& n = nodes_[i];
  const std::string& opt = n.op_type;
  Op op;
  op.node = static_cast<int>(i);
  op.emit = static_cast<int>(i);
  op.out = n.outputs[0];
  std::vector<Act> acts;
  if (opt == "Conv") {
    FormConv(n, &op);
  } else if (opt == "BatchNormalization") {
    op.kind = Op::kBatchNorm;
    op.in = {n.inputs[0]};
    const int c = SoleConsumer(op.out);
    if (c >= 0 && !absorbed_[c] && nodes_[c].op_type == "Relu") {
      absorbed_[c] = true;
      op.emit = c;
      op.out = nodes_[c].outputs[0];
      op.acts.push_back({alg::eltwise_relu});
      ++op.absorbed;
    }
  } else if (SwishMul(static_cast<int>(i)) >= 0) {
    // Swish / HardSwish on its own: the Mul (later in the order) produces the value.
    const int m = SwishMul(static_cast<int>(i));
    op.kind = Op::kEltwise;
    op.in = {n.inputs[0]};
    op.acts = {GateAct(static_cast<int>(i))};
    absorbed_[m] = true;
    op.emit = m;
    op.out = nodes_[m].outputs[0];
    ++op.absorbed;
  } else if (ActivationOf(n, constant_, &acts, nullptr)) {
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
    FormBinary(n, &op);
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
  return op;
}

void ChainPlanner::FormConv(const Node& n, Op* op) {
  op->kind = Op::kConv;
  op->in = {n.inputs[0]};
  const int64_t M = Constant(n.inputs[1])->dim(0);
  op->scale.assign(static_cast<size_t>(M), 1.f);
  op->shift.assign(static_cast<size_t>(M), 0.f);
  if (n.HasInput(2))
    for (int64_t c = 0; c < M; ++c) op->shift[static_cast<size_t>(c)] = Constant(n.inputs[2])->data<float>()[c];
  AbsorbConvEpilogue(M, op);
}

// The epilogue of the convolution `op` (M output channels) from its output on: folded into its
// weights and bias, or its post-ops; op->out becomes the last value it produces.
void ChainPlanner::AbsorbConvEpilogue(int64_t M, Op* op) {
  std::vector<Act> acts;
  // Absorb the epilogue while the current value has one consumer.
  std::string cur = op->out;
  int post = 0;  // post-ops so far
  for (;;) {
    const int c = SoleConsumer(cur);
    int pair_mul = -1;
    if (c < 0) {
      // x * Sigmoid(x) reads x twice.
      auto cs = Consumers(cur);
      if (is_output_.count(cur) || cs.size() != 2) break;
      int gate = -1;
      for (int s : cs) {
        const int m = SwishMul(s);
        if (m >= 0 && std::find(cs.begin(), cs.end(), m) != cs.end()) pair_mul = m, gate = s;
      }
      if (pair_mul < 0 || absorbed_[pair_mul]) break;
      op->acts.push_back(GateAct(gate));
      for (int s : cs) absorbed_[s] = true;
      op->emit = std::max(op->emit, pair_mul);
      op->absorbed += 2;
      ++post;
      cur = nodes_[pair_mul].outputs[0];
      continue;
    }
    if (absorbed_[c]) break;  // taken by another operator's epilogue (the other side of a residual Add)
    const Node& e = nodes_[c];
    const bool first = post == 0;
    if (e.op_type == "BatchNormalization" && first && e.inputs[0] == cur) {
      const float eps = e.GetFloat("epsilon", 1e-5f);
      const Tensor *g = Constant(e.inputs[1]), *b = Constant(e.inputs[2]), *mu = Constant(e.inputs[3]),
                   *var = Constant(e.inputs[4]);
      if (g->numel() != M || b->numel() != M || mu->numel() != M || var->numel() != M) break;
      for (int64_t k = 0; k < M; ++k) {
        const size_t u = static_cast<size_t>(k);
        const double a = g->data<float>()[k] / std::sqrt(static_cast<double>(var->data<float>()[k]) + eps);
        op->scale[u] = static_cast<float>(op->scale[u] * a);
        op->shift[u] = static_cast<float>((op->shift[u] - mu->data<float>()[k]) * a + b->data<float>()[k]);
      }
      op->folded = true;
    } else if ((e.op_type == "Add" || e.op_type == "Mul") && first &&
               (Constant(e.inputs[0]) != nullptr || Constant(e.inputs[1]) != nullptr)) {
      const Tensor* t = Constant(e.inputs[0]) != nullptr ? Constant(e.inputs[0]) : Constant(e.inputs[1]);
      if (!ScalarOrPerChannel(*t, M)) break;
      for (int64_t k = 0; k < M; ++k) {
        const size_t u = static_cast<size_t>(k);
        const float v = t->data<float>()[t->numel() == 1 ? 0 : k];
        if (e.op_type == "Add") {
          op->shift[u] += v;
        } else {
          op->scale[u] *= v;
          op->shift[u] *= v;
        }
      }
      op->folded = true;
    } else if (e.op_type == "Add" && binary_post_ops_ && op->residual.empty()) {
      const std::string& other = e.inputs[0] == cur ? e.inputs[1] : e.inputs[0];
      if (other == cur || Constant(other) != nullptr || ShapeOf(other) != ShapeOf(cur)) break;
      op->residual = other;
      op->residual_pos = post;
      ++post;
    } else if (IsUnaryActivation(e.op_type) && e.inputs[0] == cur && ActivationOf(e, constant_, &acts, nullptr)) {
      if (SwishMul(c) >= 0) break;  // handled above as a pair when the value is read twice
      op->acts.insert(op->acts.end(), acts.begin(), acts.end());
      post += static_cast<int>(acts.size());
    } else if (e.op_type == "Identity") {
    } else {
      break;
    }
    absorbed_[c] = true;
    op->emit = std::max(op->emit, c);
    ++op->absorbed;
    cur = e.outputs[0];
  }
  op->out = cur;
}

void ChainPlanner::FormBinary(const Node& n, Op* op) {
  const std::string& opt = n.op_type;
  std::vector<Act> acts;
  op->kind = Op::kBinary;
  op->binary = opt == "Add" ? alg::binary_add : alg::binary_mul;
  const Tensor *a = Constant(n.inputs[0]), *b = Constant(n.inputs[1]);
  if (a != nullptr || b != nullptr) {
    op->in = {a != nullptr ? n.inputs[1] : n.inputs[0]};
    op->binary_const = a != nullptr ? a : b;
  } else {
    // The full-size operand first: oneDNN broadcasts src1 only.
    const Shape &sa = ShapeOf(n.inputs[0]), &sb = ShapeOf(n.inputs[1]);
    op->in = sa[2] * sa[3] >= sb[2] * sb[3] ? std::vector<std::string>{n.inputs[0], n.inputs[1]}
                                            : std::vector<std::string>{n.inputs[1], n.inputs[0]};
  }
  // Activations after it as its post-ops.
  for (std::string cur = op->out;;) {
    const int c = SoleConsumer(cur);
    if (c < 0 || absorbed_[c] || !IsUnaryActivation(nodes_[c].op_type) || SwishMul(c) >= 0 ||
        !ActivationOf(nodes_[c], constant_, &acts, nullptr))
      break;
    op->acts.insert(op->acts.end(), acts.begin(), acts.end());
    absorbed_[c] = true;
    op->emit = c;
    ++op->absorbed;
    cur = op->out = nodes_[c].outputs[0];
  }
}

// ---------------------------------------------------------------------------------------------
// 3. Memory.

void ChainPlanner::ComputeLastUses() {
  for (size_t k = 0; k < ops_.size(); ++k) {
    for (const auto& in : ops_[k].in) last_use_[in] = static_cast<int>(k);
    if (!ops_[k].residual.empty()) last_use_[ops_[k].residual] = static_cast<int>(k);
  }
  for (const auto& o : outputs_) last_use_[o] = static_cast<int>(ops_.size());
}

void ChainPlanner::DefineInputs() {
  for (size_t i = 0; i < inputs_.size(); ++i)
    if (!Constant(inputs_[i])) input_index_[inputs_[i]] = static_cast<int>(i);
  plan_->input_mem.resize(inputs_.size());
  for (const auto& [name, i] : input_index_) plan_->input_mem[i] = dnnl::memory(InputMd(name), eng_, nullptr);
}

dnnl::memory::desc ChainPlanner::InputMd(const std::string& v) const {
  auto it = input_index_.find(v);
  const bool nhwc = it != input_index_.end() && static_cast<size_t>(it->second) < boundary_.nhwc_in.size() &&
                    boundary_.nhwc_in[static_cast<size_t>(it->second)];
  return nhwc ? dnnl::memory::desc(Dims(ShapeOf(v)), dt::f32, tag::nhwc) : PlainMd(ShapeOf(v));
}

// Concat without copies (batch 1): in the blocked layout a channel range that starts on a block
// boundary is a contiguous slice of the buffer, so the producers of a Concat's inputs write
// straight into their slices of its output. Concats are placed from the last to the first: the
// inputs of a dense block's last Concat go into its buffer, and each earlier Concat of a prefix
// of them is then a view of that buffer (DenseNet's L concats cost no copy at all). Values keep
// one place each; an input that cannot move (a chain input, placed already) is copied in.
void ChainPlanner::PlaceConcats() {
  for (int k = static_cast<int>(ops_.size()) - 1; k >= 0; --k) {
    const Op& op = ops_[static_cast<size_t>(k)];
    if (!channel_blocked_ || op.kind != Op::kConcat || ShapeOf(op.out)[0] != 1) continue;
    std::string root = op.out;
    int64_t base = 0;
    if (place_.count(op.out)) std::tie(root, base) = place_[op.out];
    // Already in one root, one after another: a view.
    bool consecutive = true;
    int64_t expect = -1;
    std::string r0;
    for (const auto& in : op.in) {
      auto it = place_.find(in);
      if (it == place_.end() || (expect >= 0 && (it->second.first != r0 || it->second.second != expect))) {
        consecutive = false;
        break;
      }
      if (expect < 0) r0 = it->second.first, expect = it->second.second;
      expect += ShapeOf(in)[1];
    }
    if (consecutive && !place_.count(op.out)) {
      place_[op.out] = {r0, place_[op.in[0]].second};
      view_concats_.insert(k);
      continue;
    }
    int64_t off = base;
    for (const auto& in : op.in) {
      const int64_t c = ShapeOf(in)[1];
      if (!place_.count(in) && !input_index_.count(in) && in != root && c % 16 == 0 && off % 16 == 0)
        place_[in] = {root, off};
      off += c;
    }
  }
  // A root's buffer lives as long as any value placed in it.
  for (const auto& [v, where] : place_) {
    auto lu = last_use_.find(v);
    if (lu != last_use_.end()) last_use_[where.first] = std::max(last_use_[where.first], lu->second);
  }
}

bool ChainPlanner::Placed(const std::string& v) const {
  if (place_.count(v)) return true;
  for (const auto& [w, where] : place_)
    if (where.first == v) return true;
  return false;
}

dnnl::memory::desc ChainPlanner::BlockedMd(const Shape& s) const { return dnnl::memory::desc(Dims(s), dt::f32, bt_); }

dnnl::memory::desc ChainPlanner::PlainMd(const Shape& s) const { return dnnl::memory::desc(Dims(s), dt::f32, tag::nchw); }

int ChainPlanner::NewBuffer(size_t bytes) {
  // Best fit among the free buffers, else a new one.
  int best = -1;
  for (size_t j = 0; j < free_buffers_.size(); ++j) {
    const int b = free_buffers_[j];
    if (buffer_size_[b] >= bytes && (best < 0 || buffer_size_[b] < buffer_size_[free_buffers_[best]])) best = static_cast<int>(j);
  }
  if (best >= 0) {
    const int b = free_buffers_[best];
    free_buffers_.erase(free_buffers_.begin() + best);
    return b;
  }
  // A free buffer too small is grown rather than left unused.
  if (!free_buffers_.empty()) {
    const int b = free_buffers_.back();
    free_buffers_.pop_back();
    buffer_size_[b] = bytes;
    return b;
  }
  buffer_size_.push_back(bytes);
  return static_cast<int>(buffer_size_.size()) - 1;
}

const dnnl::memory::desc& ChainPlanner::MdOf(const std::string& v) const {
  auto it = value_md_.find(v);
  GAF_CHECK(it != value_md_.end(), "blocked chain: value '{}' is used before it is produced", v);
  return it->second;
}

int ChainPlanner::AddStep(dnnl::primitive p, std::unordered_map<int, dnnl::memory> args) {
  const char* impl = nullptr;
  if (dnnl_primitive_desc_query(p.get_primitive_desc(), dnnl_query_impl_info_str, 0, &impl) != dnnl_success) impl = nullptr;
  std::string kind;
  switch (p.get_kind()) {
    case dnnl::primitive::kind::convolution: kind = "convolution"; break;
    case dnnl::primitive::kind::reorder: kind = "reorder"; break;
    case dnnl::primitive::kind::eltwise: kind = "eltwise"; break;
    case dnnl::primitive::kind::binary: kind = "binary"; break;
    case dnnl::primitive::kind::pooling: kind = "pooling"; break;
    case dnnl::primitive::kind::concat: kind = "concat"; break;
    case dnnl::primitive::kind::resampling: kind = "resampling"; break;
    case dnnl::primitive::kind::batch_normalization: kind = "batch_normalization"; break;
    default: kind = "primitive";
  }
  std::string out;  // the destination's dims
  if (const dnnl_memory_desc_t* md = dnnl_primitive_desc_query_md(p.get_primitive_desc(), dnnl_query_dst_md, 0))
    out = fmt::format(" to {}", fmt::join(md->dims, md->dims + md->ndims, "x"));
  Step st{std::move(p), std::move(args)};
  st.label = StepLabel(kind + " " + (impl != nullptr ? impl : "?") + out);
  plan_->steps.push_back(std::move(st));
  return static_cast<int>(plan_->steps.size()) - 1;
}

std::string ChainPlanner::StepLabel(const std::string& kernel) const {
  const std::string what = emitting_ >= 0 ? nodes_[ops_[static_cast<size_t>(emitting_)].node].Describe() : "the chain's outputs";
  return fmt::format("{} [{}]", what, kernel);
}

// The blocked form of a value for reading: produced values are blocked; a chain input gets one
// reorder (made on first need, its buffer live until its last reader).
void ChainPlanner::ReadBlocked(const std::string& v, int step, int arg) { pending_.push_back({step, arg, v}); }

void ChainPlanner::EnsureBlockedInput(const std::string& v) {
  if (value_md_.count(v)) return;
  const Shape& s = ShapeOf(v);
  value_md_[v] = BlockedMd(s);
  buffer_of_[v] = assigned_[v] = NewBuffer(value_md_[v].get_size());
  auto r = dnnl::reorder(dnnl::reorder::primitive_desc(eng_, InputMd(v), eng_, value_md_[v]));
  const int st = AddStep(r, {{DNNL_ARG_FROM, plan_->input_mem[input_index_.at(v)]}});
  ReadBlocked(v, st, DNNL_ARG_TO);
  plan_->stats.reorders_in++;
}

// Frees the buffers of the values whose last use is op k (outputs of the chain stay).
void ChainPlanner::Release(int k) {
  for (auto it = buffer_of_.begin(); it != buffer_of_.end();) {
    auto lu = last_use_.find(it->first);
    if (lu != last_use_.end() && lu->second == k && !is_output_.count(it->first)) {
      free_buffers_.push_back(it->second);
      it = buffer_of_.erase(it);
    } else {
      ++it;
    }
  }
}

// The blocked descriptor of produced value v and its buffer (its root's where it is placed in a
// Concat); `in_place_of`: a buffer it takes over instead (an elementwise step's dying input).
void ChainPlanner::DefineOutput(const std::string& v, int in_place_of) {
  value_md_[v] = BlockedMd(ShapeOf(v));
  auto pl = place_.find(v);
  const std::string& root = pl == place_.end() ? v : pl->second.first;
  if (!assigned_.count(root)) buffer_of_[root] = assigned_[root] = NewBuffer(BlockedMd(ShapeOf(root)).get_size());
  if (pl == place_.end() && in_place_of >= 0) {
    free_buffers_.push_back(assigned_[v]);  // not used after all
    buffer_of_[v] = assigned_[v] = in_place_of;
  }
}

// The output of elementwise op k (BatchNormalization, eltwise, binary): in place of its first
// input where that dies here and neither is placed in a Concat.
void ChainPlanner::DefineElementwiseOutput(const Op& op, int k) {
  const bool in_place = !input_index_.count(op.in[0]) && last_use_[op.in[0]] == k &&
                        !Placed(op.in[0]) && !Placed(op.out) &&
                        !is_output_.count(op.in[0]);
  DefineOutput(op.out, in_place ? buffer_of_.at(op.in[0]) : -1);
  if (in_place) buffer_of_.erase(op.in[0]);
}

// ---------------------------------------------------------------------------------------------
// 4. Primitives.

void ChainPlanner::EmitSteps() {
  for (size_t k = 0; k < ops_.size(); ++k) {
    const Op& op = ops_[k];
    for (const auto& in : op.in)
      if (input_index_.count(in) && !(op.kind == Op::kConv)) EnsureBlockedInput(in);
    if (!op.residual.empty() && input_index_.count(op.residual)) EnsureBlockedInput(op.residual);
    const int ki = static_cast<int>(k);
    emitting_ = ki;
    switch (op.kind) {
      case Op::kConv: EmitConv(op, ki); break;
      case Op::kBatchNorm: EmitBatchNorm(op, ki); break;
      case Op::kEltwise: EmitEltwise(op, ki); break;
      case Op::kBinary: EmitBinary(op, ki); break;
      case Op::kPool: EmitPool(op, ki); break;
      case Op::kConcat: EmitConcat(op, ki); break;
      case Op::kResize: EmitResize(op, ki); break;
      case Op::kIdentity: EmitIdentity(op, ki); break;
    }
    Release(ki);
  }
  emitting_ = -1;
}

void ChainPlanner::EmitConv(const Op& op, int k) {
  const Node& n = nodes_[op.node];
  const Tensor& w = *Constant(n.inputs[1]);
  const Shape& x = ShapeOf(op.in[0]);
  ConvGeometry g = ConvGeometryOf(n, x, w.shape());
  const int64_t G = g.group, M = w.dim(0);
  dnnl::memory::dims wd = G == 1 ? Dims(w.shape())
                                 : dnnl::memory::dims{G, M / G, w.dim(1), w.dim(2), w.dim(3)};
  dnnl::memory::dims strides{g.s[1], g.s[2]}, dil{g.d[1] - 1, g.d[2] - 1}, pad_l{g.pb[1], g.pb[2]},
      pad_r{g.pe[1], g.pe[2]};
  // A residual that dies here is added in place: the convolution writes into its buffer with
  // a sum post-op (which every oneDNN kernel has); otherwise a binary post-op reads it.
  const bool sum_in_place = !op.residual.empty() && op.residual != op.in[0] && !input_index_.count(op.residual) &&
                            !Placed(op.residual) &&
                            !Placed(op.out) && !is_output_.count(op.residual) &&
                            last_use_[op.residual] == k && buffer_of_.count(op.residual);
  if (sum_in_place) {
    value_md_[op.out] = BlockedMd(ShapeOf(op.out));
    buffer_of_[op.out] = assigned_[op.out] = buffer_of_.at(op.residual);
    buffer_of_.erase(op.residual);
  } else {
    DefineOutput(op.out);
  }
  dnnl::primitive_attr attr;
  dnnl::post_ops po;
  int pi = 0;
  size_t ai = 0;
  for (; pi < static_cast<int>(op.acts.size()) + (op.residual.empty() ? 0 : 1); ++pi) {
    if (pi == op.residual_pos) {
      if (sum_in_place) po.append_sum(1.f);
      else po.append_binary(alg::binary_add, MdOf(op.residual));
    } else {
      po.append_eltwise(1.f, op.acts[ai].a, op.acts[ai].alpha, op.acts[ai].beta), ++ai;
    }
  }
  attr.set_post_ops(po);
  // Where Swish is the last post-op and the destination is dense, the same post-ops less it: the
  // convolution then Swish as a pass of its own is a candidate too (ops/conv_choice.h).
  std::optional<dnnl::primitive_attr> attr_without_swish;
  const dnnl::memory::desc& dst_md = MdOf(op.out);
  int64_t dst_elements = 1;
  for (int d = 0; d < dst_md.data.ndims; ++d) dst_elements *= dst_md.data.padded_dims[d];
  if (!op.acts.empty() && op.acts.back().a == alg::eltwise_swish && op.acts.back().alpha == 1.f &&
      op.residual_pos != static_cast<int>(op.acts.size()) && dst_md.get_size() == sizeof(float) * dst_elements) {
    dnnl::post_ops less;
    for (int i = 0; i < po.len() - 1; ++i) {
      if (po.kind(i) == dnnl::primitive::kind::sum) {
        less.append_sum(1.f);
      } else if (po.kind(i) == dnnl::primitive::kind::binary) {
        less.append_binary(alg::binary_add, MdOf(op.residual));
      } else {
        float scale, alpha, beta;
        alg a;
        po.get_params_eltwise(i, scale, a, alpha, beta);
        less.append_eltwise(scale, a, alpha, beta);
      }
    }
    attr_without_swish.emplace();
    attr_without_swish->set_post_ops(less);
  }
  const bool plain_src = input_index_.count(op.in[0]) && !value_md_.count(op.in[0]);
  auto make_desc = [&](const dnnl::memory::desc& src_md, alg a) {
    return dnnl::convolution_forward::desc(
        dnnl::prop_kind::forward_inference, a, src_md,
        dnnl::memory::desc(wd, dt::f32, tag::any), dnnl::memory::desc({M}, dt::f32, tag::x), MdOf(op.out),
        strides, dil, pad_l, pad_r);
  };
  auto make_pd = [&](const dnnl::memory::desc& src_md) {
    const ConvDesc d = make_desc(src_md, alg::convolution_direct);
    return dnnl::convolution_forward::primitive_desc(d, attr, eng_);
  };
  dnnl::convolution_forward::primitive_desc pd;
  bool src_plain = false;
  if (plain_src) {
    // The chain's input as given (NCHW), as oneDNN's first-layer kernels read it, unless only
    // the reference implementation takes it.
    try {
      pd = make_pd(InputMd(op.in[0]));
      src_plain = std::string(pd.impl_info_str()).find("ref") == std::string::npos;
    } catch (const dnnl::error&) {
    }
  }
  std::string conv_src = op.in[0];
  bool src_direct = false;
  if (plain_src && !src_plain) {
    // The input reordered once, straight into the layout oneDNN's kernel takes for it, where that
    // is not the chain's (a few channels, or an NHWC image for a first-layer kernel that reads
    // NCHW): not into the chain's layout and then again.
    try {
      const dnnl::convolution_forward::primitive_desc any = make_pd(dnnl::memory::desc(Dims(x), dt::f32, tag::any));
      if (std::string(any.impl_info_str()).find("ref") == std::string::npos && any.src_desc() != BlockedMd(x)) {
        pd = any;
        src_direct = true;
        conv_src = op.out + "#src";
        value_md_[conv_src] = pd.src_desc();
        buffer_of_[conv_src] = assigned_[conv_src] = NewBuffer(pd.src_desc().get_size());
        last_use_[conv_src] = k;
        auto r = dnnl::reorder(dnnl::reorder::primitive_desc(eng_, InputMd(op.in[0]), eng_, pd.src_desc()));
        const int rs = AddStep(r, {{DNNL_ARG_FROM, plan_->input_mem[input_index_.at(op.in[0])]}});
        ReadBlocked(conv_src, rs, DNNL_ARG_TO);
        plan_->stats.reorders_in++;
      }
    } catch (const dnnl::error&) {
    }
    if (!src_direct) EnsureBlockedInput(op.in[0]);
  }
  if (!src_plain && !src_direct) {
    pd = make_pd(MdOf(op.in[0]));
    if (std::string(pd.impl_info_str()).find("ref") != std::string::npos) {
      // No optimized kernel reads this source in the blocked layout (few channels, padded):
      // the source in the layout oneDNN picks for it, one reorder inside the chain.
      pd = make_pd(dnnl::memory::desc(Dims(x), dt::f32, tag::any));
      GAF_CHECK(std::string(pd.impl_info_str()).find("ref") == std::string::npos,
                "{}: oneDNN has only its reference convolution for input {} (kernel {}x{}, group {})", n.Describe(),
                ShapeToString(x), w.dim(2), w.dim(3), G);
      conv_src = op.in[0] + "#src";
      value_md_[conv_src] = pd.src_desc();
      buffer_of_[conv_src] = assigned_[conv_src] = NewBuffer(pd.src_desc().get_size());
      last_use_[conv_src] = k;
      auto r = dnnl::reorder(dnnl::reorder::primitive_desc(eng_, MdOf(op.in[0]), eng_, pd.src_desc()));
      const int rs = AddStep(r, {});
      ReadBlocked(op.in[0], rs, DNNL_ARG_FROM);
      ReadBlocked(conv_src, rs, DNNL_ARG_TO);
      plan_->stats.reorders_inside++;
    }
  }
  bool swish_after = false, nhwc = false;
  {
    const dnnl::memory::desc src_md = pd.src_desc();
    // A convolution with a window (ResNet's and CSP networks' strided 3x3, depthwise ones) may run
    // on NHWC between two reorders (ConvCandidate::nhwc): only where the chain is channel-blocked
    // and its source and destination are whole values of their own (no residual, no Concat slice).
    const bool nhwc_candidate = channel_blocked_ && !src_plain && !src_direct && conv_src == op.in[0] &&
                                op.residual.empty() && !Placed(op.out) && x.size() == 4 && w.rank() == 4 &&
                                w.dim(2) * w.dim(3) > 1;
    const std::function<ConvDesc(alg)> nhwc_desc = [&](alg a) {
      return dnnl::convolution_forward::desc(
          dnnl::prop_kind::forward_inference, a, dnnl::memory::desc(Dims(x), dt::f32, tag::nhwc),
          dnnl::memory::desc(wd, dt::f32, tag::any), dnnl::memory::desc({M}, dt::f32, tag::x),
          dnnl::memory::desc(Dims(ShapeOf(op.out)), dt::f32, tag::nhwc), strides, dil, pad_l, pad_r);
    };
    const ConvCandidate chosen = ChooseConvImpl(op, pd, [&](alg a) { return make_desc(src_md, a); }, attr,
                                                attr_without_swish ? &*attr_without_swish : nullptr, sum_in_place,
                                                nhwc_candidate ? &nhwc_desc : nullptr);
    pd = chosen.pd;
    swish_after = chosen.swish_after;
    nhwc = chosen.nhwc;
  }
  if (nhwc) {
    // The source reordered into NHWC, the convolution, its destination reordered back.
    const std::string in = op.out + "#nhwc-src", out = op.out + "#nhwc-dst";
    for (const auto& [v, md] : {std::pair{in, pd.src_desc()}, std::pair{out, pd.dst_desc()}}) {
      value_md_[v] = md;
      buffer_of_[v] = assigned_[v] = NewBuffer(md.get_size());
      last_use_[v] = k;
    }
    const int to = AddStep(dnnl::reorder(dnnl::reorder::primitive_desc(eng_, MdOf(conv_src), eng_, pd.src_desc())), {});
    ReadBlocked(conv_src, to, DNNL_ARG_FROM);
    ReadBlocked(in, to, DNNL_ARG_TO);
    const auto [wm, bm] = ConvWeights(op, w, wd, G, pd);
    const int st = AddStep(dnnl::convolution_forward(pd), {{DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_BIAS, bm}});
    ReadBlocked(in, st, DNNL_ARG_SRC);
    ReadBlocked(out, st, DNNL_ARG_DST);
    const int back = AddStep(dnnl::reorder(dnnl::reorder::primitive_desc(eng_, pd.dst_desc(), eng_, MdOf(op.out))), {});
    ReadBlocked(out, back, DNNL_ARG_FROM);
    ReadBlocked(op.out, back, DNNL_ARG_TO);
    plan_->stats.reorders_inside += 2;
    plan_->stats.convs++;
    plan_->stats.post_ops += op.absorbed;
    return;
  }
  const auto [wm, bm] = ConvWeights(op, w, wd, G, pd);
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_BIAS, bm}};
  if (src_plain) args[DNNL_ARG_SRC] = plan_->input_mem[input_index_.at(op.in[0])];
  const int st = AddStep(dnnl::convolution_forward(pd), std::move(args));
  if (!src_plain) ReadBlocked(conv_src, st, DNNL_ARG_SRC);
  ReadBlocked(op.out, st, DNNL_ARG_DST);
  if (!op.residual.empty() && !sum_in_place)
    ReadBlocked(op.residual, st, DNNL_ARG_ATTR_MULTIPLE_POST_OP(op.residual_pos) | DNNL_ARG_SRC_1);
  if (swish_after) {
    // Swish over the convolution's destination, in place, once it is written.
    Plan* plan = plan_.get();
    Step pass;
    pass.label = StepLabel("Swish pass after the convolution");
    pass.pass = [plan, st, dst_elements]() {
      SwishInPlace(static_cast<float*>(plan->steps[static_cast<size_t>(st)].args.at(DNNL_ARG_DST).get_data_handle()),
                   dst_elements);
    };
    plan_->steps.push_back(std::move(pass));
    plan_->stats.swish_passes++;
  }
  if (sum_in_place) plan_->stats.residuals_in_place++;
  plan_->stats.convs++;
  plan_->stats.post_ops += op.absorbed;
}

// The implementation convolution `op` runs (`pd`: oneDNN's first choice; `desc` describes it with
// another algorithm for the same source, weights and destination, `attr` its post-ops): the
// one remembered from an earlier measurement, or the fastest of the candidates timed now
// (ops/conv_choice.h), or `pd` where there is nothing to choose from.
ConvCandidate ChainPlanner::ChooseConvImpl(const Op& op, const ConvPd& pd, const std::function<ConvDesc(alg)>& desc,
                                           const dnnl::primitive_attr& attr,
                                           const dnnl::primitive_attr* attr_without_swish, bool sum_in_place,
                                           const std::function<ConvDesc(alg)>* nhwc_desc) {
  const size_t index = plan_->conv_impls.size();
  auto take = [&](const ConvCandidate& chosen) {
    plan_->conv_impls.push_back(chosen.name);
    plan_->stats.convs_winograd += chosen.winograd ? 1 : 0;
    return chosen;
  };
  const ConvCandidate library{pd, pd.impl_info_str(), false, false};
  if (!conv_choice_.measure && conv_choice_.stored.empty()) return take(library);
  std::vector<ConvCandidate> candidates = ConvCandidates(desc, attr, conv_choice_.winograd, 3, attr_without_swish);
  if (candidates.empty()) return take(library);
  if (nhwc_desc != nullptr) AppendNhwcCandidate(*nhwc_desc, attr, &candidates);
  if (index < conv_choice_.stored.size()) {
    for (const ConvCandidate& c : candidates)
      if (c.name == conv_choice_.stored[index]) return take(c);
    // Beyond the first few of oneDNN's list (another machine's order, another layout's).
    for (const ConvCandidate& c : ConvCandidates(desc, attr, conv_choice_.winograd, 32, attr_without_swish))
      if (c.name == conv_choice_.stored[index]) return take(c);
  }
  if (!conv_choice_.measure || candidates.size() == 1) return take(candidates[0]);
  // A convolution like one this process timed already (networks repeat their layers) takes its
  // kernel: the key names everything the candidates and their speed depend on.
  const Node& n = nodes_[op.node];
  auto md_key = [](const dnnl::memory::desc& md) {
    const dnnl_memory_desc_t& d = md.data;
    const auto& b = d.format_desc.blocking;
    return fmt::format("dims {} strides {} blocks {} at {}", fmt::join(d.dims, d.dims + d.ndims, ","),
                       fmt::join(b.strides, b.strides + d.ndims, ","), fmt::join(b.inner_blks, b.inner_blks + b.inner_nblks, ","),
                       fmt::join(b.inner_idxs, b.inner_idxs + b.inner_nblks, ","));
  };
  std::string key = fmt::format("threads {} winograd {} swish pass {} src {} dst {} weights {}", plan_->threads, conv_choice_.winograd,
                                attr_without_swish != nullptr,
                                md_key(pd.src_desc()), md_key(pd.dst_desc()),
                                ShapeToString(Constant(n.inputs[1])->shape()));
  for (const char* a : {"strides", "pads", "dilations"}) key += fmt::format(" {} {}", a, fmt::join(n.GetInts(a), ","));
  key += fmt::format(" group {} post-ops", n.GetInt("group", 1));
  for (const Act& a : op.acts) key += fmt::format(" {}:{}:{}", static_cast<int>(a.a), a.alpha, a.beta);
  if (!op.residual.empty()) key += fmt::format(" residual@{} {}", op.residual_pos, sum_in_place ? "sum" : "binary");
  const std::string known = MeasuredConvKernel(key);
  for (const ConvCandidate& c : candidates)
    if (!known.empty() && c.name == known) return take(c);
  std::unordered_map<int, dnnl::memory::desc> extra;
  if (!op.residual.empty() && !sum_in_place)
    extra[DNNL_ARG_ATTR_MULTIPLE_POST_OP(op.residual_pos) | DNNL_ARG_SRC_1] = MdOf(op.residual);
  const ConvChoice choice = MeasureConvCandidates(candidates, extra);
  plan_->stats.convs_measured++;
  RememberConvKernel(key, candidates[choice.index].name);
  return take(candidates[choice.index]);
}

char* Plan::WeightSpace(size_t bytes) {
  // A CNN's weights (100 MB for ResNet-50) are read once an inference, far more than the caches
  // hold: on 2 MiB pages the page walks are fewer and the hardware prefetchers do not stop every
  // 4 KiB (oneDNN's own allocation is on 4 KiB pages). Consecutive convolutions' weights lie one
  // after another in chunks of at least 16 MiB (each from the tensor allocator: on huge pages).
  constexpr size_t kChunk = size_t{16} << 20;
  bytes = (bytes + 63) / 64 * 64;
  if (weight_chunks.empty() || weight_chunk_used + bytes > weight_chunks.back().nbytes()) {
    weight_chunks.push_back(Tensor::Uninitialized(DataType::kUint8, {static_cast<int64_t>(std::max(bytes, kChunk))}));
    weight_chunk_used = 0;
  }
  char* p = static_cast<char*>(weight_chunks.back().raw()) + weight_chunk_used;
  weight_chunk_used += bytes;
  return p;
}

// The weights and bias of convolution `op` (weight `w`, dims `wd` with G groups) in what `pd`
// wants, owned by the plan.
std::pair<dnnl::memory, dnnl::memory> ChainPlanner::ConvWeights(const Op& op, const Tensor& w,
                                                                const dnnl::memory::dims& wd, int64_t G,
                                                                const dnnl::convolution_forward::primitive_desc& pd) {
  const int64_t M = w.dim(0);
  // Weights scaled by the folded per-channel factors, reordered once into the primitive's layout.
  Tensor wf(DataType::kFloat, w.shape());
  const int64_t per = w.numel() / M;
  for (int64_t o = 0; o < M; ++o)
    for (int64_t j = 0; j < per; ++j)
      wf.data<float>()[o * per + j] = w.data<float>()[o * per + j] * op.scale[static_cast<size_t>(o)];
  NoteOwnParallelRegion();  // oneDNN runs its own OpenMP regions
  dnnl::stream s(eng_);
  dnnl::memory user_w(dnnl::memory::desc(wd, dt::f32, G == 1 ? tag::oihw : tag::goihw), eng_, wf.data<float>());
  dnnl::memory wm(pd.weights_desc(), eng_, plan_->WeightSpace(pd.weights_desc().get_size()));
  dnnl::reorder(user_w, wm).execute(s, user_w, wm);
  s.wait();
  dnnl::memory bm(pd.bias_desc(), eng_);
  std::memcpy(bm.get_data_handle(), op.shift.data(), sizeof(float) * op.shift.size());
  plan_->owned.push_back(wm);
  plan_->owned.push_back(bm);
  return {wm, bm};
}

void ChainPlanner::EmitBatchNorm(const Op& op, int k) {
  const Node& n = nodes_[op.node];
  const int64_t C = ShapeOf(op.in[0])[1];
  DefineElementwiseOutput(op, k);
  auto flags = dnnl::normalization_flags::use_global_stats | dnnl::normalization_flags::use_scale |
               dnnl::normalization_flags::use_shift;
  if (!op.acts.empty()) flags = flags | dnnl::normalization_flags::fuse_norm_relu;
  auto desc = dnnl::batch_normalization_forward::desc(dnnl::prop_kind::forward_inference, MdOf(op.in[0]),
                                                      n.GetFloat("epsilon", 1e-5f), flags);
  dnnl::batch_normalization_forward::primitive_desc pd(desc, eng_);
  std::unordered_map<int, dnnl::memory> args;
  const int arg_of[4] = {DNNL_ARG_SCALE, DNNL_ARG_SHIFT, DNNL_ARG_MEAN, DNNL_ARG_VARIANCE};
  for (int p = 0; p < 4; ++p) {
    const Tensor* t = Constant(n.inputs[1 + p]);
    GAF_CHECK(t->numel() == C, "{}: parameter {} has {} values for {} channels", n.Describe(), p + 1, t->numel(), C);
    dnnl::memory m(dnnl::memory::desc({C}, dt::f32, tag::x), eng_);
    std::memcpy(m.get_data_handle(), t->data<float>(), sizeof(float) * static_cast<size_t>(C));
    plan_->owned.push_back(m);
    args[arg_of[p]] = m;
  }
  const int st = AddStep(dnnl::batch_normalization_forward(Optimized(pd, n)), std::move(args));
  ReadBlocked(op.in[0], st, DNNL_ARG_SRC);
  ReadBlocked(op.out, st, DNNL_ARG_DST);
}

void ChainPlanner::EmitEltwise(const Op& op, int k) {
  const Node& n = nodes_[op.node];
  DefineElementwiseOutput(op, k);
  for (size_t a = 0; a < op.acts.size(); ++a) {
    auto desc = dnnl::eltwise_forward::desc(dnnl::prop_kind::forward_inference, op.acts[a].a, MdOf(op.out),
                                            op.acts[a].alpha, op.acts[a].beta);
    dnnl::eltwise_forward::primitive_desc pd(desc, eng_);
    const int st = AddStep(dnnl::eltwise_forward(Optimized(pd, n)), {});
    ReadBlocked(a == 0 ? op.in[0] : op.out, st, DNNL_ARG_SRC);
    ReadBlocked(op.out, st, DNNL_ARG_DST);
  }
}

void ChainPlanner::EmitBinary(const Op& op, int k) {
  const Node& n = nodes_[op.node];
  const Shape& y = ShapeOf(op.out);
  DefineElementwiseOutput(op, k);
  dnnl::memory::desc src1_md;
  dnnl::memory c1;
  if (op.binary_const != nullptr) {
    const Tensor& t = *op.binary_const;
    const int64_t C = y[1];
    // One value per channel, in the blocked layout (oneDNN broadcasts it over H and W).
    GAF_CHECK(t.numel() == C, "{}: a constant of {} values for {} channels", n.Describe(), t.numel(), C);
    const Shape s1{1, C, 1, 1};
    src1_md = BlockedMd(s1);
    dnnl::memory plain(PlainMd(s1), eng_, const_cast<float*>(t.data<float>()));
    c1 = dnnl::memory(src1_md, eng_);
    NoteOwnParallelRegion();  // oneDNN runs its own OpenMP regions
    dnnl::stream cs(eng_);
    dnnl::reorder(plain, c1).execute(cs, plain, c1);
    cs.wait();
    plan_->owned.push_back(c1);
  } else {
    src1_md = MdOf(op.in[1]);
  }
  dnnl::primitive_attr attr;
  if (!op.acts.empty()) attr.set_post_ops(EltwisePostOps(op.acts));
  auto desc = dnnl::binary::desc(op.binary, MdOf(op.in[0]), src1_md, MdOf(op.out));
  dnnl::binary::primitive_desc pd(desc, attr, eng_);
  std::unordered_map<int, dnnl::memory> args;
  if (c1) args[DNNL_ARG_SRC_1] = c1;
  const int st = AddStep(dnnl::binary(Optimized(pd, n)), std::move(args));
  ReadBlocked(op.in[0], st, DNNL_ARG_SRC_0);
  if (!c1) ReadBlocked(op.in[1], st, DNNL_ARG_SRC_1);
  ReadBlocked(op.out, st, DNNL_ARG_DST);
  plan_->stats.post_ops += op.absorbed;
}

void ChainPlanner::EmitPool(const Op& op, int k) {
  const Node& n = nodes_[op.node];
  const Shape& x = ShapeOf(op.in[0]);
  DefineOutput(op.out);
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
  auto desc = dnnl::pooling_forward::desc(dnnl::prop_kind::forward_inference, a, MdOf(op.in[0]),
                                          MdOf(op.out), strides, kernel, pad_l, pad_r);
  dnnl::pooling_forward::primitive_desc pd(desc, eng_);
  const int st = AddStep(dnnl::pooling_forward(Optimized(pd, n)), {});
  ReadBlocked(op.in[0], st, DNNL_ARG_SRC);
  ReadBlocked(op.out, st, DNNL_ARG_DST);
}

// Channel-blocked: the inputs in their slices of the output (placed by PlaceConcats, or copied
// in), no step for a view; otherwise a concat primitive.
void ChainPlanner::EmitConcat(const Op& op, int k) {
  const Node& n = nodes_[op.node];
  if (channel_blocked_ && (view_concats_.count(k) || place_.count(op.in[0]) || ShapeOf(op.out)[0] == 1)) {
    DefineOutput(op.out);
    if (!view_concats_.count(k)) {
      // Inputs not produced in place are copied into their slices.
      const std::string& root = place_.count(op.out) ? place_[op.out].first : op.out;
      int64_t off = place_.count(op.out) ? place_[op.out].second : 0;
      for (size_t j = 0; j < op.in.size(); ++j) {
        const std::string& in = op.in[j];
        const int64_t c = ShapeOf(in)[1];
        auto pl = place_.find(in);
        if (pl == place_.end() || pl->second != std::make_pair(root, off)) {
          GAF_CHECK(off % 16 == 0 && (c % 16 == 0 || j + 1 == op.in.size()), "{}: a slice off the channel blocks", n.Describe());
          const std::string slot = op.out + "#slot" + std::to_string(j);
          place_[slot] = {root, off};
          value_md_[slot] = BlockedMd(ShapeOf(in));
          const bool plain = input_index_.count(in) && !value_md_.count(in);
          auto r = dnnl::reorder(dnnl::reorder::primitive_desc(eng_, plain ? InputMd(in) : MdOf(in), eng_,
                                                               value_md_[slot]));
          std::unordered_map<int, dnnl::memory> args;
          if (plain) args[DNNL_ARG_FROM] = plan_->input_mem[input_index_.at(in)];
          const int st = AddStep(r, std::move(args));
          if (!plain) ReadBlocked(in, st, DNNL_ARG_FROM);
          ReadBlocked(slot, st, DNNL_ARG_TO);
          plan_->stats.concat_copies++;
        } else {
          plan_->stats.concat_in_place++;
        }
        off += c;
      }
    } else {
      plan_->stats.concat_in_place += static_cast<int>(op.in.size());
    }
    return;
  }
  DefineOutput(op.out);
  std::vector<dnnl::memory::desc> srcs;
  for (const auto& in : op.in) srcs.push_back(MdOf(in));
  dnnl::concat::primitive_desc pd(MdOf(op.out), 1, srcs, eng_);
  const int st = AddStep(dnnl::concat(Optimized(pd, n)), {});
  for (size_t j = 0; j < op.in.size(); ++j) ReadBlocked(op.in[j], st, DNNL_ARG_MULTIPLE_SRC + static_cast<int>(j));
  ReadBlocked(op.out, st, DNNL_ARG_DST);
}

void ChainPlanner::EmitResize(const Op& op, int k) {
  const Node& n = nodes_[op.node];
  DefineOutput(op.out);
  auto desc = dnnl::resampling_forward::desc(dnnl::prop_kind::forward_inference, alg::resampling_nearest,
                                             MdOf(op.in[0]), MdOf(op.out));
  dnnl::resampling_forward::primitive_desc pd(desc, eng_);
  const int st = AddStep(dnnl::resampling_forward(Optimized(pd, n)), {});
  ReadBlocked(op.in[0], st, DNNL_ARG_SRC);
  ReadBlocked(op.out, st, DNNL_ARG_DST);
}

// kIdentity: a copy (in place where the input dies)
void ChainPlanner::EmitIdentity(const Op& op, int k) {
  DefineOutput(op.out);
  auto r = dnnl::reorder(dnnl::reorder::primitive_desc(eng_, MdOf(op.in[0]), eng_, MdOf(op.out)));
  const int st = AddStep(r, {});
  ReadBlocked(op.in[0], st, DNNL_ARG_FROM);
  ReadBlocked(op.out, st, DNNL_ARG_TO);
}

// Outputs back to NCHW.
void ChainPlanner::EmitOutputs() {
  for (size_t j = 0; j < outputs_.size(); ++j) {
    const std::string& o = outputs_[j];
    GAF_CHECK(value_md_.count(o) && !input_index_.count(o), "blocked chain: output '{}' is not produced by the chain", o);
    const Shape& s = ShapeOf(o);
    // An NHWC output (a Transpose folded): the tensor [N,H,W,C] holds the value in nhwc format.
    const bool nhwc = j < boundary_.nhwc_out.size() && boundary_.nhwc_out[j];
    plan_->out_shapes.push_back(nhwc ? Shape{s[0], s[2], s[3], s[1]} : s);
    const dnnl::memory::desc md = nhwc ? dnnl::memory::desc(Dims(s), dt::f32, tag::nhwc) : PlainMd(s);
    dnnl::memory user(md, eng_, nullptr);
    plan_->output_mem.push_back(user);
    auto r = dnnl::reorder(dnnl::reorder::primitive_desc(eng_, MdOf(o), eng_, md));
    const int st = AddStep(r, {{DNNL_ARG_TO, user}});
    ReadBlocked(o, st, DNNL_ARG_FROM);
    plan_->stats.reorders_out++;
  }
}

// Bind every blocked value to its buffer.
void ChainPlanner::Bind() {
  plan_->buffers.resize(buffer_size_.size());
  for (size_t b = 0; b < buffer_size_.size(); ++b) {
    const size_t bytes = (buffer_size_[b] + 63) / 64 * 64;
    plan_->buffers[b].p.reset(static_cast<char*>(std::aligned_alloc(64, bytes)));
    GAF_CHECK(plan_->buffers[b].p != nullptr, "blocked chain: cannot allocate {} bytes", bytes);
    plan_->buffers[b].bytes = bytes;
    plan_->stats.buffer_bytes += static_cast<int64_t>(bytes);
  }
  std::map<std::string, dnnl::memory> bound;
  for (const PendingArg& a : pending_) {
    auto it = bound.find(a.value);
    if (it == bound.end())
    {
      auto pl = place_.find(a.value);
      char* base;
      if (pl != place_.end()) {
        // Channel offset `off` of a batch-1 blocked buffer: off*H*W floats in (off on a block boundary).
        const Shape& rs = ShapeOf(pl->second.first);
        base = plan_->buffers[static_cast<size_t>(assigned_.at(pl->second.first))].p.get() +
               sizeof(float) * static_cast<size_t>(pl->second.second * rs[2] * rs[3]);
      } else {
        base = plan_->buffers[static_cast<size_t>(assigned_.at(a.value))].p.get();
      }
      it = bound.emplace(a.value, dnnl::memory(MdOf(a.value), eng_, base)).first;
    }
    plan_->steps[static_cast<size_t>(a.step)].args[a.arg] = it->second;
  }
}

}  // namespace gaf::blocked_chain_internal
