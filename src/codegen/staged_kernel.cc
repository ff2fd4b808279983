#include "codegen/staged_kernel.h"

#include <fmt/format.h>

#include <cmath>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <set>

#include "codegen/gate_cache.h"
#include "codegen/half_weights.h"
#include "ops/blocked_chain.h"
#include "ops/conv.h"
#include "ops/gemm.h"
#include "ops/kernel_util.h"
#include "runtime/session.h"

namespace gaf {

namespace {

bool IsContraction(const Node& n) {
  return n.domain.empty() && (n.op_type == "MatMul" || n.op_type == "Gemm" || n.op_type == "Conv" ||
                              n.op_type == "ConvTranspose");
}

// Types and shapes of every value of the body for this call: the body runs once on random inputs
// of the call's shapes (constants with their real values).
std::map<std::string, std::pair<DataType, Shape>> BodyShapes(const RowKernelRequest& req, std::string* error) {
  const Function& f = *req.function;
  Graph g = FunctionBodyGraph(f);
  std::map<std::string, Tensor> feeds;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (size_t i = 0; i < f.inputs.size(); ++i) {
    if (req.constants[i] != nullptr) {
      g.initializers.emplace_back(f.inputs[i], *req.constants[i]);  // an initializer: not fed
      continue;
    }
    Tensor t(req.input_types[i], req.input_shapes[i]);
    if (t.dtype() == DataType::kFloat)
      for (int64_t k = 0; k < t.numel(); ++k) t.data<float>()[k] = u(rng);
    feeds[f.inputs[i]] = std::move(t);
  }
  Model m;
  m.opset_imports.push_back({"", req.opset});
  m.graph = std::move(g);
  std::map<std::string, std::pair<DataType, Shape>> shapes;
  for (size_t i = 0; i < f.inputs.size(); ++i) shapes[f.inputs[i]] = {req.input_types[i], req.input_shapes[i]};
  try {
    SessionOptions o;
    o.num_threads = 1;
    o.observer = [&](const std::string& name, const Tensor& t) { shapes[name] = {t.dtype(), t.shape()}; };
    Session s(m, o);
    s.Run(feeds);
  } catch (const std::exception& e) {
    // Integer inputs that are not constants were fed zeros: only their shapes are recorded, and
    // a body that computes shapes from their values (a Reshape's target) cannot run on zeros.
    std::string ints;
    for (size_t i = 0; i < f.inputs.size(); ++i)
      if (req.constants[i] == nullptr && req.input_types[i] != DataType::kFloat &&
          req.input_types[i] != DataType::kFloat16 && req.input_types[i] != DataType::kBFloat16 &&
          req.input_types[i] != DataType::kBool && req.input_types[i] != DataType::kDouble)
        ints += (ints.empty() ? "'" : ", '") + f.inputs[i] + "'";
    *error = ints.empty() ? fmt::format("the body does not run on the recorded shapes: {}", e.what())
                          : fmt::format("the body computes with the values of integer input(s) {} (shape data: "
                                        "only their shapes are recorded, so it was run on zeros): {}",
                                        ints, e.what());
  }
  return shapes;
}

}  // namespace

// Conv followed by an inference BatchNormalization, all parameters constant: the normalization is
// folded into the convolution's weights and bias (W' = W * a, B' = (B - mean) * a + beta with
// a = gamma / sqrt(var + eps)), so the kernel does no normalization pass at all. The new
// constants are owned by the kernel.
void FoldConvBatchNorm(Function& body, std::map<std::string, const Tensor*>& constant_of, StagedKernel& k) {
  std::map<std::string, int> uses;
  for (const Node& n : body.nodes)
    for (const auto& in : n.inputs) uses[in]++;
  for (const auto& o : body.outputs) uses[o]++;
  std::map<std::string, size_t> producer;
  for (size_t i = 0; i < body.nodes.size(); ++i)
    for (const auto& o : body.nodes[i].outputs) producer[o] = i;
  std::set<size_t> removed;
  auto constant = [&](const Node& n, size_t i) -> const Tensor* {
    if (i >= n.inputs.size() || n.inputs[i].empty()) return nullptr;
    auto it = constant_of.find(n.inputs[i]);
    return it != constant_of.end() && it->second->dtype() == DataType::kFloat ? it->second : nullptr;
  };
  for (size_t bi = 0; bi < body.nodes.size(); ++bi) {
    const Node& bn = body.nodes[bi];
    if (bn.op_type != "BatchNormalization" || !bn.domain.empty() || bn.GetInt("training_mode", 0) != 0) continue;
    if (bn.outputs.size() > 1 && std::any_of(bn.outputs.begin() + 1, bn.outputs.end(), [](const std::string& o) { return !o.empty(); }))
      continue;
    auto pit = producer.find(bn.inputs[0]);
    if (pit == producer.end() || uses[bn.inputs[0]] != 1) continue;
    Node& conv = body.nodes[pit->second];
    if (conv.op_type != "Conv" || !conv.domain.empty() || conv.outputs.size() != 1) continue;
    const Tensor* w = constant(conv, 1);
    const Tensor* cb = constant(conv, 2);
    const Tensor *gamma = constant(bn, 1), *beta = constant(bn, 2), *mean = constant(bn, 3), *var = constant(bn, 4);
    if (w == nullptr || gamma == nullptr || beta == nullptr || mean == nullptr || var == nullptr) continue;
    if (conv.inputs.size() > 2 && !conv.inputs[2].empty() && cb == nullptr) continue;
    const int64_t M = w->shape().empty() ? 0 : w->shape()[0];
    if (M == 0 || gamma->numel() != M || beta->numel() != M || mean->numel() != M || var->numel() != M ||
        (cb != nullptr && cb->numel() != M))
      continue;
    const float eps = bn.GetFloat("epsilon", 1e-5f);
    auto nw = std::make_shared<Tensor>(DataType::kFloat, w->shape());
    auto nb = std::make_shared<Tensor>(DataType::kFloat, Shape{M});
    const int64_t per = w->numel() / M;
    for (int64_t o = 0; o < M; ++o) {
      const double a = gamma->data<float>()[o] / std::sqrt(static_cast<double>(var->data<float>()[o]) + eps);
      for (int64_t j = 0; j < per; ++j)
        nw->data<float>()[o * per + j] = static_cast<float>(w->data<float>()[o * per + j] * a);
      const double b0 = cb != nullptr ? cb->data<float>()[o] : 0.0;
      nb->data<float>()[o] = static_cast<float>((b0 - mean->data<float>()[o]) * a + beta->data<float>()[o]);
    }
    const std::string wn = conv.outputs[0] + "/folded_weight", bname = conv.outputs[0] + "/folded_bias";
    constant_of[wn] = nw.get();
    constant_of[bname] = nb.get();
    k.owned_constants.emplace_back(wn, nw);
    k.owned_constants.emplace_back(bname, nb);
    conv.inputs.resize(3);
    conv.inputs[1] = wn;
    conv.inputs[2] = bname;
    conv.outputs[0] = bn.outputs[0];
    k.notes.push_back("BatchNormalization folded into Conv");
    removed.insert(bi);
  }
  std::vector<Node> kept;
  for (size_t i = 0; i < body.nodes.size(); ++i)
    if (!removed.count(i)) kept.push_back(std::move(body.nodes[i]));
  body.nodes = std::move(kept);
}

// A Conv whose output only feeds generated work: its constant bias moves into that work (an Add of
// the bias viewed per channel, [M,1,..,1]), so the library convolution skips its separate bias
// pass and the bias is added in the same pass as the epilogue (ReLU, residual Add).
void HoistConvBias(Function& body, std::map<std::string, const Tensor*>& constant_of, StagedKernel& k,
                   std::map<std::string, std::pair<DataType, Shape>>& shapes) {
  std::set<std::string> outputs(body.outputs.begin(), body.outputs.end());
  std::vector<Node> out;
  for (Node& n : body.nodes) {
    out.push_back(n);
    if (n.op_type != "Conv" || !n.domain.empty() || n.inputs.size() < 3 || n.inputs[2].empty()) continue;
    auto b = constant_of.find(n.inputs[2]);
    if (b == constant_of.end() || b->second->dtype() != DataType::kFloat || b->second->shape().size() != 1) continue;
    const std::string y = n.outputs[0];
    if (outputs.count(y)) continue;  // the kernel's own output: keep the bias in the convolution
    const Tensor* w = constant_of.count(n.inputs[1]) ? constant_of[n.inputs[1]] : nullptr;
    if (w == nullptr || w->shape().size() < 3) continue;
    Shape view(w->shape().size() - 1, 1);  // [M, 1, ..., 1] against the output [N, M, spatial...]
    view[0] = b->second->numel();
    if (!shapes.count(y)) continue;
    auto bias = std::make_shared<Tensor>(b->second->Reshaped(view));
    const std::string bname = y + "/hoisted_bias", raw = y + "/no_bias";
    constant_of[bname] = bias.get();
    k.owned_constants.emplace_back(bname, bias);
    shapes[raw] = shapes[y];
    shapes[bname] = {DataType::kFloat, view};
    Node& conv = out.back();
    conv.inputs.resize(2);
    conv.outputs[0] = raw;
    Node add;
    add.op_type = "Add";
    add.name = conv.name + "/bias";
    add.inputs = {raw, bname};
    add.outputs = {y};
    out.push_back(add);
  }
  body.nodes = std::move(out);
}

// The epilogue of a prepared Conv as oneDNN post-ops: a chain from the conv output through Add of
// a per-channel constant (the bias; only before any other step), Add of a non-constant value (the
// residual, once), and ReLU / LeakyRelu / Clip with constant bounds. On success returns the bias
// (or null), the residual value name ("" when none), the post-ops in order and the chain's end.
bool EpilogueAsPostOps(const Function& body, const std::string& conv_out, int64_t channels,
                       const std::map<std::string, const Tensor*>& constant_of, const Tensor** bias,
                       std::string* residual, std::vector<ConvPostOp>* post, std::string* end) {
  std::string cur = conv_out;
  *bias = nullptr;
  residual->clear();
  post->clear();
  auto constant = [&](const std::string& v) -> const Tensor* {
    auto it = constant_of.find(v);
    return it == constant_of.end() ? nullptr : it->second;
  };
  for (const Node& n : body.nodes) {
    if (!n.domain.empty() || n.outputs.size() != 1) return false;
    auto other_of = [&](std::string* other) {
      if (n.inputs.size() != 2) return false;
      if (n.inputs[0] == cur) *other = n.inputs[1];
      else if (n.inputs[1] == cur) *other = n.inputs[0];
      else return false;
      return *other != cur;
    };
    std::string other;
    if (n.op_type == "Add" && other_of(&other)) {
      const Tensor* c = constant(other);
      const bool per_channel = c != nullptr && c->dtype() == DataType::kFloat && c->numel() == channels &&
                               (c->rank() == 3 || (c->rank() == 4 && c->dim(0) == 1)) &&
                               c->dim(c->rank() - 3) == channels;
      if (per_channel && *bias == nullptr && post->empty()) {
        *bias = c;
      } else if (c == nullptr && residual->empty()) {
        *residual = other;
        post->push_back({ConvPostOp::kSum});
      } else {
        return false;
      }
    } else if (n.op_type == "Relu" && n.inputs.size() == 1 && n.inputs[0] == cur) {
      post->push_back({ConvPostOp::kRelu});
    } else if (n.op_type == "LeakyRelu" && n.inputs.size() == 1 && n.inputs[0] == cur) {
      post->push_back({ConvPostOp::kRelu, n.GetFloat("alpha", 0.01f)});
    } else if (n.op_type == "Clip" && !n.inputs.empty() && n.inputs[0] == cur) {
      float lo = 0, hi = 0;
      if (!ConstantClipBounds(n, constant, &lo, &hi)) return false;
      post->push_back({ConvPostOp::kClip, lo, hi});
    } else {
      return false;
    }
    cur = n.outputs[0];
  }
  *end = cur;
  return cur != conv_out;
}

void FoldEpiloguesIntoPreparedConvs(StagedKernel& k, const Function& f,
                                    const std::map<std::string, const Tensor*>& constant_of) {
  for (size_t i = 0; i + 1 < k.stages.size(); ++i) {
    StagedKernel::Stage& c = k.stages[i];
    StagedKernel::Stage& e = k.stages[i + 1];
    if (!c.library || c.node.op_type != "Conv" || !c.own_kernel || e.library || e.outputs.size() != 1 ||
        c.outputs.size() != 1 || c.node.HasInput(2))
      continue;
    auto w = constant_of.find(c.node.inputs[1]);
    if (w == constant_of.end()) continue;
    const int conv_out = c.outputs[0];
    // The conv output must be read by the epilogue only.
    bool elsewhere = std::find(f.outputs.begin(), f.outputs.end(), k.value_names[conv_out]) != f.outputs.end();
    for (size_t j = 0; j < k.stages.size(); ++j)
      if (j != i + 1 && std::find(k.stages[j].inputs.begin(), k.stages[j].inputs.end(), conv_out) != k.stages[j].inputs.end())
        elsewhere = true;
    if (elsewhere) continue;
    const Tensor* bias = nullptr;
    std::string residual, end;
    std::vector<ConvPostOp> post;
    if (!EpilogueAsPostOps(e.body, k.value_names[conv_out], w->second->dim(0), constant_of, &bias, &residual, &post,
                           &end) ||
        k.value_names[e.outputs[0]] != end)
      continue;
    Tensor flat_bias;
    if (bias != nullptr) flat_bias = bias->Reshaped({bias->numel()});
    std::shared_ptr<PreparedConv> conv =
        PreparedConv::Create(c.node, *w->second, bias != nullptr ? &flat_bias : nullptr, post);
    if (!conv) continue;
    KernelInfo info = PreparedConvKernel(conv, /*fused_stage=*/true);
    std::string ops;
    for (const ConvPostOp& op : post)
      ops += std::string(ops.empty() ? "" : ",") + (op.kind == ConvPostOp::kSum ? "sum" : op.kind == ConvPostOp::kRelu ? "relu" : "clip");
    c.own_kernel = std::make_shared<KernelInfo>(std::move(info));
    c.kernel = c.own_kernel.get();
    c.inputs = {c.inputs[0], residual.empty() ? -1 : k.ValueId(residual)};
    c.outputs = {e.outputs[0]};
    k.notes.push_back(fmt::format("oneDNN post-ops [{}{}]", bias != nullptr ? "bias" : "", (bias ? (ops.empty() ? "" : ",") : "") + ops));
    k.stages.erase(k.stages.begin() + static_cast<std::ptrdiff_t>(i) + 1);
  }
}

// A body of CNN operators that all run on oneDNN's blocked layout, with two Convs or more: one
// library stage running the whole body as a BlockedChain (ops/blocked_chain.h), its intermediate
// values never leaving the blocked layout. False (and `why`) when it does not qualify or oneDNN
// cannot plan it for the call's shapes.
bool BlockedChainKernel(const RowKernelRequest& req, const Function& f,
                        const std::map<std::string, std::pair<DataType, Shape>>& shapes, StagedKernel* k,
                        std::string* why) {
  std::map<std::string, Tensor> constants;
  for (size_t i = 0; i < f.inputs.size(); ++i)
    if (req.constants[i] != nullptr) constants[f.inputs[i]] = *req.constants[i];
  auto constant = [&](const std::string& v) -> const Tensor* {
    auto it = constants.find(v);
    return it == constants.end() ? nullptr : &it->second;
  };
  auto shape_of = [&](const std::string& v) -> const Shape* {
    auto it = shapes.find(v);
    return it == shapes.end() ? nullptr : &it->second.second;
  };
  int convs = 0;
  for (const Node& n : f.nodes) {
    *why = BlockedChainRejects(n, constant, shape_of);
    if (!why->empty()) return false;
    convs += n.op_type == "Conv";
  }
  // One convolution and its epilogue is what the prepared convolution with post-ops does.
  if (convs < 2) {
    *why = "fewer than two convolutions";
    return false;
  }
  std::vector<Shape> in_shapes;
  for (size_t i = 0; i < f.inputs.size(); ++i) {
    if (req.constants[i] == nullptr && req.input_types[i] != DataType::kFloat) {
      *why = fmt::format("input '{}' is {}", f.inputs[i], DataTypeName(req.input_types[i]));
      return false;
    }
    in_shapes.push_back(req.input_shapes[i]);
  }
  for (const auto& o : f.outputs) {
    auto it = shapes.find(o);
    if (it == shapes.end() || it->second.first != DataType::kFloat) {
      *why = fmt::format("output '{}' is not float32", o);
      return false;
    }
  }
  std::shared_ptr<BlockedChain> chain = BlockedChain::Create(f.nodes, f.inputs, f.outputs, constants, why);
  if (!chain) return false;
  if (!req.layout_cache_root.empty()) {
    GateCache cache(req.layout_cache_root, true);
    BlockedChain::LayoutStore store;
    store.get = [cache](const std::string& key) -> std::string {
      std::optional<nlohmann::json> j = cache.Get(key);
      return j && j->contains("layout") && (*j)["layout"].is_string() ? (*j)["layout"].get<std::string>() : "";
    };
    store.put = [cache](const std::string& key, const std::string& layout) { cache.Put(key, {{"layout", layout}}); };
    chain->SetLayoutStore(std::move(store));
  }
  *why = chain->Prepare(in_shapes);
  if (!why->empty()) return false;
  StagedKernel::Stage st;
  st.library = true;
  st.node.op_type = "BlockedChain";
  st.node.name = f.name;
  st.node.inputs = f.inputs;
  st.node.outputs = f.outputs;
  KernelInfo info;
  info.op_type = "BlockedChain";
  info.kind = OpKind::kOpaque;
  info.upcast_half = false;
  info.fn = [chain](KernelContext& ctx) {
    std::vector<Tensor> outs = chain->Run(ctx.inputs);
    for (size_t i = 0; i < outs.size() && i < ctx.outputs.size(); ++i) ctx.outputs[i] = std::move(outs[i]);
  };
  st.own_kernel = std::make_shared<KernelInfo>(std::move(info));
  st.kernel = st.own_kernel.get();
  for (const auto& in : f.inputs) {
    const int v = k->ValueId(in);
    st.inputs.push_back(v);
    k->function_inputs.push_back(v);
  }
  for (const auto& o : f.outputs) {
    const int v = k->ValueId(o);
    st.outputs.push_back(v);
    k->function_outputs.push_back(v);
  }
  k->live_notes.push_back([chain] { return chain->Describe(); });
  k->stages.push_back(std::move(st));
  k->ok = true;
  return true;
}

StagedKernel GenerateStagedKernel(const RowKernelRequest& req, const std::string& symbol, int64_t opset) {
  StagedKernel k;
  k.opset = opset;
  Function f = *req.function;  // copy: folding may rewrite it
  std::string err;
  auto shapes = BodyShapes(req, &err);
  if (!err.empty()) {
    k.reason = err;
    return k;
  }
  // float16/bfloat16 values are computed in float32: the caller widens half inputs and narrows
  // each output to its own type (k.output_types), so groups that mix float32 and half values (a
  // LayerNorm computed in float32 between Casts) are fine; a Cast to a half type inside the body
  // rounds as the unfused Cast does. Outputs must be floating-point.
  for (const auto& o : f.outputs) {
    auto it = shapes.find(o);
    const DataType t = it == shapes.end() ? DataType::kUndefined : it->second.first;
    if (t != DataType::kFloat && t != DataType::kFloat16 && t != DataType::kBFloat16) {
      k.reason = fmt::format("output '{}' is {}; generated kernels write float32, float16 or bfloat16", o, DataTypeName(t));
      return k;
    }
    k.output_types.push_back(t);
  }
  if (req.blocked_chains) {
    std::string why;
    StagedKernel chain = k;
    if (BlockedChainKernel(req, f, shapes, &chain, &why)) return chain;
  }
  auto value = [&](const std::string& name) { return k.ValueId(name); };
  std::map<std::string, const Tensor*> constant_of;
  for (size_t i = 0; i < f.inputs.size(); ++i) {
    k.function_inputs.push_back(value(f.inputs[i]));
    if (req.constants[i] != nullptr) constant_of[f.inputs[i]] = req.constants[i];
  }
  FoldConvBatchNorm(f, constant_of, k);
  HoistConvBias(f, constant_of, k, shapes);
  for (const auto& [name, t] : k.owned_constants) k.constant_values.emplace_back(value(name), t.get());
  // Depth of every node: contractions add one.
  std::map<std::string, int> depth_of;
  std::vector<int> depth(f.nodes.size(), 0);
  for (size_t i = 0; i < f.nodes.size(); ++i) {
    const Node& n = f.nodes[i];
    int d = 0;
    for (const auto& in : n.inputs)
      if (!in.empty() && depth_of.count(in)) d = std::max(d, depth_of[in]);
    if (IsContraction(n)) ++d;
    depth[i] = d;
    for (const auto& o : n.outputs)
      if (!o.empty()) depth_of[o] = d;
  }
  int max_depth = depth.empty() ? 0 : *std::max_element(depth.begin(), depth.end());
  std::set<std::string> function_outputs(f.outputs.begin(), f.outputs.end());
  // Uses of each value by node index (to find stage outputs).
  std::map<std::string, std::vector<size_t>> users;
  for (size_t i = 0; i < f.nodes.size(); ++i)
    for (const auto& in : f.nodes[i].inputs) users[in].push_back(i);

  int row_count = 0;
  for (int d = 0; d <= max_depth; ++d) {
    // Contractions of this depth first (their inputs are of a smaller depth), then the row work.
    for (size_t i = 0; i < f.nodes.size(); ++i) {
      if (depth[i] != d || !IsContraction(f.nodes[i])) continue;
      StagedKernel::Stage st;
      st.library = true;
      st.node = f.nodes[i];
      st.kernel = OpRegistry::Global().Find("", st.node.op_type);
      if (req.half_weights != HalfWeights::kOff && st.node.op_type == "MatMul" && st.node.inputs.size() == 2 &&
          constant_of.count(st.node.inputs[1])) {
        const Tensor* w = constant_of[st.node.inputs[1]];
        if (w->dtype() == DataType::kFloat && w->shape().size() == 2) {
          st.own_kernel = std::make_shared<KernelInfo>(HalfWeightMatMulKernel(*w, req.half_weights));
          st.kernel = st.own_kernel.get();
          k.notes.push_back("float16 weights");
        }
      } else if (st.node.op_type == "MatMul" && st.node.inputs.size() == 2 && constant_of.count(st.node.inputs[1])) {
        // A float32 constant weight: the packed product a session gives such a MatMul node outside
        // a function (ops/gemm.h, PreparedMatMul: 1.08-1.14x the row-major GEMV's pace at one row,
        // register tiles for prompts), one packed copy shared by the call site's variants.
        const Tensor* w = constant_of[st.node.inputs[1]];
        if (w->dtype() == DataType::kFloat && w->rank() == 2 && w->numel() >= kPackedMatMulMinWeight) {
          st.own_kernel = std::make_shared<KernelInfo>(PreparedMatMulKernel(SharedPreparedMatMul(*w)));
          st.kernel = st.own_kernel.get();
        }
      }
      // A Conv with a constant weight: oneDNN's blocked-layout convolution prepared once for this
      // call site, where it is faster than our tiled path (PreparedConv::Create decides).
      if (st.node.op_type == "Conv" && st.node.inputs.size() >= 2 && constant_of.count(st.node.inputs[1]) &&
          (!st.node.HasInput(2) || constant_of.count(st.node.inputs[2]))) {
        auto x = shapes.find(st.node.inputs[0]);
        if (x != shapes.end() && x->second.first == DataType::kFloat) {
          const Tensor* b = st.node.HasInput(2) ? constant_of[st.node.inputs[2]] : nullptr;
          if (auto conv = PreparedConv::Create(st.node, *constant_of[st.node.inputs[1]], b)) {
            st.own_kernel = std::make_shared<KernelInfo>(PreparedConvKernel(std::move(conv)));
            st.kernel = st.own_kernel.get();
            k.notes.push_back("oneDNN convolution");
          }
        }
      }
      if (st.kernel == nullptr) {
        k.reason = fmt::format("{}: no library kernel", st.node.Describe());
        return k;
      }
      for (const auto& in : st.node.inputs) st.inputs.push_back(in.empty() ? -1 : value(in));
      for (const auto& o : st.node.outputs) st.outputs.push_back(o.empty() ? -1 : value(o));
      k.stages.push_back(std::move(st));
    }
    // Row nodes of this depth, split into connected pieces (union-find over shared values).
    std::vector<size_t> row_nodes;
    for (size_t i = 0; i < f.nodes.size(); ++i)
      if (depth[i] == d && !IsContraction(f.nodes[i])) row_nodes.push_back(i);
    if (row_nodes.empty()) continue;
    std::vector<size_t> parent(row_nodes.size());
    std::iota(parent.begin(), parent.end(), 0);
    std::function<size_t(size_t)> find = [&](size_t x) { return parent[x] == x ? x : parent[x] = find(parent[x]); };
    std::map<std::string, size_t> producer;
    for (size_t a = 0; a < row_nodes.size(); ++a)
      for (const auto& o : f.nodes[row_nodes[a]].outputs) producer[o] = a;
    for (size_t a = 0; a < row_nodes.size(); ++a)
      for (const auto& in : f.nodes[row_nodes[a]].inputs) {
        auto it = producer.find(in);
        if (it != producer.end()) parent[find(a)] = find(it->second);
      }
    std::map<size_t, std::vector<size_t>> pieces;
    for (size_t a = 0; a < row_nodes.size(); ++a) pieces[find(a)].push_back(row_nodes[a]);
    for (const auto& [root, nodes] : pieces) {
      Function sf;
      sf.domain = f.domain;
      sf.name = fmt::format("{}_stage{}", f.name, row_count);
      std::set<std::string> produced, inputs_seen;
      RowKernelRequest sreq;
      sreq.function = &sf;
      sreq.approx_math = req.approx_math;
      sreq.opset = req.opset;
      for (size_t ni : nodes) {
        const Node& n = f.nodes[ni];
        for (const auto& in : n.inputs) {
          if (in.empty() || produced.count(in) || inputs_seen.count(in)) continue;
          inputs_seen.insert(in);
          sf.inputs.push_back(in);
          auto sh = shapes.find(in);
          if (sh == shapes.end()) {
            k.reason = fmt::format("no shape for '{}'", in);
            return k;
          }
          sreq.input_types.push_back(sh->second.first);
          sreq.input_shapes.push_back(sh->second.second);
          auto c = constant_of.find(in);
          sreq.constants.push_back(c == constant_of.end() ? nullptr : c->second);
        }
        sf.nodes.push_back(n);
        for (const auto& o : n.outputs) produced.insert(o);
      }
      std::set<size_t> in_piece(nodes.begin(), nodes.end());
      for (size_t ni : nodes)
        for (const auto& o : f.nodes[ni].outputs) {
          if (o.empty()) continue;
          bool needed = function_outputs.count(o) > 0;
          for (size_t u : users[o]) needed |= !in_piece.count(u);
          if (needed) sf.outputs.push_back(o);
        }
      StagedKernel::Stage st;
      st.row = GenerateRowKernel(sreq, fmt::format("{}_s{}", symbol, row_count));
      ++row_count;
      if (!st.row.ok) {
        k.reason = st.row.reason;
        return k;
      }
      for (const auto& in : sf.inputs) st.inputs.push_back(value(in));
      for (const auto& o : sf.outputs) st.outputs.push_back(value(o));
      st.body = std::move(sf);
      st.body.inputs.clear();  // the stage's inputs are by value id; keep only the operators
      st.body.outputs.clear();
      k.stages.push_back(std::move(st));
    }
  }
  // A prepared (oneDNN) Conv followed by an epilogue oneDNN can apply itself (bias, a residual
  // Add, ReLU / LeakyRelu / Clip): one library stage with post-ops, no pass of our own.
  FoldEpiloguesIntoPreparedConvs(k, f, constant_of);
  // Conv + elementwise epilogue: run the epilogue per finished output tile (RunStagedKernel).
  for (size_t i = 0; i + 1 < k.stages.size(); ++i) {
    StagedKernel::Stage& c = k.stages[i];
    const StagedKernel::Stage& e = k.stages[i + 1];
    if (!c.library || c.own_kernel || c.node.op_type != "Conv" || e.library || !e.row.collapse || c.outputs.empty())
      continue;
    auto x = shapes.find(c.node.inputs[0]);
    // float16/bfloat16 groups run on widened float32 values (the runtime converts at the boundary).
    if (x == shapes.end() || (x->second.first != DataType::kFloat && x->second.first != DataType::kFloat16 &&
                              x->second.first != DataType::kBFloat16))
      continue;
    if (std::find(e.inputs.begin(), e.inputs.end(), c.outputs[0]) == e.inputs.end()) continue;
    c.epilogue_stage = static_cast<int>(i + 1);
    k.notes.push_back("epilogue on conv tiles");
  }
  for (const auto& o : f.outputs) {
    if (!k.value_ids.count(o)) {
      k.reason = fmt::format("output '{}' is a function input", o);
      return k;
    }
    k.function_outputs.push_back(k.value_ids[o]);
  }
  k.ok = true;
  return k;
}

int StagedKernel::ValueId(const std::string& name) {
  auto it = value_ids.find(name);
  if (it != value_ids.end()) return it->second;
  value_ids[name] = static_cast<int>(value_names.size());
  value_names.push_back(name);
  return static_cast<int>(value_names.size()) - 1;
}

StagedKernel ReferenceStagedKernel(const Function& f, int64_t opset, const std::vector<const Tensor*>& constants) {
  StagedKernel k;
  k.opset = opset;
  std::map<std::string, const Tensor*> constant_of;
  for (size_t i = 0; i < f.inputs.size() && i < constants.size(); ++i)
    if (constants[i] != nullptr) constant_of[f.inputs[i]] = constants[i];
  for (const auto& in : f.inputs) k.function_inputs.push_back(k.ValueId(in));
  for (const Node& n : f.nodes) {
    StagedKernel::Stage st;
    st.library = true;
    st.node = n;
    st.kernel = OpRegistry::Global().Find(n.domain, n.op_type);
    GAF_CHECK(st.kernel != nullptr, "{}: no reference kernel", n.Describe());
    // As Session does for Conv nodes with initializer weights (runtime/session.cc).
    if (n.op_type == "Conv" && n.domain.empty() && n.inputs.size() >= 2 && constant_of.count(n.inputs[1]) &&
        (!n.HasInput(2) || constant_of.count(n.inputs[2]))) {
      const Tensor* b = n.HasInput(2) ? constant_of[n.inputs[2]] : nullptr;
      if (auto conv = PreparedConv::Create(n, *constant_of[n.inputs[1]], b)) {
        st.own_kernel = std::make_shared<KernelInfo>(PreparedConvKernel(std::move(conv)));
        st.kernel = st.own_kernel.get();
      }
    }
    for (const auto& in : n.inputs) st.inputs.push_back(in.empty() ? -1 : k.ValueId(in));
    for (const auto& o : n.outputs) st.outputs.push_back(o.empty() ? -1 : k.ValueId(o));
    k.stages.push_back(std::move(st));
  }
  for (const auto& o : f.outputs) k.function_outputs.push_back(k.ValueId(o));
  k.ok = true;
  return k;
}

std::string StagedKernel::Describe() const {
  std::string s;
  for (const Stage& st : stages) {
    if (!s.empty()) s += " + ";
    if (st.library) {
      s += "library " + st.node.op_type;
    } else {
      s += "generated[";
      s += st.row.ops_summary;
      s += "]";
    }
  }
  std::vector<std::string> all = notes;
  for (const auto& live : live_notes) all.push_back(live());
  for (size_t i = 0; i < all.size(); ++i) s += (i == 0 ? " (" : "; ") + all[i] + (i + 1 == all.size() ? ")" : "");
  return s;
}

std::vector<KernelSource> StagedKernel::Sources() const {
  std::vector<KernelSource> out;
  for (const Stage& st : stages)
    if (!st.library) out.push_back({st.row.symbol, st.row.source});
  return out;
}

bool StagedKernel::Bind(const KernelLibrary& library) {
  for (Stage& st : stages) {
    if (st.library) continue;
    auto err = library.errors().find(st.row.symbol);
    if (err != library.errors().end()) {
      reason = "compile error: " + err->second.substr(0, 2000);
      return false;
    }
    st.fn = reinterpret_cast<RowKernelFn>(library.Find(st.row.symbol));
    if (st.fn == nullptr) {
      reason = "symbol " + st.row.symbol + " missing from the library";
      return false;
    }
  }
  for (Stage& st : stages)
    if (st.epilogue_stage >= 0) {
      Stage& e = stages[st.epilogue_stage];
      e.tile = reinterpret_cast<RowTileFn>(library.Find(e.row.symbol + "_tile"));
      if (e.tile == nullptr) st.epilogue_stage = -1;  // an older cached library: run the stages one after another
    }
  return true;
}

// A Conv stage and its elementwise epilogue stage in one pass: the conv output is allocated, the
// epilogue call is prepared on it, and the convolution hands over each finished tile (rows of the
// output viewed as [N*M, out_size]), which the epilogue maps onto its own rows x cols view of the
// same elements. Returns false, having done nothing, when the call does not fit (other types, an
// epilogue domain other than the conv output): the caller runs the stages one after another.
template <class SetOutput>
static bool RunConvWithEpilogue(const StagedKernel& k, const StagedKernel::Stage& st, const std::vector<const Tensor*>& ins,
                                std::vector<const Tensor*>& val, SetOutput&& set_output) {
  const StagedKernel::Stage& e = k.stages[st.epilogue_stage];
  if (e.tile == nullptr || ins.size() < 2 || ins[0] == nullptr || ins[1] == nullptr ||
      ins[0]->dtype() != DataType::kFloat || ins[1]->dtype() != DataType::kFloat ||
      (ins.size() > 2 && ins[2] != nullptr && ins[2]->dtype() != DataType::kFloat))
    return false;
  Tensor y = Tensor::Uninitialized(DataType::kFloat, ConvOutputShape(st.node, ins[0]->shape(), ins[1]->shape()));
  if (y.numel() == 0) return false;  // nothing to tile
  std::vector<const Tensor*> eins;
  for (int v : e.inputs) eins.push_back(v == st.outputs[0] ? &y : (v < 0 ? nullptr : val[v]));
  RowCall call;
  PrepareRowCall(e.row, eins, &call);
  if (call.launch->out_shape != y.shape()) return false;
  const int64_t cols = call.launch->cols, osz = y.shape().size() > 2 ? y.numel() / (y.dim(0) * y.dim(1)) : 1;
  const RowKernelArgs* args = &call.args;
  RowTileFn tile = e.tile;
  ConvF32(st.node, *ins[0], *ins[1], ins.size() > 2 ? ins[2] : nullptr, &y,
          [args, tile, cols, osz](int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
            if (cols == osz) {
              tile(args, r0, r1, c0, c1);
              return;
            }
            for (int64_t r = r0; r < r1; ++r) {
              // Elements [r*osz + c0, r*osz + c1) of the output, in the epilogue's rows of `cols`.
              for (int64_t a = r * osz + c0, b = r * osz + c1; a < b;) {
                const int64_t row = a / cols, col = a % cols, n = std::min(b - a, cols - col);
                tile(args, row, row + 1, col, col + n);
                a += n;
              }
            }
          });
  set_output(st.outputs[0], std::move(y));
  for (size_t o = 0; o < e.outputs.size(); ++o) set_output(e.outputs[o], std::move(call.outputs[o]));
  return true;
}

std::vector<Tensor> RunStagedKernel(const StagedKernel& k, const std::vector<const Tensor*>& inputs, int num_threads) {
  GAF_CHECK(inputs.size() == k.function_inputs.size(), "fused kernel: expected {} inputs, got {}",
            k.function_inputs.size(), inputs.size());
  // Per-thread scratch reused across calls (a decode step makes dozens of small fused calls; their
  // bookkeeping allocations were a measurable share); a nested call on the same thread (none
  // today) gets fresh vectors.
  struct Scratch {
    bool busy = false;
    std::vector<const Tensor*> val, ins;
    std::vector<Tensor> owned;
    std::vector<char> is_owned;
  };
  thread_local Scratch shared;
  Scratch local;
  Scratch& sc = shared.busy ? local : shared;
  struct Release {
    Scratch& s;
    ~Release() {
      for (Tensor& t : s.owned) t = Tensor();  // drop intermediates now, keep the capacity
      s.busy = false;
    }
  } release{sc};
  sc.busy = true;
  const size_t nv = k.value_names.size();
  std::vector<const Tensor*>& val = sc.val;
  val.assign(nv, nullptr);
  for (const auto& [v, t] : k.constant_values) val[v] = t;
  std::vector<Tensor>& owned = sc.owned;
  if (owned.size() < nv) owned.resize(nv);
  std::vector<char>& is_owned = sc.is_owned;
  is_owned.assign(nv, 0);
  for (size_t i = 0; i < inputs.size(); ++i) val[k.function_inputs[i]] = inputs[i];
  std::vector<const Tensor*>& ins = sc.ins;
  auto set_output = [&](int v, Tensor&& t) {
    owned[v] = std::move(t);
    is_owned[v] = 1;
    val[v] = &owned[v];
  };
  for (size_t si = 0; si < k.stages.size(); ++si) {
    const StagedKernel::Stage& st = k.stages[si];
    ins.clear();
    for (int v : st.inputs) ins.push_back(v < 0 ? nullptr : val[v]);
    if (st.epilogue_stage >= 0 && RunConvWithEpilogue(k, st, ins, val, set_output)) {
      ++si;  // the epilogue stage ran on the conv's tiles
      continue;
    }
    if (st.library) {
      KernelContext ctx{st.node, k.opset, ins, {}, nullptr, num_threads};
      ctx.outputs.resize(st.node.outputs.size());
      // As the session does for kernels "computed in float32": half inputs widened, float outputs
      // narrowed back (reference stages of float16 bodies, e.g. after a Cast to float16).
      std::vector<Tensor> widened;
      DataType half = DataType::kUndefined;
      bool any_half = false;
      for (const Tensor* t : ctx.inputs)
        any_half |= t != nullptr && (t->dtype() == DataType::kFloat16 || t->dtype() == DataType::kBFloat16);
      if (st.kernel->upcast_half && any_half) {
        widened.reserve(ctx.inputs.size());
        for (const Tensor*& t : ctx.inputs)
          if (t != nullptr && (t->dtype() == DataType::kFloat16 || t->dtype() == DataType::kBFloat16)) {
            half = t->dtype();
            widened.push_back(t->CastTo(DataType::kFloat));
            t = &widened.back();
          }
      }
      st.kernel->fn(ctx);
      if (half != DataType::kUndefined)
        for (Tensor& t : ctx.outputs)
          if (t.defined() && t.dtype() == DataType::kFloat) t = t.CastTo(half);
      for (size_t o = 0; o < st.outputs.size(); ++o)
        if (st.outputs[o] >= 0) set_output(st.outputs[o], std::move(ctx.outputs[o]));
    } else {
      std::vector<Tensor> outs = RunRowKernel(st.fn, st.row, ins);
      for (size_t o = 0; o < st.outputs.size(); ++o) set_output(st.outputs[o], std::move(outs[o]));
    }
  }
  std::vector<Tensor> out;
  out.reserve(k.function_outputs.size());
  for (int v : k.function_outputs) {
    // An output that is a function input, or listed twice, is copied.
    GAF_CHECK(val[v] != nullptr, "fused kernel: output '{}' was not computed", k.value_names[v]);
    if (is_owned[v]) {
      out.push_back(std::move(owned[v]));
      is_owned[v] = 0;
      val[v] = &out.back();
    } else {
      out.push_back(*val[v]);
    }
  }
  return out;
}

}  // namespace gaf
