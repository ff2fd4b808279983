// Cost model: FLOPs and bytes of single operators, roofline time of kernels, and the cost of a
// group of operators before and after fusion with the fused kernel's on-chip footprint.
// The formulas are stated in docs/cost_model.md; every figure a report prints comes from here.
//
//   unfused:  t_before = sum_i [ max(F_i / P, B_i / BW) + o ]      B_i = bytes read + written by op i
//   fused:    t_after  = max(F / P, (B_ext + S) / BW) + o           B_ext = external inputs read once
//                                                                     + external outputs written once
//             S = 0 when the footprint fits the local-memory budget, else 2 x interior bytes (spill)
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "cost/cost_model.h"
#include "ir/error.h"
#include "ops/kernel.h"

namespace gaf {
namespace {

// Tiling a CPU fused kernel would use (docs/cost_model.md, "Footprint").
constexpr int64_t kTileM = 64;            // output tile rows of a contraction
constexpr int64_t kTileN = 64;            // output tile columns of a contraction
constexpr int64_t kTileK = 128;           // K panel of a contraction
constexpr int64_t kElementBlock = 4096;   // elements per thread of an elementwise chain

// FLOPs per element of a transcendental function (a polynomial/rational approximation plus range
// reduction), and of composites of two transcendentals (GELU, Mish, Softplus).
constexpr double kTranscendentalFlops = 10;
constexpr double kCompositeFlops = 20;
constexpr double kNormalizationFlops = 5;  // softmax / layer-norm-like, per input element

const std::unordered_map<std::string, double>& ElementwiseFlops() {
  static const std::unordered_map<std::string, double> table = {
      {"Exp", kTranscendentalFlops},   {"Log", kTranscendentalFlops},   {"Erf", kTranscendentalFlops},
      {"Tanh", kTranscendentalFlops},  {"Sigmoid", kTranscendentalFlops}, {"Sin", kTranscendentalFlops},
      {"Cos", kTranscendentalFlops},   {"Tan", kTranscendentalFlops},   {"Asin", kTranscendentalFlops},
      {"Acos", kTranscendentalFlops},  {"Atan", kTranscendentalFlops},  {"Sinh", kTranscendentalFlops},
      {"Cosh", kTranscendentalFlops},  {"Asinh", kTranscendentalFlops}, {"Acosh", kTranscendentalFlops},
      {"Atanh", kTranscendentalFlops}, {"Pow", kTranscendentalFlops},   {"Elu", kTranscendentalFlops},
      {"Selu", kTranscendentalFlops},  {"Celu", kTranscendentalFlops},  {"Gelu", kCompositeFlops},
      {"Mish", kCompositeFlops},       {"Softplus", kCompositeFlops},   {"FastGelu", kCompositeFlops},
      {"QuickGelu", kTranscendentalFlops},
      // Conversions and copies do no arithmetic.
      {"Cast", 0}, {"CastLike", 0}, {"Identity", 0},
  };
  return table;
}

bool IsShapeOnlyOp(const Node& n) { return n.domain.empty() && (n.op_type == "Shape" || n.op_type == "Size"); }

const ValueShape* Find(const ShapeMap& shapes, const std::string& name) {
  if (name.empty()) return nullptr;
  auto it = shapes.find(name);
  return it != shapes.end() && it->second.known ? &it->second : nullptr;
}

double Bytes(const ValueShape* v) {
  if (v == nullptr) return 0;
  return static_cast<double>(NumElements(v->shape)) * static_cast<double>(DataTypeSize(v->dtype));
}

double Numel(const ValueShape* v) { return v ? static_cast<double>(NumElements(v->shape)) : 0; }

double ProductOf(const Shape& s, size_t from, size_t to) {
  double p = 1;
  for (size_t i = from; i < to && i < s.size(); ++i) p *= static_cast<double>(s[i]);
  return p;
}

OpKind KindOf(const Node& n) {
  const KernelInfo* k = OpRegistry::Global().Find(n.domain, n.op_type);
  return k ? k->kind : OpKind::kOpaque;
}

bool IsContractionOp(const Node& n) {
  static const std::set<std::string> ops = {"MatMul", "Gemm", "MatMulInteger", "QLinearMatMul", "Einsum",
                                            "Conv", "ConvTranspose", "ConvInteger", "QLinearConv"};
  return n.domain.empty() && ops.count(n.op_type) > 0;
}

// Operand positions (A, B) of a contraction.
std::pair<int, int> ContractionOperands(const Node& n) {
  if (n.op_type == "QLinearMatMul" || n.op_type == "QLinearConv") return {0, 3};
  return {0, 1};
}

// M, N, K of a contraction seen as one matrix product (Conv as implicit GEMM).
struct Mnk {
  double m = 0, n = 0, k = 0;
  bool conv = false;
};

Mnk ContractionDims(const Node& node, const ShapeMap& shapes) {
  Mnk d;
  const auto [ia, ib] = ContractionOperands(node);
  const ValueShape* a = ia < static_cast<int>(node.inputs.size()) ? Find(shapes, node.inputs[ia]) : nullptr;
  const ValueShape* b = ib < static_cast<int>(node.inputs.size()) ? Find(shapes, node.inputs[ib]) : nullptr;
  const ValueShape* y = node.outputs.empty() ? nullptr : Find(shapes, node.outputs[0]);
  if (y == nullptr) return d;
  const Shape& ys = y->shape;
  const std::string& op = node.op_type;
  if (op == "MatMul" || op == "MatMulInteger" || op == "QLinearMatMul") {
    if (a == nullptr || a->shape.empty()) return d;
    d.k = static_cast<double>(a->shape.back());
    d.n = ys.empty() ? 1 : static_cast<double>(ys.back());
    d.m = d.n > 0 ? Numel(y) / d.n : 0;  // all batch rows together
  } else if (op == "Gemm") {
    if (a == nullptr || a->shape.size() != 2 || ys.size() != 2) return d;
    d.k = static_cast<double>(node.GetInt("transA", 0) ? a->shape[0] : a->shape[1]);
    d.m = static_cast<double>(ys[0]);
    d.n = static_cast<double>(ys[1]);
  } else if (op == "Conv" || op == "ConvInteger" || op == "QLinearConv") {
    if (b == nullptr || b->shape.size() < 2 || ys.size() < 2) return d;
    d.conv = true;
    d.n = static_cast<double>(ys[1]);
    d.m = d.n > 0 ? Numel(y) / d.n : 0;
    d.k = ProductOf(b->shape, 1, b->shape.size());  // Cin/group * kernel elements
  } else if (op == "ConvTranspose") {
    // W: [Cin, Cout/group, k...]. Each input element scatters into Cout/group * k outputs.
    if (a == nullptr || b == nullptr || b->shape.size() < 2 || a->shape.size() < 2) return d;
    d.conv = true;
    const double group = static_cast<double>(std::max<int64_t>(1, node.GetInt("group", 1)));
    d.m = Numel(a) / static_cast<double>(a->shape[1]);  // batch x input spatial
    d.k = static_cast<double>(a->shape[1]) / group;
    d.n = ProductOf(b->shape, 1, b->shape.size()) * group;
  } else if (op == "Einsum") {
    // 2 x (product of all distinct index extents) for a two-operand contraction.
    const std::string eq = node.GetString("equation", "");
    std::map<char, int64_t> extent;
    size_t arrow = eq.find("->");
    std::string lhs = eq.substr(0, arrow);
    std::vector<std::string> terms;
    std::string cur;
    for (char c : lhs) {
      if (c == ',') {
        terms.push_back(cur);
        cur.clear();
      } else if (c != ' ') {
        cur += c;
      }
    }
    terms.push_back(cur);
    for (size_t t = 0; t < terms.size() && t < node.inputs.size(); ++t) {
      const ValueShape* v = Find(shapes, node.inputs[t]);
      if (v == nullptr || terms[t].find('.') != std::string::npos) continue;
      for (size_t i = 0; i < terms[t].size() && i < v->shape.size(); ++i)
        extent[terms[t][i]] = std::max(extent[terms[t][i]], v->shape[i]);
    }
    double all = 1;
    for (const auto& [c, e] : extent) all *= static_cast<double>(e);
    const double out = std::max(1.0, Numel(y));
    d.n = ys.empty() ? 1 : static_cast<double>(ys.back());
    d.m = d.n > 0 ? out / d.n : out;
    d.k = all / out;
  }
  return d;
}

// Elements reduced per output element and the reduced axes of input 0, for ops that reduce
// (Reduce*, Arg*, softmax family, normalizations, CumSum); empty axes = not a reduction.
struct Reduction {
  std::vector<int64_t> axes;
  double row = 0;  // elements per reduced row
  Shape input_shape;
};

std::vector<int64_t> AxesFrom(int64_t axis, size_t rank) {
  std::vector<int64_t> out;
  if (axis < 0) axis += static_cast<int64_t>(rank);
  for (int64_t i = std::max<int64_t>(axis, 0); i < static_cast<int64_t>(rank); ++i) out.push_back(i);
  return out;
}

Reduction ReductionOf(const Node& n, const ShapeMap& shapes) {
  Reduction r;
  if (!n.domain.empty() || n.inputs.empty()) return r;
  const ValueShape* x = Find(shapes, n.inputs[0]);
  const ValueShape* y = n.outputs.empty() ? nullptr : Find(shapes, n.outputs[0]);
  if (x == nullptr || x->shape.empty()) return r;
  const size_t rank = x->shape.size();
  const std::string& op = n.op_type;
  auto norm = [&](int64_t a) { return a < 0 ? a + static_cast<int64_t>(rank) : a; };
  if (op.rfind("Reduce", 0) == 0 || op == "ArgMax" || op == "ArgMin") {
    if (y == nullptr) return r;
    if (y->shape.size() == rank) {  // keepdims: the reduced axes are the ones that became 1
      for (size_t i = 0; i < rank; ++i)
        if (y->shape[i] == 1 && x->shape[i] != 1) r.axes.push_back(static_cast<int64_t>(i));
    } else if (op == "ArgMax" || op == "ArgMin") {
      r.axes.push_back(norm(n.GetInt("axis", 0)));
    } else if (n.HasAttr("axes")) {
      for (int64_t a : n.GetInts("axes")) r.axes.push_back(norm(a));
    }
    const double row = Numel(x) / std::max(1.0, Numel(y));
    if (r.axes.empty() && row > 1) {  // trailing axes whose product is the row length
      double p = 1;
      for (int64_t i = static_cast<int64_t>(rank) - 1; i >= 0 && p < row; --i) {
        p *= static_cast<double>(x->shape[i]);
        r.axes.insert(r.axes.begin(), i);
      }
    }
  } else if (op == "Softmax" || op == "LogSoftmax" || op == "Hardmax") {
    r.axes = {norm(n.GetInt("axis", -1))};
  } else if (op == "LayerNormalization") {
    r.axes = AxesFrom(n.GetInt("axis", -1), rank);
  } else if (op == "InstanceNormalization" || op == "GroupNormalization") {
    r.axes = AxesFrom(2, rank);
  } else if (op == "LpNormalization") {
    r.axes = {norm(n.GetInt("axis", -1))};
  } else if (op == "MeanVarianceNormalization") {
    for (int64_t a : n.GetInts("axes", {0, 2, 3})) r.axes.push_back(norm(a));
  } else if (op == "CumSum") {
    r.axes = {static_cast<int64_t>(rank) - 1};  // axis is an input; the last axis is the common case
  } else {
    return r;
  }
  std::vector<int64_t> valid;
  for (int64_t a : r.axes)
    if (a >= 0 && a < static_cast<int64_t>(rank)) valid.push_back(a);
  r.axes = valid;
  r.row = 1;
  for (int64_t a : r.axes) r.row *= static_cast<double>(x->shape[a]);
  if (op == "GroupNormalization" && rank >= 2) {
    const int64_t groups = std::max<int64_t>(1, n.GetInt("num_groups", 1));
    r.row *= static_cast<double>(x->shape[1]) / static_cast<double>(groups);
  }
  r.input_shape = x->shape;
  if (r.axes.empty()) r.row = 0;
  return r;
}

double NodeFlops(const Node& node, const ShapeMap& shapes) {
  const std::string& op = node.op_type;
  const ValueShape* x = node.inputs.empty() ? nullptr : Find(shapes, node.inputs[0]);
  const ValueShape* y = node.outputs.empty() ? nullptr : Find(shapes, node.outputs[0]);
  const double out = Numel(y);
  const double in = Numel(x);
  if (!node.domain.empty()) return out;  // unknown domain: one op per output element
  if (IsContractionOp(node)) {
    const Mnk d = ContractionDims(node, shapes);
    double f = 2 * d.m * d.n * d.k;
    if (op == "Gemm" && node.HasInput(2)) f += out;                    // + C
    if ((op == "Conv" || op == "ConvTranspose") && node.HasInput(2)) f += out;  // + bias
    return f;
  }
  if (op == "LSTM" || op == "GRU" || op == "RNN") {
    // seq x batch x directions x gates x (2 x H x (I + H)) for the gate products.
    const ValueShape* w = Find(shapes, node.inputs.size() > 1 ? node.inputs[1] : "");
    const ValueShape* r = Find(shapes, node.inputs.size() > 2 ? node.inputs[2] : "");
    if (x == nullptr || w == nullptr || r == nullptr || x->shape.size() < 3 || w->shape.size() < 3) return 0;
    const double seq = static_cast<double>(x->shape[0]), batch = static_cast<double>(x->shape[1]);
    const double dirs = static_cast<double>(w->shape[0]);
    return seq * batch * dirs * 2 * static_cast<double>(w->shape[1]) *
           static_cast<double>(w->shape[2] + r->shape[2]);
  }
  if (op == "MaxPool" || op == "AveragePool" || op == "LpPool") {
    double k = 1;
    for (int64_t v : node.GetInts("kernel_shape")) k *= static_cast<double>(v);
    return out * k;
  }
  if (op == "GlobalAveragePool" || op == "GlobalMaxPool" || op == "GlobalLpPool") return in;
  if (op == "ReduceSumSquare" || op == "ReduceL2") return 2 * in;
  if (op == "ReduceLogSumExp") return (1 + kTranscendentalFlops) * in;
  if (op.rfind("Reduce", 0) == 0 || op == "ArgMax" || op == "ArgMin" || op == "CumSum") return in;
  if (op == "Softmax" || op == "LogSoftmax" || op == "LayerNormalization" || op == "InstanceNormalization" ||
      op == "GroupNormalization" || op == "LpNormalization" || op == "MeanVarianceNormalization" ||
      op == "LRN") {
    return kNormalizationFlops * in;
  }
  if (op == "Hardmax") return in;
  if (op == "BatchNormalization") return 2 * in;  // inference: per-channel scale and shift
  if (op == "Sum" || op == "Max" || op == "Min" || op == "Mean") {
    int present = 0;
    for (size_t i = 0; i < node.inputs.size(); ++i) present += node.HasInput(i);
    return out * std::max(1, present - 1);
  }
  const auto& table = ElementwiseFlops();
  if (auto it = table.find(op); it != table.end()) return it->second * out;
  const OpKind kind = KindOf(node);
  if (kind == OpKind::kElementwise || kind == OpKind::kBroadcast) return out;
  return 0;  // data movement, shape ops, opaque ops
}

DataType NodeDtype(const Node& n, const ShapeMap& shapes) {
  for (const std::string& o : n.outputs)
    if (const ValueShape* v = Find(shapes, o)) return v->dtype;
  return DataType::kFloat;
}

std::string HumanBytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} B", b) : fmt::format("{:.1f} {}", b, units[u]);
}

// Elements of value `v` inside one block `box` of the reference shape `ref` (right-aligned
// broadcasting: a bias [N] shares TN elements of a [TM, TN] tile, a scalar 1).
double ShareInBox(const Shape& v, const Shape& ref, const Shape& box) {
  const double nv = static_cast<double>(NumElements(v));
  double nbox = 1;
  for (int64_t b : box) nbox *= static_cast<double>(b);
  if (nv == static_cast<double>(NumElements(ref)) && v != ref) return std::min(nv, nbox);  // reshaped copy
  double share = 1;
  const size_t rv = v.size(), rb = box.size();
  for (size_t i = 0; i < rv; ++i) {
    const int64_t dv = v[rv - 1 - i];
    const int64_t db = i < rb ? box[rb - 1 - i] : 1;
    share *= static_cast<double>(std::min(dv, db));
  }
  return std::min(share, nv);
}

}  // namespace

bool IsAliasingOp(const Node& n) {
  static const std::set<std::string> ops = {"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"};
  return n.domain.empty() && ops.count(n.op_type) > 0;
}

OpCost EstimateNodeCost(const Node& node, const ShapeMap& shapes) {
  OpCost c;
  if (IsAliasingOp(node)) return c;  // a view: no data moves, nothing computed
  c.flops = NodeFlops(node, shapes);
  if (!IsShapeOnlyOp(node)) {
    std::unordered_set<std::string> seen;
    for (const std::string& in : node.inputs)
      if (!in.empty() && seen.insert(in).second) c.bytes_read += Bytes(Find(shapes, in));
  }
  for (const std::string& out : node.outputs) c.bytes_written += Bytes(Find(shapes, out));
  return c;
}

double KernelTimeUs(const OpCost& cost, const HardwareProfile& hw, DataType dt) {
  const double peak = hw.PeakGflopsFor(dt);
  const double compute_us = peak > 0 ? cost.flops / (peak * 1e3) : 0;  // GFLOP/s = 1e3 FLOP/us
  const double memory_us = hw.bandwidth_gbs > 0 ? (cost.bytes_read + cost.bytes_written) / (hw.bandwidth_gbs * 1e3) : 0;
  return std::max(compute_us, memory_us) + hw.kernel_overhead_us;
}

double NodeTimeUs(const Node& node, const ShapeMap& shapes, const HardwareProfile& hw) {
  if (IsAliasingOp(node)) return 0;
  return KernelTimeUs(EstimateNodeCost(node, shapes), hw, NodeDtype(node, shapes));
}

GroupCost EstimateGroupCost(const Graph& g, const std::vector<int>& nodes, const ShapeMap& shapes,
                            const HardwareProfile& hw) {
  GraphIndex index(g);
  return EstimateGroupCost(g, nodes, shapes, hw, index);
}

GroupCost EstimateGroupCost(const Graph& g, const std::vector<int>& nodes_in, const ShapeMap& shapes,
                            const HardwareProfile& hw, const GraphIndex& index) {
  GroupCost gc;
  std::vector<int> nodes = nodes_in;
  std::sort(nodes.begin(), nodes.end());
  nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
  for (int i : nodes)
    GAF_CHECK(i >= 0 && i < static_cast<int>(g.nodes.size()), "EstimateGroupCost: node index {} out of range "
              "(graph has {} nodes)", i, g.nodes.size());
  const std::unordered_set<int> in_group(nodes.begin(), nodes.end());

  // Per operator: FLOPs, bytes, unfused time.
  std::unordered_map<std::string, int> producer_step;  // value -> step in `nodes`
  int kernels_before = 0;
  double max_flops = -1;
  DataType group_dtype = DataType::kFloat;
  for (size_t s = 0; s < nodes.size(); ++s) {
    const Node& n = g.nodes[nodes[s]];
    const OpCost c = EstimateNodeCost(n, shapes);
    gc.flops += c.flops;
    gc.bytes_before += c.bytes_read + c.bytes_written;
    gc.time_before_us += NodeTimeUs(n, shapes, hw);
    if (!IsAliasingOp(n)) ++kernels_before;
    if (c.flops > max_flops) {
      max_flops = c.flops;
      group_dtype = NodeDtype(n, shapes);
    }
    for (const std::string& o : n.outputs)
      if (!o.empty()) producer_step[o] = static_cast<int>(s);
  }

  // Values: external inputs, external outputs, interior values; alias roots for views.
  std::unordered_map<std::string, std::string> root;  // view output -> the value it aliases
  auto root_of = [&](const std::string& v) {
    std::string r = v;
    for (auto it = root.find(r); it != root.end(); it = root.find(r)) r = it->second;
    return r;
  };
  std::unordered_map<std::string, int> last_use;  // alias root -> last step reading it
  std::vector<std::string> external_inputs;
  std::unordered_set<std::string> seen_inputs;
  for (size_t s = 0; s < nodes.size(); ++s) {
    const Node& n = g.nodes[nodes[s]];
    if (IsAliasingOp(n) && n.HasInput(0) && n.HasOutput(0)) root[n.outputs[0]] = n.inputs[0];
    const bool shape_only = IsShapeOnlyOp(n);
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      const std::string& in = n.inputs[k];
      if (in.empty()) continue;
      if (!producer_step.count(in) && !shape_only && seen_inputs.insert(in).second)
        external_inputs.push_back(in);
      // A view's input is read when the view is; Shape/Size read no data.
      if (!shape_only && !IsAliasingOp(n)) last_use[root_of(in)] = static_cast<int>(s);
    }
  }
  // An external input costs a read only if some operator computes with it (directly or through
  // a view); one that only feeds views or Shape moves no data.
  for (const std::string& in : external_inputs)
    if (last_use.count(root_of(in))) gc.bytes_after += Bytes(Find(shapes, in));

  double interior_bytes = 0;
  std::vector<std::string> external_outputs;
  std::unordered_set<std::string> written_roots;
  for (int ni : nodes) {
    const Node& n = g.nodes[ni];
    for (const std::string& o : n.outputs) {
      if (o.empty()) continue;
      bool outside = index.IsGraphOutput(o);
      bool inside = false;
      for (const auto& [consumer, slot] : index.Consumers(o)) {
        if (in_group.count(consumer)) {
          if (!IsShapeOnlyOp(g.nodes[consumer])) inside = true;
        } else {
          outside = true;
        }
      }
      if (outside) {
        external_outputs.push_back(o);
        // Written once per distinct buffer: a view of a value computed here shares its write,
        // and a view of an external input writes nothing.
        const std::string r = root_of(o);
        if (producer_step.count(r) && written_roots.insert(r).second) gc.bytes_after += Bytes(Find(shapes, r));
      }
      if (inside && !IsAliasingOp(n)) {
        ++gc.round_trips_before;  // written by one kernel, read back by the next
        interior_bytes += Bytes(Find(shapes, o));
      }
    }
  }
  gc.round_trips_after = 0;

  // ---- Footprint of the fused kernel for the tiling it would use. ----
  // Reference shape and block: contraction tile, reduction row, or elementwise block.
  int main_contraction = -1;
  double main_contraction_flops = -1;
  Reduction widest;
  std::string reduction_op;
  for (int ni : nodes) {
    const Node& n = g.nodes[ni];
    if (IsContractionOp(n)) {
      const double f = NodeFlops(n, shapes);
      if (f > main_contraction_flops) {
        main_contraction_flops = f;
        main_contraction = ni;
      }
    }
    Reduction r = ReductionOf(n, shapes);
    if (r.row > widest.row) {
      widest = r;
      reduction_op = n.Describe();
    }
  }

  Shape ref, box;
  std::unordered_map<std::string, double> operand_share;  // contraction operands: their panels
  std::string tiling;
  if (main_contraction >= 0) {
    const Node& mc = g.nodes[main_contraction];
    const Mnk d = ContractionDims(mc, shapes);
    const int64_t tm = static_cast<int64_t>(std::min<double>(d.m, kTileM));
    const bool full_row = widest.row > 0;  // a reduction follows: the tile must span whole rows
    const int64_t tn = static_cast<int64_t>(full_row ? d.n : std::min<double>(d.n, kTileN));
    const int64_t tk = static_cast<int64_t>(std::min<double>(d.k, kTileK));
    if (const ValueShape* y = Find(shapes, mc.outputs[0])) {
      ref = y->shape;
      box.assign(ref.size(), 1);
      if (d.conv && ref.size() >= 3) {
        box[1] = std::min<int64_t>(ref[1], tn);
        int64_t remaining = tm;
        for (size_t i = ref.size() - 1; i >= 2 && remaining > 1; --i) {
          box[i] = std::min<int64_t>(ref[i], remaining);
          remaining = (remaining + box[i] - 1) / box[i];
        }
      } else if (ref.size() >= 2) {
        box[ref.size() - 1] = std::min<int64_t>(ref.back(), tn);
        box[ref.size() - 2] = std::min<int64_t>(ref[ref.size() - 2], tm);
      } else if (ref.size() == 1) {
        box[0] = std::min<int64_t>(ref[0], tn);
      }
    }
    for (int ni : nodes) {
      const Node& n = g.nodes[ni];
      if (!IsContractionOp(n)) continue;
      const Mnk dn = ContractionDims(n, shapes);
      const double ntm = std::min<double>(dn.m, kTileM);
      const double ntn = ni == main_contraction ? static_cast<double>(tn) : std::min<double>(dn.n, kTileN);
      const double ntk = std::min<double>(dn.k, kTileK);
      const auto [ia, ib] = ContractionOperands(n);
      if (n.HasInput(ia)) operand_share[root_of(n.inputs[ia])] = std::max(operand_share[root_of(n.inputs[ia])], ntm * ntk);
      if (n.HasInput(ib)) operand_share[root_of(n.inputs[ib])] = std::max(operand_share[root_of(n.inputs[ib])], ntk * ntn);
    }
    tiling = fmt::format("{}x{} output tile of {}{}, K panel {} (A {}x{}, B {}x{}); epilogue operands tiled alike",
                         tm, tn, mc.Describe(), full_row ? " (whole rows: a reduction follows)" : "", tk, tm, tk,
                         tk, tn);
  } else if (widest.row > 0) {
    ref = widest.input_shape;
    box.assign(ref.size(), 1);
    for (int64_t a : widest.axes) box[a] = ref[a];
    tiling = fmt::format("one row of {:.0f} elements per thread (reduction of {})", widest.row, reduction_op);
  } else {
    tiling = fmt::format("block of {} elements per thread", kElementBlock);
  }

  auto share_bytes = [&](const std::string& value) -> double {
    const ValueShape* v = Find(shapes, value);
    if (v == nullptr) return 0;
    double elems;
    if (!box.empty()) {
      elems = ShareInBox(v->shape, ref, box);
    } else {
      elems = std::min<double>(Numel(v), kElementBlock);
    }
    if (auto it = operand_share.find(value); it != operand_share.end()) elems = std::max(elems, it->second);
    return elems * static_cast<double>(DataTypeSize(v->dtype));
  };

  // Peak of the live blocks over the group's steps (a value is live from its producer, or the
  // start for external inputs, to its last reading step; views share their root's block).
  struct Live {
    int start, end;
    double bytes;
  };
  std::unordered_map<std::string, Live> live;
  for (const std::string& in : external_inputs) {
    const std::string r = root_of(in);
    if (!live.count(r)) live[r] = Live{0, last_use.count(r) ? last_use[r] : 0, share_bytes(r)};
  }
  for (size_t s = 0; s < nodes.size(); ++s) {
    const Node& n = g.nodes[nodes[s]];
    if (IsAliasingOp(n)) continue;
    for (const std::string& o : n.outputs) {
      if (o.empty() || live.count(o)) continue;
      const int end = last_use.count(o) ? std::max(last_use[o], static_cast<int>(s)) : static_cast<int>(s);
      live[o] = Live{static_cast<int>(s), end, share_bytes(o)};
    }
  }
  int peak_live = 0;
  for (size_t s = 0; s < nodes.size(); ++s) {
    double total = 0;
    int count = 0;
    for (const auto& [name, l] : live) {
      if (l.start <= static_cast<int>(s) && static_cast<int>(s) <= l.end && l.bytes > 0) {
        total += l.bytes;
        ++count;
      }
    }
    if (total > gc.footprint_bytes) {
      gc.footprint_bytes = total;
      peak_live = count;
    }
  }
  gc.fits_local_memory = gc.footprint_bytes <= hw.local_memory_bytes;
  gc.tiling = fmt::format("{}; {} live values at peak", tiling, peak_live);

  // ---- Times. ----
  const double spill = gc.fits_local_memory ? 0 : 2 * interior_bytes;
  OpCost fused{gc.flops, gc.bytes_after + spill, 0};
  gc.time_after_us = kernels_before == 0 ? 0 : KernelTimeUs(fused, hw, group_dtype);  // views only: no kernel
  gc.gflops_before = gc.time_before_us > 0 ? gc.flops / gc.time_before_us / 1e3 : 0;
  gc.gflops_after = gc.time_after_us > 0 ? gc.flops / gc.time_after_us / 1e3 : 0;
  gc.formula = fmt::format(
      "t = max(FLOPs / {:.0f} GFLOPS, bytes / {:.1f} GB/s) + {:.2f} us per kernel ({}); "
      "before: {} kernels, {:.4g} FLOPs, {} moved, {} round trips -> {:.3f} us; "
      "after: 1 kernel, {} moved (external inputs once + outputs once){} -> {:.3f} us; "
      "footprint {} vs local memory {}",
      hw.PeakGflopsFor(group_dtype), hw.bandwidth_gbs, hw.kernel_overhead_us, hw.name, kernels_before, gc.flops,
      HumanBytes(gc.bytes_before), gc.round_trips_before, gc.time_before_us, HumanBytes(gc.bytes_after),
      spill > 0 ? fmt::format(" + {} spilled (footprint overflows)", HumanBytes(spill)) : "", gc.time_after_us,
      HumanBytes(gc.footprint_bytes), HumanBytes(hw.local_memory_bytes));
  return gc;
}

}  // namespace gaf
