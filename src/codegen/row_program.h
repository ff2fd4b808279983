// Internal to the row-kernel generator (row_kernel.cc, row_lowering.cc, row_schedule.cc,
// row_emit.cc): the lowered program and the generator's stages. GenerateRowKernel runs them in
// order; each returns false with GeneratedRowKernel::reason set when the group cannot be generated.
//
//   0 PrepareRowBody   (row_kernel.cc)   gathers and rank changes of inputs/outputs become recorded views
//   1 PlanRowDomain    (row_kernel.cc)   how inputs are viewed, which axes merge into one row, the row domain
//   2 LowerRowBody     (row_lowering.cc) body nodes -> primitives, float16/bfloat16 rounding
//   3 ClassifyRowPrims (row_schedule.cc) input classes, each primitive's kind (row / row scalar) and loop level
//   4 ScheduleRow      (row_schedule.cc) output checks, narrow values, liveness, buffered values
//   5 EmitRowKernel    (row_emit.cc)     the C++ translation unit
//
// Nothing here depends on the sizes of the call's dims beyond the classes they give the inputs
// (and the structural Slice/Concat offsets): the source is shared by every call site of the same
// structure.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "codegen/row_kernel.h"

namespace gaf {
namespace rowgen {

// ---- lowered program ----

enum class PrimKind { kInput, kConst, kUnary, kBinary, kReduce, kSlice, kConcat };

// Operation of a unary or binary primitive (kWhere: three operands, c ? a : b).
enum class PrimOp {
  kNone,
  // unary
  kRelu, kNeg, kAbs, kSqrt, kReciprocal, kExp, kLog, kTanh, kSigmoid, kErf, kSoftplus, kFloor, kCeil,
  kLeakyRelu, kHardSigmoid, kRoundHalf, kRoundBFloat16,
  kIdentity, kNot, kCast,  // kCast: to the primitive's own value type (Prim::vt)
  // binary
  kAdd, kSub, kMul, kDiv, kMax, kMin, kPow,
  kEqual, kLess, kLessOrEqual, kGreater, kGreaterOrEqual, kAnd, kOr, kXor,
  // ternary
  kWhere,
};

// One row of the op table (row_lowering.cc): the op's name, its operand count, and whether an
// ai.onnx node of that name with no attributes lowers to exactly this primitive.
struct PrimOpInfo {
  PrimOp op;
  const char* name;
  int arity;
  bool plain_onnx;
};
// The table row of `op` (every PrimOp but kNone has one), or null.
const PrimOpInfo* InfoOf(PrimOp op);
// The primitive an ai.onnx node of this op type lowers to directly, or null.
const PrimOpInfo* PlainOnnxOp(const std::string& op_type);

enum class ReduceOp { kSum, kMax, kMin, kMean };

// A value of the row: kRow varies along the row (one per column), kScal is one value per row.
enum class VKind { kRow, kScal };

// The type a primitive's value has in the generated code: float (float32/float16/bfloat16 values
// are computed in float32), the integer types exactly as integers (no conversion to float, so no
// bound on their magnitude), bool.
enum class VType { kF32, kI32, kI64, kBool };
const char* CTypeOf(VType t);
// The value type of a tensor element type, or false (double, uint8, strings, ...).
bool VTypeOf(DataType t, VType* vt);

struct Prim {
  PrimKind kind;
  explicit Prim(PrimKind k) : kind(k) {}
  PrimOp op = PrimOp::kNone;      // kUnary, kBinary
  ReduceOp reduce = ReduceOp::kSum;  // kReduce
  int a = -1, b = -1, c = -1;  // c: Where's condition (c ? a : b)
  int input = -1;   // kInput: function input index
  double value = 0; // kConst
  int64_t ivalue = 0;  // kConst of an integer or bool type (exact)
  VType vt = VType::kF32;
  float alpha = 0, beta = 0;  // unary parameters (LeakyRelu alpha, HardSigmoid alpha/beta)
  int64_t offset = 0;         // kSlice: first column taken; kConcat: width of operand a
  VKind vkind = VKind::kScal;  // set by ClassifyRowPrims
  int level = 0;               // loop of the row it is computed in (reductions before it), ditto
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
  Shape domain;  // the row domain (RowDomainPlan::full)

  // Operands < 0 (absent) make every builder below return -1 (a malformed node fails lowering).
  int Add(Prim p);
  int Const(double v);
  int IntConst(int64_t v, VType vt);
  static Shape Broadcast(const Shape& a, const Shape& b);
  int Unary(PrimOp op, int a, float alpha = 0, float beta = 0);
  int Binary(PrimOp op, int a, int b);
  int Select(int cond, int x, int y);
  int Reduce(ReduceOp op, int a);
};

// The axes of a Reduce* node (attribute, or constant input from opset 18), normalized against
// `rank` and sorted; an absent list means all axes. False when the axes are not a constant.
bool ReduceAxes(const Node& n, const std::map<std::string, const Tensor*>& consts, int64_t rank,
                std::vector<int64_t>* axes);

// float16/bfloat16 values reach a fused kernel as float32: the runtime widens them before the call
// and narrows the outputs after it (KernelInfo::upcast_half), so the generated code sees floats.
inline bool ComputedAsFloat(DataType t) {
  return t == DataType::kFloat || t == DataType::kFloat16 || t == DataType::kBFloat16;
}
// Inputs generated code can read: float values, bool, int64 and int32 (held as integers).
inline bool Readable(DataType t) {
  return ComputedAsFloat(t) || t == DataType::kBool || t == DataType::kInt64 || t == DataType::kInt32;
}
// Whether a function input is read as data by some node of the body (not only as shape data:
// Unsqueeze/Squeeze axes, a Reshape's or Expand's shape, Slice bounds, reduction axes).
bool ReadsAsData(const Function& f, const std::string& name);

// Merges the last n axes of every shape (aligned to the right, padded to the largest rank) into
// one; false when a shape is neither whole nor all ones over them (row_kernel.cc).
bool MergeLastAxes(std::vector<Shape>& shapes, size_t n);

// ---- stage results ----

// Stage 1: the shape each input is read as (views and merged axes applied) and the row domain.
struct RowDomainPlan {
  std::vector<Shape> shapes;  // per input
  std::vector<bool> data;     // per input: read as data (float, bool, or an integer read by value)
  std::vector<bool> constant; // per input: a constant (weights; preferred as a shared row)
  int64_t rank = 0;           // rank of the domain before trailing axes were merged
  Shape full;                 // the domain
  int64_t rows = 0, cols = 0;
};

// Stage 4: what the emitter needs to know of each primitive.
struct RowSchedule {
  std::vector<int> out_prim;     // per function output: the primitive computing it
  std::map<int, int> out_index;  // primitive -> output index
  std::vector<bool> live;        // needed by an output
  std::vector<bool> buffered;    // a row value read by a later loop of the row: kept in a row buffer
  std::vector<bool> narrow;      // a row value narrower than the row (a Slice's part): emitted inline only
  int max_level = 0;             // loops per row: max_level + 1
};

// ---- stages ----

// Stage 0 (row_kernel.cc): Gathers of a constant table by an integer input and rank changes of
// inputs/outputs (Unsqueeze, Squeeze, ones-only Reshape) are taken out of the body and recorded
// as gather_index / input_views / output_views; `body` is the rest, `base` each input's shape
// before its view (a gathered table: indices.shape + table.shape[1:]).
bool PrepareRowBody(const RowKernelRequest& req, GeneratedRowKernel* g, Function* body, std::vector<Shape>* base);
bool PlanRowDomain(const RowKernelRequest& req, GeneratedRowKernel* g, RowDomainPlan* plan);
bool LowerRowBody(const RowKernelRequest& req, const RowDomainPlan& plan, GeneratedRowKernel* g, Lowering* lw,
                  std::vector<int>* input_prim);
bool ClassifyRowPrims(const RowDomainPlan& plan, const std::vector<int>& input_prim, GeneratedRowKernel* g,
                      Lowering* lw);
bool ScheduleRow(const Function& f, const RowDomainPlan& plan, const Lowering& lw, GeneratedRowKernel* g,
                 RowSchedule* sched);
bool EmitRowKernel(const RowKernelRequest& req, const Lowering& lw, const std::vector<int>& input_prim,
                   const RowSchedule& sched, GeneratedRowKernel* g);

}  // namespace rowgen
}  // namespace gaf
