// BlockedChain (ops/blocked_chain.h): what runs in a chain (BlockedChainRejects and the operator
// recognition it shares with the planner), the chain's plans by input-shape signature (Prepare:
// the layout chosen by measurement or taken from the layout store), Run and Describe. How one
// signature is planned, pass by pass, is ChainPlanner's (ops/blocked_chain_plan.h).
#include "ops/blocked_chain.h"

#include <oneapi/dnnl/dnnl.hpp>
#include <omp.h>

#include <algorithm>
#include <functional>
#include <set>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <map>
#include <mutex>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ops/blocked_chain_plan.h"
#include "ops/dnnl_util.h"
#include "ops/kernel_util.h"

namespace gaf {
namespace {

constexpr size_t kPlansKept = 4;  // input-shape signatures (x thread counts) planned per chain
constexpr int kLayoutRounds = 5;   // interleaved timed runs per layout (after a warm-up); the median decides

using blocked_chain_internal::Act;
using blocked_chain_internal::ActivationOf;
using blocked_chain_internal::ChainPlanner;
using blocked_chain_internal::IsUnaryActivation;
using blocked_chain_internal::LayoutName;
using blocked_chain_internal::NearestFactors;
using blocked_chain_internal::ScalarOrPerChannel;
using blocked_chain_internal::tag;

// Step profiling (SetStepProfiling) and the plans it has timed (weak: a plan dropped with its
// chain leaves the profile).
std::atomic<bool>& StepProfiling() {
  static std::atomic<bool> on{false};
  return on;
}
std::mutex& ProfiledPlansMutex() {
  static std::mutex mu;
  return mu;
}
std::vector<std::weak_ptr<blocked_chain_internal::Plan>>& ProfiledPlans() {
  static std::vector<std::weak_ptr<blocked_chain_internal::Plan>> plans;
  return plans;
}

tag BlockTag() {
  static const tag t = __builtin_cpu_supports("avx512f") ? tag::nChw16c : tag::nChw8c;
  return t;
}

}  // namespace

namespace blocked_chain_internal {

// The unary activation `n` as eltwise steps (HardSigmoid is linear then clip); false when it is
// not one. Clip bounds come from constants (`constant`).
bool ActivationOf(const Node& n, const std::function<const Tensor*(const std::string&)>& constant,
                  std::vector<Act>* acts, std::string* why) {
  acts->clear();
  const std::string& op = n.op_type;
  if (op == "Relu") acts->push_back({alg::eltwise_relu, 0.f, 0.f});
  else if (op == "LeakyRelu") acts->push_back({alg::eltwise_relu, n.GetFloat("alpha", 0.01f), 0.f});
  else if (op == "Sigmoid") acts->push_back({alg::eltwise_logistic});
  else if (op == "Tanh") acts->push_back({alg::eltwise_tanh});
  else if (op == "HardSwish") acts->push_back({alg::eltwise_hardswish});
  else if (op == "HardSigmoid") {
    acts->push_back({alg::eltwise_linear, n.GetFloat("alpha", 0.2f), n.GetFloat("beta", 0.5f)});
    acts->push_back({alg::eltwise_clip, 0.f, 1.f});
  } else if (op == "Clip") {
    float lo = 0, hi = 0;
    if (!ConstantClipBounds(n, constant, &lo, &hi)) {
      if (why) *why = n.Describe() + ": Clip bounds that are not constant float32 scalars";
      return false;
    }
    acts->push_back({alg::eltwise_clip, lo, hi});
  } else {
    return false;
  }
  return true;
}

bool IsUnaryActivation(const std::string& op) {
  return op == "Relu" || op == "LeakyRelu" || op == "Sigmoid" || op == "Tanh" || op == "HardSwish" ||
         op == "HardSigmoid" || op == "Clip";
}

// A constant usable as the second operand of Add/Mul on [N,C,H,W]: a scalar or one value per
// channel ([C,1,1] or [1,C,1,1]).
bool ScalarOrPerChannel(const Tensor& t, int64_t channels) {
  if (t.dtype() != DataType::kFloat) return false;
  if (t.numel() == 1) return true;
  if (channels > 0 && t.numel() != channels) return false;
  const Shape& s = t.shape();
  return (s.size() == 3 && s[1] == 1 && s[2] == 1) || (s.size() == 4 && s[0] == 1 && s[2] == 1 && s[3] == 1);
}

// Resize / Upsample nearest by integer factors [1,1,fh,fw] (false with `why` otherwise).
bool NearestFactors(const Node& n, const std::function<const Tensor*(const std::string&)>& constant,
                    const Shape* x, int64_t* fh, int64_t* fw, std::string* why) {
  auto fail = [&](const std::string& m) {
    if (why) *why = n.Describe() + ": " + m;
    return false;
  };
  if (n.GetString("mode", "nearest") != "nearest") return fail("only nearest resizing runs on blocked layouts");
  std::vector<float> scales;
  if (n.op_type == "Upsample" && n.HasAttr("scales")) {
    scales = n.GetFloats("scales");
  } else {
    const size_t si = n.op_type == "Upsample" || n.inputs.size() == 2 ? 1 : 2;
    if (n.op_type == "Resize") {
      if (n.GetInt("antialias", 0) != 0) return fail("antialiased resizing");
      const std::string ct = n.GetString("coordinate_transformation_mode", "half_pixel");
      const std::string nm = n.GetString("nearest_mode", "round_prefer_floor");
      // For integer factors these all pick source index floor(dst / factor), as oneDNN does.
      const bool ok = (ct == "asymmetric" && nm == "floor") ||
                      ((ct == "half_pixel" || ct == "pytorch_half_pixel") && nm == "round_prefer_floor");
      if (!ok) return fail("coordinate mode '" + ct + "' with nearest mode '" + nm + "'");
      if (!n.GetInts("axes").empty()) return fail("resizing with 'axes'");
    }
    const Tensor* s = si < n.inputs.size() && !n.inputs[si].empty() ? constant(n.inputs[si]) : nullptr;
    if (s != nullptr && s->numel() > 0) {
      if (s->dtype() != DataType::kFloat) return fail("scales that are not float32");
      for (int64_t i = 0; i < s->numel(); ++i) scales.push_back(s->data<float>()[i]);
    } else if (n.op_type == "Resize" && n.inputs.size() > 3 && !n.inputs[3].empty()) {
      const Tensor* sz = constant(n.inputs[3]);
      if (sz == nullptr || sz->dtype() != DataType::kInt64 || sz->numel() != 4) return fail("sizes that are not constant");
      if (x == nullptr || x->size() != 4) return fail("sizes without a known 4-D input shape");
      for (int i = 0; i < 4; ++i) {
        const int64_t o = sz->data<int64_t>()[i];
        if ((*x)[i] <= 0 || o % (*x)[i] != 0) return fail("sizes that are not integer multiples of the input");
        scales.push_back(static_cast<float>(o / (*x)[i]));
      }
    } else {
      return fail("scales that are not constant");
    }
  }
  if (scales.size() != 4 || scales[0] != 1.f || scales[1] != 1.f) return fail("resizing of batch or channels");
  for (int i = 2; i < 4; ++i)
    if (scales[i] < 1.f || scales[i] > 64.f || scales[i] != std::floor(scales[i]))
      return fail("a factor that is not an integer from 1 to 64");
  *fh = static_cast<int64_t>(scales[2]);
  *fw = static_cast<int64_t>(scales[3]);
  return true;
}

}  // namespace blocked_chain_internal

std::string BlockedChainRejects(const Node& n, const std::function<const Tensor*(const std::string&)>& constant,
                                const std::function<const Shape*(const std::string&)>& shape_of) {
  if (!n.domain.empty()) return n.Describe() + ": not an ONNX operator";
  for (const Attribute& a : n.attributes)
    if (a.g || !a.graphs.empty()) return n.Describe() + ": carries a subgraph";
  const std::string& op = n.op_type;
  auto cst = [&](size_t i) -> const Tensor* {
    return i < n.inputs.size() && !n.inputs[i].empty() ? constant(n.inputs[i]) : nullptr;
  };
  auto float_cst = [&](size_t i) {
    const Tensor* t = cst(i);
    return t != nullptr && t->dtype() == DataType::kFloat;
  };
  // Data values (non-constant inputs, the outputs) must be 4-D where their shapes are known.
  auto data_rank_ok = [&](const std::string& v) {
    if (v.empty() || constant(v) != nullptr) return true;
    const Shape* s = shape_of(v);
    return s == nullptr || s->size() == 4;
  };
  if (n.outputs.empty() || n.outputs[0].empty()) return n.Describe() + ": no output";
  if (n.inputs.empty() || n.inputs[0].empty()) return n.Describe() + ": no data input";
  for (size_t i = 1; i < n.outputs.size(); ++i)
    if (!n.outputs[i].empty()) return n.Describe() + ": a second output";
  std::string why;
  std::vector<Act> acts;
  if (op == "Conv") {
    const Tensor* w = cst(1);
    if (w == nullptr || w->dtype() != DataType::kFloat || w->rank() != 4) return n.Describe() + ": weight not a constant 4-D float32";
    if (n.HasInput(2) && !float_cst(2)) return n.Describe() + ": bias not a constant float32";
  } else if (op == "BatchNormalization") {
    if (n.GetInt("training_mode", 0) != 0) return n.Describe() + ": training mode";
    for (size_t i = 1; i < 5; ++i)
      if (!float_cst(i)) return n.Describe() + ": parameters not constant float32";
  } else if (IsUnaryActivation(op)) {
    if (!ActivationOf(n, constant, &acts, &why)) return why;
  } else if (op == "Identity") {
  } else if (op == "Add" || op == "Mul") {
    if (n.inputs.size() != 2) return n.Describe() + ": not two inputs";
    const Tensor *a = cst(0), *b = cst(1);
    if (a != nullptr && b != nullptr) return n.Describe() + ": constant operands";
    const Tensor* c = a != nullptr ? a : b;
    const Shape* xs = shape_of(n.inputs[a != nullptr ? 1 : 0]);
    if (c != nullptr) {
      if (!ScalarOrPerChannel(*c, xs != nullptr && xs->size() == 4 ? (*xs)[1] : -1))
        return n.Describe() + ": a constant operand that is neither a scalar nor per channel";
    } else {
      const Shape *sa = shape_of(n.inputs[0]), *sb = shape_of(n.inputs[1]);
      if ((sa != nullptr && sa->size() != 4) || (sb != nullptr && sb->size() != 4)) return n.Describe() + ": not 4-D";
      if (sa != nullptr && sb != nullptr && *sa != *sb) {
        const Shape& big = (*sa)[2] * (*sa)[3] >= (*sb)[2] * (*sb)[3] ? *sa : *sb;
        const Shape& small = &big == sa ? *sb : *sa;
        if (small.size() != 4 || big.size() != 4 || small[0] != big[0] || small[1] != big[1] || small[2] != 1 ||
            small[3] != 1)
          return n.Describe() + ": operand shapes " + ShapeToString(*sa) + " and " + ShapeToString(*sb) +
                 " (same shape or [N,C,1,1] broadcast only)";
      }
    }
  } else if (op == "MaxPool" || op == "AveragePool") {
    if (n.GetInts("kernel_shape").size() != 2) return n.Describe() + ": not a 2-D window";
    for (int64_t d : n.GetInts("dilations"))
      if (d != 1) return n.Describe() + ": dilated pooling";
    if (op == "MaxPool" && n.GetInt("storage_order", 0) != 0) return n.Describe() + ": storage_order";
    if (op == "AveragePool" && n.GetInt("count_include_pad", 0) != 0 && n.GetInt("ceil_mode", 0) != 0)
      return n.Describe() + ": count_include_pad with ceil_mode";
  } else if (op == "GlobalAveragePool" || op == "GlobalMaxPool") {
  } else if (op == "Concat") {
    const int64_t axis = n.GetInt("axis", 0);
    if (axis != 1 && axis != -3) return n.Describe() + ": not along channels";
    // oneDNN concatenates blocked tensors well only when each part fills whole channel blocks.
    for (const auto& in : n.inputs) {
      const Shape* s = in.empty() ? nullptr : shape_of(in);
      if (s != nullptr && s->size() == 4 && (*s)[1] % 16 != 0)
        return n.Describe() + ": input '" + in + "' has " + std::to_string((*s)[1]) +
               " channels, not a multiple of the 16-channel block";
    }
  } else if (op == "Resize" || op == "Upsample") {
    int64_t fh = 0, fw = 0;
    if (!NearestFactors(n, constant, shape_of(n.inputs[0]), &fh, &fw, &why)) return why;
  } else if (op == "Transpose") {
    // NCHW <-> NHWC only; where it may sit (after a chain input, before a chain output) is checked
    // when the chain is made (BlockedChain::Create folds it into the input's or output's format).
    const std::vector<int64_t> perm = n.GetInts("perm");
    if (perm != std::vector<int64_t>{0, 3, 1, 2} && perm != std::vector<int64_t>{0, 2, 3, 1})
      return n.Describe() + ": a Transpose other than NHWC to NCHW or back";
  } else if (op == "ConvTranspose") {
    // oneDNN 2.6's deconvolution ran the PP-OCR-like head's 2x2 stride-2 upsampling 10-100x slower
    // than our ConvTranspose kernel: it stays outside chains.
    return n.Describe() + ": ConvTranspose is left to our own kernel (oneDNN's deconvolution is slow here)";
  } else {
    return n.Describe() + ": " + op + " does not run on blocked layouts";
  }
  if (!data_rank_ok(n.inputs[0]) || !data_rank_ok(n.outputs[0])) return n.Describe() + ": not 4-D";
  if ((op == "Add" || op == "Mul" || op == "Concat") &&
      !std::all_of(n.inputs.begin(), n.inputs.end(), data_rank_ok))
    return n.Describe() + ": not 4-D";
  return "";
}

struct BlockedChain::Impl {
  int pools_moved = 0;  // AveragePools moved before the 1x1 convolution they read (PoolBeforePointwiseConv)
  std::vector<Node> nodes;
  std::vector<std::string> inputs, outputs;
  std::map<std::string, Tensor> constants;
  // Inputs and outputs in NHWC, by position: the Transposes at the chain's boundary, folded.
  blocked_chain_internal::Boundary boundary;

  // The NCHW shapes the plans are made for: an NHWC input's dims permuted.
  std::vector<Shape> Logical(std::vector<Shape> shapes) const {
    for (size_t i = 0; i < shapes.size() && i < boundary.nhwc_in.size(); ++i)
      if (boundary.nhwc_in[i] && shapes[i].size() == 4) shapes[i] = {shapes[i][0], shapes[i][3], shapes[i][1], shapes[i][2]};
    return shapes;
  }

  const Tensor* Constant(const std::string& v) const {
    auto it = constants.find(v);
    return it == constants.end() ? nullptr : &it->second;
  }

  using Plan = blocked_chain_internal::Plan;
  using Step = blocked_chain_internal::Step;
  std::mutex mu;
  std::shared_ptr<Plan> last;
  std::vector<std::shared_ptr<Plan>> plans;  // by input shapes and thread count, oldest first
  BlockedChain::Layout layout = BlockedChain::Layout::kMeasured;
  BlockedChain::ConvKernels conv_kernels = BlockedChain::ConvKernels::kMeasured;
  BlockedChain::LayoutStore store;
  // What the layout choice depends on, for the store (see LayoutStore).
  std::string ChoiceKey(const std::vector<Shape>& in_shapes, int threads) const {
    std::string k = fmt::format("blocked-chain v4 dnnl {}.{}.{} threads {} inputs", DNNL_VERSION_MAJOR,
                                DNNL_VERSION_MINOR, DNNL_VERSION_PATCH, threads);
    for (const Shape& sh : in_shapes) k += " " + ShapeToString(sh);
    k += fmt::format(" nhwc in {} out {}", fmt::join(boundary.nhwc_in, ","), fmt::join(boundary.nhwc_out, ","));
    for (const Node& n : nodes) {
      k += "\n" + n.op_type + "(";
      for (const auto& in : n.inputs) {
        const Tensor* c = in.empty() ? nullptr : Constant(in);
        k += c != nullptr ? "const" + ShapeToString(c->shape()) : "v";
        k += ",";
      }
      k += ")";
      for (const Attribute& a : n.attributes) {
        k += " " + a.name + "=";
        if (a.type == Attribute::Type::kInt) k += std::to_string(a.i);
        else if (a.type == Attribute::Type::kFloat) k += fmt::format("{}", a.f);
        else if (a.type == Attribute::Type::kString) k += fmt::format("{:?}", a.s);
        else if (a.type == Attribute::Type::kInts) k += fmt::format("{}", fmt::join(a.ints, ","));
        else if (a.type == Attribute::Type::kFloats) k += fmt::format("{}", fmt::join(a.floats, ","));
        else k += "?";
      }
    }
    return k;
  }
  std::string plan_error;  // why the last PlanFor found no plan

  // The plan of these input shapes at the current thread count, made (and the layout chosen) on
  // first use; null with plan_error set when oneDNN cannot run the chain for them. mu held.
  std::shared_ptr<Plan> PlanFor(const std::vector<Shape>& input_shapes);

  // `layout`: the format of every value inside the chain (a channel-blocked tag, or nhwc).
  // `stored`: the convolution kernels remembered for this layout (none: measured, as
  // conv_kernels says).
  std::shared_ptr<Plan> Build(const std::vector<Shape>& in_shapes, bool binary_post_ops, dnnl::memory::format_tag layout,
                              std::vector<std::string> stored);
};

std::shared_ptr<BlockedChain::Impl::Plan> BlockedChain::Impl::Build(const std::vector<Shape>& in_shapes,
                                                                     bool binary_post_ops, dnnl::memory::format_tag layout,
                                                                     std::vector<std::string> stored) {
  blocked_chain_internal::ConvImplChoice choice;
  choice.measure = conv_kernels != ConvKernels::kLibrary;
  choice.winograd = conv_kernels == ConvKernels::kMeasured;
  choice.stored = std::move(stored);
  return ChainPlanner(nodes, inputs, outputs, constants, binary_post_ops, layout, std::move(choice), boundary)
      .Build(in_shapes);
}

namespace {

// Whether an attribute of ints is absent or every value equals v.
bool AllOr(const Node& n, const char* name, int64_t v) {
  if (!n.HasAttr(name)) return true;
  for (int64_t x : n.GetInts(name))
    if (x != v) return false;
  return true;
}

bool NoAutoPad(const Node& n) {
  const std::string a = n.GetString("auto_pad", "NOTSET");
  return a == "NOTSET" || a == "VALID";
}

// A 1x1 convolution whose only reader is an AveragePool without padding (DenseNet's transitions:
// BN, ReLU, 1x1 convolution, 2x2 average pool) computes what the pool, then the convolution,
// computes: both are linear and the convolution maps each pixel on its own, so the average of its
// outputs is its output on the average of the inputs (its bias too: the average of a constant).
// After the pool the convolution has a quarter of the pixels to compute (DenseNet-121's three
// transitions are 11% of its multiply-adds). The sums are reassociated: the rounding differs, as
// it does between two kernels. Returns how many pairs were swapped; names a new value only with a
// name no node uses.
int PoolBeforePointwiseConv(std::vector<Node>& nodes, const std::vector<std::string>& outputs,
                            const std::function<const Tensor*(const std::string&)>& constant) {
  std::set<std::string> names;
  // Each value's readers: how many inputs name it, and the last node that reads it. A swap keeps
  // these for every value a later convolution may output (its source is read at the same place).
  std::map<std::string, std::pair<size_t, size_t>> readers;
  for (size_t j = 0; j < nodes.size(); ++j) {
    const Node& n = nodes[j];
    names.insert(n.inputs.begin(), n.inputs.end());
    names.insert(n.outputs.begin(), n.outputs.end());
    for (const std::string& in : n.inputs) {
      auto& r = readers[in];
      ++r.first, r.second = j;
    }
  }
  int swapped = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    Node& conv = nodes[i];
    if (conv.op_type != "Conv" || conv.inputs.size() < 2 || conv.outputs.size() != 1) continue;
    const Tensor* w = constant(conv.inputs[1]);
    if (w == nullptr || w->rank() != 4 || w->dim(2) != 1 || w->dim(3) != 1 || !AllOr(conv, "strides", 1) ||
        !AllOr(conv, "pads", 0) || !AllOr(conv, "dilations", 1) || !AllOr(conv, "kernel_shape", 1) || !NoAutoPad(conv))
      continue;
    const std::string y = conv.outputs[0];
    if (std::find(outputs.begin(), outputs.end(), y) != outputs.end()) continue;
    const auto r = readers.find(y);
    if (r == readers.end() || r->second.first != 1 || r->second.second <= i) continue;
    const size_t pool_at = r->second.second;
    Node& pool = nodes[pool_at];
    if (pool.op_type != "AveragePool" || pool.inputs.size() != 1 || pool.inputs[0] != y || pool.outputs.size() != 1 ||
        !AllOr(pool, "pads", 0) || pool.GetInt("ceil_mode", 0) != 0 || !AllOr(pool, "dilations", 1) || !NoAutoPad(pool))
      continue;
    std::string pooled = y + "/pooled_input";
    while (names.count(pooled)) pooled += "_";
    names.insert(pooled);
    Node first = pool, second = conv;  // the pool at the convolution's place, the convolution at the pool's
    first.inputs[0] = conv.inputs[0];
    first.outputs[0] = pooled;
    second.inputs[0] = pooled;
    second.outputs[0] = pool.outputs[0];
    nodes[i] = std::move(first);
    nodes[pool_at] = std::move(second);
    ++swapped;
  }
  return swapped;
}

}  // namespace

std::shared_ptr<BlockedChain> BlockedChain::Create(std::vector<Node> nodes, std::vector<std::string> inputs,
                                                   std::vector<std::string> outputs,
                                                   std::map<std::string, Tensor> constants, std::string* why) {
  auto constant = [&](const std::string& v) -> const Tensor* {
    auto it = constants.find(v);
    return it == constants.end() ? nullptr : &it->second;
  };
  auto no_shape = [](const std::string&) -> const Shape* { return nullptr; };
  for (const Node& n : nodes) {
    std::string r = BlockedChainRejects(n, constant, no_shape);
    if (!r.empty()) {
      if (why) *why = r;
      return nullptr;
    }
  }
  if (outputs.empty()) {
    if (why) *why = "no outputs";
    return nullptr;
  }
  // Transposes at the boundary (tf2onnx's NHWC models: one to NCHW after the image input, one back
  // to NHWC before an output) are folded into how the chain reads that input and writes that
  // output: an NHWC tensor is the NCHW value in oneDNN's nhwc format, so the chain's reorder in or
  // out does the transposition and the Transpose's own pass over the data goes.
  blocked_chain_internal::Boundary boundary;
  boundary.nhwc_in.assign(inputs.size(), false);
  boundary.nhwc_out.assign(outputs.size(), false);
  std::vector<Node> kept;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    if (n.op_type != "Transpose") {
      kept.push_back(n);
      continue;
    }
    const std::string &x = n.inputs[0], &y = n.outputs[0];
    auto read_elsewhere = [&](const std::string& v) {
      for (size_t j = 0; j < nodes.size(); ++j)
        if (j != i && std::find(nodes[j].inputs.begin(), nodes[j].inputs.end(), v) != nodes[j].inputs.end()) return true;
      return false;
    };
    const auto in_at = std::find(inputs.begin(), inputs.end(), x);
    const bool y_is_output = std::find(outputs.begin(), outputs.end(), y) != outputs.end();
    if (n.GetInts("perm") == std::vector<int64_t>{0, 3, 1, 2} && in_at != inputs.end() && constant(x) == nullptr &&
        !read_elsewhere(x) && !y_is_output && std::count(inputs.begin(), inputs.end(), x) == 1) {
      boundary.nhwc_in[static_cast<size_t>(in_at - inputs.begin())] = true;
      *in_at = y;  // the chain reads the Transpose's output: the input, seen as NCHW
      continue;
    }
    if (n.GetInts("perm") == std::vector<int64_t>{0, 2, 3, 1} && y_is_output && !read_elsewhere(y) &&
        std::find(inputs.begin(), inputs.end(), x) == inputs.end()) {
      for (size_t o = 0; o < outputs.size(); ++o)
        if (outputs[o] == y) outputs[o] = x, boundary.nhwc_out[o] = true;  // written as NHWC
      continue;
    }
    if (why)
      *why = n.Describe() + ": a Transpose inside the chain (only one after a chain input, to NCHW, or before a "
                            "chain output, to NHWC, is folded into the chain)";
    return nullptr;
  }
  nodes = std::move(kept);
  const int pools_moved = PoolBeforePointwiseConv(nodes, outputs, constant);
  auto c = std::shared_ptr<BlockedChain>(new BlockedChain());
  c->impl_ = std::make_unique<Impl>();
  c->impl_->pools_moved = pools_moved;
  c->impl_->boundary = std::move(boundary);
  c->impl_->nodes = std::move(nodes);
  c->impl_->inputs = std::move(inputs);
  c->impl_->outputs = std::move(outputs);
  c->impl_->constants = std::move(constants);
  return c;
}

BlockedChain::~BlockedChain() = default;

void BlockedChain::SetLayoutStore(LayoutStore store) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->store = std::move(store);
}

void BlockedChain::SetConvKernels(ConvKernels kernels) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->conv_kernels != kernels) {
    impl_->last.reset();
    impl_->plans.clear();
  }
  impl_->conv_kernels = kernels;
}

void BlockedChain::SetLayout(Layout layout) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->layout != layout) {
    impl_->last.reset();
    impl_->plans.clear();
  }
  impl_->layout = layout;
}

namespace {

// Runs a plan's steps on zeroed inputs and outputs of its shapes (the data does not change the
// time of these kernels).
struct TimedRun {
  std::vector<std::vector<float>> in, out;
  void Bind(BlockedChain::Impl::Plan& p, const std::vector<Shape>& in_shapes) {
    in.assign(in_shapes.size(), {});
    for (size_t i = 0; i < in_shapes.size(); ++i) {
      if (!p.input_mem[i]) continue;
      int64_t n = 1;
      for (int64_t d : in_shapes[i]) n *= d;
      in[i].assign(static_cast<size_t>(n), 0.f);
      p.input_mem[i].set_data_handle(in[i].data());
    }
    out.assign(p.out_shapes.size(), {});
    for (size_t i = 0; i < p.out_shapes.size(); ++i) {
      int64_t n = 1;
      for (int64_t d : p.out_shapes[i]) n *= d;
      out[i].assign(static_cast<size_t>(n), 0.f);
      p.output_mem[i].set_data_handle(out[i].data());
    }
  }
  static double Once(BlockedChain::Impl::Plan& p) {
    NoteOwnParallelRegion();  // oneDNN runs its own OpenMP regions
    dnnl::stream s(DnnlEngine());
    const auto t0 = std::chrono::steady_clock::now();
    for (auto& st : p.steps) st.Execute(s);
    s.wait();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
};

}  // namespace

std::string BlockedChain::Prepare(const std::vector<Shape>& input_shapes) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->PlanFor(impl_->Logical(input_shapes)) ? "" : impl_->plan_error;
}

std::shared_ptr<BlockedChain::Impl::Plan> BlockedChain::Impl::PlanFor(const std::vector<Shape>& input_shapes) {
  const int threads = omp_get_max_threads();
  if (last && last->in_shapes == input_shapes && last->threads == threads) return last;
  for (const auto& p : plans)
    if (p->in_shapes == input_shapes && p->threads == threads) {
      last = p;
      return p;
    }
  // The layout is chosen by measurement: a plan on the channel-blocked layout (the jit kernels;
  // Concats in place) and one on NHWC (oneDNN's brgemm kernels), timed interleaved on this
  // machine at this thread count; the faster is kept.
  std::string first;
  std::vector<std::shared_ptr<Plan>> candidates;
  std::vector<tag> layouts;
  if (layout != Layout::kNhwc) layouts.push_back(BlockTag());
  if (layout != Layout::kBlocked) layouts.push_back(tag::nhwc);
  // What the store holds: the layout's name, then the kernel of each convolution, a line each.
  std::string key, stored;
  std::vector<std::string> stored_kernels;
  if (layout == Layout::kMeasured && conv_kernels == ConvKernels::kMeasured && store.get) {
    key = ChoiceKey(input_shapes, threads);
    const std::string entry = store.get(key);
    size_t at = entry.find('\n');
    stored = entry.substr(0, at);
    while (at != std::string::npos) {
      const size_t next = entry.find('\n', at + 1);
      stored_kernels.push_back(entry.substr(at + 1, next == std::string::npos ? std::string::npos : next - at - 1));
      at = next;
    }
    for (tag t : layouts)
      if (stored == LayoutName(t)) layouts = {t};  // anything else stored is ignored
  }
  for (tag t : layouts) {
    // With residual Adds as post-ops first; where oneDNN has no convolution taking them, the
    // Adds run as binary steps of their own.
    for (bool binary : {true, false}) {
      try {
        candidates.push_back(
            Build(input_shapes, binary, t, stored == LayoutName(t) ? stored_kernels : std::vector<std::string>{}));
        break;
      } catch (const dnnl::error& e) {
        if (first.empty()) first = fmt::format("oneDNN: {} (status {})", e.what(), static_cast<int>(e.status));
      } catch (const std::exception& e) {
        if (first.empty()) first = e.what();
      }
    }
  }
  if (candidates.empty()) {
    plan_error = first;
    return nullptr;
  }
  if (candidates.size() > 1) {
    std::vector<TimedRun> runs(candidates.size());
    std::vector<std::vector<double>> times(candidates.size());
    for (size_t i = 0; i < candidates.size(); ++i) {
      runs[i].Bind(*candidates[i], input_shapes);
      TimedRun::Once(*candidates[i]);  // warm-up: first touches, oneDNN's lazy initialization
    }
    for (int round = 0; round < kLayoutRounds; ++round)
      for (size_t i = 0; i < candidates.size(); ++i) times[i].push_back(TimedRun::Once(*candidates[i]));
    size_t best = 0;
    for (size_t i = 0; i < candidates.size(); ++i) {
      std::sort(times[i].begin(), times[i].end());
      candidates[i]->measured_ms = times[i][kLayoutRounds / 2];
      if (candidates[i]->measured_ms < candidates[best]->measured_ms) best = i;
    }
    std::string choice;
    for (const auto& p : candidates)
      choice += fmt::format("{}{} {:.3f} ms", choice.empty() ? fmt::format("layout measured at {} thread(s): ", threads) : ", ",
                            p->layout, p->measured_ms);
    last = candidates[best];
    last->choice = choice;
  } else {
    last = candidates[0];
    if (layouts.size() == 1 && !key.empty() && stored == candidates[0]->layout)
      last->choice = fmt::format("layout from an earlier measurement on this machine at {} thread(s)", threads);
  }
  if (!key.empty() && store.put && (candidates.size() > 1 || last->stats.convs_measured > 0)) {
    std::string entry = last->layout;
    for (const std::string& k : last->conv_impls) entry += "\n" + k;
    store.put(key, entry);
  }
  // A few signatures are kept (a detector fed images of several sizes does not re-plan on every
  // change), the oldest dropped first.
  plans.push_back(last);
  if (plans.size() > kPlansKept) plans.erase(plans.begin());
  return last;
}

std::vector<Tensor> BlockedChain::Run(const std::vector<const Tensor*>& inputs) {
  std::vector<Shape> shapes(impl_->inputs.size());
  for (size_t i = 0; i < impl_->inputs.size(); ++i) {
    if (impl_->Constant(impl_->inputs[i])) continue;
    GAF_CHECK(i < inputs.size() && inputs[i] != nullptr && inputs[i]->dtype() == DataType::kFloat,
              "blocked chain: input '{}' must be a float32 tensor", impl_->inputs[i]);
    shapes[i] = inputs[i]->shape();
  }
  shapes = impl_->Logical(std::move(shapes));
  // Planned and run under one lock: another thread's call of other shapes cannot swap the plan.
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::shared_ptr<Impl::Plan> plan = impl_->PlanFor(shapes);
  GAF_CHECK(plan != nullptr, "blocked chain: cannot plan for these shapes: {}", impl_->plan_error);
  Impl::Plan& p = *plan;
  std::vector<Tensor> outs;
  for (const Shape& s : p.out_shapes) outs.push_back(Tensor::Uninitialized(DataType::kFloat, s));
  for (size_t i = 0; i < impl_->inputs.size(); ++i)
    if (p.input_mem[i]) p.input_mem[i].set_data_handle(const_cast<float*>(inputs[i]->data<float>()));
  for (size_t i = 0; i < outs.size(); ++i) p.output_mem[i].set_data_handle(outs[i].data<float>());
  NoteOwnParallelRegion();  // oneDNN runs its own OpenMP regions
  dnnl::stream s(DnnlEngine());
  if (!StepProfiling().load(std::memory_order_relaxed)) {
    for (Impl::Step& st : p.steps) st.Execute(s);
    s.wait();
    return outs;
  }
  std::vector<double> seconds(p.steps.size());
  for (size_t k = 0; k < p.steps.size(); ++k) {
    const auto t0 = std::chrono::steady_clock::now();
    p.steps[k].Execute(s);
    s.wait();
    seconds[k] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  bool first;
  {
    std::lock_guard<std::mutex> profile_lock(p.profile_mu);
    for (size_t k = 0; k < seconds.size(); ++k) p.step_seconds[k] += seconds[k];
    first = p.profiled_calls++ == 0;
  }
  if (first) {
    std::lock_guard<std::mutex> registry_lock(ProfiledPlansMutex());
    ProfiledPlans().push_back(plan);
  }
  return outs;
}

void BlockedChain::SetStepProfiling(bool on) { StepProfiling().store(on); }

std::vector<BlockedChain::StepTime> BlockedChain::StepProfile(size_t max) {
  std::vector<StepTime> all;
  {
    std::lock_guard<std::mutex> registry_lock(ProfiledPlansMutex());
    auto& plans = ProfiledPlans();
    for (auto it = plans.begin(); it != plans.end();) {
      std::shared_ptr<Impl::Plan> p = it->lock();
      if (!p) {
        it = plans.erase(it);
        continue;
      }
      std::lock_guard<std::mutex> profile_lock(p->profile_mu);
      for (size_t k = 0; k < p->steps.size() && k < p->step_seconds.size(); ++k)
        all.push_back({p->steps[k].label, p->profiled_calls, p->step_seconds[k]});
      ++it;
    }
  }
  std::stable_sort(all.begin(), all.end(), [](const StepTime& a, const StepTime& b) { return a.seconds > b.seconds; });
  if (all.size() > max) all.resize(max);
  return all;
}

BlockedChain::Stats BlockedChain::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->last ? impl_->last->stats : Stats{};
}

std::string BlockedChain::Describe() const {
  const Stats s = stats();
  std::string layout, measured, kernels;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->last) {
      layout = impl_->last->layout, measured = impl_->last->choice;
      // The convolutions' kernels by name, most used first.
      std::map<std::string, int> count;
      for (const std::string& k : impl_->last->conv_impls) count[k]++;
      std::vector<std::pair<int, std::string>> by_use;
      for (const auto& [k, c] : count) by_use.emplace_back(-c, k);
      std::sort(by_use.begin(), by_use.end());
      for (const auto& [c, k] : by_use) kernels += fmt::format("{}{} x{}", kernels.empty() ? "" : ", ", k, -c);
    }
  }
  return fmt::format("oneDNN {} chain: {} operators, {} convolutions, {} folded/post-op, {} steps, reorders {} in / {} out / "
                     "{} inside, Concat inputs {} in place / {} copied, {} residuals in place, {:.1f} MB of buffers{}",
                     layout, impl_->nodes.size(), s.convs, s.post_ops, s.steps, s.reorders_in, s.reorders_out,
                     s.reorders_inside, s.concat_in_place, s.concat_copies, s.residuals_in_place,
                     static_cast<double>(s.buffer_bytes) / 1e6, measured.empty() ? "" : " (" + measured + ")") +
         (impl_->pools_moved == 0 ? ""
                                  : fmt::format("; {} average pool(s) moved before their 1x1 convolution", impl_->pools_moved)) +
         (kernels.empty() ? "" : fmt::format("; convolution kernels ({} timed when planned): {}", s.convs_measured, kernels));
}

}  // namespace gaf
