// ElementwiseChain (domain ai.graph_autofusion.plan): a chain of elementwise operators run as one
// pass over blocks of the output, as the plan rewrite makes it from operators whose intermediate
// values nothing else reads (runtime/plan_rewrite_chains.cc): a tanh- or erf-GELU written out by
// an exporter (nine Mul/Add/Tanh nodes a layer in a torch.onnx.export GPT-2), a Linear's bias Add
// and the activation after it, a residual Add of a bias Add.
//
//   inputs  the chain's inputs from outside (tensors and constants)
//   attrs   ops   one opcode per instruction (ChainOp), in the original operators' order
//           args  two operands per instruction: k >= 0 input k, k < 0 the result of instruction
//                 -k - 1 (an earlier one); the second is unused (-1) for unary operators
//           fallback  the original nodes, as a graph on the node's inputs
//
// Each instruction is the original operator's arithmetic on the block, written to a buffer of the
// thread before the next reads it: the same float operations and the same functions
// (ops/fast_math.h) as the elementwise kernels, one operator's rounding at a time, so results are
// bit-identical to the operators run one by one (checked by the unit tests). The intermediate
// values never reach memory beyond the thread's buffers: a 256-token prompt's GELU input is 4 MB a
// layer at GPT-2's 4096 columns, read and written nine times by the operators one by one.
//
// An input is the output's shape, one element (a scalar), or a row broadcast along the output's
// last axis (a bias: [N] or [1, ..., N]); other shapes, and types other than float32, run the
// fallback.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "ops/elementwise_chain.h"
#include "ops/fast_math.h"
#include "ops/kernel.h"
#include "ops/kernel_util.h"

namespace gaf {
namespace {

constexpr int64_t kBlock = 256;        // elements an instruction works on at a time
constexpr int64_t kGrain = 1 << 14;    // elements per task

enum class Operand : uint8_t { kFull, kScalar, kRow };

template <class F>
void Unary(const float* __restrict x, float* __restrict y, int64_t n, F f) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = f(x[i]);
}

template <class F>
void Binary(const float* a, bool a_scalar, const float* b, bool b_scalar, float* __restrict y, int64_t n, F f) {
  if (a_scalar && b_scalar) {
    const float av = a[0], bv = b[0];
    for (int64_t i = 0; i < n; ++i) y[i] = f(av, bv);
  } else if (a_scalar) {
    const float av = a[0];
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] = f(av, b[i]);
  } else if (b_scalar) {
    const float bv = b[0];
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] = f(a[i], bv);
  } else {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] = f(a[i], b[i]);
  }
}

void Apply(ChainOp op, const float* a, bool as, const float* b, bool bs, float* y, int64_t n) {
  switch (op) {
    case ChainOp::kAdd: return Binary(a, as, b, bs, y, n, [](float p, float q) { return p + q; });
    case ChainOp::kSub: return Binary(a, as, b, bs, y, n, [](float p, float q) { return p - q; });
    case ChainOp::kMul: return Binary(a, as, b, bs, y, n, [](float p, float q) { return p * q; });
    case ChainOp::kDiv: return Binary(a, as, b, bs, y, n, [](float p, float q) { return p / q; });
    default: break;
  }
  // A unary operator of a scalar operand: its value at every element.
  float v[kBlock];
  if (as) {
    std::fill(v, v + n, a[0]);
    a = v;
  }
  switch (op) {
    case ChainOp::kTanh: return Unary(a, y, n, [](float x) { return gaf_fast::FastTanh(x); });
    case ChainOp::kErf: return Unary(a, y, n, [](float x) { return gaf_fast::FastErf(x); });
    case ChainOp::kSigmoid: return Unary(a, y, n, [](float x) { return gaf_fast::FastSigmoid(x); });
    case ChainOp::kExp: return Unary(a, y, n, [](float x) { return gaf_fast::FastExp(x); });
    case ChainOp::kRelu: return Unary(a, y, n, [](float x) { return x < 0.f ? 0.f : x; });
    case ChainOp::kNeg: return Unary(a, y, n, [](float x) { return -x; });
    case ChainOp::kAbs: return Unary(a, y, n, [](float x) { return x < 0.f ? -x : x; });
    case ChainOp::kSqrt: return Unary(a, y, n, [](float x) { return std::sqrt(x); });
    default: break;
  }
}

void ElementwiseChainKernel(KernelContext& ctx) {
  static const std::vector<int64_t> kNone;
  const Attribute* ops_attr = ctx.node.FindAttr("ops");
  const Attribute* args_attr = ctx.node.FindAttr("args");
  const std::vector<int64_t>& ops = ops_attr != nullptr ? ops_attr->ints : kNone;
  const std::vector<int64_t>& args = args_attr != nullptr ? args_attr->ints : kNone;
  const int64_t n_ops = static_cast<int64_t>(ops.size()), n_in = static_cast<int64_t>(ctx.num_inputs());
  // The program is the plan rewrite's; one read from a file is checked before it runs.
  GAF_CHECK(n_ops >= 1 && n_ops <= kMaxChainOps && static_cast<int64_t>(args.size()) == 2 * n_ops,
            "{}: {} instructions with {} operands (1 to {}, two each)", ctx.node.Describe(), n_ops, args.size(),
            kMaxChainOps);
  GAF_CHECK(ctx.num_outputs() == 1, "{}: {} outputs (one)", ctx.node.Describe(), ctx.num_outputs());
  for (int64_t k = 0; k < n_ops; ++k) {
    GAF_CHECK(IsChainOp(ops[k]), "{}: instruction {} has an unknown operator code {}", ctx.node.Describe(), k,
              ops[k]);
    const int operands = ChainOpArity(static_cast<ChainOp>(ops[k]));
    for (int j = 0; j < 2; ++j) {
      const int64_t a = args[2 * k + j];
      GAF_CHECK(j >= operands ? a == -1 : (a >= 0 ? a < n_in : -a - 1 < k),
                "{}: instruction {} reads operand {}, neither one of the node's {} inputs nor one of the {} results "
                "before it", ctx.node.Describe(), k, a, n_in, k);
    }
  }
  for (int64_t i = 0; i < n_in; ++i)
    if (!ctx.has_input(static_cast<size_t>(i)) || ctx.input(static_cast<size_t>(i)).dtype() != DataType::kFloat)
      return RunPlanFallback(ctx);
  // The output's shape: the input with the most elements (of those, the highest rank), when every
  // other input is that shape, one element or a row along its last axis, of no higher rank: then
  // it is the inputs' broadcast. Other shapes run the fallback.
  const Tensor* big = &ctx.input(0);
  for (int64_t i = 1; i < n_in; ++i) {
    const Tensor& t = ctx.input(static_cast<size_t>(i));
    if (t.numel() > big->numel() || (t.numel() == big->numel() && t.rank() > big->rank())) big = &t;
  }
  const Shape& shape = big->shape();
  const int64_t total = big->numel(), row = shape.empty() ? 1 : shape.back();
  std::vector<Operand> kind(static_cast<size_t>(n_in));
  bool rows = false;
  for (int64_t i = 0; i < n_in; ++i) {
    const Tensor& t = ctx.input(static_cast<size_t>(i));
    if (t.shape() == shape) {
      kind[i] = Operand::kFull;
    } else if (t.numel() == 1 && t.rank() <= static_cast<int64_t>(shape.size())) {
      kind[i] = Operand::kScalar;
    } else {
      bool is_row = t.rank() >= 1 && t.rank() <= static_cast<int64_t>(shape.size()) && t.dim(t.rank() - 1) == row &&
                    t.numel() == row;
      if (!is_row) return RunPlanFallback(ctx);
      kind[i] = Operand::kRow;
      rows = true;
    }
  }
  Tensor Y = Tensor::Uninitialized(DataType::kFloat, shape);
  float* y = Y.data<float>();
  std::vector<const float*> in(static_cast<size_t>(n_in));
  for (int64_t i = 0; i < n_in; ++i) in[i] = ctx.input(static_cast<size_t>(i)).data<float>();
  ParallelFor(total, kGrain, [&](int64_t s, int64_t e) {
    thread_local std::vector<float> temps;  // the instructions' results on a block, kept between calls
    if (temps.size() < static_cast<size_t>(n_ops * kBlock)) temps.resize(static_cast<size_t>(n_ops * kBlock));
    for (int64_t p = s; p < e;) {
      // A block within one row when a row operand is read.
      int64_t n = std::min(kBlock, e - p);
      if (rows) n = std::min(n, row - p % row);
      for (int64_t k = 0; k < n_ops; ++k) {
        const float* opnd[2] = {nullptr, nullptr};
        bool scalar[2] = {false, false};
        for (int j = 0; j < 2; ++j) {
          const int64_t a = args[2 * k + j];
          if (a == -1 && j == 1 && ChainOpArity(static_cast<ChainOp>(ops[k])) == 1) continue;
          if (a < 0) {
            opnd[j] = temps.data() + (-a - 1) * kBlock;
          } else {
            switch (kind[a]) {
              case Operand::kFull: opnd[j] = in[a] + p; break;
              case Operand::kScalar: opnd[j] = in[a], scalar[j] = true; break;
              case Operand::kRow: opnd[j] = in[a] + p % row; break;
            }
          }
        }
        float* out = k + 1 == n_ops ? y + p : temps.data() + k * kBlock;
        Apply(static_cast<ChainOp>(ops[k]), opnd[0], scalar[0], opnd[1], scalar[1], out, n);
      }
      p += n;
    }
  });
  ctx.outputs[0] = std::move(Y);
}

}  // namespace

bool IsChainOp(int64_t code) { return code >= 0 && code <= static_cast<int64_t>(ChainOp::kSqrt); }

int ChainOpArity(ChainOp op) { return op <= ChainOp::kDiv ? 2 : 1; }

int64_t ChainOpOf(const std::string& op_type) {
  static const std::pair<const char*, ChainOp> kOps[] = {
      {"Add", ChainOp::kAdd},   {"Sub", ChainOp::kSub},         {"Mul", ChainOp::kMul},   {"Div", ChainOp::kDiv},
      {"Tanh", ChainOp::kTanh}, {"Erf", ChainOp::kErf},         {"Sigmoid", ChainOp::kSigmoid},
      {"Exp", ChainOp::kExp},   {"Relu", ChainOp::kRelu},       {"Neg", ChainOp::kNeg},
      {"Abs", ChainOp::kAbs},   {"Sqrt", ChainOp::kSqrt}};
  for (const auto& [name, op] : kOps)
    if (op_type == name) return static_cast<int64_t>(op);
  return -1;
}

void RegisterElementwiseChainKernels(OpRegistry& r) {
  // Not upcast: half types run the fallback, whose operators round each step in their type.
  r.Register({"ai.graph_autofusion.plan", "ElementwiseChain", OpKind::kElementwise, ElementwiseChainKernel, false});
}

}  // namespace gaf
