// The kernel interface of the reference CPU runtime.
//
// A kernel reads ctx.inputs (nullptr for an absent optional input), reads attributes from
// ctx.node, and assigns every present output: ctx.outputs[i] = Tensor(...). It never writes into
// an input. It throws gaf::Error for invalid input (naming what is wrong) and
// gaf::UnsupportedError for valid input it does not implement (a type, a mode, an attribute).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ir/tensor.h"

namespace gaf {

// Runs subgraphs (If/Loop/Scan bodies) for control-flow kernels. `inputs` bind to the
// subgraph's formal inputs in order; outer-scope values are resolved from the calling frame.
class SubgraphRunner {
 public:
  virtual ~SubgraphRunner() = default;
  virtual std::vector<Tensor> RunSubgraph(const Graph& body, const std::vector<Tensor>& inputs) = 0;
};

struct KernelContext {
  const Node& node;
  int64_t opset = 0;  // version of the node's domain imported by the model
  std::vector<const Tensor*> inputs;
  std::vector<Tensor> outputs;  // sized to node.outputs.size()
  SubgraphRunner* subgraphs = nullptr;
  int num_threads = 1;
  // The caller feeds the outputs back (a generation's present caches become the next past): a
  // kernel that appends to a key/value cache may make it a cache with room (Tensor::WithCacheRoom)
  // and append to such a cache in place.
  bool cache_room = false;
  // The caller reads only the last position of the outputs a LastPosition node leads to (a
  // generation's logits; runtime/plan_rewrite.h).
  bool last_position_only = false;

  size_t num_inputs() const { return inputs.size(); }
  bool has_input(size_t i) const { return i < inputs.size() && inputs[i] != nullptr; }
  // Throws gaf::Error naming the node if input i is absent.
  const Tensor& input(size_t i) const;
  size_t num_outputs() const { return outputs.size(); }
  bool has_output(size_t i) const { return node.HasOutput(i); }
};

using KernelFn = std::function<void(KernelContext&)>;

// Ordered scale of operator kinds for fusion (TVM's scale): combining kinds is max().
enum class OpKind : int {
  kElementwise = 0,   // one output element from the same-index input elements
  kBroadcast = 1,     // elementwise with broadcasting
  kInjective = 2,     // data movement / reshape / index mapping
  kReduction = 3,     // reduces along axes (incl. normalizations, softmax)
  kContraction = 4,   // MatMul, Gemm, Conv: accepts elementwise epilogues
  kOpaque = 5,        // everything else (control flow, sorting, random, ...)
};
const char* OpKindName(OpKind k);

struct KernelInfo {
  std::string domain;   // "" for ai.onnx
  std::string op_type;
  OpKind kind = OpKind::kOpaque;
  KernelFn fn;
  // When true the runtime converts float16/bfloat16 inputs to float before calling fn and
  // converts float outputs back to the half type afterwards ("computed in float32").
  bool upcast_half = true;
  // When true the kernel reads key/value caches with room where they are (Tensor::padded); the
  // runtime hands other kernels a contiguous copy of such an input.
  bool reads_padded_caches = false;
  // For a kernel offered for a function call (SessionOptions::function_kernels): called when the
  // session runs the call another way instead, with why (runtime/plan_calls.h).
  std::function<void(const std::string& why)> declined;
};

class OpRegistry {
 public:
  static OpRegistry& Global();  // built on first use by RegisterAllKernels()
  void Register(KernelInfo info);
  const KernelInfo* Find(const std::string& domain, const std::string& op_type) const;
  std::vector<const KernelInfo*> All() const;

 private:
  std::vector<KernelInfo> kernels_;
};

// Registration functions, one per kernel family, called explicitly from RegisterAllKernels
// (registry.cc); no static self-registration.
void RegisterElementwiseKernels(OpRegistry& r);  // unary/binary math, activations, logic, Cast, Where, Clip
void RegisterTensorKernels(OpRegistry& r);       // shape/data movement: Reshape, Transpose, Concat, Slice, Gather, ...
void RegisterReduceKernels(OpRegistry& r);       // Reduce*, ArgMax/Min, Softmax family, normalizations, CumSum, TopK
void RegisterNnKernels(OpRegistry& r);           // MatMul, Gemm, Conv, ConvTranspose, pooling, ...
void RegisterRnnKernels(OpRegistry& r);          // LSTM, GRU, RNN
void RegisterControlFlowKernels(OpRegistry& r);  // If, Loop, Scan
void RegisterLossAndQuantKernels(OpRegistry& r); // losses, (de)quantization, NMS, GridSample, RoiAlign, Det, windows, random
void RegisterPlanKernels(OpRegistry& r);         // operators of the session's plan rewrites (runtime/plan_rewrite.h)
void RegisterSoftmaxEpilogueKernels(OpRegistry& r);  // MaskedSoftmax: scale, mask and Softmax in one pass (plan rewrite)
void RegisterAttentionKernels(OpRegistry& r);  // FusedAttention: scores, masked softmax and values in blocks (plan rewrite)
void RegisterRMSNormKernels(OpRegistry& r);     // RMSNorm: Pow, ReduceMean, Add, Sqrt, reciprocal and Muls in one pass (plan rewrite)
void RegisterRotaryKernels(OpRegistry& r);      // RotaryHalf: x * cos + rotate_half(x) * sin in one pass (plan rewrite)
void RegisterElementwiseChainKernels(OpRegistry& r);  // ElementwiseChain: elementwise operators in one pass (plan rewrite)
void RegisterSiLUGateKernels(OpRegistry& r);  // SiLUGate: SiLU, or SwiGLU's SiLU(gate) * up, in one pass (plan rewrite)
void RegisterCopyKernels(OpRegistry& r);         // FusedCopy: a tree of data-movement operators in one pass (plan rewrite)
void RegisterTransformerKernels(OpRegistry& r);  // RMSNormalization, RotaryEmbedding, Swish, SwiGLU (opsets 23-28)
void RegisterAttentionOpKernels(OpRegistry& r);  // Attention (opsets 23-24): grouped-query, masks, KV caches

}  // namespace gaf
