// The instructions of ElementwiseChain (ops/elementwise_chain.cc), shared with the plan rewrite
// that makes the node (runtime/plan_rewrite_chains.cc).
#pragma once

#include <cstdint>
#include <string>

namespace gaf {

// Binary operators first (through kDiv), then unary ones.
enum class ChainOp : int64_t { kAdd = 0, kSub, kMul, kDiv, kTanh, kErf, kSigmoid, kExp, kRelu, kNeg, kAbs, kSqrt };

// Operators one ElementwiseChain runs at most: the plan rewrite stops a chain there, and the
// kernel refuses a longer program (only a model file can carry one).
inline constexpr int64_t kMaxChainOps = 256;

// Whether `code` is a ChainOp.
bool IsChainOp(int64_t code);
// 2 for the binary operators, 1 for the unary ones.
int ChainOpArity(ChainOp op);
// The ChainOp of an ai.onnx operator type, or -1 when it is not one.
int64_t ChainOpOf(const std::string& op_type);

}  // namespace gaf
