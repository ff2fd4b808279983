// Internal to ops/blocked_chain.cc and ops/blocked_chain_plan.cc (not a public header): the plan a
// BlockedChain builds for one input-shape signature (Plan: the primitives as steps, the weights in
// their layouts, the memory plan), ChainPlanner, which builds it pass by pass, and the operator
// recognition both the planner and BlockedChainRejects use (defined in blocked_chain.cc).
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ir/graph.h"
#include "ir/tensor.h"
#include "ops/blocked_chain.h"
#include "ops/conv_choice.h"

namespace gaf::blocked_chain_internal {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;
using alg = dnnl::algorithm;

inline std::string LayoutName(tag t) { return t == tag::nhwc ? "nhwc" : t == tag::nChw16c ? "nChw16c" : "nChw8c"; }

struct Act {
  alg a;
  float alpha = 0, beta = 0;
};

// Operator recognition shared by BlockedChainRejects and the planner (blocked_chain.cc, where each
// is described): a unary activation as eltwise steps, an Add/Mul constant usable per channel, the
// integer factors of a nearest Resize / Upsample.
bool ActivationOf(const Node& n, const std::function<const Tensor*(const std::string&)>& constant,
                  std::vector<Act>* acts, std::string* why);
bool IsUnaryActivation(const std::string& op);
bool ScalarOrPerChannel(const Tensor& t, int64_t channels);
bool NearestFactors(const Node& n, const std::function<const Tensor*(const std::string&)>& constant,
                    const Shape* x, int64_t* fh, int64_t* fw, std::string* why);

// Scratch owned by a plan: 64-byte aligned.
struct Buffer {
  std::unique_ptr<char, decltype(&std::free)> p{nullptr, &std::free};
  size_t bytes = 0;
};

struct Step {
  dnnl::primitive prim;
  std::unordered_map<int, dnnl::memory> args;
  std::function<void()> pass;  // a pass of our own instead of a primitive (SwishInPlace)
  std::string label;           // the node it runs and its kernel (BlockedChain::StepTime::step)
  void Execute(dnnl::stream& s) {
    if (pass) pass();
    else prim.execute(s, args);
  }
};
struct Plan {
  std::vector<Shape> in_shapes;
  int threads = 0;
  std::vector<Buffer> buffers;
  std::vector<dnnl::memory> owned;  // weights, biases, constants in the primitives' layouts
  // The convolutions' weights, in plan order, in chunks of the tensor allocator (2 MiB and more on
  // transparent huge pages, under the memory limit): WeightSpace.
  std::vector<Tensor> weight_chunks;
  size_t weight_chunk_used = 0;
  // `bytes` (64-byte aligned) in the last weight chunk, or in a new one when it has no room.
  char* WeightSpace(size_t bytes);
  std::vector<Step> steps;
  std::vector<dnnl::memory> input_mem;   // user (NCHW) memory per input; handles set per call
  std::vector<dnnl::memory> output_mem;  // user memory per output
  std::vector<Shape> out_shapes;
  BlockedChain::Stats stats;
  std::string layout;
  // The oneDNN implementation of each convolution, in plan order (ConvCandidate::name).
  std::vector<std::string> conv_impls;
  double measured_ms = 0;  // the median of its timed runs when the layout was chosen by measurement
  // Step profiling (BlockedChain::SetStepProfiling): seconds per step over `profiled_calls` calls.
  std::vector<double> step_seconds;
  int64_t profiled_calls = 0;
  std::mutex profile_mu;  // guards the two above (Run adds, BlockedChain::StepProfile reads)
  std::string choice;      // how its layout was chosen, for Describe ("" when it was fixed)
};

// One operator of the plan: a node plus what it absorbed.
struct Op {
  enum Kind { kConv, kBatchNorm, kEltwise, kBinary, kPool, kConcat, kResize, kIdentity } kind;
  int node = -1;      // the anchor node
  int emit = -1;      // position in the node order where it runs (its last absorbed node)
  std::vector<std::string> in;  // data inputs (values of the chain or its inputs)
  std::string out;
  std::vector<Act> acts;        // eltwise post-ops (or the eltwise op itself)
  // kConv: folded per-channel scale/shift (BatchNormalization, Add/Mul of constants) and a residual.
  std::vector<float> scale, shift;
  bool folded = false;
  std::string residual;         // binary add post-op operand
  int residual_pos = -1;        // where it sits among the post-ops (index into the post-op list)
  alg binary = alg::binary_add;
  const Tensor* binary_const = nullptr;  // kBinary with a constant operand
  int absorbed = 0;
};

// How the planner picks each convolution's oneDNN implementation (ops/conv_choice.h).
struct ConvImplChoice {
  bool measure = true;    // time the candidates (else oneDNN's first choice)
  bool winograd = true;   // Winograd kernels among the candidates
  // Implementations remembered from an earlier measurement of this chain (Plan::conv_impls); a
  // convolution whose remembered one is among its candidates takes it without measuring.
  std::vector<std::string> stored;
};

// The chain's inputs and outputs in NHWC, by position (BlockedChain::Create folds the Transposes
// at the boundary into them): such an input's tensor is read, and such an output's written, as the
// NCHW value in oneDNN's nhwc format. Empty: all NCHW.
struct Boundary {
  std::vector<bool> nhwc_in, nhwc_out;
};

// Builds the plan of one input-shape signature of a chain (BlockedChain::Impl::Build), in the four
// passes blocked_chain_plan.cc describes; what the passes share is its state. One Build per planner.
class ChainPlanner {
 public:
  // The chain (BlockedChain::Create's `nodes` in topological order, `inputs`, `outputs`,
  // `constants`), referenced while planning. `binary_post_ops`: residual Adds as post-ops of the
  // convolutions (else binary steps of their own); `layout`: the format of every value inside the
  // chain (a channel-blocked tag, or nhwc).
  ChainPlanner(const std::vector<Node>& nodes, const std::vector<std::string>& inputs,
               const std::vector<std::string>& outputs, const std::map<std::string, Tensor>& constants,
               bool binary_post_ops, tag layout, ConvImplChoice conv_choice = {}, Boundary boundary = {});
  // The plan for these input shapes (by input; constants' entries ignored). Throws (Error,
  // dnnl::error) where oneDNN cannot run the chain so.
  std::shared_ptr<Plan> Build(const std::vector<Shape>& in_shapes);

 private:
  const Tensor* Constant(const std::string& v) const;

  // 1. Shapes.
  void InferShapes(const std::vector<Shape>& in_shapes);
  const Shape& ShapeOf(const std::string& v) const;

  // 2. Operators.
  void CountUses();
  int SoleConsumer(const std::string& v);
  std::vector<int> Consumers(const std::string& v) const;
  Act GateAct(int s) const;
  int SwishMul(int s);
  void FormOperators();
  Op FormOperator(size_t i);
  void FormConv(const Node& n, Op* op);
  void AbsorbConvEpilogue(int64_t M, Op* op);
  void FormBinary(const Node& n, Op* op);

  // 3. Memory.
  void ComputeLastUses();
  void DefineInputs();
  void PlaceConcats();
  bool Placed(const std::string& v) const;
  dnnl::memory::desc BlockedMd(const Shape& s) const;
  dnnl::memory::desc PlainMd(const Shape& s) const;
  dnnl::memory::desc InputMd(const std::string& v) const;  // a chain input's, as its tensor holds it
  int NewBuffer(size_t bytes);
  const dnnl::memory::desc& MdOf(const std::string& v) const;
  int AddStep(dnnl::primitive p, std::unordered_map<int, dnnl::memory> args);
  std::string StepLabel(const std::string& kernel) const;
  void ReadBlocked(const std::string& v, int step, int arg);
  void EnsureBlockedInput(const std::string& v);
  void Release(int k);
  void DefineOutput(const std::string& v, int in_place_of = -1);
  void DefineElementwiseOutput(const Op& op, int k);

  // 4. Primitives.
  void EmitSteps();
  void EmitConv(const Op& op, int k);
  // nhwc_desc (or nullptr): the convolution on NHWC, for an nhwc candidate (ConvCandidate::nhwc).
  ConvCandidate ChooseConvImpl(const Op& op, const ConvPd& pd, const std::function<ConvDesc(alg)>& desc,
                               const dnnl::primitive_attr& attr, const dnnl::primitive_attr* attr_without_swish,
                               bool sum_in_place, const std::function<ConvDesc(alg)>* nhwc_desc = nullptr);
  std::pair<dnnl::memory, dnnl::memory> ConvWeights(const Op& op, const Tensor& w, const dnnl::memory::dims& wd,
                                                    int64_t G, const dnnl::convolution_forward::primitive_desc& pd);
  void EmitBatchNorm(const Op& op, int k);
  void EmitEltwise(const Op& op, int k);
  void EmitBinary(const Op& op, int k);
  void EmitPool(const Op& op, int k);
  void EmitConcat(const Op& op, int k);
  void EmitResize(const Op& op, int k);
  void EmitIdentity(const Op& op, int k);
  void EmitOutputs();
  void Bind();

  // The chain and what to plan.
  const std::vector<Node>& nodes_;
  const std::vector<std::string>& inputs_;
  const std::vector<std::string>& outputs_;
  const std::map<std::string, Tensor>& constants_;
  const bool binary_post_ops_;
  const std::function<const Tensor*(const std::string&)> constant_;  // Constant, for the recognition helpers
  dnnl::engine& eng_;
  const tag bt_;
  const bool channel_blocked_;
  const ConvImplChoice conv_choice_;
  const Boundary boundary_;
  std::shared_ptr<Plan> plan_;

  // 1. Shapes.
  std::map<std::string, Shape> shape_;
  // Uses inside the chain; outputs of the chain.
  std::map<std::string, int> uses_;
  std::set<std::string> is_output_;
  // 2. Operators.
  std::vector<bool> absorbed_;
  std::vector<Op> ops_;
  int emitting_ = -1;  // the op whose steps are being added (-1: the chain's outputs)
  // 3. Memory.
  std::map<std::string, int> last_use_;  // op index
  std::map<std::string, int> buffer_of_;
  std::map<std::string, int> assigned_;  // every blocked value's buffer (buffer_of_: the live ones)
  std::vector<int> free_buffers_;
  std::vector<size_t> buffer_size_;
  std::map<std::string, int> input_index_;
  std::map<std::string, std::pair<std::string, int64_t>> place_;  // value -> (root value, channel offset)
  std::set<int> view_concats_;                                    // ops that need no step
  // Steps are recorded with buffer indices and bound to addresses once all sizes are known.
  struct PendingArg {
    int step, arg;
    std::string value;
  };
  std::vector<PendingArg> pending_;
  std::map<std::string, dnnl::memory::desc> value_md_;
};

}  // namespace gaf::blocked_chain_internal
