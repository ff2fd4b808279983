#include "codegen/row_kernel.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "codegen/compiler.h"
#include "codegen/fast_math_embed.h"

namespace gaf {

// Merges the last n axes of every shape (aligned to the right, padded to the largest rank) into
// one; false when a shape is neither whole nor all ones over them.
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
static bool MergeLastAxes(std::vector<Shape>& shapes, size_t n) {
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
  if (k == r - 1 || !MergeLastAxes(out, r - k)) return shapes;
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

namespace {

// ---- lowered program ----

enum class VKind { kRow, kScal };

struct Prim {
  enum Kind { kInput, kConst, kUnary, kBinary, kReduce, kSlice, kConcat } kind;
  explicit Prim(Kind k) : kind(k) {}
  std::string op;   // unary: Relu, Neg, ...; binary: Add, ...; reduce: Sum, Max, Min, Mean
  int a = -1, b = -1, c = -1;  // c: Where's condition (op "Where": c ? a : b)
  int input = -1;   // kInput: function input index
  double value = 0; // kConst
  float alpha = 0, beta = 0;  // unary parameters (LeakyRelu alpha, HardSigmoid alpha/beta)
  int64_t offset = 0;         // kSlice: first column taken; kConcat: width of operand a
  VKind vkind = VKind::kScal;
  int level = 0;
  Shape shape;
};

struct Lowering {
  std::vector<Prim> prims;
  std::map<std::string, int> id;
  std::string error;
  // Reductions over the last `trailing` axes of the original rank-`rank` domain (merged into one
  // row before lowering); keepdims=0 results, which may only be outputs of the group.
  int64_t rank = 0, trailing = 1;
  std::set<int> squeezed;
  std::set<int> bools;  // prims that are bool inputs (only Where's condition may read them)

  int Add(Prim p) {
    prims.push_back(std::move(p));
    return static_cast<int>(prims.size()) - 1;
  }
  int Const(double v) {
    Prim p(Prim::kConst);
    p.value = v;
    p.shape = {1};
    return Add(p);
  }
  static Shape Broadcast(const Shape& a, const Shape& b) {
    size_t r = std::max(a.size(), b.size());
    Shape o(r);
    for (size_t i = 0; i < r; ++i) {
      int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
      int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
      o[i] = da == 1 ? db : da;
    }
    return o;
  }
  int Unary(const std::string& op, int a, float alpha = 0, float beta = 0) {
    Prim p(Prim::kUnary);
    p.op = op;
    p.a = a;
    p.alpha = alpha;
    p.beta = beta;
    p.shape = prims[a].shape;
    return Add(p);
  }
  int Binary(const std::string& op, int a, int b) {
    Prim p(Prim::kBinary);
    p.op = op;
    p.a = a;
    p.b = b;
    p.shape = Broadcast(prims[a].shape, prims[b].shape);
    return Add(p);
  }
  int Select(int cond, int x, int y) {
    Prim p(Prim::kBinary);
    p.op = "Where";
    p.a = x;
    p.b = y;
    p.c = cond;
    p.shape = Broadcast(Broadcast(prims[x].shape, prims[y].shape), prims[cond].shape);
    return Add(p);
  }
  int Reduce(const std::string& op, int a) {
    Prim p(Prim::kReduce);
    p.op = op;
    p.a = a;
    p.shape = prims[a].shape;
    if (!p.shape.empty()) p.shape.back() = 1;
    return Add(p);
  }
};

// The axes of a Reduce* node (attribute, or constant input from opset 18), normalized against
// `rank` and sorted; an absent list means all axes.
bool ReduceAxes(const Node& n, const std::map<std::string, const Tensor*>& consts, int64_t rank,
                std::vector<int64_t>* axes) {
  *axes = n.GetInts("axes");
  if (n.HasInput(1)) {
    auto it = consts.find(n.inputs[1]);
    if (it == consts.end()) return false;
    *axes = it->second->ToInt64s();
  }
  if (axes->empty())
    for (int64_t a = 0; a < rank; ++a) axes->push_back(a);
  for (int64_t& a : *axes) a = a < 0 ? a + rank : a;
  std::sort(axes->begin(), axes->end());
  return true;
}

bool IsLastAxis(int64_t axis, size_t rank) {
  int64_t r = static_cast<int64_t>(rank);
  return axis == -1 || axis == r - 1;
}

// Lowers one body node into primitives; returns false with lw.error set.
bool LowerNode(const Node& n, Lowering& lw, const std::map<std::string, const Tensor*>& consts, int64_t opset) {
  auto in = [&](size_t i) -> int {
    auto it = lw.id.find(n.inputs[i]);
    return it == lw.id.end() ? -1 : it->second;
  };
  auto fail = [&](const std::string& why) {
    lw.error = fmt::format("{}: {}", n.Describe(), why);
    return false;
  };
  for (size_t i = 0; i < n.inputs.size(); ++i)
    if (!n.inputs[i].empty() && in(i) < 0 && !consts.count(n.inputs[i]))
      return fail(fmt::format("input '{}' is not available", n.inputs[i]));
  const std::string& op = n.op_type;
  int out = -1;
  static const std::set<std::string> kUnary = {"Relu", "Neg", "Abs", "Sqrt", "Reciprocal", "Exp", "Log",
                                               "Tanh", "Sigmoid", "Erf", "Softplus", "Floor", "Ceil"};
  static const std::set<std::string> kBinary = {"Add", "Sub", "Mul", "Div", "Max", "Min"};
  if (!n.domain.empty()) return fail("operators outside ai.onnx are not supported by the row code generator");
  if (op == "Identity" || op == "Dropout") {
    out = in(0);
  } else if (op == "Cast") {
    // Values are computed in float32: a Cast to float16/bfloat16 inside a body rounds the value to
    // that type's precision (and range), as the unfused Cast would; a Cast to float is exact.
    const int64_t to = n.GetInt("to", 1);
    if (to == static_cast<int64_t>(DataType::kFloat)) out = in(0);
    else if (to == static_cast<int64_t>(DataType::kFloat16)) out = lw.Unary("RoundHalf", in(0));
    else if (to == static_cast<int64_t>(DataType::kBFloat16)) out = lw.Unary("RoundBFloat16", in(0));
    else return fail("Cast to a type other than float, float16 or bfloat16");
  } else if (kUnary.count(op)) {
    out = lw.Unary(op, in(0));
  } else if (op == "LeakyRelu") {
    out = lw.Unary(op, in(0), n.GetFloat("alpha", 0.01f));
  } else if (op == "HardSigmoid") {
    out = lw.Unary(op, in(0), n.GetFloat("alpha", 0.2f), n.GetFloat("beta", 0.5f));
  } else if (op == "HardSwish") {
    out = lw.Binary("Mul", in(0), lw.Unary("HardSigmoid", in(0), 1.f / 6.f, 0.5f));
  } else if (op == "Gelu") {
    if (n.GetString("approximate", "none") != "none") return fail("Gelu approximate=tanh");
    int x = in(0);
    int e = lw.Unary("Erf", lw.Binary("Mul", x, lw.Const(M_SQRT1_2)));
    out = lw.Binary("Mul", lw.Binary("Mul", x, lw.Const(0.5)), lw.Binary("Add", e, lw.Const(1.0)));
  } else if (op == "Where") {
    const int cond = in(0), x = in(1), y = in(2);
    if (cond < 0 || x < 0 || y < 0) return fail("Where with a constant tensor operand");
    if (lw.bools.count(x) || lw.bools.count(y)) return fail("Where selecting booleans");
    out = lw.Select(cond, x, y);
  } else if (op == "Sum" || ((op == "Max" || op == "Min") && n.inputs.size() > 2)) {
    out = in(0);
    for (size_t i = 1; i < n.inputs.size(); ++i) out = lw.Binary(op == "Sum" ? "Add" : op, out, in(i));
  } else if (op == "Softsign") {
    out = lw.Binary("Div", in(0), lw.Binary("Add", lw.Unary("Abs", in(0)), lw.Const(1.0)));
  } else if (kBinary.count(op)) {
    if (n.inputs.size() != 2) return fail("expects two inputs");
    out = lw.Binary(op, in(0), in(1));
  } else if (op == "Pow") {
    int base = in(0), e = in(1);
    if (lw.prims[e].kind != Prim::kConst) return fail("Pow with a non-constant exponent");
    double ev = lw.prims[e].value;
    if (ev == 2.0) out = lw.Binary("Mul", base, base);
    else if (ev == 3.0) out = lw.Binary("Mul", lw.Binary("Mul", base, base), base);
    else if (ev == 1.0) out = base;
    else if (ev == 0.5) out = lw.Unary("Sqrt", base);
    else if (ev == -1.0) out = lw.Unary("Reciprocal", base);
    else out = lw.Binary("Pow", base, e);
  } else if (op == "Clip") {
    out = in(0);
    if (opset < 11) {
      out = lw.Binary("Max", out, lw.Const(n.GetFloat("min", -3.402823e38f)));
      out = lw.Binary("Min", out, lw.Const(n.GetFloat("max", 3.402823e38f)));
    } else {
      if (n.HasInput(1)) out = lw.Binary("Max", out, in(1));
      if (n.HasInput(2)) out = lw.Binary("Min", out, in(2));
    }
  } else if (op == "ReduceMean" || op == "ReduceSum" || op == "ReduceMax" || op == "ReduceMin" ||
             op == "ReduceSumSquare" || op == "ReduceL2") {
    int x = in(0);
    // Single-axis reductions are checked against their input's rank; merged trailing axes against
    // the domain's original rank (negative axes count from the right, like broadcasting).
    const int64_t r = lw.trailing > 1 ? lw.rank : static_cast<int64_t>(lw.prims[x].shape.size());
    std::vector<int64_t> axes;
    if (!ReduceAxes(n, consts, r, &axes)) return fail("axes are not a constant");
    std::vector<int64_t> want;
    for (int64_t a = r - lw.trailing; a < r; ++a) want.push_back(a);
    if (axes != want) return fail("only reductions over the last axis (or the same trailing axes everywhere) are generated");
    if (op == "ReduceSumSquare" || op == "ReduceL2") x = lw.Binary("Mul", x, x);
    std::string kind = op == "ReduceMean" ? "Mean" : op == "ReduceMax" ? "Max" : op == "ReduceMin" ? "Min" : "Sum";
    out = lw.Reduce(kind, x);
    if (op == "ReduceL2") out = lw.Unary("Sqrt", out);
    if (n.GetInt("keepdims", 1) == 0) lw.squeezed.insert(out);
  } else if (op == "GlobalAveragePool" || op == "GlobalMaxPool") {
    // A mean / max over the spatial axes 2.., merged into one row (reduce_trailing).
    int x = in(0);
    const int64_t r = lw.trailing > 1 ? lw.rank : static_cast<int64_t>(lw.prims[x].shape.size());
    if (r < 3 || r - lw.trailing != 2) return fail("pooling whose spatial axes are not the reduced trailing axes");
    out = lw.Reduce(op == "GlobalAveragePool" ? "Mean" : "Max", x);
  } else if (op == "Softmax" || op == "LogSoftmax") {
    int x = in(0);
    // Before opset 13, Softmax(axis=k) normalizes over all of the axes k.. (flattened).
    int64_t axis = n.GetInt("axis", opset >= 13 ? -1 : 1);
    const bool merged = lw.trailing > 1 && opset < 13 && (axis < 0 ? axis + lw.rank : axis) == lw.rank - lw.trailing;
    if (!merged && (lw.trailing > 1 || !IsLastAxis(axis, lw.prims[x].shape.size())))
      return fail("softmax over an axis other than the last");
    int m = lw.Reduce("Max", x);
    int d = lw.Binary("Sub", x, m);
    int e = lw.Unary("Exp", d);
    int s = lw.Reduce("Sum", e);
    out = op == "Softmax" ? lw.Binary("Div", e, s) : lw.Binary("Sub", d, lw.Unary("Log", s));
  } else if (op == "LayerNormalization") {
    int x = in(0);
    // LayerNormalization(axis=k) normalizes over the axes k.. together.
    const int64_t axis = n.GetInt("axis", -1);
    const bool merged = lw.trailing > 1 && (axis < 0 ? axis + lw.rank : axis) == lw.rank - lw.trailing;
    if (!merged && (lw.trailing > 1 || !IsLastAxis(axis, lw.prims[x].shape.size())))
      return fail("LayerNormalization over more than the last axis");
    for (size_t o = 1; o < n.outputs.size(); ++o)
      if (!n.outputs[o].empty()) return fail("LayerNormalization's Mean/InvStdDev outputs");
    int mean = lw.Reduce("Mean", x);
    int d = lw.Binary("Sub", x, mean);
    int var = lw.Reduce("Mean", lw.Binary("Mul", d, d));
    int inv = lw.Unary("Reciprocal", lw.Unary("Sqrt", lw.Binary("Add", var, lw.Const(n.GetFloat("epsilon", 1e-5f)))));
    out = lw.Binary("Mul", d, inv);
    if (n.HasInput(1)) out = lw.Binary("Mul", out, in(1));
    if (n.HasInput(2)) out = lw.Binary("Add", out, in(2));
  } else if (op == "BatchNormalization") {
    if (n.GetInt("training_mode", 0) != 0) return fail("BatchNormalization in training mode");
    for (size_t o = 1; o < n.outputs.size(); ++o)
      if (!n.outputs[o].empty()) return fail("BatchNormalization's running statistics outputs");
    if (n.inputs.size() < 5) return fail("BatchNormalization expects 5 inputs");
    int inv = lw.Unary("Reciprocal", lw.Unary("Sqrt", lw.Binary("Add", in(4), lw.Const(n.GetFloat("epsilon", 1e-5f)))));
    out = lw.Binary("Add", lw.Binary("Mul", lw.Binary("Sub", in(0), in(3)), lw.Binary("Mul", in(1), inv)), in(2));
  } else if (op == "Slice") {
    // Only a contiguous slice of the last axis: the value at column j is the operand's at j + start.
    int x = in(0);
    Shape xs = lw.prims[x].shape;
    if (xs.empty()) return fail("Slice of a scalar");
    std::vector<int64_t> starts, ends, axes, steps;
    if (opset < 10 || !n.HasInput(1)) {
      starts = n.GetInts("starts");
      ends = n.GetInts("ends");
      axes = n.GetInts("axes");
    } else {
      auto read = [&](size_t i, std::vector<int64_t>* v) {
        if (!n.HasInput(i)) return true;
        auto it = consts.find(n.inputs[i]);
        if (it == consts.end()) return false;
        *v = it->second->ToInt64s();
        return true;
      };
      if (!read(1, &starts) || !read(2, &ends) || !read(3, &axes) || !read(4, &steps))
        return fail("Slice bounds are not constants");
    }
    if (axes.empty()) for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
    if (starts.size() != 1 || ends.size() != 1 || axes.size() != 1 || !IsLastAxis(axes[0], xs.size()))
      return fail("only slices of the last axis are generated");
    if (!steps.empty() && steps[0] != 1) return fail("Slice with a step other than 1");
    int64_t w = xs.back();
    int64_t b = starts[0] < 0 ? starts[0] + w : starts[0];
    int64_t e = ends[0] < 0 ? ends[0] + w : ends[0];
    b = std::clamp<int64_t>(b, 0, w);
    e = std::clamp<int64_t>(e, 0, w);
    if (e <= b) return fail("empty Slice");
    Prim p(Prim::kSlice);
    p.a = x;
    p.offset = b;
    p.shape = xs;
    p.shape.back() = e - b;
    out = lw.Add(p);
  } else if (op == "Concat") {
    if (n.inputs.size() != 2) return fail("only Concat of two operands is generated");
    int a = in(0), b = in(1);
    const Shape &as = lw.prims[a].shape, &bs = lw.prims[b].shape;
    if (as.size() != bs.size() || as.empty() || !IsLastAxis(n.GetInt("axis", 0), as.size()))
      return fail("only Concat along the last axis is generated");
    Prim p(Prim::kConcat);
    p.a = a;
    p.b = b;
    p.offset = as.back();
    p.shape = Lowering::Broadcast(as, bs);
    p.shape.back() = as.back() + bs.back();
    out = lw.Add(p);
  } else {
    return fail(fmt::format("operator {} is not supported by the row code generator", op));
  }
  if (out < 0) return fail("missing operand");
  if (n.outputs.size() > 1 && op != "Dropout" && op != "LayerNormalization" && op != "BatchNormalization")
    return fail("multiple outputs");
  lw.id[n.outputs[0]] = out;
  return true;
}

std::string FloatLiteral(double v) {
  if (std::isinf(v)) return v > 0 ? "INFINITY" : "(-INFINITY)";
  if (std::isnan(v)) return "NAN";
  std::string s = fmt::format("{:.9g}", static_cast<float>(v));
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s + "f";
}

}  // namespace

// float16/bfloat16 values reach a fused kernel as float32: the runtime widens them before the call
// and narrows the outputs after it (KernelInfo::upcast_half), so the generated code sees floats.
static bool ComputedAsFloat(DataType t) {
  return t == DataType::kFloat || t == DataType::kFloat16 || t == DataType::kBFloat16;
}
// Inputs generated code can read: float values, and bool masks (Where's condition).
static bool Readable(DataType t) { return ComputedAsFloat(t) || t == DataType::kBool; }

GeneratedRowKernel GenerateRowKernel(const RowKernelRequest& req, const std::string& symbol) {
  GeneratedRowKernel g;
  g.symbol = symbol;
  if (!IsKernelSymbol(symbol)) {
    g.reason = "the kernel symbol is not a C identifier";
    return g;
  }
  const Function& f = *req.function;
  for (const Node& n : f.nodes) g.ops_summary += (g.ops_summary.empty() ? "" : ",") + n.op_type;
  size_t nin = f.inputs.size();
  if (req.input_shapes.size() != nin || req.input_types.size() != nin) {
    g.reason = "input count mismatch";
    return g;
  }
  g.signature.input_bool.assign(nin, false);
  // Per-channel parameters ([C]) of BatchNormalization broadcast along axis 1, not the last: they
  // are viewed as [C,1,...,1] (same data), which the row model then reads as one value per row.
  std::vector<Shape> shapes = req.input_shapes;
  g.input_views.assign(nin, Shape{});
  {
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
            shapes[i] = g.input_views[i] = view;
          }
    }
  }
  // Reductions over several trailing axes (global pooling: ReduceMean axes=[2,3]): those axes are
  // merged into one row when every reduction uses the same ones and every input is whole or
  // broadcast over them.
  int64_t domain_rank = 0;
  for (size_t i = 0; i < nin; ++i)
    if (Readable(req.input_types[i])) domain_rank = std::max<int64_t>(domain_rank, shapes[i].size());
  {
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
    if (seen.size() == 1 && !last_axis_ops) {
      const std::vector<int64_t>& axes = *seen.begin();
      const int64_t t = static_cast<int64_t>(axes.size());
      bool trailing = t > 1 && axes.back() == domain_rank - 1 && axes.front() == domain_rank - t;
      for (size_t k = 1; trailing && k < axes.size(); ++k) trailing = axes[k] == axes[k - 1] + 1;
      if (trailing) {
        std::vector<size_t> idx;
        std::vector<Shape> dom;
        for (size_t i = 0; i < nin; ++i) {
          if (!Readable(req.input_types[i])) continue;
          // Lower-rank inputs align to the right (numpy broadcasting), as MergeLastAxes pads them.
          idx.push_back(i);
          dom.push_back(shapes[i]);
        }
        if (!MergeLastAxes(dom, static_cast<size_t>(t))) {
          g.reason = "an input is broadcast within the reduced axes";
          return g;
        }
        for (size_t k = 0; k < idx.size(); ++k) shapes[idx[k]] = dom[k];
        g.reduce_trailing = static_cast<int>(t);
      }
    }
  }
  // Purely elementwise bodies: trailing axes over which every input is either whole or broadcast
  // are merged into one row (a conv output [N,C,H,W] with per-channel [C,1,1] parameters becomes
  // rows of H*W), so rows are long and per-row work is rare.
  {
    static const std::set<std::string> kRowwise = {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceSumSquare",
                                                   "ReduceL2", "Softmax", "LogSoftmax", "LayerNormalization", "Slice", "Concat",
                                                   "GlobalAveragePool", "GlobalMaxPool"};
    bool elementwise = true;
    for (const Node& n : f.nodes) elementwise &= !kRowwise.count(n.op_type);
    std::vector<size_t> idx;
    std::vector<Shape> dom;
    for (size_t i = 0; i < nin; ++i) {
      const Tensor* c = req.constants.size() > i ? req.constants[i] : nullptr;
      if ((c != nullptr && c->numel() == 1) || !Readable(req.input_types[i])) continue;
      idx.push_back(i);
      dom.push_back(shapes[i]);
    }
    if (elementwise && !dom.empty()) {
      std::vector<Shape> col = CollapseTrailing(dom);
      if (col[0].size() != std::max_element(dom.begin(), dom.end(), [](const Shape& a, const Shape& b) {
            return a.size() < b.size();
          })->size()) {
        g.collapse = true;
        for (size_t k = 0; k < idx.size(); ++k) shapes[idx[k]] = col[k];
      }
    }
  }
  // The domain is formed by non-constant inputs (constants only broadcast into it).
  std::vector<Shape> varying;
  g.domain_inputs.assign(nin, false);
  for (size_t i = 0; i < nin; ++i) {
    const Tensor* c = req.constants.size() > i ? req.constants[i] : nullptr;
    bool scalar_const = c != nullptr && c->numel() == 1;
    bool int_const = c != nullptr && !Readable(req.input_types[i]);
    if (scalar_const || int_const) continue;
    varying.push_back(shapes[i]);
    g.domain_inputs[i] = true;
  }
  Shape full;
  int64_t rows = 0, cols = 0;
  if (!RowDomain(varying, &full, &rows, &cols, &g.reason)) return g;

  Lowering lw;
  std::map<std::string, const Tensor*> consts;
  std::vector<int> input_prim(nin, -1);
  for (size_t i = 0; i < nin; ++i) {
    const Tensor* c = req.constants.size() > i ? req.constants[i] : nullptr;
    if (c != nullptr) consts[f.inputs[i]] = c;
    if (c != nullptr && c->numel() == 1 && c->dtype() != DataType::kString) {
      lw.id[f.inputs[i]] = lw.Const(c->ScalarAsDouble());
      continue;
    }
    if (!Readable(req.input_types[i])) {
      if (c != nullptr) continue;  // integer constant tensors (axes) are read at lowering time
      g.reason = fmt::format("input {} ('{}') is {}; generated kernels take float32 (and bool conditions)", i,
                             f.inputs[i], DataTypeName(req.input_types[i]));
      return g;
    }
    Prim p(Prim::kInput);
    p.input = static_cast<int>(i);
    p.shape = shapes[i];
    lw.id[f.inputs[i]] = input_prim[i] = lw.Add(p);
    if (req.input_types[i] == DataType::kBool) {
      lw.bools.insert(input_prim[i]);
      g.signature.input_bool[i] = true;
    }
    // A half-typed input arrives widened; rounding it again changes nothing for a value that came
    // from a float16 tensor and rounds one that a library stage (a Conv, a MatMul) of the same
    // kernel computed in float32, as the unfused operator's float16 output would be.
    if (req.input_types[i] == DataType::kFloat16 || req.input_types[i] == DataType::kBFloat16)
      lw.id[f.inputs[i]] = lw.Unary(req.input_types[i] == DataType::kFloat16 ? "RoundHalf" : "RoundBFloat16", input_prim[i]);
  }
  lw.rank = domain_rank;
  lw.trailing = g.reduce_trailing;
  // Values typed float16/bfloat16 in the body are rounded to that type where their operator ends,
  // as the unfused operators' outputs are (each is computed in float32 and stored narrowed): the
  // kernel then follows the graph's own precision, not a more precise one that differs from it.
  std::map<std::string, DataType> vtype;
  for (size_t i = 0; i < nin; ++i) vtype[f.inputs[i]] = req.input_types[i];
  auto is_half = [](DataType t) { return t == DataType::kFloat16 || t == DataType::kBFloat16; };
  for (const Node& n : f.nodes) {
    if (!LowerNode(n, lw, consts, req.opset)) {
      g.reason = lw.error;
      return g;
    }
    DataType t = DataType::kFloat;
    if (n.op_type == "Cast") {
      t = static_cast<DataType>(n.GetInt("to", 1));
    } else {
      for (size_t i = n.op_type == "Where" ? 1 : 0; i < n.inputs.size(); ++i) {
        auto it = vtype.find(n.inputs[i]);
        if (it != vtype.end() && (it->second == DataType::kFloat || is_half(it->second))) {
          t = it->second;
          break;
        }
      }
      if (is_half(t) && !n.outputs.empty() && lw.id.count(n.outputs[0]))
        lw.id[n.outputs[0]] = lw.Unary(t == DataType::kFloat16 ? "RoundHalf" : "RoundBFloat16", lw.id[n.outputs[0]]);
    }
    for (const std::string& o : n.outputs)
      if (!o.empty()) vtype[o] = t;
  }

  // Bool inputs may only be Where's condition.
  for (const Prim& p : lw.prims)
    for (int operand : {p.a, p.b})
      if (operand >= 0 && lw.bools.count(operand)) {
        g.reason = "a bool input used other than as Where's condition";
        return g;
      }
  // A keepdims=0 reduction changes how its result broadcasts: it may only be an output.
  for (const Prim& p : lw.prims)
    for (int operand : {p.a, p.b, p.c})
      if (operand >= 0 && lw.squeezed.count(operand)) {
        g.reason = "a keepdims=0 reduction is read inside the group";
        return g;
      }
  // Classify inputs, derive kinds and levels.
  std::vector<std::vector<int64_t>> dummy(nin);
  g.signature.inputs.assign(nin, RowInputClass::kScalar);
  for (size_t i = 0; i < nin; ++i)
    if (input_prim[i] >= 0) g.signature.inputs[i] = ClassifyRowInput(shapes[i], full, &dummy[i]);
  auto& P = lw.prims;
  for (Prim& p : P) {
    switch (p.kind) {
      case Prim::kInput: {
        RowInputClass c = g.signature.inputs[p.input];
        p.vkind = (c == RowInputClass::kFull || c == RowInputClass::kRowVec || c == RowInputClass::kGeneral)
                      ? VKind::kRow : VKind::kScal;
        p.level = 0;
        break;
      }
      case Prim::kConst: p.vkind = VKind::kScal; p.level = 0; break;
      case Prim::kUnary: p.vkind = P[p.a].vkind; p.level = P[p.a].level; break;
      case Prim::kBinary:
        p.vkind = (P[p.a].vkind == VKind::kRow || P[p.b].vkind == VKind::kRow || (p.c >= 0 && P[p.c].vkind == VKind::kRow))
                      ? VKind::kRow : VKind::kScal;
        p.level = std::max({P[p.a].level, P[p.b].level, p.c >= 0 ? P[p.c].level : 0});
        break;
      case Prim::kSlice:
      case Prim::kConcat:
        if (P[p.a].vkind != VKind::kRow || (p.b >= 0 && P[p.b].vkind != VKind::kRow)) {
          g.reason = "Slice/Concat of a value that is constant along the row";
          return g;
        }
        p.vkind = VKind::kRow;
        p.level = std::max(P[p.a].level, p.b >= 0 ? P[p.b].level : 0);
        break;
      case Prim::kReduce:
        if (P[p.a].vkind != VKind::kRow) {
          g.reason = "a reduction over a dimension of size 1";
          return g;
        }
        p.vkind = VKind::kScal;
        p.level = P[p.a].level + 1;
        break;
    }
  }
  // Outputs must have the domain's shape (rows) or the domain's shape with last dim 1 (per row).
  std::vector<int> out_prim;
  for (const std::string& o : f.outputs) {
    auto it = lw.id.find(o);
    if (it == lw.id.end()) {
      g.reason = fmt::format("output '{}' is not computed by supported operators", o);
      return g;
    }
    const Prim& p = P[it->second];
    Shape per_row = full;
    per_row.back() = 1;
    bool is_row = p.vkind == VKind::kRow;
    g.signature.output_squeezed.push_back(lw.squeezed.count(it->second) > 0);
    if ((is_row && p.shape != full) || (!is_row && p.shape != per_row) || p.kind == Prim::kInput ||
        p.kind == Prim::kConst) {
      g.reason = fmt::format("output '{}' has shape {}, not the group's row domain {}", o, ShapeToString(p.shape),
                             ShapeToString(full));
      return g;
    }
    out_prim.push_back(it->second);
    g.signature.output_per_row.push_back(!is_row);
  }

  // Narrow values (a Slice's part of the row) may only feed other narrow values, Slice or Concat.
  auto narrow = [&](int v) { return P[v].vkind == VKind::kRow && !P[v].shape.empty() && P[v].shape.back() != cols; };
  for (size_t v = 0; v < P.size(); ++v) {
    const Prim& p = P[v];
    if (p.kind == Prim::kInput && narrow(static_cast<int>(v))) {
      g.reason = fmt::format("input {} has rows of width {}, the group's rows are {} wide", p.input, p.shape.back(), cols);
      return g;
    }
    bool consumer_ok = p.kind == Prim::kSlice || p.kind == Prim::kConcat || narrow(static_cast<int>(v));
    for (int operand : {p.a, p.b, p.c})
      if (operand >= 0 && narrow(operand) && !consumer_ok) {
        g.reason = "part of a row (a Slice) is used other than through Concat back to the full row";
        return g;
      }
  }
  // Which row values are read by a later loop (buffered), which prims are live at all.
  int max_level = 0;
  std::vector<bool> live(P.size(), false);
  std::vector<int> stack(out_prim.begin(), out_prim.end());
  while (!stack.empty()) {
    int v = stack.back();
    stack.pop_back();
    if (live[v]) continue;
    live[v] = true;
    if (P[v].a >= 0) stack.push_back(P[v].a);
    if (P[v].b >= 0) stack.push_back(P[v].b);
    if (P[v].c >= 0) stack.push_back(P[v].c);
  }
  std::vector<bool> buffered(P.size(), false);
  for (size_t v = 0; v < P.size(); ++v) {
    if (!live[v]) continue;
    max_level = std::max(max_level, P[v].level);
    int loop_level = P[v].kind == Prim::kReduce ? P[P[v].a].level : P[v].level;
    for (int operand : {P[v].a, P[v].b, P[v].c})
      if (operand >= 0 && P[operand].vkind == VKind::kRow && P[operand].kind != Prim::kInput &&
          P[operand].level < loop_level)
        buffered[operand] = true;
  }
  std::map<int, int> out_index;
  for (size_t k = 0; k < out_prim.size(); ++k) out_index.emplace(out_prim[k], static_cast<int>(k));

  // ---- emit ----
  int cur_level = 0;
  auto ref = [&](int v) -> std::string {
    const Prim& p = P[v];
    if (p.kind == Prim::kConst) return FloatLiteral(p.value);
    if (p.vkind == VKind::kScal) return fmt::format("s{}", v);
    if (p.kind == Prim::kInput) {
      RowInputClass c = g.signature.inputs[p.input];
      return c == RowInputClass::kRowVec ? fmt::format("in{}[j]", p.input) : fmt::format("p{}[j]", p.input);
    }
    return p.level < cur_level ? fmt::format("buf{}[j]", v) : fmt::format("t{}", v);
  };
  auto expr_of = [&](const Prim& p, const std::string& a, const std::string& b, const std::string& c) -> std::string {
    if (p.kind == Prim::kBinary) {
      if (p.op == "Where") return fmt::format("({} ? {} : {})", c, a, b);
      if (p.op == "Add") return a + " + " + b;
      if (p.op == "Sub") return a + " - " + b;
      if (p.op == "Mul") return a + " * " + b;
      if (p.op == "Div") return a + " / " + b;
      // Comparisons rather than std::fmax/fmin: those are library calls unless -ffinite-math-only.
      if (p.op == "Max") return fmt::format("({0} > {1} ? {0} : {1})", a, b);
      if (p.op == "Min") return fmt::format("({0} < {1} ? {0} : {1})", a, b);
      if (p.op == "Pow") return fmt::format("std::pow({}, {})", a, b);
    }
    if (p.op == "Relu") return fmt::format("({0} > 0.f ? {0} : 0.f)", a);
    if (p.op == "Neg") return "-" + a;
    if (p.op == "Abs") return fmt::format("std::fabs({})", a);
    if (p.op == "Sqrt") return fmt::format("std::sqrt({})", a);
    if (p.op == "Reciprocal") return fmt::format("1.f / {}", a);
    const char* ns = req.approx_math ? "gaf_approx" : "gaf_fast";
    if (p.op == "Exp") return fmt::format("{}::FastExp({})", ns, a);
    if (p.op == "Log") return fmt::format("std::log({})", a);
    if (p.op == "Tanh") return fmt::format("{}::FastTanh({})", ns, a);
    if (p.op == "Sigmoid") return fmt::format("{}::FastSigmoid({})", ns, a);
    if (p.op == "Erf") return fmt::format("{}::FastErf({})", ns, a);
    if (p.op == "Softplus") return fmt::format("std::log1p({}::FastExp({}))", ns, a);
    if (p.op == "Floor") return fmt::format("std::floor({})", a);
    if (p.op == "Ceil") return fmt::format("std::ceil({})", a);
    if (p.op == "LeakyRelu") return fmt::format("({0} >= 0.f ? {0} : {0} * {1})", a, FloatLiteral(p.alpha));
    if (p.op == "HardSigmoid")
      return fmt::format("gaf_clamp01({} * {} + {})", a, FloatLiteral(p.alpha), FloatLiteral(p.beta));
    if (p.op == "RoundHalf") return fmt::format("gaf_round_half({})", a);
    if (p.op == "RoundBFloat16") return fmt::format("gaf_round_bf16({})", a);
    return "/*unknown*/0.f";
  };
  // Values under a Slice or Concat of the last axis are emitted inline at a shifted column index
  // (`idx`); "narrow" values (row width other than the domain's) exist only there.
  std::string emit_error;
  std::function<std::string(int, const std::string&)> inl = [&](int v, const std::string& idx) -> std::string {
    const Prim& p = P[v];
    bool indexed = p.kind == Prim::kSlice || p.kind == Prim::kConcat || narrow(v);
    if (idx == "j" && !indexed) return ref(v);
    if (p.kind == Prim::kConst || p.vkind == VKind::kScal) return ref(v);
    switch (p.kind) {
      case Prim::kInput: {
        RowInputClass c = g.signature.inputs[p.input];
        return c == RowInputClass::kRowVec ? fmt::format("in{}[{}]", p.input, idx) : fmt::format("p{}[{}]", p.input, idx);
      }
      case Prim::kSlice: return inl(p.a, fmt::format("({} + {})", idx, p.offset));
      case Prim::kConcat:
        return fmt::format("(({0}) < {1} ? {2} : {3})", idx, p.offset, inl(p.a, idx),
                           inl(p.b, fmt::format("({} - {})", idx, p.offset)));
      default: break;
    }
    if (p.level < cur_level) {
      if (buffered[v]) return fmt::format("buf{}[{}]", v, idx);
      emit_error = "a Slice/Concat of a value computed before a reduction";
      return "0.f";
    }
    return expr_of(p, inl(p.a, idx), p.b >= 0 ? inl(p.b, idx) : "", p.c >= 0 ? inl(p.c, idx) : "");
  };
  auto expr = [&](const Prim& p) -> std::string {
    if (p.kind == Prim::kSlice || p.kind == Prim::kConcat) return inl(static_cast<int>(&p - P.data()), "j");
    return expr_of(p, p.a >= 0 ? ref(p.a) : "", p.b >= 0 ? ref(p.b) : "", p.c >= 0 ? ref(p.c) : "");
  };

  std::ostringstream os;
  // No string from the model (function, node or value names, doc strings) is ever written into
  // generated code, not even into comments: the source depends on the body's structure only.
  os << "// Generated by graph-autofusion: fused row kernel\n";
  os << "// Row domain " << ShapeToString(full) << " at generation; input classes:";
  for (size_t i = 0; i < nin; ++i) os << " " << static_cast<int>(g.signature.inputs[i]);
  os << "\n#include <omp.h>\n#include <cmath>\n#include <cstdint>\n#include <cstdlib>\n";
  os << kFastMathSource << "\n";
  if (req.approx_math)
    os << "#include <cstring>\n"
          "// math=approx: deliberately low-precision functions (Schraudolph 1999 exp, ~4% error).\n"
          "namespace gaf_approx {\n"
          "inline float FastExp(float x) {\n"
          "  x = x < -87.f ? -87.f : (x > 88.f ? 88.f : x);\n"
          "  int32_t i = static_cast<int32_t>(12102203.f * x + 1065353216.f);\n"
          "  float f; std::memcpy(&f, &i, 4); return f;\n}\n"
          "inline float FastSigmoid(float x) { return 1.f / (1.f + FastExp(-x)); }\n"
          "inline float FastTanh(float x) { return 2.f * FastSigmoid(2.f * x) - 1.f; }\n"
          "inline float FastErf(float x) { return FastTanh(1.1283792f * x); }\n"
          "}  // namespace gaf_approx\n";
  os << "static inline float gaf_clamp01(float x) { return x < 0.f ? 0.f : (x > 1.f ? 1.f : x); }\n";
  // Rounding to float16 / bfloat16 and back (Cast inside a body), round to nearest even.
  os << "#include <cstring>\n"
        "#if defined(__F16C__)\n#include <immintrin.h>\n"
        "static inline float gaf_round_half(float x) { return _cvtsh_ss(_cvtss_sh(x, 0)); }\n"
        "#else\n"
        "static inline float gaf_round_half(float x) { return static_cast<float>(static_cast<_Float16>(x)); }\n"
        "#endif\n"
        "static inline float gaf_round_bf16(float x) {\n"
        "  uint32_t u; std::memcpy(&u, &x, 4);\n"
        "  if ((u & 0x7fffffffu) > 0x7f800000u) return x;  // NaN stays NaN\n"
        "  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;\n"
        "  std::memcpy(&x, &u, 4); return x;\n}\n";
  os << "struct RowKernelArgs { int64_t rows, cols; const float* const* in; const int64_t* const* in_row_offset; "
        "float* const* out; };\n";
  // Rows [r0, r1) in one function; the entry point calls it directly for small work (an OpenMP
  // region costs more than a few thousand elements) and splits the rows over threads otherwise.
  // Columns [c0, c1) of each row: the whole row, except when a fused convolution hands an
  // elementwise epilogue one finished tile at a time (entry point <symbol>_tile).
  os << "static void rows_" << symbol << "(const RowKernelArgs* a, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {\n";
  os << "  const int64_t N = a->cols;\n  (void)N;\n";
  for (size_t i = 0; i < nin; ++i) {
    if (input_prim[i] < 0 || !live[input_prim[i]]) continue;
    if (g.signature.input_bool[i])
      os << fmt::format("  const bool* __restrict in{0} = reinterpret_cast<const bool*>(a->in[{0}]);\n", i);
    else
      os << fmt::format("  const float* __restrict in{0} = a->in[{0}];\n", i);
    RowInputClass c = g.signature.inputs[i];
    if (c == RowInputClass::kGeneral || c == RowInputClass::kGeneralPerRow)
      os << fmt::format("  const int64_t* off{0} = a->in_row_offset[{0}];\n", i);
  }
  for (size_t k = 0; k < out_prim.size(); ++k) os << fmt::format("  float* __restrict out{0} = a->out[{0}];\n", k);
  os << "  {\n";
  // Row buffers: on the stack for rows up to 2048 floats, else from the heap.
  for (size_t v = 0; v < P.size(); ++v)
    if (buffered[v])
      os << fmt::format("    alignas(64) float stack{0}[2048];\n"
                        "    float* buf{0} = N <= 2048 ? stack{0} : static_cast<float*>(std::aligned_alloc(64, ((N * 4 + 63) / 64) * 64));\n",
                        v);
  os << "    for (int64_t r = r0; r < r1; ++r) {\n";
  for (size_t i = 0; i < nin; ++i) {
    if (input_prim[i] < 0 || !live[input_prim[i]]) continue;
    int v = input_prim[i];
    switch (g.signature.inputs[i]) {
      case RowInputClass::kFull: os << fmt::format("      const auto* p{0} = in{0} + r * N;\n", i); break;
      case RowInputClass::kGeneral: os << fmt::format("      const auto* p{0} = in{0} + off{0}[r];\n", i); break;
      case RowInputClass::kRowVec: break;
      case RowInputClass::kPerRow: os << fmt::format("      const float s{} = in{}[r];\n", v, i); break;
      case RowInputClass::kScalar: os << fmt::format("      const float s{} = in{}[0];\n", v, i); break;
      case RowInputClass::kGeneralPerRow: os << fmt::format("      const float s{} = in{}[off{}[r]];\n", v, i, i); break;
    }
  }
  for (int level = 0; level <= max_level; ++level) {
    cur_level = level;
    // Row scalars available before this loop.
    for (size_t v = 0; v < P.size(); ++v) {
      const Prim& p = P[v];
      if (!live[v] || p.vkind != VKind::kScal || p.level != level) continue;
      if (p.kind == Prim::kUnary || p.kind == Prim::kBinary) os << fmt::format("      const float s{} = {};\n", v, expr(p));
      if (out_index.count(static_cast<int>(v))) os << fmt::format("      out{}[r] = s{};\n", out_index[v], v);
    }
    // The fused loop of this level: row values and reduction accumulations.
    std::vector<int> row_ops, reds;
    for (size_t v = 0; v < P.size(); ++v) {
      if (!live[v]) continue;
      if (P[v].vkind == VKind::kRow && P[v].level == level && P[v].kind != Prim::kInput && !narrow(static_cast<int>(v)))
        row_ops.push_back(v);
      if (P[v].kind == Prim::kReduce && P[P[v].a].level == level) reds.push_back(v);
    }
    if (row_ops.empty() && reds.empty()) continue;
    std::string clauses;
    for (int v : reds) {
      const std::string& op = P[v].op;
      std::string init = op == "Max" ? "-INFINITY" : op == "Min" ? "INFINITY" : "0.f";
      os << fmt::format("      float acc{} = {};\n", v, init);
      clauses += fmt::format(" reduction({}:acc{})", op == "Max" ? "max" : op == "Min" ? "min" : "+", v);
    }
    os << "#pragma omp simd" << clauses << "\n      for (int64_t j = c0; j < c1; ++j) {\n";
    for (int v : row_ops) {
      os << fmt::format("        const float t{} = {};\n", v, expr(P[v]));
      if (buffered[v]) os << fmt::format("        buf{0}[j] = t{0};\n", v);
      if (out_index.count(v)) os << fmt::format("        out{}[r * N + j] = t{};\n", out_index[v], v);
    }
    for (int v : reds) {
      const std::string& op = P[v].op;
      std::string x = ref(P[v].a);
      if (op == "Max") os << fmt::format("        acc{0} = acc{0} > {1} ? acc{0} : {1};\n", v, x);
      else if (op == "Min") os << fmt::format("        acc{0} = acc{0} < {1} ? acc{0} : {1};\n", v, x);
      else os << fmt::format("        acc{} += {};\n", v, x);
    }
    os << "      }\n";
    for (int v : reds)
      os << fmt::format("      const float s{0} = acc{0}{1};\n", v, P[v].op == "Mean" ? " / static_cast<float>(N)" : "");
  }
  os << "    }\n";
  for (size_t v = 0; v < P.size(); ++v)
    if (buffered[v]) os << fmt::format("    if (buf{0} != stack{0}) std::free(buf{0});\n", v);
  os << "  }\n}\n";
  os << "extern \"C\" void " << symbol << "(const RowKernelArgs* a) {\n"
     << "  const int64_t R = a->rows, N = a->cols;\n"
     << "  if (R == 1 || R * N <= 8192 || omp_in_parallel()) {\n    rows_" << symbol << "(a, 0, R, 0, N);\n    return;\n  }\n"
     << "#pragma omp parallel\n  {\n"
     << "    const int64_t t = omp_get_thread_num(), n = omp_get_num_threads();\n"
     << "    rows_" << symbol << "(a, R * t / n, R * (t + 1) / n, 0, N);\n  }\n}\n";
  os << "extern \"C\" void " << symbol << "_tile(const RowKernelArgs* a, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {\n"
     << "  rows_" << symbol << "(a, r0, r1, c0, c1);\n}\n";
  if (!emit_error.empty()) {
    g.reason = emit_error;
    return g;
  }
  g.source = os.str();
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
      GAF_CHECK(MergeLastAxes(shapes, static_cast<size_t>(k.reduce_trailing)),
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
