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

namespace rowgen {
namespace {

// Per-channel parameters ([C]) of BatchNormalization broadcast along axis 1, not the last: they
// are viewed as [C,1,...,1] (same data), which the row model then reads as one value per row.
void ViewPerChannelParams(const Function& f, std::vector<Shape>& shapes, GeneratedRowKernel* g) {
  const size_t nin = f.inputs.size();
  g->input_views.assign(nin, Shape{});
  size_t max_rank = 0;
  for (const Shape& sh : shapes) max_rank = std::max(max_rank, sh.size());
  for (const Node& n : f.nodes) {
    if (n.op_type != "BatchNormalization" || !n.domain.empty()) continue;
    size_t rank = max_rank;
    for (size_t i = 0; i < nin; ++i)
      if (f.inputs[i] == n.inputs[0]) rank = shapes[i].size();
    if (rank < 3) continue;
    for (size_t k = 1; k < n.inputs.size() && k < 5; ++k)
      for (size_t i = 0; i < nin; ++i)
        if (f.inputs[i] == n.inputs[k] && shapes[i].size() == 1) {
          Shape view(rank - 1, 1);
          view[0] = shapes[i][0];
          shapes[i] = g->input_views[i] = view;
        }
  }
}

// Reductions over several trailing axes (global pooling: ReduceMean axes=[2,3]): those axes are
// merged into one row (reduce_trailing) when every reduction of the body uses the same ones, no
// Slice/Concat reads the last axis, and every input is whole or broadcast over them (else the
// group fails).
bool MergeReducedTrailingAxes(const RowKernelRequest& req, int64_t domain_rank, std::vector<Shape>& shapes,
                              GeneratedRowKernel* g) {
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
  if (seen.size() != 1 || last_axis_ops) return true;
  const std::vector<int64_t>& axes = *seen.begin();
  const int64_t t = static_cast<int64_t>(axes.size());
  bool trailing = t > 1 && axes.back() == domain_rank - 1 && axes.front() == domain_rank - t;
  for (size_t k = 1; trailing && k < axes.size(); ++k) trailing = axes[k] == axes[k - 1] + 1;
  if (!trailing) return true;
  std::vector<size_t> idx;
  std::vector<Shape> dom;
  for (size_t i = 0; i < nin; ++i) {
    if (!Readable(req.input_types[i])) continue;
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
void CollapseElementwiseAxes(const RowKernelRequest& req, std::vector<Shape>& shapes, GeneratedRowKernel* g) {
  const Function& f = *req.function;
  static const std::set<std::string> kRowwise = {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceSumSquare",
                                                 "ReduceL2", "Softmax", "LogSoftmax", "LayerNormalization", "Slice", "Concat",
                                                 "GlobalAveragePool", "GlobalMaxPool"};
  bool elementwise = true;
  for (const Node& n : f.nodes) elementwise &= !kRowwise.count(n.op_type);
  std::vector<size_t> idx;
  std::vector<Shape> dom;
  for (size_t i = 0; i < f.inputs.size(); ++i) {
    const Tensor* c = req.constants.size() > i ? req.constants[i] : nullptr;
    if ((c != nullptr && c->numel() == 1) || !Readable(req.input_types[i])) continue;
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
  ViewPerChannelParams(f, shapes, g);
  plan->rank = 0;
  for (size_t i = 0; i < nin; ++i)
    if (Readable(req.input_types[i])) plan->rank = std::max<int64_t>(plan->rank, shapes[i].size());
  if (!MergeReducedTrailingAxes(req, plan->rank, shapes, g)) return false;
  CollapseElementwiseAxes(req, shapes, g);
  std::vector<Shape> varying;
  g->domain_inputs.assign(nin, false);
  for (size_t i = 0; i < nin; ++i) {
    const Tensor* c = req.constants.size() > i ? req.constants[i] : nullptr;
    bool scalar_const = c != nullptr && c->numel() == 1;
    bool int_const = c != nullptr && !Readable(req.input_types[i]);
    if (scalar_const || int_const) continue;
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
  rowgen::RowDomainPlan plan;
  rowgen::Lowering lw;
  std::vector<int> input_prim;
  rowgen::RowSchedule sched;
  if (!rowgen::PlanRowDomain(req, &g, &plan) || !rowgen::LowerRowBody(req, plan, &g, &lw, &input_prim) ||
      !rowgen::ClassifyRowPrims(plan, input_prim, &g, &lw) || !rowgen::ScheduleRow(f, plan, lw, &g, &sched) ||
      !rowgen::EmitRowKernel(req, lw, input_prim, sched, &g))
    return g;
  g.ok = true;
  return g;
}

// The shape an input is read as: its own, or for a per-channel parameter [C] the view [C,1,..,1]
// of the rank chosen at generation.
static Shape ViewOf(const GeneratedRowKernel& k, size_t i, const Tensor& t) {
  if (k.input_views.size() <= i || k.input_views[i].empty()) return t.shape();
  GAF_CHECK(t.shape().size() == 1, "{}: input {} of shape {} is not a per-channel vector", k.symbol, i,
            ShapeToString(t.shape()));
  Shape v(k.input_views[i].size(), 1);
  v[0] = t.shape()[0];
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
    const DataType want_type = k.signature.input_bool[i] ? DataType::kBool : DataType::kFloat;
    GAF_CHECK(inputs[i]->dtype() == want_type, "{}: input {} is {}, the kernel takes {}", k.symbol, i,
              DataTypeName(inputs[i]->dtype()), DataTypeName(want_type));
    L->shapes[i] = inputs[i]->shape();
    shapes.push_back(viewed[i] = ViewOf(k, i, *inputs[i]));
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
      hit = inputs[i] != nullptr &&
            inputs[i]->dtype() == (k.signature.input_bool[i] ? DataType::kBool : DataType::kFloat) &&
            inputs[i]->shape() == L->shapes[i];
  if (!hit) {
    L = PlanLaunch(k, inputs);
    std::lock_guard<std::mutex> lock(k.launch_cache->mu);
    k.launch_cache->last = L;
  }
  return L;
}

// Fills the argument arrays of a call and allocates its outputs.
static void FillCall(const GeneratedRowKernel& k, const RowLaunch& L, const std::vector<const Tensor*>& inputs,
                     std::vector<const float*>& in, std::vector<const int64_t*>& in_off,
                     std::vector<float*>& out_ptrs, std::vector<Tensor>& outs) {
  in.assign(inputs.size(), nullptr);
  in_off.assign(inputs.size(), nullptr);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!k.domain_inputs[i]) continue;
    // Bool masks travel through the same pointer array; the generated code reads them as bool.
    in[i] = k.signature.input_bool[i] ? reinterpret_cast<const float*>(inputs[i]->data<bool>()) : inputs[i]->data<float>();
    in_off[i] = L.offsets[i].empty() ? nullptr : L.offsets[i].data();
  }
  outs.clear();
  outs.reserve(k.signature.output_per_row.size());
  out_ptrs.clear();
  for (size_t o = 0; o < k.signature.output_per_row.size(); ++o) {
    const bool squeezed = o < k.signature.output_squeezed.size() && k.signature.output_squeezed[o];
    // Generated kernels write every element of every output: no zero fill.
    outs.push_back(Tensor::Uninitialized(DataType::kFloat, squeezed ? L.squeezed_shape
                                                           : k.signature.output_per_row[o] ? L.per_row_shape
                                                                                          : L.out_shape));
    out_ptrs.push_back(outs.back().data<float>());
  }
}

std::vector<Tensor> RunRowKernel(RowKernelFn fn, const GeneratedRowKernel& k, const std::vector<const Tensor*>& inputs) {
  std::shared_ptr<const RowLaunch> L = LaunchFor(k, inputs);
  thread_local std::vector<const float*> in;
  thread_local std::vector<const int64_t*> in_off;
  thread_local std::vector<float*> out_ptrs;
  std::vector<Tensor> outs;
  FillCall(k, *L, inputs, in, in_off, out_ptrs, outs);
  RowKernelArgs args{L->rows, L->cols, in.data(), in_off.data(), out_ptrs.data()};
  fn(&args);
  return outs;
}

void PrepareRowCall(const GeneratedRowKernel& k, const std::vector<const Tensor*>& inputs, RowCall* call) {
  call->launch = LaunchFor(k, inputs);
  FillCall(k, *call->launch, inputs, call->in, call->in_off, call->out_ptrs, call->outputs);
  call->args = RowKernelArgs{call->launch->rows, call->launch->cols, call->in.data(), call->in_off.data(),
                             call->out_ptrs.data()};
}

}  // namespace gaf
