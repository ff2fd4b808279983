// Canonicalization before matching, so that exporter variants look alike.
//
// Passes, repeated until nothing changes (each change is logged as one line naming the node):
//   1. Constant nodes become initializers.
//   2. Constant folding: a deterministic node of the default domain whose inputs are all
//      initializers is run once through its reference kernel (OpRegistry) and replaced by
//      initializers; Shape/Size of a value whose shape is fully known fold the same way.
//   3. Forwarding: Identity, inference Dropout (no training_mode or a false constant, mask unused),
//      Pad by zero on every axis,
//      Cast to the type the value already has, Reshape/Expand to the shape the value already has
//      (also through a chain: Reshape(Reshape(x, s1), shape of x)), and Squeeze/Unsqueeze pairs
//      with the same axes are removed; readers of the output read the input instead.
//   4. Common subexpressions: two nodes with the same op, inputs and attributes become one.
//   5. Slice of a Slice on other axes (all parameters constant; the inner one read only by such
//      Slices, and not a graph output) becomes one Slice of the inner one's input over the axes of
//      both: torch.onnx.export writes x[..., ::2, ::2] as two Slices, each a full copy.
//   6. Nodes none of whose outputs is read (nor a graph output) are removed.
// Each pass is one sweep in node order (renames are applied as nodes are reached, and to the
// nodes before at the end of the sweep), so a long chain of removable nodes costs linear time.
// Graph outputs keep their names: a node whose output is a graph output is only removed when the
// value it forwards can be renamed to the output's name.
#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <numeric>
#include <optional>
#include <set>
#include <unordered_map>

#include "ir/error.h"
#include "match/pattern.h"
#include "ops/kernel.h"

namespace gaf {
namespace {

constexpr int64_t kMaxFoldedElements = int64_t{1} << 24;  // do not materialize huge constants

bool DefaultDomain(const Node& n) { return n.domain.empty() || n.domain == "ai.onnx"; }

bool HasSubgraph(const Node& n) {
  for (const Attribute& a : n.attributes)
    if (a.type == Attribute::Type::kGraph || a.type == Attribute::Type::kGraphs) return true;
  return false;
}

bool IsNondeterministic(const std::string& op) {
  static const std::set<std::string> kOps = {"RandomNormal",     "RandomUniform", "RandomNormalLike",
                                             "RandomUniformLike", "Multinomial",  "Bernoulli", "Dropout"};
  return kOps.count(op) > 0;
}

// Ops whose output has the element type of input 0.
bool KeepsInputType(const std::string& op) {
  static const std::set<std::string> kOps = {
      "Add", "Sub", "Mul", "Div", "Pow", "Neg", "Abs", "Sqrt", "Exp", "Log", "Reciprocal", "Relu", "LeakyRelu",
      "Sigmoid", "Tanh", "Erf", "Softmax", "LogSoftmax", "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin",
      "MatMul", "Gemm", "Conv", "BatchNormalization", "LayerNormalization", "Transpose", "Reshape", "Expand",
      "Squeeze", "Unsqueeze", "Flatten", "Identity", "Slice", "Concat", "Gather", "Clip", "Max", "Min", "Where",
      "HardSigmoid", "HardSwish", "Gelu", "Dropout", "Floor", "Ceil", "Round", "Sin", "Cos", "Softplus", "Elu"};
  return kOps.count(op) > 0;
}

class Canonicalizer {
 public:
  explicit Canonicalizer(Model& m) : m_(m), g_(m.graph) {}

  std::vector<std::string> Run() {
    for (int round = 0; round < 20; ++round) {
      bool changed = false;
      changed |= ConstantsToInitializers();
      changed |= FoldConstants();
      while (Forward()) changed = true;
      while (Cse()) changed = true;
      changed |= MergeSlices();
      changed |= FoldPadsIntoConvs();
      changed |= RemoveDeadNodes();
      if (!changed) break;
    }
    RemoveUnusedInitializers();
    return log_;
  }

 private:
  // ---- facts about values ----
  DataType TypeOf(const std::string& v, int depth = 0) const {
    if (const Tensor* t = FindInit(v)) return t->dtype();
    if (const ValueInfo* vi = FindInfo(v); vi && vi->dtype != DataType::kUndefined) return vi->dtype;
    if (depth > 64) return DataType::kUndefined;
    auto it = producer_.find(v);
    if (it == producer_.end()) return DataType::kUndefined;
    const Node& n = g_.nodes[it->second];
    if (n.op_type == "Cast") return static_cast<DataType>(n.GetInt("to", 0));
    if (KeepsInputType(n.op_type) && DefaultDomain(n)) {
      // Where's data inputs are 1 and 2.
      size_t slot = n.op_type == "Where" ? 1 : 0;
      if (n.HasInput(slot) && n.outputs[0] == v) return TypeOf(n.inputs[slot], depth + 1);
    }
    return DataType::kUndefined;
  }

  // Fully known shape of a value, if any.
  std::optional<Shape> ShapeOf(const std::string& v) const {
    if (const Tensor* t = FindInit(v)) return t->shape();
    const ValueInfo* vi = FindInfo(v);
    if (!vi || !vi->has_shape) return std::nullopt;
    Shape s;
    for (const Dim& d : vi->dims) {
      if (!d.known()) return std::nullopt;
      s.push_back(d.value);
    }
    return s;
  }

  std::optional<std::vector<int64_t>> ConstInts(const std::string& v) const {
    const Tensor* t = FindInit(v);
    if (!t || t->dtype() == DataType::kString) return std::nullopt;
    return t->ToInt64s();
  }

  void Reindex() {
    producer_.clear();
    consumers_.clear();
    subgraph_reads_.clear();
    for (size_t i = 0; i < g_.nodes.size(); ++i) {
      for (const std::string& o : g_.nodes[i].outputs)
        if (!o.empty()) producer_[o] = static_cast<int>(i);
      for (const std::string& in : g_.nodes[i].inputs)
        if (!in.empty()) consumers_[in]++;
      // Values read by subgraphs (If/Loop/Scan bodies) from this scope: passes leave them alone,
      // since renaming does not reach into subgraphs.
      for (const Attribute& a : g_.nodes[i].attributes) {
        std::vector<const Graph*> subs;
        if (a.g) subs.push_back(a.g.get());
        for (const auto& sg : a.graphs)
          if (sg) subs.push_back(sg.get());
        for (const Graph* sg : subs)
          for (const std::string& v : OuterScopeValues(*sg)) {
            consumers_[v]++;
            subgraph_reads_.insert(v);
          }
      }
    }
    outputs_.clear();
    for (const ValueInfo& o : g_.outputs) outputs_.insert(o.name);
    graph_inputs_.clear();
    for (const ValueInfo& in : g_.inputs) graph_inputs_.insert(in.name);
    IndexValues();
  }

  // Initializers and declared values by name (Graph's lookups scan lists: quadratic in a pass).
  void IndexValues() {
    init_index_.clear();
    for (size_t k = 0; k < g_.initializers.size(); ++k) init_index_.emplace(g_.initializers[k].first, k);
    info_.clear();
    for (const auto* list : {&g_.inputs, &g_.outputs, &g_.value_info})
      for (const ValueInfo& v : *list) info_.emplace(v.name, &v);  // the first wins, as in FindValueInfo
    readers_.clear();
    for (size_t i = 0; i < g_.nodes.size(); ++i)
      for (const std::string& in : g_.nodes[i].inputs)
        if (!in.empty()) readers_[in].push_back(static_cast<int>(i));
  }
  const Tensor* FindInit(const std::string& v) const {
    auto it = init_index_.find(v);
    return it == init_index_.end() ? nullptr : &g_.initializers[it->second].second;
  }
  const ValueInfo* FindInfo(const std::string& v) const {
    auto it = info_.find(v);
    return it == info_.end() ? nullptr : it->second;
  }
  void SetInit(const std::string& v, Tensor t) {
    auto [it, inserted] = init_index_.emplace(v, g_.initializers.size());
    if (inserted) g_.initializers.emplace_back(v, std::move(t));
    else g_.initializers[it->second].second = std::move(t);
  }

  // Renames decided during a sweep: readers of `from` read `to` (chains resolve, no cycles: a
  // name is renamed once and only to a value that is live at that point).
  std::string Resolve(std::string v) const {
    for (auto it = renamed_.find(v); it != renamed_.end(); it = renamed_.find(v)) v = it->second;
    return v;
  }
  void ResolveInputs(Node& n) const {
    if (renamed_.empty()) return;
    for (std::string& in : n.inputs)
      if (!in.empty()) in = Resolve(in);
  }
  // Ends a sweep: removes its dead nodes and renames the inputs of the nodes before the renames.
  void FinishSweep(const std::vector<bool>& dead) {
    RemoveNodes(dead);
    for (Node& n : g_.nodes) ResolveInputs(n);
    renamed_.clear();
  }

  bool IsGraphOutput(const std::string& v) const { return outputs_.count(v) > 0; }
  bool IsConstant(const std::string& v) const {
    // An initializer that is also a graph input may be overridden by a feed: not a constant.
    // (Before IR version 4 every initializer is also listed as an input.)
    return FindInit(v) != nullptr && (m_.ir_version < 4 || !graph_inputs_.count(v));
  }

  void RemoveNodes(const std::vector<bool>& dead) {
    std::vector<Node> kept;
    kept.reserve(g_.nodes.size());
    for (size_t i = 0; i < g_.nodes.size(); ++i)
      if (!dead[i]) kept.push_back(std::move(g_.nodes[i]));
    g_.nodes = std::move(kept);
  }

  // ---- 1. Constant nodes -> initializers ----
  bool ConstantsToInitializers() {
    Reindex();
    std::vector<bool> dead(g_.nodes.size(), false);
    bool changed = false;
    for (size_t i = 0; i < g_.nodes.size(); ++i) {
      const Node& n = g_.nodes[i];
      if (n.op_type != "Constant" || !DefaultDomain(n) || !n.HasOutput(0) || IsGraphOutput(n.outputs[0])) continue;
      const Tensor* init = FindInit(n.outputs[0]);
      std::optional<Tensor> t = init != nullptr ? std::optional<Tensor>(*init) : ConstantNodeValue(n);
      if (!t || !t->defined()) continue;
      SetInit(n.outputs[0], *t);
      log_.push_back(fmt::format("Constant {} -> initializer '{}' {}{}", n.Describe(), n.outputs[0],
                                 DataTypeName(t->dtype()), ShapeToString(t->shape())));
      dead[i] = true;
      changed = true;
    }
    if (changed) RemoveNodes(dead);
    return changed;
  }

  // ---- 2. constant folding ----
  // The elements ConstantOfShape(shape) would make, from its constant shape; past
  // kMaxFoldedElements (also for a negative or overflowing dim, or a shape that is not constant).
  int64_t ConstantOfShapeElements(const Node& n) const {
    std::optional<std::vector<int64_t>> dims = n.HasInput(0) && IsConstant(n.inputs[0]) ? ConstInts(n.inputs[0]) : std::nullopt;
    if (!dims) return kMaxFoldedElements + 1;
    int64_t count = 1;
    for (int64_t d : *dims) {
      if (d < 0 || (d > 0 && count > kMaxFoldedElements / d)) return kMaxFoldedElements + 1;
      count *= d;
    }
    return count;
  }

  std::optional<std::vector<Tensor>> Evaluate(const Node& n) {
    if (n.op_type == "Shape" || n.op_type == "Size") {
      if (!n.HasInput(0)) return std::nullopt;
      std::optional<Shape> s = ShapeOf(n.inputs[0]);
      if (!s) return std::nullopt;
      if (n.op_type == "Size") return std::vector<Tensor>{Tensor::Scalar<int64_t>(NumElements(*s))};
      int64_t r = static_cast<int64_t>(s->size());
      int64_t start = n.GetInt("start", 0), end = n.GetInt("end", r);
      if (start < 0) start += r;
      if (end < 0) end += r;
      start = std::clamp<int64_t>(start, 0, r);
      end = std::clamp<int64_t>(end, start, r);
      return std::vector<Tensor>{Tensor::FromInt64s(std::vector<int64_t>(s->begin() + start, s->begin() + end))};
    }
    if (!DefaultDomain(n) || HasSubgraph(n) || IsNondeterministic(n.op_type) || n.inputs.empty()) return std::nullopt;
    bool any = false;
    for (const std::string& in : n.inputs) {
      if (in.empty()) continue;
      if (!IsConstant(in)) return std::nullopt;
      any = true;
    }
    if (!any) return std::nullopt;
    const KernelInfo* k = OpRegistry::Global().Find("", n.op_type);
    // ConstantOfShape is opaque to fusion (its shape comes from a value) but folds like any other
    // once that value is a constant of few enough elements: torch.onnx.export computes a Pad's
    // pads from one (F.pad, nn.ZeroPad2d).
    const bool small_fill = n.op_type == "ConstantOfShape" && ConstantOfShapeElements(n) <= kMaxFoldedElements;
    if (!k || (k->kind == OpKind::kOpaque && !small_fill)) return std::nullopt;
    KernelContext ctx{n, m_.OpsetVersion(""), {}, {}, nullptr, 1};
    std::vector<Tensor> ins;
    ins.reserve(n.inputs.size());
    DataType half = DataType::kUndefined;
    for (const std::string& in : n.inputs) {
      if (in.empty()) {
        ins.emplace_back();
        continue;
      }
      Tensor t = *FindInit(in);
      if (k->upcast_half && IsHalf(t.dtype())) {
        half = t.dtype();
        t = t.CastTo(DataType::kFloat);
      }
      ins.push_back(t);
    }
    for (size_t i = 0; i < ins.size(); ++i) ctx.inputs.push_back(n.inputs[i].empty() ? nullptr : &ins[i]);
    ctx.outputs.resize(n.outputs.size());
    try {
      k->fn(ctx);
    } catch (const Error&) {
      return std::nullopt;  // leave the node for the runtime to report
    }
    for (size_t i = 0; i < ctx.outputs.size(); ++i) {
      if (!n.HasOutput(i)) continue;
      if (!ctx.outputs[i].defined() || ctx.outputs[i].numel() > kMaxFoldedElements) return std::nullopt;
      if (half != DataType::kUndefined && ctx.outputs[i].dtype() == DataType::kFloat)
        ctx.outputs[i] = ctx.outputs[i].CastTo(half);
    }
    return ctx.outputs;
  }

  bool FoldConstants() {
    Reindex();
    std::vector<bool> dead(g_.nodes.size(), false);
    bool changed = false;
    for (size_t i = 0; i < g_.nodes.size(); ++i) {
      const Node& n = g_.nodes[i];
      bool output_kept = false;
      for (const std::string& o : n.outputs) output_kept |= !o.empty() && IsGraphOutput(o);
      if (output_kept || n.outputs.empty()) continue;
      std::optional<std::vector<Tensor>> outs = Evaluate(n);
      if (!outs) continue;
      std::vector<std::string> shapes;
      for (size_t k = 0; k < n.outputs.size(); ++k) {
        if (!n.HasOutput(k)) continue;
        SetInit(n.outputs[k], (*outs)[k]);
        shapes.push_back(fmt::format("'{}' {}{}", n.outputs[k], DataTypeName((*outs)[k].dtype()),
                                     ShapeToString((*outs)[k].shape())));
      }
      log_.push_back(fmt::format("folded constant {} -> initializer {}", n.Describe(), fmt::join(shapes, ", ")));
      dead[i] = true;
      changed = true;
    }
    if (changed) RemoveNodes(dead);
    return changed;
  }

  // ---- 3. forwarding ----
  // The value node i forwards unchanged from its input, or "" when it is not a no-op.
  std::string ForwardedValue(const Node& n, std::string* what) const {
    if (!DefaultDomain(n) || !n.HasInput(0) || !n.HasOutput(0)) return "";
    const std::string& x = n.inputs[0];
    if (n.op_type == "Identity") {
      *what = "an Identity";
      return x;
    }
    if (n.op_type == "Dropout") {
      if (n.HasOutput(1) && (consumers_.count(n.outputs[1]) || IsGraphOutput(n.outputs[1]))) return "";
      if (n.HasInput(2)) {
        const Tensor* t = FindInit(n.inputs[2]);
        if (!t || !IsConstant(n.inputs[2]) || t->numel() != 1 || t->ScalarAsDouble() != 0) return "";
      }
      if (n.GetInt("is_test", 1) == 0 && m_.OpsetVersion("") < 7) return "";
      *what = "an inference Dropout";
      return x;
    }
    if (n.op_type == "Pad") {
      // All pads zero (opset 11+: a constant input; before: the attribute), whatever the mode:
      // torch.onnx.export writes one in front of AveragePool.
      std::optional<std::vector<int64_t>> pads;
      if (n.HasAttr("pads")) pads = n.GetInts("pads");
      else if (n.HasInput(1) && IsConstant(n.inputs[1])) pads = ConstInts(n.inputs[1]);
      if (!pads || pads->empty() || std::any_of(pads->begin(), pads->end(), [](int64_t p) { return p != 0; }))
        return "";
      *what = "a Pad by zero everywhere";
      return x;
    }
    if (n.op_type == "Cast") {
      DataType from = TypeOf(x);
      if (from != DataType::kUndefined && static_cast<int64_t>(from) == n.GetInt("to", -1)) {
        *what = fmt::format("a Cast to {}, which the value already is", DataTypeName(from));
        return x;
      }
      return "";
    }
    if (n.op_type == "Reshape" && n.HasInput(1)) {
      std::optional<std::vector<int64_t>> target = ConstInts(n.inputs[1]);
      if (!target || !IsConstant(n.inputs[1])) return "";
      if (n.GetInt("allowzero", 0) != 0) return "";
      // Resolve 0 (copy) and -1 (inferred) against x's shape when it is known.
      std::vector<int64_t> want = *target;
      std::optional<Shape> xs = ShapeOf(x);
      int64_t known_product = 1;
      int infer = -1;
      for (size_t d = 0; d < want.size(); ++d) {
        if (want[d] == 0) {
          if (!xs || d >= xs->size()) return "";
          want[d] = (*xs)[d];
        }
        if (want[d] == -1) {
          if (infer >= 0) return "";
          infer = static_cast<int>(d);
        } else {
          known_product *= want[d];
        }
      }
      if (infer >= 0) {
        if (!xs || known_product == 0) return "";
        want[infer] = NumElements(*xs) / known_product;
      }
      // Walk back through a chain of Reshapes to a value that already has that shape.
      std::string src = x;
      for (int hops = 0; hops < 8; ++hops) {
        std::optional<Shape> s = ShapeOf(src);
        if (s && *s == want) {
          *what = src == x ? "a Reshape to the shape the value already has"
                            : fmt::format("a Reshape back to the shape of '{}'", src);
          return src;
        }
        auto it = producer_.find(src);
        if (it == producer_.end() || g_.nodes[it->second].op_type != "Reshape") break;
        src = g_.nodes[it->second].inputs[0];
      }
      return "";
    }
    if (n.op_type == "Expand" && n.HasInput(1) && !IsGraphOutput(n.outputs[0])) {
      // Expand(c, Shape(v)) read only by broadcasting elementwise operators that also read v:
      // they broadcast c against v themselves, to the same shape (broadcast(broadcast(c, v), v,
      // ...) = broadcast(c, v, ...)), so the Expand is a no-op for them. Exporters write it for
      // attention masks (masked_fill), and its Shape(v) would read a value inside the attention.
      // The target is Shape(v), or a constant equal to v's known shape (Shape folded).
      static const std::set<std::string> kBroadcasting = {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Where",
                                                           "Equal", "Less", "Greater", "And", "Or", "Xor"};
      std::string v;
      auto sp = producer_.find(n.inputs[1]);
      if (sp != producer_.end()) {
        const Node& shape = g_.nodes[sp->second];
        if (shape.op_type == "Shape" && DefaultDomain(shape) && shape.HasInput(0) && !shape.HasAttr("start") &&
            !shape.HasAttr("end"))
          v = shape.inputs[0];
      }
      std::optional<std::vector<int64_t>> target = v.empty() && IsConstant(n.inputs[1]) ? ConstInts(n.inputs[1])
                                                                                       : std::nullopt;
      auto reads_v = [&](const Node& r) {
        for (const std::string& read : r.inputs) {
          if (read.empty() || read == n.outputs[0]) continue;
          const std::string in = Resolve(read);  // r comes later in this sweep
          if (!v.empty() && in == v) return true;
          if (target) {
            std::optional<Shape> s = ShapeOf(in);
            if (s && *s == Shape(target->begin(), target->end())) return true;
          }
        }
        return false;
      };
      if (!v.empty() || target) {
        bool all = true, any = false;
        auto readers = readers_.find(n.outputs[0]);
        if (readers != readers_.end())
          for (int ri : readers->second) {
            const Node& r = g_.nodes[ri];
            any = true;
            all &= DefaultDomain(r) && kBroadcasting.count(r.op_type) > 0 && reads_v(r);
          }
        if (any && all) {
          *what = v.empty() ? "an Expand to the shape of another input of its readers, which broadcast against it anyway"
                            : fmt::format("an Expand to the shape of '{}', which its readers broadcast against anyway", v);
          return x;
        }
      }
    }
    if (n.op_type == "Expand" && n.HasInput(1)) {
      std::optional<std::vector<int64_t>> target = ConstInts(n.inputs[1]);
      std::optional<Shape> s = ShapeOf(x);
      if (!target || !s || !IsConstant(n.inputs[1]) || target->size() > s->size()) return "";
      // Broadcasting x to target keeps x's shape when every target dim is 1 or x's dim.
      size_t off = s->size() - target->size();
      for (size_t d = 0; d < target->size(); ++d)
        if ((*target)[d] != 1 && (*target)[d] != (*s)[off + d]) return "";
      *what = "an Expand to the shape the value already has";
      return x;
    }
    if ((n.op_type == "Squeeze" || n.op_type == "Unsqueeze")) {
      auto it = producer_.find(x);
      if (it == producer_.end()) return "";
      const Node& p = g_.nodes[it->second];
      const char* inverse = n.op_type == "Squeeze" ? "Unsqueeze" : "Squeeze";
      if (p.op_type != inverse || !p.HasInput(0)) return "";
      auto axes_of = [&](const Node& q) -> std::optional<std::vector<int64_t>> {
        if (q.HasAttr("axes")) return q.GetInts("axes");
        if (q.HasInput(1) && IsConstant(q.inputs[1])) return ConstInts(q.inputs[1]);
        return std::nullopt;
      };
      std::optional<std::vector<int64_t>> a = axes_of(n), b = axes_of(p);
      // Same axes lists: both are relative to the same (larger) rank, so the pair is the identity.
      if (!a || !b || a->empty() || *a != *b) return "";
      *what = fmt::format("a {} undoing {}", n.op_type, p.Describe());
      return p.inputs[0];
    }
    return "";
  }

  bool Forward() {
    Reindex();
    std::vector<bool> dead(g_.nodes.size(), false);
    bool changed = false;
    for (size_t i = 0; i < g_.nodes.size(); ++i) {
      Node& n = g_.nodes[i];
      ResolveInputs(n);
      std::string what;
      std::string src = ForwardedValue(n, &what);
      if (src.empty()) continue;
      const std::string out = n.outputs[0];
      if (subgraph_reads_.count(out) || subgraph_reads_.count(src)) continue;
      if (!IsGraphOutput(out)) {
        renamed_[out] = src;
        log_.push_back(fmt::format("removed {}, {}; readers of '{}' now read '{}'", n.Describe(), what, out, src));
      } else {
        // Keep the graph output's name: rename the forwarded value instead, when it is a node's
        // output that is neither a graph input nor another graph output.
        auto p = producer_.find(src);
        if (p == producer_.end() || IsGraphOutput(src) || graph_inputs_.count(src)) continue;
        const int pi = p->second;
        for (std::string& o : g_.nodes[pi].outputs)
          if (o == src) o = out;
        producer_.erase(p);
        producer_[out] = pi;
        renamed_[src] = out;
        log_.push_back(fmt::format("removed {}, {}; '{}' is now computed under the graph output's name '{}'",
                                   n.Describe(), what, src, out));
      }
      dead[i] = true;
      changed = true;
    }
    if (changed) FinishSweep(dead);
    return changed;
  }

  // ---- 6. dead nodes (left behind by the passes above or by the exporter) ----
  bool RemoveDeadNodes() {
    Reindex();
    std::vector<bool> dead(g_.nodes.size(), false);
    bool changed = false;
    // Backwards, so a chain of dead nodes goes in one sweep.
    for (int i = static_cast<int>(g_.nodes.size()) - 1; i >= 0; --i) {
      const Node& n = g_.nodes[i];
      bool live = n.outputs.empty();
      for (const std::string& o : n.outputs)
        live |= !o.empty() && ((consumers_.count(o) && consumers_[o] > 0) || IsGraphOutput(o));
      if (live) continue;
      log_.push_back(fmt::format("removed unused {} (no node reads its outputs)", n.Describe()));
      dead[i] = true;
      changed = true;
      for (const std::string& in : n.inputs)
        if (!in.empty()) consumers_[in]--;
    }
    if (changed) RemoveNodes(dead);
    return changed;
  }

  static std::string AttrKey(const Attribute& a) {
    std::string k = a.name + ":" + std::to_string(static_cast<int>(a.type)) + ":";
    switch (a.type) {
      case Attribute::Type::kFloat: k += fmt::format("{}", a.f); break;
      case Attribute::Type::kInt: k += std::to_string(a.i); break;
      case Attribute::Type::kString: k += a.s; break;
      case Attribute::Type::kFloats: k += fmt::format("{}", fmt::join(a.floats, ",")); break;
      case Attribute::Type::kInts: k += fmt::format("{}", fmt::join(a.ints, ",")); break;
      case Attribute::Type::kStrings: k += fmt::format("{}", fmt::join(a.strings, ",")); break;
      default: return "";  // tensors, graphs: not compared
    }
    return k;
  }

  // ---- 5. Slice of a Slice ----
  struct SliceParams {
    std::vector<int64_t> starts, ends, axes, steps;
  };
  // The constant parameters of an opset-10+ Slice, axes made non-negative; nullopt otherwise.
  std::optional<SliceParams> ConstSlice(const Node& n) const {
    if (n.op_type != "Slice" || !DefaultDomain(n) || m_.OpsetVersion("") < 10 || !n.HasInput(0) || !n.HasInput(1) ||
        !n.HasInput(2) || !n.HasOutput(0) || n.inputs.size() > 5)
      return std::nullopt;
    for (size_t k = 1; k < n.inputs.size(); ++k)
      if (n.HasInput(k) && !IsConstant(n.inputs[k])) return std::nullopt;
    SliceParams sp;
    for (size_t k = 1; k < n.inputs.size(); ++k) {
      if (!n.HasInput(k)) continue;
      std::optional<std::vector<int64_t>> v = ConstInts(n.inputs[k]);
      if (!v) return std::nullopt;
      (k == 1 ? sp.starts : k == 2 ? sp.ends : k == 3 ? sp.axes : sp.steps) = std::move(*v);
    }
    const size_t k = sp.starts.size();
    if (sp.ends.size() != k) return std::nullopt;
    if (!n.HasInput(3)) {
      sp.axes.resize(k);
      std::iota(sp.axes.begin(), sp.axes.end(), int64_t{0});
    }
    if (!n.HasInput(4)) sp.steps.assign(k, 1);
    if (sp.axes.size() != k || sp.steps.size() != k) return std::nullopt;
    const ValueInfo* vi = FindInfo(n.inputs[0]);
    const int64_t rank = vi != nullptr && vi->has_shape ? static_cast<int64_t>(vi->dims.size()) : -1;
    std::set<int64_t> seen;
    for (int64_t& a : sp.axes) {
      if (a < 0 && rank >= 0) a += rank;
      if (a < 0 || (rank >= 0 && a >= rank) || !seen.insert(a).second) return std::nullopt;
    }
    for (int64_t st : sp.steps)
      if (st == 0) return std::nullopt;
    return sp;
  }
  static bool Disjoint(const SliceParams& a, const SliceParams& b) {
    for (int64_t x : a.axes)
      if (std::find(b.axes.begin(), b.axes.end(), x) != b.axes.end()) return false;
    return true;
  }

  // Slicing on disjoint axes commutes and each axis is clamped against its own extent, which
  // the other Slice leaves unchanged: the two make one Slice over the union of their axes.
  bool MergeSlices() {
    Reindex();
    bool changed = false;
    std::set<int> merged;  // nodes rewritten in this sweep (they no longer read the inner Slice)
    for (size_t i = 0; i < g_.nodes.size(); ++i) {
      const std::optional<SliceParams> outer = ConstSlice(g_.nodes[i]);
      if (!outer) continue;
      const std::string mid = g_.nodes[i].inputs[0];
      auto pit = producer_.find(mid);
      if (pit == producer_.end() || IsGraphOutput(mid) || subgraph_reads_.count(mid)) continue;
      const Node& inner_node = g_.nodes[pit->second];
      const std::optional<SliceParams> inner = ConstSlice(inner_node);
      if (!inner || !Disjoint(*inner, *outer)) continue;
      bool all_merge = true;  // the inner Slice must go away, or merging would copy more
      for (int r : readers_[mid]) {
        if (merged.count(r)) continue;
        const std::optional<SliceParams> o = ConstSlice(g_.nodes[r]);
        all_merge &= r != static_cast<int>(pit->second) && g_.nodes[r].inputs[0] == mid && o && Disjoint(*inner, *o);
      }
      if (!all_merge) continue;
      SliceParams m = *inner;
      m.starts.insert(m.starts.end(), outer->starts.begin(), outer->starts.end());
      m.ends.insert(m.ends.end(), outer->ends.begin(), outer->ends.end());
      m.axes.insert(m.axes.end(), outer->axes.begin(), outer->axes.end());
      m.steps.insert(m.steps.end(), outer->steps.begin(), outer->steps.end());
      Node& n = g_.nodes[i];
      const std::string base = n.outputs[0] + "/merged_slice_";
      const char* names[] = {"starts", "ends", "axes", "steps"};
      const std::vector<int64_t>* lists[] = {&m.starts, &m.ends, &m.axes, &m.steps};
      std::vector<std::string> ins{inner_node.inputs[0]};
      for (int k = 0; k < 4; ++k) {
        std::string name = base + names[k];
        while (FindInit(name) != nullptr || producer_.count(name) || graph_inputs_.count(name)) name += "_";
        SetInit(name, Tensor::FromInt64s(*lists[k]));
        ins.push_back(name);
      }
      log_.push_back(fmt::format("{} of {} (other axes) -> one Slice of '{}'", n.Describe(), inner_node.Describe(),
                                 inner_node.inputs[0]));
      n.inputs = std::move(ins);
      merged.insert(static_cast<int>(i));
      changed = true;
    }
    return changed;
  }

  // ---- 5b. a zero Pad in front of a Conv ----
  // Pad(x, constant 0, height and width only) read only by a Conv (explicit pads or VALID) is the
  // Conv reading x with those pads added to its own: the padded copy goes, and the Conv can join a
  // chain of its neighbours. Keras' ZeroPadding2D before stride-2 convolutions (tf2onnx) and the
  // "same" padding of TensorFlow-ported PyTorch models (F.pad before the Conv) write one.
  bool FoldPadsIntoConvs() {
    Reindex();
    bool changed = false;
    for (size_t i = 0; i < g_.nodes.size(); ++i) {
      const Node& pad = g_.nodes[i];
      if (pad.op_type != "Pad" || !DefaultDomain(pad) || !pad.HasInput(0) || !pad.HasOutput(0) ||
          pad.GetString("mode", "constant") != "constant")
        continue;
      std::optional<std::vector<int64_t>> pads;
      if (pad.HasAttr("pads")) pads = pad.GetInts("pads");  // before opset 11
      else if (pad.HasInput(1) && IsConstant(pad.inputs[1])) pads = ConstInts(pad.inputs[1]);
      if (!pads || pads->size() != 8 || (pad.inputs.size() > 3 && pad.HasInput(3))) continue;  // no axes input
      if ((*pads)[0] != 0 || (*pads)[1] != 0 || (*pads)[4] != 0 || (*pads)[5] != 0 ||
          std::any_of(pads->begin(), pads->end(), [](int64_t p) { return p < 0 || p > (int64_t{1} << 20); }))
        continue;
      if (pad.HasAttr("value") && pad.GetFloat("value", 0.f) != 0.f) continue;
      if (pad.HasInput(2)) {
        const Tensor* v = FindInit(pad.inputs[2]);
        if (v == nullptr || !IsConstant(pad.inputs[2]) || v->numel() != 1 || v->ScalarAsDouble() != 0) continue;
      }
      const std::string& y = pad.outputs[0];
      if (IsGraphOutput(y) || subgraph_reads_.count(y) || readers_[y].size() != 1) continue;
      Node& conv = g_.nodes[static_cast<size_t>(readers_[y][0])];
      if (conv.op_type != "Conv" || !DefaultDomain(conv) || conv.inputs.empty() || conv.inputs[0] != y ||
          std::count(conv.inputs.begin(), conv.inputs.end(), y) != 1)
        continue;
      const std::string auto_pad = conv.GetString("auto_pad", "NOTSET");
      if (auto_pad != "NOTSET" && auto_pad != "VALID" && !auto_pad.empty()) continue;
      std::vector<int64_t> cp = auto_pad == "VALID" ? std::vector<int64_t>{} : conv.GetInts("pads");
      if (cp.empty()) cp.assign(4, 0);
      if (cp.size() != 4) continue;  // a 2-D convolution
      // Pads from the file: bounded before they are added (the Conv reports unreasonable ones).
      if (std::any_of(cp.begin(), cp.end(), [](int64_t p) { return p < 0 || p > (int64_t{1} << 20); })) continue;
      const std::vector<int64_t> merged{cp[0] + (*pads)[2], cp[1] + (*pads)[3], cp[2] + (*pads)[6], cp[3] + (*pads)[7]};
      log_.push_back(fmt::format("{} (zeros around height and width) -> pads {} of {}", pad.Describe(),
                                 fmt::join(merged, ","), conv.Describe()));
      Attribute a;
      a.name = "pads";
      a.type = Attribute::Type::kInts;
      a.ints = merged;
      conv.SetAttr(a);
      if (conv.HasAttr("auto_pad")) {
        Attribute ap;
        ap.name = "auto_pad";
        ap.type = Attribute::Type::kString;
        ap.s = "NOTSET";
        conv.SetAttr(ap);
      }
      // The index goes stale only for the Pad's output (now unread) and its input (one more
      // reader); a later Pad's fold looks only at the readers of its own output, which a Pad
      // earlier in the order cannot be, so no re-index per fold (many Pads would make that
      // quadratic); the next sweep re-indexes.
      conv.inputs[0] = pad.inputs[0];
      changed = true;
    }
    return changed;
  }

  // ---- 4. common subexpressions ----
  bool Cse() {
    Reindex();
    std::unordered_map<std::string, int> seen;
    std::vector<bool> dead(g_.nodes.size(), false);
    bool changed = false;
    for (size_t i = 0; i < g_.nodes.size(); ++i) {
      Node& n = g_.nodes[i];
      ResolveInputs(n);
      std::string key = CseKey(n);
      if (key.empty()) continue;
      auto [it, inserted] = seen.emplace(std::move(key), static_cast<int>(i));
      if (inserted) continue;
      bool graph_out = false;
      for (const std::string& o : n.outputs) graph_out |= !o.empty() && (IsGraphOutput(o) || subgraph_reads_.count(o));
      if (graph_out) continue;
      const Node& first = g_.nodes[it->second];
      bool ok = true;
      for (size_t k = 0; k < n.outputs.size(); ++k)
        if (!n.outputs[k].empty() && first.outputs[k].empty()) ok = false;
      if (!ok) continue;
      for (size_t k = 0; k < n.outputs.size(); ++k)
        if (!n.outputs[k].empty()) renamed_[n.outputs[k]] = first.outputs[k];
      log_.push_back(fmt::format("merged duplicate {} into {}", n.Describe(), first.Describe()));
      dead[i] = true;
      changed = true;
    }
    if (changed) FinishSweep(dead);
    return changed;
  }

  // Op, inputs and attributes of a node that may merge with its duplicates; "" when it may not.
  static std::string CseKey(const Node& n) {
    if (IsNondeterministic(n.op_type) || HasSubgraph(n) || n.outputs.empty() || n.op_type == "Constant") return "";
    std::string key = n.domain + "|" + n.op_type + "|" + std::to_string(n.outputs.size()) + "|" +
                      fmt::format("{}", fmt::join(n.inputs, ",")) + "|";
    std::vector<std::string> attrs;
    for (const Attribute& a : n.attributes) {
      std::string k = AttrKey(a);
      if (k.empty()) return "";
      attrs.push_back(k);
    }
    std::sort(attrs.begin(), attrs.end());
    return key + fmt::format("{}", fmt::join(attrs, ";"));
  }

  void RemoveUnusedInitializers() {
    Reindex();
    std::set<std::string> used(outputs_.begin(), outputs_.end());
    for (const auto& [v, c] : consumers_) used.insert(v);
    // Subgraphs may read outer initializers.
    std::function<void(const Graph&)> scan = [&](const Graph& sg) {
      for (const Node& n : sg.nodes)
        for (const Attribute& a : n.attributes) {
          if (a.g) for (const std::string& v : OuterScopeValues(*a.g)) used.insert(v);
          for (const auto& sub : a.graphs)
            if (sub) for (const std::string& v : OuterScopeValues(*sub)) used.insert(v);
        }
    };
    scan(g_);
    int removed = 0;
    std::vector<std::pair<std::string, Tensor>> kept;
    for (auto& [name, t] : g_.initializers) {
      if (used.count(name) || graph_inputs_.count(name) || !created_or_folded(name)) {
        kept.emplace_back(name, t);
      } else {
        ++removed;
      }
    }
    if (removed > 0) {
      g_.initializers = std::move(kept);
      log_.push_back(fmt::format("removed {} initializers no node reads any more", removed));
    }
  }

  // Only initializers that canonicalization made unused are removed (a model's own unused
  // initializers are left alone): those read by a folded or removed node.
  bool created_or_folded(const std::string& name) const { return !original_unused_.count(name); }

 public:
  void RecordOriginalUnused() {
    Reindex();
    for (const auto& [name, t] : g_.initializers)
      if (!consumers_.count(name) && !IsGraphOutput(name)) original_unused_.insert(name);
  }

 private:
  Model& m_;
  Graph& g_;
  std::unordered_map<std::string, int> producer_;
  std::unordered_map<std::string, int> consumers_;
  std::unordered_map<std::string, std::vector<int>> readers_;  // value -> nodes reading it
  std::unordered_map<std::string, size_t> init_index_;
  std::unordered_map<std::string, const ValueInfo*> info_;
  std::unordered_map<std::string, std::string> renamed_;  // this sweep's renames
  std::set<std::string> outputs_, graph_inputs_, original_unused_, subgraph_reads_;
  std::vector<std::string> log_;
};

}  // namespace

std::vector<std::string> Canonicalize(Model& model) {
  Canonicalizer c(model);
  c.RecordOriginalUnused();
  return c.Run();
}

}  // namespace gaf
