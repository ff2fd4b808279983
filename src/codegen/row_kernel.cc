#include "codegen/row_kernel.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

#include "codegen/compiler.h"
#include "codegen/row_program.h"

namespace gaf {

// Shapes aligned to the right and padded with ones to the largest rank, and their broadcast.
static void PadToRank(const std::vector<Shape>& shapes, std::vector<Shape>* pad, Shape* full) {
  size_t r = 0;
  for (const Shape& s : shapes) r = std::max(r, s.size());
  full->assign(r, 1);
  pad->clear();
  for (const Shape& s : shapes) {
    Shape p(r, 1);
    for (size_t i = 0; i < s.size(); ++i) p[r - s.size() + i] = s[i];
    for (size_t i = 0; i < r; ++i) (*full)[i] = p[i] == 1 ? (*full)[i] : p[i];
    pad->push_back(std::move(p));
  }
}

// Whether padded shape p is the whole extent, or all ones, over axes [k, r).
static bool WholeOrOnes(const Shape& p, const Shape& full, size_t k) {
  bool whole = true, ones = true;
  for (size_t i = k; i < p.size(); ++i) {
    whole &= p[i] == full[i];
    ones &= p[i] == 1;
  }
  return whole || ones;
}

// Merges the last n axes of every shape (aligned to the right, padded to the largest rank) into
// one; false when a shape is neither whole nor all ones over them.
bool rowgen::MergeLastAxes(std::vector<Shape>& shapes, size_t n) {
  std::vector<Shape> pad;
  Shape full;
  PadToRank(shapes, &pad, &full);
  const size_t r = full.size();
  if (n < 2 || r < n) return n < 2;
  for (Shape& p : pad) {
    if (!WholeOrOnes(p, full, r - n)) return false;
    int64_t prod = 1;
    for (size_t i = r - n; i < r; ++i) prod *= p[i];
    p.resize(r - n);
    p.push_back(prod);
  }
  shapes = std::move(pad);
  return true;
}

std::vector<Shape> CollapseTrailing(const std::vector<Shape>& shapes) {
  std::vector<Shape> pad;
  Shape full;
  PadToRank(shapes, &pad, &full);
  const size_t r = full.size();
  if (r < 2) return shapes;
  // Grow the trailing group [k, r) while every shape stays whole or all ones over it.
  size_t k = r - 1;
  while (k > 0) {
    bool ok = true;
    for (const Shape& p : pad) ok &= WholeOrOnes(p, full, k - 1);
    if (!ok) break;
    --k;
  }
  std::vector<Shape> out = shapes;
  if (k == r - 1 || !rowgen::MergeLastAxes(out, r - k)) return shapes;
  return out;
}

bool RowDomain(const std::vector<Shape>& input_shapes, Shape* full, int64_t* rows, int64_t* cols,
               std::string* reason) {
  Shape out;
  for (const Shape& s : input_shapes) {
    size_t r = std::max(out.size(), s.size());
    Shape b(r);
    for (size_t i = 0; i < r; ++i) {
      int64_t da = i < r - out.size() ? 1 : out[i - (r - out.size())];
      int64_t db = i < r - s.size() ? 1 : s[i - (r - s.size())];
      if (da != db && da != 1 && db != 1) {
        *reason = fmt::format("inputs do not broadcast together ({} vs {})", ShapeToString(out), ShapeToString(s));
        return false;
      }
      b[i] = da == 1 ? db : da;
    }
    out = b;
  }
  if (out.empty()) out = {1};
  *full = out;
  *cols = out.back();
  *rows = NumElements(out) / std::max<int64_t>(*cols, 1);
  if (*cols == 0 || *rows == 0) {
    *reason = "empty tensors";
    return false;
  }
  return true;
}

std::vector<int64_t> RowOffsets(const Shape& input, const Shape& full) {
  size_t r = full.size();
  Shape s(r, 1);
  for (size_t i = 0; i < input.size(); ++i) s[r - input.size() + i] = input[i];
  int64_t rows = NumElements(full) / std::max<int64_t>(full.back(), 1);
  std::vector<int64_t> offsets(static_cast<size_t>(rows), 0);
  std::vector<int64_t> in_strides(r, 0);
  int64_t acc = 1;
  for (size_t i = r; i-- > 0;) {
    in_strides[i] = s[i] == 1 ? 0 : acc;
    acc *= s[i];
  }
  // Odometer over the leading dims (no divisions: this runs on every call of a kernel).
  std::vector<int64_t> idx(r, 0);
  int64_t off = 0;
  for (int64_t row = 0; row < rows; ++row) {
    offsets[static_cast<size_t>(row)] = off;
    for (size_t i = r - 1; i-- > 0;) {
      off += in_strides[i];
      if (++idx[i] < full[i]) break;
      off -= in_strides[i] * full[i];
      idx[i] = 0;
    }
  }
  return offsets;
}

RowInputClass ClassifyRowInput(const Shape& input, const Shape& full, std::vector<int64_t>* offsets) {
  size_t r = full.size();
  Shape s(r, 1);
  for (size_t i = 0; i < input.size(); ++i) s[r - input.size() + i] = input[i];
  int64_t cols = full.back();
  bool last_full = s.back() == cols;
  bool leading_all_one = true, leading_same = true;
  for (size_t i = 0; i + 1 < r; ++i) {
    leading_all_one &= s[i] == 1;
    leading_same &= s[i] == full[i];
  }
  if (last_full && leading_same) return RowInputClass::kFull;
  if (last_full && leading_all_one) return RowInputClass::kRowVec;
  if (!last_full && leading_all_one) return RowInputClass::kScalar;
  if (!last_full && leading_same) return RowInputClass::kPerRow;
  // General broadcast of the leading dims: a table of row offsets (in elements of the input).
  *offsets = RowOffsets(input, full);
  return last_full ? RowInputClass::kGeneral : RowInputClass::kGeneralPerRow;
}

bool ApplyRowView(const RowView& view, const Shape& in, Shape* out, std::string* why) {
  Shape s = in;
  for (const RowViewStep& st : view) {
    if (st.kind == RowViewStep::Kind::kReshape) {
      // Only ones inserted or removed: the dims other than 1 must be the same, in order.
      Shape a, b;
      for (int64_t d : s)
        if (d != 1) a.push_back(d);
      for (int64_t d : st.target)
        if (d != 1) b.push_back(d);
      if (a != b) {
        *why = fmt::format("shape {} does not reshape to {} by inserting or removing ones", ShapeToString(s),
                           ShapeToString(st.target));
        return false;
      }
      s = st.target;
    } else if (st.kind == RowViewStep::Kind::kUnsqueeze) {
      const int64_t r = static_cast<int64_t>(s.size() + st.axes.size());
      std::vector<bool> inserted(static_cast<size_t>(r), false);
      for (int64_t a : st.axes) {
        const int64_t n = a < 0 ? a + r : a;
        if (n < 0 || n >= r || inserted[static_cast<size_t>(n)]) {
          *why = fmt::format("Unsqueeze axis {} out of range for rank {}", a, s.size());
          return false;
        }
        inserted[static_cast<size_t>(n)] = true;
      }
      Shape o;
      size_t k = 0;
      for (int64_t i = 0; i < r; ++i) o.push_back(inserted[static_cast<size_t>(i)] ? 1 : s[k++]);
      s = o;
    } else {
      const int64_t r = static_cast<int64_t>(s.size());
      std::vector<bool> removed(s.size(), false);
      for (int64_t a : st.axes) {
        const int64_t n = a < 0 ? a + r : a;
        if (n < 0 || n >= r || s[static_cast<size_t>(n)] != 1) {
          *why = fmt::format("Squeeze axis {} of shape {} is not a dim of size 1", a, ShapeToString(s));
          return false;
        }
        removed[static_cast<size_t>(n)] = true;
      }
      Shape o;
      for (size_t i = 0; i < s.size(); ++i)
        if (!(st.axes.empty() ? s[i] == 1 : removed[i])) o.push_back(s[i]);
      s = o;
    }
  }
  *out = s;
  return true;
}

namespace rowgen {

bool ReadsAsData(const Function& f, const std::string& name) {
  static const std::set<std::pair<std::string, size_t>> kShapeSlots = {
      {"Unsqueeze", 1}, {"Squeeze", 1}, {"Reshape", 1}, {"Expand", 1}, {"Slice", 1}, {"Slice", 2},
      {"Slice", 3}, {"Slice", 4}, {"ReduceMean", 1}, {"ReduceSum", 1}, {"ReduceMax", 1}, {"ReduceMin", 1},
      {"ReduceSumSquare", 1}, {"ReduceL2", 1}};
  if (std::find(f.outputs.begin(), f.outputs.end(), name) != f.outputs.end()) return true;
  for (const Node& n : f.nodes)
    for (size_t k = 0; k < n.inputs.size(); ++k)
      if (n.inputs[k] == name && !(n.domain.empty() && kShapeSlots.count({n.op_type, k}))) return true;
  return false;
}

namespace {

// The axes of an Unsqueeze/Squeeze (attribute before opset 13, else a constant input); false when
// they are not constant.
bool ViewAxes(const Node& n, const std::map<std::string, const Tensor*>& consts, std::vector<int64_t>* axes) {
  *axes = n.GetInts("axes");
  if (n.HasInput(1)) {
    auto it = consts.find(n.inputs[1]);
    if (it == consts.end()) return false;
    *axes = it->second->ToInt64s();
  }
  return true;
}

// Renames every use of `from` in the body (node inputs and function outputs) to `to`.
void RenameUses(Function& f, const std::string& from, const std::string& to) {
  for (Node& n : f.nodes)
    for (std::string& in : n.inputs)
      if (in == from) in = to;
  for (std::string& o : f.outputs)
    if (o == from) o = to;
}

// Uses of a value: node input slots plus function outputs.
int UsesOf(const Function& f, const std::string& v) {
  int u = static_cast<int>(std::count(f.outputs.begin(), f.outputs.end(), v));
  for (const Node& n : f.nodes) u += static_cast<int>(std::count(n.inputs.begin(), n.inputs.end(), v));
  return u;
}

}  // namespace

bool PrepareRowBody(const RowKernelRequest& req, GeneratedRowKernel* g, Function* body, std::vector<Shape>* base) {
  *body = *req.function;
  Function& f = *body;
  const size_t nin = f.inputs.size();
  *base = req.input_shapes;
  g->input_views.assign(nin, RowView{});
  g->output_views.assign(f.outputs.size(), RowView{});
  g->gather_index.assign(nin, -1);
  std::map<std::string, const Tensor*> consts;
  std::map<std::string, size_t> input_of;
  for (size_t i = 0; i < nin; ++i) {
    input_of[f.inputs[i]] = i;
    if (req.constants.size() > i && req.constants[i] != nullptr) consts[f.inputs[i]] = req.constants[i];
  }
  auto constant = [&](size_t i) { return req.constants.size() > i ? req.constants[i] : nullptr; };
  // Gather(table, indices) along axis 0, the table a float constant used only here, the indices an
  // integer input: the table becomes a gathered input.
  for (size_t k = 0; k < f.nodes.size(); ++k) {
    const Node& n = f.nodes[k];
    if (n.op_type != "Gather" || !n.domain.empty() || n.inputs.size() != 2 || n.outputs.size() != 1) continue;
    auto t = input_of.find(n.inputs[0]);
    auto x = input_of.find(n.inputs[1]);
    if (t == input_of.end() || x == input_of.end()) continue;
    const Tensor* table = constant(t->second);
    const DataType it = req.input_types[x->second];
    if (table == nullptr || table->dtype() != DataType::kFloat || table->shape().empty() || table->numel() < 2 ||
        (it != DataType::kInt64 && it != DataType::kInt32) || constant(x->second) != nullptr ||
        UsesOf(f, n.inputs[0]) != 1 || g->gather_index[t->second] >= 0)
      continue;
    const int64_t axis = n.GetInt("axis", 0);
    if (axis != 0 && axis != -static_cast<int64_t>(table->shape().size())) continue;
    Shape s = req.input_shapes[x->second];
    s.insert(s.end(), table->shape().begin() + 1, table->shape().end());
    (*base)[t->second] = s;
    g->gather_index[t->second] = static_cast<int>(x->second);
    const std::string out = n.outputs[0], tab = n.inputs[0];
    f.nodes.erase(f.nodes.begin() + static_cast<std::ptrdiff_t>(k));
    RenameUses(f, out, tab);
    --k;
  }
  // Unsqueeze/Squeeze of a unary elementwise op (Cast, Not, ...) of a function input commute with
  // it: the rank change moves onto the input, which is then read through a view. (Left in the body,
  // an Unsqueeze of [1, T] to [1, 1, 1, T] would only look like leading ones at batch 1.)
  static const std::set<std::string> kUnaryPointwise = {"Cast", "Not", "Neg", "Abs", "Identity"};
  for (size_t k = 0; k < f.nodes.size(); ++k) {
    const Node n = f.nodes[k];
    if (!n.domain.empty() || (n.op_type != "Unsqueeze" && n.op_type != "Squeeze") || n.inputs.empty() ||
        n.outputs.size() != 1 || UsesOf(f, n.inputs[0]) != 1)
      continue;
    for (size_t j = 0; j < k; ++j) {
      const Node e = f.nodes[j];
      if (e.outputs.size() != 1 || e.outputs[0] != n.inputs[0] || !e.domain.empty() || !kUnaryPointwise.count(e.op_type) ||
          e.inputs.size() != 1 || !input_of.count(e.inputs[0]) || UsesOf(f, e.inputs[0]) != 1)
        continue;
      Node view = n, op = e;
      view.inputs[0] = e.inputs[0];
      view.outputs[0] = e.outputs[0];  // the viewed input
      op.inputs[0] = e.outputs[0];
      op.outputs[0] = n.outputs[0];
      f.nodes[j] = view;
      f.nodes[k] = op;
      break;
    }
  }
  // Rank changes of function inputs used only there: the input is read through a view.
  auto step_of = [&](const Node& n, const Shape& in, RowViewStep* st) {
    if (!n.domain.empty() || n.outputs.size() != 1 || n.inputs.empty()) return false;
    if (n.op_type == "Unsqueeze" || n.op_type == "Squeeze") {
      st->kind = n.op_type == "Unsqueeze" ? RowViewStep::Kind::kUnsqueeze : RowViewStep::Kind::kSqueeze;
      return ViewAxes(n, consts, &st->axes);
    }
    if (n.op_type != "Reshape" || !n.HasInput(1)) return false;
    auto it = consts.find(n.inputs[1]);
    if (it == consts.end()) return false;
    // Only a target given in full (a constant, or shape data folded by value behind a guard): a
    // 0 or -1 would be resolved against the generation shape, which the view must not depend on
    // (variants with the same source share one kernel).
    std::vector<int64_t> t = it->second->ToInt64s();
    for (int64_t d : t)
      if (d <= 0) return false;
    st->kind = RowViewStep::Kind::kReshape;
    st->target = t;
    Shape ignored;
    std::string why;
    return NumElements(t) == NumElements(in) && ApplyRowView({*st}, in, &ignored, &why);
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t k = 0; k < f.nodes.size() && !changed; ++k) {
      const Node n = f.nodes[k];
      auto in = input_of.find(n.inputs.empty() ? std::string() : n.inputs[0]);
      if (in == input_of.end() || UsesOf(f, n.inputs[0]) != 1) continue;
      const size_t i = in->second;
      Shape now;
      std::string why;
      RowViewStep st;
      if (!ApplyRowView(g->input_views[i], (*base)[i], &now, &why) || !step_of(n, now, &st)) continue;
      Shape next;
      if (!ApplyRowView({st}, now, &next, &why)) {
        g->reason = fmt::format("{}: {}", n.Describe(), why);
        return false;
      }
      g->input_views[i].push_back(st);
      f.nodes.erase(f.nodes.begin() + static_cast<std::ptrdiff_t>(k));
      RenameUses(f, n.outputs[0], n.inputs[0]);
      changed = true;
    }
  }
  // Unsqueeze/Squeeze of the group's result right before an output: the output is written through
  // a view (the result, read by nothing else, keeps the domain's layout).
  for (size_t o = 0; o < f.outputs.size(); ++o) {
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t k = 0; k < f.nodes.size(); ++k) {
        const Node n = f.nodes[k];
        RowViewStep st;
        if (n.outputs.size() != 1 || n.outputs[0] != f.outputs[o] || (n.op_type != "Unsqueeze" && n.op_type != "Squeeze") ||
            !step_of(n, {}, &st) || n.inputs.empty() || input_of.count(n.inputs[0]) || UsesOf(f, n.inputs[0]) != 1 ||
            UsesOf(f, f.outputs[o]) != 1)
          continue;
        g->output_views[o].insert(g->output_views[o].begin(), st);
        f.outputs[o] = n.inputs[0];
        f.nodes.erase(f.nodes.begin() + static_cast<std::ptrdiff_t>(k));
        changed = true;
        break;
      }
    }
  }
  return true;
}

namespace {

// Per-channel parameters ([C]) of BatchNormalization broadcast along axis 1, not the last: they
// are viewed as [C,1,...,1] (an Unsqueeze of the trailing axes, same data), which the row model
// then reads as one value per row.
void ViewPerChannelParams(const Function& f, std::vector<Shape>& shapes, GeneratedRowKernel* g) {
  const size_t nin = f.inputs.size();
  size_t max_rank = 0;
  for (const Shape& sh : shapes) max_rank = std::max(max_rank, sh.size());
  for (const Node& n : f.nodes) {
    if (n.op_type != "BatchNormalization" || !n.domain.empty() || n.inputs.empty()) continue;
    size_t rank = max_rank;
    for (size_t i = 0; i < nin; ++i)
      if (f.inputs[i] == n.inputs[0]) rank = shapes[i].size();
    if (rank < 3) continue;
    for (size_t k = 1; k < n.inputs.size() && k < 5; ++k)
      for (size_t i = 0; i < nin; ++i)
        if (f.inputs[i] == n.inputs[k] && shapes[i].size() == 1 && g->input_views[i].empty()) {
          RowViewStep st;
          for (int64_t a = 1; a + 1 < static_cast<int64_t>(rank); ++a) st.axes.push_back(a);
          g->input_views[i].push_back(st);
          std::string why;
          ApplyRowView(g->input_views[i], Shape(shapes[i]), &shapes[i], &why);
        }
  }
}

// Reductions over several trailing axes (global pooling: ReduceMean axes=[2,3]): those axes are
// merged into one row (reduce_trailing) when every reduction of the body uses the same ones, no
// Slice/Concat reads the last axis, and every input is whole or broadcast over them (else the
// group fails).
bool MergeReducedTrailingAxes(const RowKernelRequest& req, int64_t domain_rank, const std::vector<bool>& data,
                              std::vector<Shape>& shapes, GeneratedRowKernel* g) {
  const Function& f = *req.function;
  const size_t nin = f.inputs.size();
  std::map<std::string, const Tensor*> cmap;
  for (size_t i = 0; i < nin; ++i)
    if (req.constants.size() > i && req.constants[i] != nullptr) cmap[f.inputs[i]] = req.constants[i];
  static const std::set<std::string> kReduce = {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin",
                                                "ReduceSumSquare", "ReduceL2"};
  static const std::set<std::string> kLastAxisOnly = {"Slice", "Concat"};
  std::set<std::vector<int64_t>> seen;
  bool last_axis_ops = false;
  auto from_axis = [&](int64_t a) {  // the axes a.. of the domain
    std::vector<int64_t> v;
    for (a = a < 0 ? a + domain_rank : a; a < domain_rank; ++a) v.push_back(a);
    return v;
  };
  for (const Node& n : f.nodes) {
    last_axis_ops |= kLastAxisOnly.count(n.op_type) > 0;
    std::vector<int64_t> axes;
    if (kReduce.count(n.op_type) && ReduceAxes(n, cmap, domain_rank, &axes)) seen.insert(axes);
    if (n.op_type == "Softmax" || n.op_type == "LogSoftmax") {
      const int64_t a = n.GetInt("axis", req.opset >= 13 ? -1 : 1);
      seen.insert(req.opset >= 13 ? std::vector<int64_t>{a < 0 ? a + domain_rank : a} : from_axis(a));
    }
    if (n.op_type == "LayerNormalization") seen.insert(from_axis(n.GetInt("axis", -1)));
    if (n.op_type == "GlobalAveragePool" || n.op_type == "GlobalMaxPool") seen.insert(from_axis(2));
  }
  // A gathered table's rows are table rows: its last axis is never merged with others.
  const bool gathered = std::any_of(g->gather_index.begin(), g->gather_index.end(), [](int k) { return k >= 0; });
  if (seen.size() != 1 || last_axis_ops || gathered) return true;
  const std::vector<int64_t>& axes = *seen.begin();
  const int64_t t = static_cast<int64_t>(axes.size());
  bool trailing = t > 1 && axes.back() == domain_rank - 1 && axes.front() == domain_rank - t;
  for (size_t k = 1; trailing && k < axes.size(); ++k) trailing = axes[k] == axes[k - 1] + 1;
  if (!trailing) return true;
  std::vector<size_t> idx;
  std::vector<Shape> dom;
  for (size_t i = 0; i < nin; ++i) {
    if (!data[i]) continue;
    // Lower-rank inputs align to the right (numpy broadcasting), as MergeLastAxes pads them.
    idx.push_back(i);
    dom.push_back(shapes[i]);
  }
  if (!MergeLastAxes(dom, static_cast<size_t>(t))) {
    g->reason = "an input is broadcast within the reduced axes";
    return false;
  }
  for (size_t k = 0; k < idx.size(); ++k) shapes[idx[k]] = dom[k];
  g->reduce_trailing = static_cast<int>(t);
  return true;
}

// Purely elementwise bodies: trailing axes over which every input is either whole or broadcast
// are merged into one row (a conv output [N,C,H,W] with per-channel [C,1,1] parameters becomes
// rows of H*W), so rows are long and per-row work is rare (collapse; redone per call).
void CollapseElementwiseAxes(const RowKernelRequest& req, const std::vector<bool>& data, std::vector<Shape>& shapes,
                             GeneratedRowKernel* g) {
  const Function& f = *req.function;
  static const std::set<std::string> kRowwise = {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceSumSquare",
                                                 "ReduceL2", "Softmax", "LogSoftmax", "LayerNormalization", "Slice", "Concat",
                                                 "GlobalAveragePool", "GlobalMaxPool", "Expand"};
  bool elementwise = std::none_of(g->gather_index.begin(), g->gather_index.end(), [](int k) { return k >= 0; });
  for (const Node& n : f.nodes) elementwise &= !kRowwise.count(n.op_type);
  std::vector<size_t> idx;
  std::vector<Shape> dom;
  for (size_t i = 0; i < f.inputs.size(); ++i) {
    const Tensor* c = req.constants.size() > i ? req.constants[i] : nullptr;
    if ((c != nullptr && c->numel() == 1) || !data[i]) continue;
    idx.push_back(i);
    dom.push_back(shapes[i]);
  }
  if (!elementwise || dom.empty()) return;
  std::vector<Shape> col = CollapseTrailing(dom);
  if (col[0].size() != std::max_element(dom.begin(), dom.end(), [](const Shape& a, const Shape& b) {
        return a.size() < b.size();
      })->size()) {
    g->collapse = true;
    for (size_t k = 0; k < idx.size(); ++k) shapes[idx[k]] = col[k];
  }
}

}  // namespace

// Stage 1: how each input is read (views, merged trailing axes) and the row domain, formed by the
// non-constant inputs (constants only broadcast into it).
bool PlanRowDomain(const RowKernelRequest& req, GeneratedRowKernel* g, RowDomainPlan* plan) {
  const Function& f = *req.function;
  const size_t nin = f.inputs.size();
  std::vector<Shape>& shapes = plan->shapes;
  shapes = req.input_shapes;
  if (g->input_views.size() != nin) g->input_views.assign(nin, RowView{});
  if (g->gather_index.size() != nin) g->gather_index.assign(nin, -1);
  if (g->output_views.size() != f.outputs.size()) g->output_views.assign(f.outputs.size(), RowView{});
  for (size_t i = 0; i < nin; ++i)
    if (!ApplyRowView(g->input_views[i], req.input_shapes[i], &shapes[i], &g->reason)) return false;
  ViewPerChannelParams(f, shapes, g);
  // Float and bool inputs are data; an integer input is data when a node reads its values (not
  // only as axes or shapes); a gathered table is data (its rows are read).
  plan->data.assign(nin, false);
  plan->constant.assign(nin, false);
  for (size_t i = 0; i < nin; ++i) {
    const DataType t = req.input_types[i];
    plan->constant[i] = req.constants.size() > i && req.constants[i] != nullptr;
    plan->data[i] = ComputedAsFloat(t) || t == DataType::kBool ||
                    (Readable(t) && ReadsAsData(f, f.inputs[i]));
  }
  plan->rank = 0;
  for (size_t i = 0; i < nin; ++i)
    if (plan->data[i]) plan->rank = std::max<int64_t>(plan->rank, shapes[i].size());
  if (!MergeReducedTrailingAxes(req, plan->rank, plan->data, shapes, g)) return false;
  CollapseElementwiseAxes(req, plan->data, shapes, g);
  std::vector<Shape> varying;
  g->domain_inputs.assign(nin, false);
  for (size_t i = 0; i < nin; ++i) {
    const Tensor* c = req.constants.size() > i ? req.constants[i] : nullptr;
    bool scalar_const = c != nullptr && c->numel() == 1;
    if (scalar_const || !plan->data[i]) continue;
    varying.push_back(shapes[i]);
    g->domain_inputs[i] = true;
  }
  return RowDomain(varying, &plan->full, &plan->rows, &plan->cols, &g->reason);
}

}  // namespace rowgen

// The stages in order (row_program.h); each fails with the reason set.
GeneratedRowKernel GenerateRowKernel(const RowKernelRequest& req, const std::string& symbol) {
  GeneratedRowKernel g;
  g.symbol = symbol;
  if (!IsKernelSymbol(symbol)) {
    g.reason = "the kernel symbol is not a C identifier";
    return g;
  }
  const Function& f = *req.function;
  for (const Node& n : f.nodes) g.ops_summary += (g.ops_summary.empty() ? "" : ",") + n.op_type;
  const size_t nin = f.inputs.size();
  if (req.input_shapes.size() != nin || req.input_types.size() != nin) {
    g.reason = "input count mismatch";
    return g;
  }
  g.signature.input_bool.assign(nin, false);
  g.signature.input_types.assign(nin, DataType::kFloat);
  // Stage 0 takes gathers and rank changes out of the body; the later stages see the rest.
  Function body;
  RowKernelRequest r = req;
  if (!rowgen::PrepareRowBody(req, &g, &body, &r.input_shapes)) return g;
  r.function = &body;
  rowgen::RowDomainPlan plan;
  rowgen::Lowering lw;
  std::vector<int> input_prim;
  rowgen::RowSchedule sched;
  if (!rowgen::PlanRowDomain(r, &g, &plan) || !rowgen::LowerRowBody(r, plan, &g, &lw, &input_prim) ||
      !rowgen::ClassifyRowPrims(plan, input_prim, &g, &lw) || !rowgen::ScheduleRow(body, plan, lw, &g, &sched) ||
      !rowgen::EmitRowKernel(r, lw, input_prim, sched, &g))
    return g;
  g.ok = true;
  return g;
}

// The type a domain input must have at run time.
static DataType WantType(const GeneratedRowKernel& k, size_t i) {
  if (k.signature.input_types.size() > i) return k.signature.input_types[i];
  return k.signature.input_bool.size() > i && k.signature.input_bool[i] ? DataType::kBool : DataType::kFloat;
}

static bool Gathered(const GeneratedRowKernel& k, size_t i) { return k.gather_index.size() > i && k.gather_index[i] >= 0; }

// The shape of an input before its view: its own, or for a gathered table indices.shape +
// table.shape[1:].
static Shape BaseShape(const GeneratedRowKernel& k, size_t i, const std::vector<const Tensor*>& inputs) {
  if (!Gathered(k, i)) return inputs[i]->shape();
  const size_t x = static_cast<size_t>(k.gather_index[i]);
  GAF_CHECK(x < inputs.size() && inputs[x] != nullptr, "{}: the indices of input {} are absent", k.symbol, i);
  GAF_CHECK(inputs[x]->dtype() == DataType::kInt64 || inputs[x]->dtype() == DataType::kInt32,
            "{}: indices of input {} are {}, not int64/int32", k.symbol, i, DataTypeName(inputs[x]->dtype()));
  Shape s = inputs[x]->shape();
  s.insert(s.end(), inputs[i]->shape().begin() + 1, inputs[i]->shape().end());
  return s;
}

// The shape an input is read as: its base shape through the view recorded at generation.
static Shape ViewOf(const GeneratedRowKernel& k, size_t i, const Shape& base) {
  if (k.input_views.size() <= i || k.input_views[i].empty()) return base;
  Shape v;
  std::string why;
  GAF_CHECK(ApplyRowView(k.input_views[i], base, &v, &why), "{}: input {}: {}", k.symbol, i, why);
  return v;
}

// Computes the launch of a call from its input shapes (and checks them); throws gaf::Error when
// the inputs do not fit the generated code.
static std::shared_ptr<const RowLaunch> PlanLaunch(const GeneratedRowKernel& k, const std::vector<const Tensor*>& inputs) {
  auto L = std::make_shared<RowLaunch>();
  L->shapes.resize(inputs.size());
  L->offsets.resize(inputs.size());
  std::vector<Shape> shapes;
  std::vector<Shape> viewed(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!k.domain_inputs[i]) continue;
    GAF_CHECK(inputs[i] != nullptr, "{}: input {} is absent", k.symbol, i);
    const DataType want_type = WantType(k, i);
    GAF_CHECK(inputs[i]->dtype() == want_type, "{}: input {} is {}, the kernel takes {}", k.symbol, i,
              DataTypeName(inputs[i]->dtype()), DataTypeName(want_type));
    L->shapes[i] = BaseShape(k, i, inputs);
    shapes.push_back(viewed[i] = ViewOf(k, i, L->shapes[i]));
  }
  Shape full;
  int64_t rows = 0, cols = 0;
  std::string reason;
  GAF_CHECK(RowDomain(shapes, &L->out_shape, &rows, &cols, &reason), "{}: {}", k.symbol, reason);
  if (k.collapse || k.reduce_trailing > 1) {
    if (k.collapse) shapes = CollapseTrailing(shapes);
    else
      GAF_CHECK(rowgen::MergeLastAxes(shapes, static_cast<size_t>(k.reduce_trailing)),
                "{}: an input is broadcast within the reduced axes", k.symbol);
    for (size_t i = 0, d = 0; i < inputs.size(); ++i)
      if (k.domain_inputs[i]) viewed[i] = shapes[d++];
  }
  GAF_CHECK(RowDomain(shapes, &full, &rows, &cols, &reason), "{}: {}", k.symbol, reason);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!k.domain_inputs[i]) continue;
    const Shape& is = viewed[i];
    GAF_CHECK(is.empty() || is.back() == 1 || is.back() == cols, "{}: input {} of shape {} has rows of another width",
              k.symbol, i, ShapeToString(is));
    const RowInputClass want = k.signature.inputs[i];
    if (Gathered(k, i)) {
      // Rows of the gathered value [indices.., D] as rows of the index tensor (the row offsets of
      // the table are made per call from the index values, FillCall).
      const int64_t d = NumElements(inputs[i]->shape()) / std::max<int64_t>(inputs[i]->shape()[0], 1);
      GAF_CHECK(!is.empty() && is.back() == d, "{}: gathered input {} is viewed as {}", k.symbol, i, ShapeToString(is));
      GAF_CHECK((want == RowInputClass::kGeneral && d == cols) || (want == RowInputClass::kGeneralPerRow && d == 1),
                "{}: gathered input {} of shape {} broadcasts differently than at generation", k.symbol, i,
                ShapeToString(is));
      L->offsets[i] = RowOffsets(is, full);
      for (int64_t& o : L->offsets[i]) o /= std::max<int64_t>(d, 1);
      continue;
    }
    const RowInputClass got = ClassifyRowInput(is, full, &L->offsets[i]);
    if (got != want) {
      // With one row, a full row and a shared row read the same addresses (so do per-row and
      // scalar values); a row-offset table describes any broadcast of the leading dims.
      using C = RowInputClass;
      const bool one_row = rows == 1;
      const bool per_row = is.empty() || is.back() == 1;
      bool ok = one_row && (((want == C::kFull || want == C::kRowVec) && (got == C::kFull || got == C::kRowVec)) ||
                            ((want == C::kPerRow || want == C::kScalar) && (got == C::kPerRow || got == C::kScalar)));
      if (!ok && ((want == C::kGeneral && !per_row) || (want == C::kGeneralPerRow && per_row))) {
        L->offsets[i] = RowOffsets(is, full);
        ok = true;
      }
      GAF_CHECK(ok, "{}: input {} of shape {} broadcasts differently than at generation", k.symbol, i,
                ShapeToString(is));
      if (want != C::kGeneral && want != C::kGeneralPerRow) L->offsets[i].clear();
    }
  }
  L->rows = rows;
  L->cols = cols;
  // Per-row outputs: the reduced trailing axes kept as 1 (keepdims) or dropped.
  const size_t t = static_cast<size_t>(std::max(1, k.reduce_trailing));
  GAF_CHECK(L->out_shape.size() >= t, "{}: output of rank {} for a reduction over {} axes", k.symbol,
            L->out_shape.size(), t);
  L->per_row_shape = L->out_shape;
  for (size_t i = L->out_shape.size() - t; i < L->out_shape.size(); ++i) L->per_row_shape[i] = 1;
  L->squeezed_shape.assign(L->out_shape.begin(), L->out_shape.end() - static_cast<std::ptrdiff_t>(t));
  // Outputs written through a view (an Unsqueeze of the result): their shapes per output.
  const size_t nout = k.signature.output_per_row.size();
  L->output_shapes.resize(nout);
  for (size_t o = 0; o < nout; ++o) {
    const bool squeezed = o < k.signature.output_squeezed.size() && k.signature.output_squeezed[o];
    const Shape& s = squeezed ? L->squeezed_shape : k.signature.output_per_row[o] ? L->per_row_shape : L->out_shape;
    L->output_shapes[o] = s;
    if (o < k.output_views.size() && !k.output_views[o].empty())
      GAF_CHECK(ApplyRowView(k.output_views[o], s, &L->output_shapes[o], &reason), "{}: output {}: {}", k.symbol, o,
                reason);
  }
  return L;
}

// The launch plan of a call: the kernel's last one when every domain input has the same type
// and shape, else a new one (kept as the last).
static std::shared_ptr<const RowLaunch> LaunchFor(const GeneratedRowKernel& k, const std::vector<const Tensor*>& inputs) {
  GAF_CHECK(inputs.size() == k.domain_inputs.size(), "{}: expected {} inputs, got {}", k.symbol,
            k.domain_inputs.size(), inputs.size());
  std::shared_ptr<const RowLaunch> L;
  {
    std::lock_guard<std::mutex> lock(k.launch_cache->mu);
    L = k.launch_cache->last;
  }
  bool hit = L != nullptr;
  for (size_t i = 0; hit && i < inputs.size(); ++i)
    if (k.domain_inputs[i])
      hit = inputs[i] != nullptr && inputs[i]->dtype() == WantType(k, i) &&
            (Gathered(k, i) ? BaseShape(k, i, inputs) == L->shapes[i] : inputs[i]->shape() == L->shapes[i]);
  if (!hit) {
    L = PlanLaunch(k, inputs);
    std::lock_guard<std::mutex> lock(k.launch_cache->mu);
    k.launch_cache->last = L;
  }
  return L;
}

// Row offsets of a gathered table for this call: the index at each row of the launch's index
// table, normalized (negative counts from the end) and checked as Gather checks it.
static void GatherOffsets(const GeneratedRowKernel& k, size_t i, const RowLaunch& L,
                          const std::vector<const Tensor*>& inputs, std::vector<int64_t>* out) {
  const Tensor& table = *inputs[i];
  const Tensor& idx = *inputs[static_cast<size_t>(k.gather_index[i])];
  const int64_t n = table.shape()[0];
  const int64_t d = NumElements(table.shape()) / std::max<int64_t>(n, 1);
  const std::vector<int64_t>& at = L.offsets[i];
  out->resize(at.size());
  for (size_t r = 0; r < at.size(); ++r) {
    int64_t v = idx.dtype() == DataType::kInt64 ? idx.data<int64_t>()[at[r]] : idx.data<int32_t>()[at[r]];
    if (v < 0) v += n;
    GAF_CHECK(v >= 0 && v < n, "{}: gather index {} out of range [-{}, {})", k.symbol, v < 0 ? v - n : v, n, n);
    (*out)[r] = v * d;
  }
}

// Fills the argument arrays of a call and allocates its outputs.
static void FillCall(const GeneratedRowKernel& k, const RowLaunch& L, const std::vector<const Tensor*>& inputs,
                     std::vector<const float*>& in, std::vector<const int64_t*>& in_off,
                     std::vector<std::vector<int64_t>>& gathered, std::vector<float*>& out_ptrs,
                     std::vector<Tensor>& outs) {
  in.assign(inputs.size(), nullptr);
  in_off.assign(inputs.size(), nullptr);
  if (gathered.size() < inputs.size()) gathered.resize(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!k.domain_inputs[i]) continue;
    // Bool and integer inputs travel through the same pointer array; the generated code reads
    // them as their own type.
    in[i] = static_cast<const float*>(inputs[i]->raw());
    if (Gathered(k, i)) {
      GatherOffsets(k, i, L, inputs, &gathered[i]);
      in_off[i] = gathered[i].data();
      continue;
    }
    in_off[i] = L.offsets[i].empty() ? nullptr : L.offsets[i].data();
  }
  outs.clear();
  outs.reserve(k.signature.output_per_row.size());
  out_ptrs.clear();
  for (size_t o = 0; o < k.signature.output_per_row.size(); ++o) {
    // Generated kernels write every element of every output: no zero fill.
    outs.push_back(Tensor::Uninitialized(DataType::kFloat, L.output_shapes[o]));
    out_ptrs.push_back(outs.back().data<float>());
  }
}

std::vector<Tensor> RunRowKernel(RowKernelFn fn, const GeneratedRowKernel& k, const std::vector<const Tensor*>& inputs) {
  std::shared_ptr<const RowLaunch> L = LaunchFor(k, inputs);
  thread_local std::vector<const float*> in;
  thread_local std::vector<const int64_t*> in_off;
  thread_local std::vector<float*> out_ptrs;
  thread_local std::vector<std::vector<int64_t>> gathered;
  std::vector<Tensor> outs;
  FillCall(k, *L, inputs, in, in_off, gathered, out_ptrs, outs);
  RowKernelArgs args{L->rows, L->cols, in.data(), in_off.data(), out_ptrs.data()};
  fn(&args);
  return outs;
}

void PrepareRowCall(const GeneratedRowKernel& k, const std::vector<const Tensor*>& inputs, RowCall* call) {
  call->launch = LaunchFor(k, inputs);
  FillCall(k, *call->launch, inputs, call->in, call->in_off, call->gathered, call->out_ptrs, call->outputs);
  call->args = RowKernelArgs{call->launch->rows, call->launch->cols, call->in.data(), call->in_off.data(),
                             call->out_ptrs.data()};
}

}  // namespace gaf
