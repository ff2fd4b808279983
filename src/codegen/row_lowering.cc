// Stage 2 of the row-kernel generator: the body's nodes lowered into primitives (row_program.h).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "codegen/row_program.h"

namespace gaf {
namespace rowgen {

namespace {

// The one table of primitive ops. plain_onnx: an ai.onnx node of that name lowers to exactly this
// primitive (the others come from nodes with attributes or constant operands, or from rounding).
constexpr PrimOpInfo kPrimOps[] = {
    {PrimOp::kRelu, "Relu", 1, true},
    {PrimOp::kNeg, "Neg", 1, true},
    {PrimOp::kAbs, "Abs", 1, true},
    {PrimOp::kSqrt, "Sqrt", 1, true},
    {PrimOp::kReciprocal, "Reciprocal", 1, true},
    {PrimOp::kExp, "Exp", 1, true},
    {PrimOp::kLog, "Log", 1, true},
    {PrimOp::kTanh, "Tanh", 1, true},
    {PrimOp::kSigmoid, "Sigmoid", 1, true},
    {PrimOp::kErf, "Erf", 1, true},
    {PrimOp::kSoftplus, "Softplus", 1, true},
    {PrimOp::kFloor, "Floor", 1, true},
    {PrimOp::kCeil, "Ceil", 1, true},
    {PrimOp::kLeakyRelu, "LeakyRelu", 1, false},      // alpha
    {PrimOp::kHardSigmoid, "HardSigmoid", 1, false},  // alpha, beta
    {PrimOp::kRoundHalf, "RoundHalf", 1, false},          // Cast to float16 (not an ONNX op)
    {PrimOp::kRoundBFloat16, "RoundBFloat16", 1, false},  // Cast to bfloat16 (not an ONNX op)
    {PrimOp::kIdentity, "Identity", 1, false},  // a rank change by leading ones, an Expand into the domain
    {PrimOp::kNot, "Not", 1, true},
    {PrimOp::kCast, "Cast", 1, false},  // to the primitive's value type (Cast nodes lower through it)
    {PrimOp::kAdd, "Add", 2, true},
    {PrimOp::kSub, "Sub", 2, true},
    {PrimOp::kMul, "Mul", 2, true},
    {PrimOp::kDiv, "Div", 2, true},
    {PrimOp::kMax, "Max", 2, true},
    {PrimOp::kMin, "Min", 2, true},
    {PrimOp::kPow, "Pow", 2, false},    // constant exponents are rewritten first
    {PrimOp::kEqual, "Equal", 2, true},
    {PrimOp::kLess, "Less", 2, true},
    {PrimOp::kLessOrEqual, "LessOrEqual", 2, true},
    {PrimOp::kGreater, "Greater", 2, true},
    {PrimOp::kGreaterOrEqual, "GreaterOrEqual", 2, true},
    {PrimOp::kAnd, "And", 2, true},
    {PrimOp::kOr, "Or", 2, true},
    {PrimOp::kXor, "Xor", 2, true},
    {PrimOp::kWhere, "Where", 3, false},  // Select
};

bool IsLastAxis(int64_t axis, size_t rank) {
  int64_t r = static_cast<int64_t>(rank);
  return axis == -1 || axis == r - 1;
}

PrimOp RoundOp(DataType t) { return t == DataType::kFloat16 ? PrimOp::kRoundHalf : PrimOp::kRoundBFloat16; }

bool IsComparison(PrimOp op) {
  return op == PrimOp::kEqual || op == PrimOp::kLess || op == PrimOp::kLessOrEqual || op == PrimOp::kGreater ||
         op == PrimOp::kGreaterOrEqual;
}
bool IsLogic(PrimOp op) { return op == PrimOp::kAnd || op == PrimOp::kOr || op == PrimOp::kXor || op == PrimOp::kNot; }

const char* VTypeName(VType t) {
  switch (t) {
    case VType::kF32: return "float";
    case VType::kI32: return "int32";
    case VType::kI64: return "int64";
    case VType::kBool: return "bool";
  }
  return "?";
}

// Which operand types a primitive accepts (ONNX's type constraints, restricted to what the
// generated code computes exactly as the reference kernels do): float ops on float; comparisons,
// Max/Min, Where, Identity and Cast on any type (Equal also on bool, the others not); And/Or/Xor/
// Not on bool; Add/Sub/Mul/Neg/Abs on float and int64 (int32 arithmetic is not generated: its
// wrap-around at 2^31 would be undefined behaviour in C++); reductions on float.
std::string TypeError(const std::vector<Prim>& P, const Prim& p) {
  auto vt = [&](int v) { return P[v].vt; };
  const PrimOpInfo* info = InfoOf(p.op);
  const std::string name = p.kind == PrimKind::kReduce ? "a reduction" : info ? info->name : "?";
  auto bad = [&](VType t) { return fmt::format("{} on {} values is not generated", name, VTypeName(t)); };
  switch (p.kind) {
    case PrimKind::kReduce: return vt(p.a) == VType::kF32 ? "" : bad(vt(p.a));
    case PrimKind::kConcat: return vt(p.a) == vt(p.b) ? "" : "Concat of values of different types";
    case PrimKind::kUnary: {
      const VType a = vt(p.a);
      if (p.op == PrimOp::kCast || p.op == PrimOp::kIdentity) return "";
      if (p.op == PrimOp::kNot) return a == VType::kBool ? "" : bad(a);
      if (p.op == PrimOp::kNeg || p.op == PrimOp::kAbs) return a == VType::kF32 || a == VType::kI64 ? "" : bad(a);
      return a == VType::kF32 ? "" : bad(a);
    }
    case PrimKind::kBinary: {
      const VType a = vt(p.a), b = vt(p.b);
      if (p.op == PrimOp::kWhere) {
        if (vt(p.c) != VType::kBool) return fmt::format("Where with a {} condition", VTypeName(vt(p.c)));
        return a == b ? "" : "Where selecting values of different types";
      }
      if (a != b) return fmt::format("{} of {} and {} values", name, VTypeName(a), VTypeName(b));
      if (p.op == PrimOp::kAnd || p.op == PrimOp::kOr || p.op == PrimOp::kXor) return a == VType::kBool ? "" : bad(a);
      if (p.op == PrimOp::kEqual) return "";
      if (IsComparison(p.op) || p.op == PrimOp::kMax || p.op == PrimOp::kMin) return a != VType::kBool ? "" : bad(a);
      if (p.op == PrimOp::kAdd || p.op == PrimOp::kSub || p.op == PrimOp::kMul)
        return a == VType::kF32 || a == VType::kI64 ? "" : bad(a);
      return a == VType::kF32 ? "" : bad(a);
    }
    default: return "";
  }
}

}  // namespace

const char* CTypeOf(VType t) {
  switch (t) {
    case VType::kF32: return "float";
    case VType::kI32: return "int32_t";
    case VType::kI64: return "int64_t";
    case VType::kBool: return "bool";
  }
  return "float";
}

bool VTypeOf(DataType t, VType* vt) {
  if (ComputedAsFloat(t)) *vt = VType::kF32;
  else if (t == DataType::kInt64) *vt = VType::kI64;
  else if (t == DataType::kInt32) *vt = VType::kI32;
  else if (t == DataType::kBool) *vt = VType::kBool;
  else return false;
  return true;
}

const PrimOpInfo* InfoOf(PrimOp op) {
  for (const PrimOpInfo& i : kPrimOps)
    if (i.op == op) return &i;
  return nullptr;
}

const PrimOpInfo* PlainOnnxOp(const std::string& op_type) {
  for (const PrimOpInfo& i : kPrimOps)
    if (i.plain_onnx && op_type == i.name) return &i;
  return nullptr;
}

int Lowering::Add(Prim p) {
  prims.push_back(std::move(p));
  return static_cast<int>(prims.size()) - 1;
}
int Lowering::Const(double v) {
  Prim p(PrimKind::kConst);
  p.value = v;
  p.shape = {1};
  return Add(p);
}
int Lowering::IntConst(int64_t v, VType vt) {
  Prim p(PrimKind::kConst);
  p.value = static_cast<double>(v);
  p.ivalue = v;
  p.vt = vt;
  p.shape = {1};
  return Add(p);
}
Shape Lowering::Broadcast(const Shape& a, const Shape& b) {
  size_t r = std::max(a.size(), b.size());
  Shape o(r);
  for (size_t i = 0; i < r; ++i) {
    int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    o[i] = da == 1 ? db : da;
  }
  return o;
}
int Lowering::Unary(PrimOp op, int a, float alpha, float beta) {
  if (a < 0) return -1;
  Prim p(PrimKind::kUnary);
  p.op = op;
  p.a = a;
  p.alpha = alpha;
  p.beta = beta;
  p.shape = prims[a].shape;
  p.vt = op == PrimOp::kNot ? VType::kBool : prims[a].vt;
  return Add(p);
}
int Lowering::Binary(PrimOp op, int a, int b) {
  if (a < 0 || b < 0) return -1;
  Prim p(PrimKind::kBinary);
  p.op = op;
  p.a = a;
  p.b = b;
  p.shape = Broadcast(prims[a].shape, prims[b].shape);
  p.vt = IsComparison(op) || IsLogic(op) ? VType::kBool : prims[a].vt;
  return Add(p);
}
int Lowering::Select(int cond, int x, int y) {
  if (cond < 0 || x < 0 || y < 0) return -1;
  Prim p(PrimKind::kBinary);
  p.op = PrimOp::kWhere;
  p.a = x;
  p.b = y;
  p.c = cond;
  p.shape = Broadcast(Broadcast(prims[x].shape, prims[y].shape), prims[cond].shape);
  p.vt = prims[x].vt;
  return Add(p);
}
int Lowering::Reduce(ReduceOp op, int a) {
  if (a < 0) return -1;
  Prim p(PrimKind::kReduce);
  p.reduce = op;
  p.a = a;
  p.shape = prims[a].shape;
  if (!p.shape.empty()) p.shape.back() = 1;
  return Add(p);
}

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

namespace {

// Lowers one body node into primitives; returns false with lw.error set. (The order in which
// primitives are created is their numbering in the generated source.)
bool LowerNode(const Node& n, Lowering& lw, const std::map<std::string, const Tensor*>& consts, int64_t opset) {
  // The primitive of input i, or -1 when the node has no such input (a malformed node fails with
  // "missing operand", never reads out of bounds).
  auto in = [&](size_t i) -> int {
    if (i >= n.inputs.size() || n.inputs[i].empty()) return -1;
    auto it = lw.id.find(n.inputs[i]);
    return it == lw.id.end() ? -1 : it->second;
  };
  auto fail = [&](const std::string& why) {
    lw.error = fmt::format("{}: {}", n.Describe(), why);
    return false;
  };
  auto const_ints = [&](size_t i, std::vector<int64_t>* v) {
    if (i >= n.inputs.size()) return false;
    auto it = consts.find(n.inputs[i]);
    if (it == consts.end()) return false;
    *v = it->second->ToInt64s();
    return true;
  };
  for (size_t i = 0; i < n.inputs.size(); ++i)
    if (!n.inputs[i].empty() && in(i) < 0 && !consts.count(n.inputs[i]))
      return fail(fmt::format("input '{}' is not available", n.inputs[i]));
  if (n.outputs.empty() || n.outputs[0].empty()) return fail("a node without an output");
  if (in(0) < 0) return fail("missing operand");
  const std::string& op = n.op_type;
  int out = -1;
  using O = PrimOp;
  if (!n.domain.empty()) return fail("operators outside ai.onnx are not supported by the row code generator");
  const size_t first_new = lw.prims.size();
  // A value of another shape but the same elements in the same order, which broadcasts the same
  // (leading ones added or removed: numpy broadcasting pads shapes with leading ones).
  auto same_broadcast = [](Shape a, Shape b) {
    while (!a.empty() && a.front() == 1) a.erase(a.begin());
    while (!b.empty() && b.front() == 1) b.erase(b.begin());
    return a == b;
  };
  auto reshaped = [&](int x, const Shape& s) {
    int v = lw.Unary(O::kIdentity, x);
    lw.prims[v].shape = s;
    return v;
  };
  if (op == "Identity" || op == "Dropout") {
    out = in(0);
  } else if (op == "Cast") {
    // Values are computed in float32: a Cast to float16/bfloat16 inside a body rounds the value to
    // that type's precision (and range), as the unfused Cast would; a Cast to float is exact.
    // Integers and bools are held as themselves: Cast between them and float converts as the
    // reference's static_cast (to bool: != 0).
    const int x = in(0);
    if (x < 0) return fail("missing operand");
    const DataType to = static_cast<DataType>(n.GetInt("to", 1));
    VType want;
    if (!VTypeOf(to, &want)) return fail(fmt::format("Cast to {}", DataTypeName(to)));
    auto cast = [&](int v, VType t) {
      if (lw.prims[v].vt == t) return v;
      int c = lw.Unary(O::kCast, v);
      lw.prims[c].vt = t;
      return c;
    };
    out = cast(x, want);
    if (to == DataType::kFloat16 || to == DataType::kBFloat16) out = lw.Unary(RoundOp(to), out);
  } else if (op == "Unsqueeze" || op == "Squeeze" || op == "Reshape") {
    // Inside the body (at the inputs they are views, PrepareRowBody): only leading ones.
    const int x = in(0);
    if (x < 0) return fail("missing operand");
    if (lw.trailing > 1) return fail("a rank change in a body whose reduced axes are merged");
    RowView view(1);
    Shape xs = lw.prims[x].shape, ys;
    std::vector<int64_t> v;
    std::string why;
    if (op == "Reshape") {
      if (!const_ints(1, &v)) return fail("the target shape is not a constant");
      for (size_t d = 0; d < v.size(); ++d)
        if (v[d] <= 0) return fail("a target shape with 0 or -1 inside the body");
      view[0].kind = RowViewStep::Kind::kReshape;
      view[0].target = v;
    } else {
      view[0].kind = op == "Unsqueeze" ? RowViewStep::Kind::kUnsqueeze : RowViewStep::Kind::kSqueeze;
      view[0].axes = n.GetInts("axes");
      if (n.HasInput(1) && !const_ints(1, &view[0].axes)) return fail("axes are not a constant");
    }
    if (!ApplyRowView(view, xs, &ys, &why)) return fail(why);
    if (!same_broadcast(xs, ys)) return fail("a rank change inside the body other than leading ones");
    out = reshaped(x, ys);
  } else if (op == "Expand") {
    // Expand to a shape the row domain already covers is a broadcast, which every row value is.
    const int x = in(0);
    std::vector<int64_t> t;
    if (x < 0) return fail("missing operand");
    if (!const_ints(1, &t)) return fail("the target shape is not a constant");
    if (lw.trailing > 1 || static_cast<int64_t>(lw.domain.size()) != lw.rank)
      return fail("Expand in a body whose axes are merged");
    Shape ys = Lowering::Broadcast(lw.prims[x].shape, Shape(t.begin(), t.end()));
    if (ys.size() > lw.domain.size()) return fail("Expand beyond the inputs' broadcast domain");
    for (size_t d = 0; d < ys.size(); ++d) {
      const int64_t dom = lw.domain[lw.domain.size() - ys.size() + d];
      if (ys[d] != 1 && ys[d] != dom) return fail("Expand beyond the inputs' broadcast domain");
    }
    out = reshaped(x, ys);
  } else if (op == "LeakyRelu") {
    out = lw.Unary(O::kLeakyRelu, in(0), n.GetFloat("alpha", 0.01f));
  } else if (op == "HardSigmoid") {
    out = lw.Unary(O::kHardSigmoid, in(0), n.GetFloat("alpha", 0.2f), n.GetFloat("beta", 0.5f));
  } else if (op == "HardSwish") {
    out = lw.Binary(O::kMul, in(0), lw.Unary(O::kHardSigmoid, in(0), 1.f / 6.f, 0.5f));
  } else if (op == "Gelu") {
    if (n.GetString("approximate", "none") != "none") return fail("Gelu approximate=tanh");
    int x = in(0);
    int e = lw.Unary(O::kErf, lw.Binary(O::kMul, x, lw.Const(M_SQRT1_2)));
    out = lw.Binary(O::kMul, lw.Binary(O::kMul, x, lw.Const(0.5)), lw.Binary(O::kAdd, e, lw.Const(1.0)));
  } else if (op == "Where") {
    const int cond = in(0), x = in(1), y = in(2);
    if (n.inputs.size() != 3) return fail("Where expects 3 inputs");
    if (cond < 0 || x < 0 || y < 0) return fail("Where with a constant tensor operand");
    out = lw.Select(cond, x, y);
  } else if (op == "Sum" || ((op == "Max" || op == "Min") && n.inputs.size() > 2)) {
    const O each = op == "Sum" ? O::kAdd : op == "Max" ? O::kMax : O::kMin;
    out = in(0);
    for (size_t i = 1; i < n.inputs.size(); ++i) out = lw.Binary(each, out, in(i));
  } else if (op == "Softsign") {
    out = lw.Binary(O::kDiv, in(0), lw.Binary(O::kAdd, lw.Unary(O::kAbs, in(0)), lw.Const(1.0)));
  } else if (op == "Pow") {
    if (n.inputs.size() != 2) return fail("Pow expects 2 inputs");
    int base = in(0), e = in(1);
    if (base < 0 || e < 0) return fail("missing operand");
    if (lw.prims[e].kind != PrimKind::kConst) return fail("Pow with a non-constant exponent");
    double ev = lw.prims[e].value;
    if (lw.prims[e].vt != VType::kF32) e = lw.Const(ev);  // an integer exponent: the same power
    if (ev == 2.0) out = lw.Binary(O::kMul, base, base);
    else if (ev == 3.0) out = lw.Binary(O::kMul, lw.Binary(O::kMul, base, base), base);
    else if (ev == 1.0) out = base;
    else if (ev == 0.5) out = lw.Unary(O::kSqrt, base);
    else if (ev == -1.0) out = lw.Unary(O::kReciprocal, base);
    else out = lw.Binary(O::kPow, base, e);
  } else if (op == "Clip") {
    if (n.inputs.size() > 3) return fail("Clip expects at most 3 inputs");
    out = in(0);
    if (opset < 11) {
      out = lw.Binary(O::kMax, out, lw.Const(n.GetFloat("min", -3.402823e38f)));
      out = lw.Binary(O::kMin, out, lw.Const(n.GetFloat("max", 3.402823e38f)));
    } else {
      if (n.HasInput(1)) out = lw.Binary(O::kMax, out, in(1));
      if (n.HasInput(2)) out = lw.Binary(O::kMin, out, in(2));
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
    if (op == "ReduceSumSquare" || op == "ReduceL2") x = lw.Binary(O::kMul, x, x);
    const ReduceOp kind = op == "ReduceMean" ? ReduceOp::kMean
                          : op == "ReduceMax" ? ReduceOp::kMax
                          : op == "ReduceMin" ? ReduceOp::kMin
                                              : ReduceOp::kSum;
    out = lw.Reduce(kind, x);
    if (op == "ReduceL2") out = lw.Unary(O::kSqrt, out);
    if (n.GetInt("keepdims", 1) == 0) lw.squeezed.insert(out);
  } else if (op == "GlobalAveragePool" || op == "GlobalMaxPool") {
    // A mean / max over the spatial axes 2.., merged into one row (reduce_trailing).
    int x = in(0);
    const int64_t r = lw.trailing > 1 ? lw.rank : static_cast<int64_t>(lw.prims[x].shape.size());
    if (r < 3 || r - lw.trailing != 2) return fail("pooling whose spatial axes are not the reduced trailing axes");
    out = lw.Reduce(op == "GlobalAveragePool" ? ReduceOp::kMean : ReduceOp::kMax, x);
  } else if (op == "Softmax" || op == "LogSoftmax") {
    int x = in(0);
    // Before opset 13, Softmax(axis=k) normalizes over all of the axes k.. (flattened).
    int64_t axis = n.GetInt("axis", opset >= 13 ? -1 : 1);
    const bool merged = lw.trailing > 1 && opset < 13 && (axis < 0 ? axis + lw.rank : axis) == lw.rank - lw.trailing;
    if (!merged && (lw.trailing > 1 || !IsLastAxis(axis, lw.prims[x].shape.size())))
      return fail("softmax over an axis other than the last");
    int m = lw.Reduce(ReduceOp::kMax, x);
    int d = lw.Binary(O::kSub, x, m);
    int e = lw.Unary(O::kExp, d);
    int s = lw.Reduce(ReduceOp::kSum, e);
    out = op == "Softmax" ? lw.Binary(O::kDiv, e, s) : lw.Binary(O::kSub, d, lw.Unary(O::kLog, s));
  } else if (op == "LayerNormalization") {
    int x = in(0);
    // LayerNormalization(axis=k) normalizes over the axes k.. together.
    const int64_t axis = n.GetInt("axis", -1);
    const bool merged = lw.trailing > 1 && (axis < 0 ? axis + lw.rank : axis) == lw.rank - lw.trailing;
    if (!merged && (lw.trailing > 1 || !IsLastAxis(axis, lw.prims[x].shape.size())))
      return fail("LayerNormalization over more than the last axis");
    for (size_t o = 1; o < n.outputs.size(); ++o)
      if (!n.outputs[o].empty()) return fail("LayerNormalization's Mean/InvStdDev outputs");
    int mean = lw.Reduce(ReduceOp::kMean, x);
    int d = lw.Binary(O::kSub, x, mean);
    int var = lw.Reduce(ReduceOp::kMean, lw.Binary(O::kMul, d, d));
    int inv = lw.Unary(O::kReciprocal,
                       lw.Unary(O::kSqrt, lw.Binary(O::kAdd, var, lw.Const(n.GetFloat("epsilon", 1e-5f)))));
    out = lw.Binary(O::kMul, d, inv);
    if (n.HasInput(1)) out = lw.Binary(O::kMul, out, in(1));
    if (n.HasInput(2)) out = lw.Binary(O::kAdd, out, in(2));
  } else if (op == "BatchNormalization") {
    if (n.GetInt("training_mode", 0) != 0) return fail("BatchNormalization in training mode");
    for (size_t o = 1; o < n.outputs.size(); ++o)
      if (!n.outputs[o].empty()) return fail("BatchNormalization's running statistics outputs");
    if (n.inputs.size() < 5) return fail("BatchNormalization expects 5 inputs");
    int inv = lw.Unary(O::kReciprocal,
                       lw.Unary(O::kSqrt, lw.Binary(O::kAdd, in(4), lw.Const(n.GetFloat("epsilon", 1e-5f)))));
    out = lw.Binary(O::kAdd, lw.Binary(O::kMul, lw.Binary(O::kSub, in(0), in(3)), lw.Binary(O::kMul, in(1), inv)),
                    in(2));
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
    Prim p(PrimKind::kSlice);
    p.a = x;
    p.offset = b;
    p.shape = xs;
    p.shape.back() = e - b;
    out = lw.Add(p);
  } else if (op == "Concat") {
    if (n.inputs.size() != 2) return fail("only Concat of two operands is generated");
    int a = in(0), b = in(1);
    if (a < 0 || b < 0) return fail("missing operand");
    const Shape &as = lw.prims[a].shape, &bs = lw.prims[b].shape;
    if (as.size() != bs.size() || as.empty() || !IsLastAxis(n.GetInt("axis", 0), as.size()))
      return fail("only Concat along the last axis is generated");
    Prim p(PrimKind::kConcat);
    p.a = a;
    p.b = b;
    p.offset = as.back();
    p.shape = Lowering::Broadcast(as, bs);
    p.shape.back() = as.back() + bs.back();
    out = lw.Add(p);
  } else if (const PrimOpInfo* plain = PlainOnnxOp(op)) {
    // One node, one primitive: Relu, Exp, ..., Add, Mul, ... (two-input Max/Min).
    if (plain->arity == 1) {
      out = lw.Unary(plain->op, in(0));
    } else {
      if (n.inputs.size() != 2) return fail("expects two inputs");
      out = lw.Binary(plain->op, in(0), in(1));
    }
  } else {
    return fail(fmt::format("operator {} is not supported by the row code generator", op));
  }
  if (out < 0) return fail("missing operand");
  for (size_t v = first_new; v < lw.prims.size(); ++v) {
    const std::string why = TypeError(lw.prims, lw.prims[v]);
    if (!why.empty()) return fail(why);
  }
  if (n.outputs.size() > 1 && op != "Dropout" && op != "LayerNormalization" && op != "BatchNormalization")
    return fail("multiple outputs");
  lw.id[n.outputs[0]] = out;
  return true;
}

// The primitives reading the function's inputs: scalar constants become literals, integer
// constants are kept for lowering (axes, Slice bounds), float and bool inputs become kInput.
bool LowerInputs(const RowKernelRequest& req, const RowDomainPlan& plan, GeneratedRowKernel* g, Lowering* lw,
                 std::map<std::string, const Tensor*>* consts, std::vector<int>* input_prim) {
  const Function& f = *req.function;
  const size_t nin = f.inputs.size();
  input_prim->assign(nin, -1);
  if (g->signature.input_types.size() != nin) g->signature.input_types.assign(nin, DataType::kFloat);
  if (g->signature.input_bool.size() != nin) g->signature.input_bool.assign(nin, false);
  for (size_t i = 0; i < nin; ++i) {
    const Tensor* c = req.constants.size() > i ? req.constants[i] : nullptr;
    if (c != nullptr) (*consts)[f.inputs[i]] = c;
    VType vt = VType::kF32;
    const bool typed = VTypeOf(req.input_types[i], &vt);
    if (c != nullptr && c->numel() == 1 && c->dtype() != DataType::kString) {
      // Scalar constants become literals of their own type (integers exactly).
      lw->id[f.inputs[i]] = typed && vt != VType::kF32 ? lw->IntConst(c->ScalarAsInt64(), vt) : lw->Const(c->ScalarAsDouble());
      continue;
    }
    const bool gather_index =
        std::find(g->gather_index.begin(), g->gather_index.end(), static_cast<int>(i)) != g->gather_index.end();
    if (!plan.data[i]) {
      // Constant tensors of axes and shapes are read at lowering time; the indices of a gathered
      // table are read per call; an unused input is not read.
      bool used = false;
      for (const Node& n : f.nodes) used |= std::find(n.inputs.begin(), n.inputs.end(), f.inputs[i]) != n.inputs.end();
      if (c != nullptr || gather_index || !used) continue;
      g->reason = Readable(req.input_types[i])
                      ? fmt::format("input {} ('{}') is {} shape data that is not a constant", i, f.inputs[i],
                                    DataTypeName(req.input_types[i]))
                      : fmt::format("input {} ('{}') is {}; generated kernels read float, int64, int32 and bool", i,
                                    f.inputs[i], DataTypeName(req.input_types[i]));
      return false;
    }
    Prim p(PrimKind::kInput);
    p.input = static_cast<int>(i);
    p.shape = plan.shapes[i];
    p.vt = vt;
    lw->id[f.inputs[i]] = (*input_prim)[i] = lw->Add(p);
    g->signature.input_bool[i] = vt == VType::kBool;
    g->signature.input_types[i] = vt == VType::kF32 ? DataType::kFloat : req.input_types[i];
    // A half-typed input arrives widened; rounding it again changes nothing for a value that came
    // from a float16 tensor and rounds one that a library stage (a Conv, a MatMul) of the same
    // kernel computed in float32, as the unfused operator's float16 output would be.
    if (req.input_types[i] == DataType::kFloat16 || req.input_types[i] == DataType::kBFloat16)
      lw->id[f.inputs[i]] = lw->Unary(RoundOp(req.input_types[i]), (*input_prim)[i]);
  }
  return true;
}

}  // namespace

// Lowers the inputs and then every node; values typed float16/bfloat16 in the body are rounded to
// that type where their operator ends, as the unfused operators' outputs are (each is computed in
// float32 and stored narrowed): the kernel then follows the graph's own precision, not a more
// precise one that differs from it. Checks that keepdims=0 reductions are only outputs (operand
// types are checked per node, TypeError).
bool LowerRowBody(const RowKernelRequest& req, const RowDomainPlan& plan, GeneratedRowKernel* g, Lowering* lw,
                  std::vector<int>* input_prim) {
  const Function& f = *req.function;
  std::map<std::string, const Tensor*> consts;
  if (!LowerInputs(req, plan, g, lw, &consts, input_prim)) return false;
  lw->rank = plan.rank;
  lw->domain = plan.full;
  lw->trailing = g->reduce_trailing;
  std::map<std::string, DataType> vtype;
  for (size_t i = 0; i < f.inputs.size(); ++i) vtype[f.inputs[i]] = req.input_types[i];
  auto is_half = [](DataType t) { return t == DataType::kFloat16 || t == DataType::kBFloat16; };
  for (const Node& n : f.nodes) {
    if (!LowerNode(n, *lw, consts, req.opset)) {
      g->reason = lw->error;
      return false;
    }
    DataType t = DataType::kFloat;
    const int res = n.outputs.empty() || !lw->id.count(n.outputs[0]) ? -1 : lw->id[n.outputs[0]];
    const VType rvt = res < 0 ? VType::kF32 : lw->prims[res].vt;
    if (rvt != VType::kF32) {
      t = rvt == VType::kBool ? DataType::kBool : rvt == VType::kI64 ? DataType::kInt64 : DataType::kInt32;
    } else if (n.op_type == "Cast") {
      t = static_cast<DataType>(n.GetInt("to", 1));
    } else {
      for (size_t i = n.op_type == "Where" ? 1 : 0; i < n.inputs.size(); ++i) {
        auto it = vtype.find(n.inputs[i]);
        if (it != vtype.end() && (it->second == DataType::kFloat || is_half(it->second))) {
          t = it->second;
          break;
        }
      }
      if (is_half(t) && !n.outputs.empty() && lw->id.count(n.outputs[0]))
        lw->id[n.outputs[0]] = lw->Unary(RoundOp(t), lw->id[n.outputs[0]]);
    }
    for (const std::string& o : n.outputs)
      if (!o.empty()) vtype[o] = t;
  }

  // A keepdims=0 reduction changes how its result broadcasts: it may only be an output.
  for (const Prim& p : lw->prims)
    for (int operand : {p.a, p.b, p.c})
      if (operand >= 0 && lw->squeezed.count(operand)) {
        g->reason = "a keepdims=0 reduction is read inside the group";
        return false;
      }
  return true;
}

}  // namespace rowgen
}  // namespace gaf
