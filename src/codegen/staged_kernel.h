// Fused kernels for groups that contain contractions (MatMul, Gemm, Conv): the group's body is
// split into stages by contraction depth. Contractions run through the matrix library (our MatMul
// kernel: oneDNN sgemm, or the streaming GEMV for batch-1 decode; a MatMul by a constant float32
// weight the packed product a session gives such a node, PreparedMatMul, one copy per weight shared
// by the call site's variants; float16 copies with --half-weights); everything between them is
// generated: each connected piece of elementwise/reduction work at one depth becomes one
// generated row loop nest (see row_kernel.h) that reads the contraction's output once.
//
//   FusedSwiGLU                      stages
//   x ─ MatMul Wg ─ Sigmoid ─ Mul ┐   0  library  MatMul(x, Wg) -> g
//   x ─ MatMul Wu ────────────────Mul   1  library  MatMul(x, Wu) -> u
//                                      2  row      y[j] = g[j] * sigmoid(g[j]) * u[j]
//
//   FusedAttention: library Q·Kᵀ, row (scale, mask, softmax in one pass), library P·V.
//
// A group without contractions is one row stage (the whole group in one loop nest). A group
// with an operator that is neither a contraction nor row-generatable gets no kernel (the reason
// says which node), so a "fused" kernel never just calls the old kernels one after another.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "codegen/compiler.h"
#include "codegen/row_kernel.h"
#include "ir/graph.h"
#include "ops/kernel.h"

namespace gaf {

struct StagedKernel {
  struct Stage {
    bool library = false;            // contraction through the matrix library, else a generated row stage
    std::vector<int> inputs, outputs;  // value ids
    GeneratedRowKernel row;          // row stage
    RowKernelFn fn = nullptr;
    Node node;                       // library stage
    const KernelInfo* kernel = nullptr;
    std::shared_ptr<KernelInfo> own_kernel;  // a kernel made for this stage (float16 weights)
    // A float32 Conv whose next stage is an elementwise epilogue on its output: the convolution
    // hands each finished tile to that stage's tile entry point while the tile is in cache.
    int epilogue_stage = -1;
    RowTileFn tile = nullptr;        // row stage: <symbol>_tile, bound when it is an epilogue
    Function body;                   // row stage: its operators (for folding into a library stage)
  };
  bool ok = false;
  std::string reason;                // why there is no kernel
  std::vector<Stage> stages;
  std::vector<std::string> value_names;
  std::vector<int> function_inputs, function_outputs;  // value ids
  std::vector<DataType> output_types;  // declared type of each function output (float32 or a half type)
  int64_t opset = 17;
  // Constants the kernel made (BatchNormalization folded into a Conv's weights and bias).
  std::vector<std::pair<std::string, std::shared_ptr<Tensor>>> owned_constants;
  std::vector<std::pair<int, const Tensor*>> constant_values;  // value id -> owned constant
  std::vector<std::string> notes;                                // rewrites made, for Describe()
  // Notes read when Describe() is called: a blocked chain's plan (its layout and kernels) is made
  // again at the session's thread count on its first run, after the kernel was generated.
  std::vector<std::function<std::string()>> live_notes;
  std::map<std::string, int> value_ids;                          // value name -> id

  // The id of a value, allocated on first use.
  int ValueId(const std::string& name);

  // "library MatMul + row[Sigmoid,Mul,Mul]" style summary.
  std::string Describe() const;
  // Sources of the row stages (symbols <prefix>_s<k>), for the batch compile.
  std::vector<KernelSource> Sources() const;
  // Resolves the row stages' entry points; returns false with `reason` set when one is missing or
  // failed to compile (with the compiler's message).
  bool Bind(const KernelLibrary& library);
};

// Plans and generates the kernel of one fused function for one call's input types, shapes and
// constants (`request.function` is the function).
StagedKernel GenerateStagedKernel(const RowKernelRequest& request, const std::string& symbol, int64_t opset);

// The unfused operators of a function as a kernel whose every stage is one node's kernel as the
// session runs it in the model as given: the reference kernel, or for a Conv whose weight (and
// bias) are constants (`constants`: per function input, the constant value or null) the prepared
// oneDNN convolution the session binds to such a node. The baseline of the safe-fusion gates.
StagedKernel ReferenceStagedKernel(const Function& f, int64_t opset, const std::vector<const Tensor*>& constants = {});

// Runs a bound kernel. Throws gaf::Error when the inputs no longer fit the generated code (another
// broadcast class), so the caller can run the body instead.
std::vector<Tensor> RunStagedKernel(const StagedKernel& kernel, const std::vector<const Tensor*>& inputs,
                                    int num_threads);

}  // namespace gaf
