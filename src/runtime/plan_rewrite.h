// Rewrites of a session's own copy of the main graph (SessionOptions::rewrite_products) that let
// products read their operands where they are instead of through copies the graph makes first:
//
//   MatMul(A, Transpose(X) swapping the last two axes)          -> GroupedMatMul(A, X) trans_b
//   MatMul(A, Reshape(Expand(Unsqueeze(X, axis 2), e), s))       -> GroupedMatMul(A, X, e, s) kv_group
//   (and both together: Q·Kᵀ over a key cache repeated per query head, as torch.onnx.export
//   writes grouped-query attention: the transposed and repeated cache is never materialized)
//   ... where X = Concat(past, new) on the cache axis, read by that product alone (and perhaps a
//   graph output: the present cache)  -> GroupedMatMul(A, past, new, e, s) append, outputs (Y, X):
//   the product reads the past rows where they are and copies them into X from cache, so a decode
//   step reads the past cache once instead of twice; Shape nodes of X (which read no data) become
//   ConcatShape(past, new), the same shape without X; a cache read transposed (Q·Kᵀ) or as it is
//   (P·V) with as many heads as the queries (multi-head attention, no repeat) likewise:
//   GroupedMatMul(A, past, new) append
//   MatMul(A, W1), MatMul(A, W2), ... with constant [K, N] weights  -> SiblingMatMul(A, W1, W2, ...)
//   (query/key/value, gate/up: a decode step streams all their weights in one set of tasks)
//   SiLUGate(SiblingMatMul(A, Wg, Wu)) (a SwiGLU MLP's gate and up)  -> GatedMatMul(A, Wg, Wu):
//   the gate applied inside the products' tasks, G and U never written out
//   a tree of Concat/Transpose/Slice/Reshape/Flatten/Identity (each value read by the next
//   alone, at least three of them moving data)  -> FusedCopy(inputs): every element copied once,
//   from the tree's inputs to its output (a detector head's Concat, Reshape, Concat, Transpose;
//   the Focus stem's Slices and Concat); ops/fused_copy.cc
//   Softmax(Add(Div(X, c) or Mul(X, c), mask)) with c a constant scalar, on the last axis (also
//   without the scale or without the mask)  -> MaskedSoftmax(X, c, mask): attention's scores
//   scaled, masked and normalized row by row in one pass; ops/masked_softmax.cc
//   GroupedMatMul(Q, K...) trans_b -> MaskedSoftmax [-> Cast to float] -> GroupedMatMul(P, V...) or
//   MatMul(P, V), each value read by the next alone  -> FusedAttention: blocks of query rows whose scores stay in a
//   thread's buffer, the key columns a causal mask removes skipped; ops/fused_attention.cc
//   Transpose(FusedAttention(...), perm 0 2 1 3), read by the Transpose alone  -> FusedAttention
//   out_transposed: each query block's rows written as [b, S, H, dv] (the heads merged back before
//   the output projection) instead of a copy after it
//   Mul(W, Mul(X, Div(1, Sqrt(Add(ReduceMean(Pow(X, 2)), eps)))))  (and variants)  -> RMSNorm(X, eps, W):
//   one pass per row, bit-identical; ops/rms_norm.cc
//   Add(Mul(X, cos), Mul(Concat(Neg(Slice(X, h, end)), Slice(X, 0, h)), sin))  -> RotaryHalf(X, cos, sin):
//   rotary embedding with rotate_half in one pass, bit-identical; ops/rotary_half.cc; with X =
//   Transpose(T) keeping the last axis last and read by it alone -> RotaryHalf(T, cos, sin) perm
//   Add(MatMul(A, W), R) with W a constant float32 [K, N] weight and R not a constant (a residual)
//   -> ResidualMatMul(A, W, R): R added where the product's tasks store their sums, bit-identical
//   (Add's arithmetic), the product never written out alone; ops/gemm.h; and an RMSNorm of its
//   result (whatever else reads it)  -> that ResidualMatMul with the norm as a second output, made
//   in the same pass over the rows
//   elementwise operators left after those (Add, Sub, Mul, Div, Tanh, Erf, Sigmoid, Exp, Relu, Neg,
//   Abs, Sqrt), two or more whose intermediate values only the chain reads  -> ElementwiseChain:
//   one pass over blocks of the output, bit-identical (an exporter's GELU, a bias Add and what
//   follows it); ops/elementwise_chain.cc
//
// Only copies consumed by that MatMul alone are absorbed, never a graph output or a constant
// (constants are folded once anyway). GroupedMatMul checks each run's shapes and runs the
// original operators (kept as its `fallback` graph) when they are not of the rewritten form, so
// results are MatMul's. The saved model is never changed: this is the session's execution plan.
#pragma once

#include <string>
#include <vector>

#include "ir/graph.h"

namespace gaf {

// Domain of the operators the rewrites make (never written to a model file).
inline constexpr const char* kPlanDomain = "ai.graph_autofusion.plan";

struct ProductRewrites {
  int transposed = 0;  // products reading B transposed in place
  int kv_grouped = 0;  // products reading a repeated key/value cache once per cache head
  int appended = 0;    // products that also make their cache from Concat(past, new) (repeated or not)
  int shape_readers = 0;  // Shape nodes of such caches, made ConcatShape(past, new)
  int sibling_groups = 0, siblings = 0;  // SiblingMatMul nodes, and the MatMuls they replace
  int copy_groups = 0, copies = 0;        // FusedCopy nodes, and the operators they replace
  int softmax_epilogues = 0;  // MaskedSoftmax nodes: a Softmax with the scale and/or mask Add before it
  int silu_gates = 0, silus = 0;  // SiLUGate nodes: SiLU(G) * U (SwiGLU), and SiLU(G) alone
  int gated_products = 0;         // GatedMatMul nodes: a SiblingMatMul of gate and up with its SiLUGate
  int residual_products = 0;      // ResidualMatMul nodes: a MatMul by a constant weight with the Add of its result
  int residual_norms = 0;         // of them, also making the RMSNorm of their result (an RMSNorm node gone)
  int rms_norms = 0;              // RMSNorm nodes: Pow, ReduceMean, Add, Sqrt, reciprocal, Mul(s)
  int rotaries = 0;               // RotaryHalf nodes: x * cos + rotate_half(x) * sin
  int rotaries_transposed = 0;    // of them, reading x's Transpose's input in place (the copy never made)
  int attention_blocks = 0;       // FusedAttention nodes: scores product, MaskedSoftmax, values product
  int attention_transposed = 0;   // of them, writing their output with the heads and query rows swapped (a Transpose gone)
  int elementwise_chains = 0, chained_operators = 0;  // ElementwiseChain nodes, and the operators they run
  // LastPosition nodes: before a product by a constant weight that makes a graph output (a
  // decoder's logits), so that a generation's runs (Session::Run's last_position_only) compute it
  // for the last position only.
  int last_positions = 0;
  std::vector<std::string> notes;  // one line per rewritten node
};

// Rewrites `model`'s main graph in place (nodes of subgraphs are left alone). group_siblings:
// also make SiblingMatMul nodes (off where MatMul kernels are replaced per node: float16 weights);
// fold_residuals: also make ResidualMatMul nodes (off where MatMul kernels are replaced per node,
// which take no ResidualMatMul).
ProductRewrites RewriteProducts(Model& model, bool group_siblings = true, bool fold_residuals = true);

}  // namespace gaf
