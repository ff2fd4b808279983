// A blocked-layout chain: a connected group of CNN operators run as oneDNN primitives on the
// channel-blocked layout (nChw16c on AVX-512 machines, nChw8c otherwise) from its inputs to its
// outputs, with layout changes (reorders) only at the chain's boundary.
//
//   inputs (NCHW) ─ reorder in ─ Conv+BN+SiLU ─ Conv+Add+ReLU ─ MaxPool ─ Concat ─ ... ─ reorder out (NCHW)
//
// What a chain runs (BlockedChainRejects says why a node is not one of these):
//   - Conv (2-D, constant weight and bias, any group: depthwise included) with its epilogue as
//     oneDNN post-ops: BatchNormalization and Add/Mul of a per-channel constant folded into the
//     weights and bias; Relu, LeakyRelu, Clip, Sigmoid, Tanh, HardSwish, HardSigmoid, Swish
//     (x * Sigmoid(x), which is how exporters write SiLU) as eltwise post-ops; a residual Add of
//     another value of the chain as a binary post-op;
//   - BatchNormalization (inference, constant parameters), then ReLU fused into it;
//   - the activations above and Add/Mul of two values of the chain (one may broadcast as
//     [N,C,1,1]: SE gating) or of a scalar / per-channel constant;
//   - MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool; Concat along channels;
//     Resize / Upsample nearest by integer factors; Identity;
//   - at its boundary only, a Transpose NHWC -> NCHW of an input and NCHW -> NHWC of an output
//     (tf2onnx's NHWC models): folded into how it reads that input and writes that output (the
//     NHWC tensor is the NCHW value in oneDNN's nhwc format; Create rejects one anywhere else).
// Every value is float32 and 4-D. Each input-shape signature gets a plan, built once: the
// primitives, the weights reordered into their layouts, and a memory plan (buffers assigned by
// liveness, reused across calls: no allocation in the steady state).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ir/tensor.h"

namespace gaf {

// Why `n` cannot be a step of a blocked chain, or "" when it can. `constant` gives the value of a
// constant input (null otherwise); `shape_of` the shape of a value (null when unknown: then the
// shape conditions are left to planning).
std::string BlockedChainRejects(const Node& n, const std::function<const Tensor*(const std::string&)>& constant,
                                const std::function<const Shape*(const std::string&)>& shape_of);

class BlockedChain {
 public:
  struct Stats {
    int convs = 0;          // convolutions
    int post_ops = 0;       // operators run as post-ops of a convolution / folded into its weights
    int steps = 0;          // primitives executed per call, reorders included
    int reorders_in = 0;    // layout changes of the chain's inputs
    int reorders_out = 0;   // layout changes of its outputs
    int concat_in_place = 0;  // Concat inputs written straight into their slices
    int concat_copies = 0;    // Concat inputs copied into their slices
    int residuals_in_place = 0;  // residual Adds written into the residual's buffer (sum post-op)
    int reorders_inside = 0;  // sources of convolutions no optimized kernel reads blocked; NHWC round trips (2 each)
    int convs_winograd = 0;   // convolutions run by a Winograd kernel
    int convs_measured = 0;   // convolutions whose kernel was chosen by timing its candidates now
    int swish_passes = 0;     // Swish run as a pass after its convolution, not as its post-op
    int64_t buffer_bytes = 0;  // the memory plan's intermediate buffers
  };
  // `nodes` in topological order; `inputs` the values a call feeds (constants among them are taken
  // from `constants` and need no feed); `outputs` what it returns. Null with `why` set when a
  // node is not supported.
  static std::shared_ptr<BlockedChain> Create(std::vector<Node> nodes, std::vector<std::string> inputs,
                                              std::vector<std::string> outputs,
                                              std::map<std::string, Tensor> constants, std::string* why);
  // The layout of the values inside the chain: by default both the channel-blocked layout and
  // NHWC are planned and timed on this machine at the call's thread count (five interleaved
  // runs after a warm-up, medians), and the faster is kept; tests and comparisons can fix one.
  enum class Layout { kMeasured, kBlocked, kNhwc };
  void SetLayout(Layout layout);
  // How each convolution's oneDNN kernel is chosen (ops/conv_choice.h): by default its candidates,
  // Winograd kernels included, are timed when a plan is built (and remembered in the layout store
  // with the layout); kDirect times only the direct algorithm's kernels (the direct algorithm's
  // rounding); kLibrary takes oneDNN's first choice without timing.
  enum class ConvKernels { kMeasured, kDirect, kLibrary };
  void SetConvKernels(ConvKernels kernels);
  // Where a measured choice is remembered across processes: `get` returns the layout stored under
  // a key ("" when none), `put` stores one. The key names the chain's operators and attributes,
  // the input and weight shapes, the thread count and oneDNN's version; the store keys it by the
  // machine (codegen: the gate cache, per CPU target). A stored layout is used without measuring;
  // the stored string is the layout's name, then one line per convolution naming its kernel.
  struct LayoutStore {
    std::function<std::string(const std::string& key)> get;
    std::function<void(const std::string& key, const std::string& layout)> put;
  };
  void SetLayoutStore(LayoutStore store);
  // Plans the chain for these input shapes (by input; constants' entries ignored). "" on success,
  // else why oneDNN cannot run it (the caller keeps its other kernel).
  std::string Prepare(const std::vector<Shape>& input_shapes);
  // inputs[i] for inputs()[i] (null for constants). Thread-safe (calls on one chain serialize).
  std::vector<Tensor> Run(const std::vector<const Tensor*>& inputs);
  Stats stats() const;  // of the last plan
  std::string Describe() const;

  // Step timing (`run --profile`): while on, every chain's Run times each of its steps (two clock
  // reads a step). Process-wide: a chain's steps are oneDNN primitives and passes of our own that
  // the session's per-node profile sees as one node.
  static void SetStepProfiling(bool on);
  struct StepTime {
    std::string step;   // the node it runs and its kernel, e.g. "node 'conv1' (Conv) [convolution jit_1x1:avx512_core]"
    int64_t calls = 0;  // timed calls of its chain
    double seconds = 0;  // their total
  };
  // The timed steps of every plan still alive, slowest first, at most `max`.
  static std::vector<StepTime> StepProfile(size_t max);
  ~BlockedChain();
  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace gaf
