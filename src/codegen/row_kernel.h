// Code generation for fused groups whose work is organized in rows: elementwise / broadcast chains,
// reductions over the last axis with their prologue and epilogue (RMSNorm, LayerNorm, Softmax with
// scale and mask, GELU, SiLU, ...). The generated C++ computes the whole group in one pass over
// each row: values live in registers inside fused loops, and only values needed by a later loop
// of the same row are kept in a small per-thread row buffer (a few KiB, in L1/L2). Rows are split
// over threads.
//
//   body (after lowering)          generated loop nest, per row r
//   x ── Mul(x,x) ── ReduceMean     for j: acc += x[j]*x[j]             (loop 0, fused reduction)
//   │                    │          s = 1/sqrt(acc/N + eps)             (row scalars)
//   │               Add eps, Sqrt   for j: y[j] = x[j] * s * w[j]       (loop 1)
//   └──── Div ──── Mul w ── y
//
// Lowering first rewrites Softmax, LogSoftmax and LayerNormalization (last axis) into primitive
// reductions and elementwise ops. Inputs are classified by how they broadcast against the
// group's output viewed as [rows, cols]: FULL (own row), ROWVEC (one row shared by all rows),
// PERROW (one value per row), SCALAR, GENERAL (row offsets from a table; column stride 0 or 1).
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "codegen/half_weights.h"
#include "ir/graph.h"

namespace gaf {

// Host-side argument block of every generated row kernel (ABI shared with the generated code).
struct RowKernelArgs {
  int64_t rows = 0;
  int64_t cols = 0;
  const float* const* in = nullptr;
  const int64_t* const* in_row_offset = nullptr;  // per input: table of `rows` offsets, or null
  float* const* out = nullptr;
};

enum class RowInputClass { kFull, kRowVec, kPerRow, kScalar, kGeneral, kGeneralPerRow };

struct RowKernelSignature {
  std::vector<RowInputClass> inputs;
  std::vector<bool> input_bool;      // a bool input, read as bool
  // Per input: the type the kernel reads (float for float32/float16/bfloat16, which arrive
  // widened; bool; int64; int32). Integers are held as integers in the generated code.
  std::vector<DataType> input_types;
  std::vector<bool> output_per_row;  // true: output is [.., 1] (one value per row)
  std::vector<bool> output_squeezed; // per-row output of a keepdims=0 reduction: the reduced axes dropped
};

// What a call needs besides data pointers, for one set of input shapes (rows, cols, output shape,
// row-offset tables); RunRowKernel keeps the last one so repeated calls (a decode loop) skip it.
struct RowLaunch {
  std::vector<Shape> shapes;  // per input as given (empty for non-domain inputs)
  int64_t rows = 0, cols = 0;
  Shape out_shape, per_row_shape, squeezed_shape;
  std::vector<Shape> output_shapes;  // per output (its output view applied)
  // Per input: its row-offset table; for a gathered table, the row of the index tensor each row reads.
  std::vector<std::vector<int64_t>> offsets;
};
struct RowLaunchCache {
  std::mutex mu;
  std::shared_ptr<const RowLaunch> last;
};

// A rank change applied to an input (or to an output) at run time, on the actual shape: the body's
// Unsqueeze / Squeeze of a function input (or of the group's result before an output), a Reshape
// that only inserts or removes ones, BatchNormalization's [C] parameters as [C,1,..,1].
struct RowViewStep {
  enum class Kind { kUnsqueeze, kSqueeze, kReshape };
  Kind kind = Kind::kUnsqueeze;
  std::vector<int64_t> axes;  // kUnsqueeze / kSqueeze (ONNX semantics; Squeeze without axes: all ones)
  Shape target;               // kReshape: the exact result (a constant or guarded target)
};
using RowView = std::vector<RowViewStep>;
// Applies a view to a shape; false with the reason when the shape does not fit it (a squeezed
// axis that is not 1, a reshape whose non-one dims differ).
bool ApplyRowView(const RowView& view, const Shape& in, Shape* out, std::string* why);

struct GeneratedRowKernel {
  bool ok = false;
  std::string reason;       // why the group cannot be generated (when !ok)
  std::string symbol;       // extern "C" function name
  std::string source;       // full C++ translation unit
  std::string ops_summary;  // the body's operators, e.g. "Pow,ReduceMean,Add,Sqrt,Div,Mul,Mul"
  RowKernelSignature signature;
  std::vector<bool> domain_inputs;  // inputs that form the row domain (all but scalar constants)
  bool collapse = false;             // elementwise body: trailing axes merged (CollapseTrailing) at run time
  int reduce_trailing = 1;           // reductions over this many trailing axes, merged into one row
  std::vector<RowView> input_views;   // per input: the view it is read through (empty: as it is)
  std::vector<RowView> output_views;  // per output: the view its result is written as
  // Per input: -1, or the index of the integer input whose values select this constant table's
  // rows (Gather axis 0): the table is read as indices.shape + table.shape[1:], its rows through a
  // table of offsets computed per call from the index values (out of range: gaf::Error, as Gather).
  std::vector<int> gather_index;
  std::shared_ptr<RowLaunchCache> launch_cache = std::make_shared<RowLaunchCache>();
};

// Input shapes/dtypes of one call of the fused function, in the function's input order.
struct RowKernelRequest {
  const Function* function = nullptr;
  std::vector<DataType> input_types;
  std::vector<Shape> input_shapes;
  // Value of each input that is a constant (an initializer), else null. Scalar constants are
  // folded into the code as literals; integer constants give axes.
  std::vector<const Tensor*> constants;
  // Fast low-precision math (a rule's math=approx): exp by Schraudolph's bit trick (~4% error)
  // and sigmoid/tanh/erf through it. Only for rules whose author asked for it; FuseSafe's
  // precision gate decides whether the result is kept.
  bool approx_math = false;
  // Contractions with a constant [K,N] weight use a float16 copy of it (half_weights.h).
  HalfWeights half_weights = HalfWeights::kOff;
  // A body of CNN operators that all run on oneDNN's blocked layout runs as one BlockedChain
  // (staged_kernel.cc; ops/blocked_chain.h) instead of stages with NCHW values between them.
  bool blocked_chains = true;
  // The kernel cache root: a chain's measured layout choice is kept in its gate cache (per CPU
  // target), so later processes do not measure again. Empty: not kept.
  std::string layout_cache_root;
  int64_t opset = 17;  // the model's ai.onnx opset (Softmax's default axis, Clip's inputs, ...)
};

// Generates the kernel, or returns ok=false with a reason (unsupported op, type, axis, shape).
GeneratedRowKernel GenerateRowKernel(const RowKernelRequest& request, const std::string& symbol);

// The output domain of a call: broadcast shape of the inputs; rows x cols view. Returns false with
// a reason when the group does not fit the row model.
bool RowDomain(const std::vector<Shape>& input_shapes, Shape* full, int64_t* rows, int64_t* cols,
               std::string* reason);

// Merges trailing axes over which every shape is either the whole extent or all ones (shapes
// aligned to the right); returns them unchanged when nothing merges.
std::vector<Shape> CollapseTrailing(const std::vector<Shape>& shapes);

// Classifies one input against the domain and fills its row-offset table when needed.
RowInputClass ClassifyRowInput(const Shape& input, const Shape& full, std::vector<int64_t>* offsets);
// Offset (in elements of the input) of each row of `full` in a broadcast input.
std::vector<int64_t> RowOffsets(const Shape& input, const Shape& full);

// Calls a compiled row kernel on concrete inputs: computes the domain, checks that every input
// still has the class the kernel was generated for (gaf::Error otherwise, so the caller can
// regenerate), builds row-offset tables, allocates and returns the outputs.
using RowKernelFn = void (*)(const RowKernelArgs*);
std::vector<Tensor> RunRowKernel(RowKernelFn fn, const GeneratedRowKernel& kernel,
                                 const std::vector<const Tensor*>& inputs);

// Entry point <symbol>_tile: rows [r0, r1), columns [c0, c1) of each. Only meaningful for
// elementwise kernels (`collapse`): a reduction needs whole rows.
using RowTileFn = void (*)(const RowKernelArgs*, int64_t r0, int64_t r1, int64_t c0, int64_t c1);

// A call prepared but not run: launch plan, pointers and allocated outputs, for a caller that
// runs the kernel in pieces (a convolution handing over finished tiles).
struct RowCall {
  std::shared_ptr<const RowLaunch> launch;
  std::vector<const float*> in;
  std::vector<const int64_t*> in_off;
  std::vector<float*> out_ptrs;
  std::vector<Tensor> outputs;
  std::vector<std::vector<int64_t>> gathered;  // per gathered input: this call's row offsets
  RowKernelArgs args;
};
// As RunRowKernel up to the call; input data may be written after this (only pointers and
// shapes are read).
void PrepareRowCall(const GeneratedRowKernel& kernel, const std::vector<const Tensor*>& inputs, RowCall* call);

}  // namespace gaf
