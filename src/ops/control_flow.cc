// Control flow: If, Loop, Scan. Bodies run through ctx.subgraphs, which resolves outer-scope
// values from the calling frame.
#include <cstring>

#include "ir/limits.h"
#include "ops/kernel.h"
#include "ops/kernel_util.h"

namespace gaf {
namespace {

bool TruthValue(const Tensor& t, const Node& node, const char* what) {
  GAF_CHECK(t.numel() == 1, "{}: {} must hold a single value, got shape {}", node.Describe(), what,
            ShapeToString(t.shape()));
  return t.ScalarAsDouble() != 0.0;
}

void IfKernel(KernelContext& ctx) {
  const Node& n = ctx.node;
  bool cond = TruthValue(ctx.input(0), n, "the condition");
  const Graph* branch = n.GetGraph(cond ? "then_branch" : "else_branch");
  GAF_CHECK(branch != nullptr, "{}: missing {} attribute", n.Describe(), cond ? "then_branch" : "else_branch");
  std::vector<Tensor> outs = ctx.subgraphs->RunSubgraph(*branch, {});
  GAF_CHECK(outs.size() >= ctx.num_outputs(), "{}: branch produced {} outputs, node has {}", n.Describe(),
            outs.size(), ctx.num_outputs());
  for (size_t i = 0; i < ctx.num_outputs(); ++i) ctx.outputs[i] = outs[i];
}

// Stacks equally shaped tensors along a new axis `axis` (0..rank).
Tensor Stack(const std::vector<Tensor>& items, int64_t axis, const Node& node) {
  GAF_CHECK(!items.empty(), "{}: nothing to stack", node.Describe());
  const Shape& s = items[0].shape();
  for (const Tensor& t : items)
    GAF_CHECK(t.shape() == s && t.dtype() == items[0].dtype(),
              "{}: scan outputs change shape or type between iterations ({} vs {})", node.Describe(),
              ShapeToString(s), ShapeToString(t.shape()));
  Shape out_shape = s;
  out_shape.insert(out_shape.begin() + axis, static_cast<int64_t>(items.size()));
  Tensor out(items[0].dtype(), out_shape);
  GAF_CHECK(items[0].dtype() != DataType::kString, "{}: string scan outputs are not supported", node.Describe());
  size_t esz = DataTypeSize(items[0].dtype());
  int64_t outer = 1;
  for (int64_t i = 0; i < axis; ++i) outer *= s[i];
  int64_t inner = items[0].numel() / std::max<int64_t>(outer, 1);
  if (items[0].numel() == 0) return out;
  size_t block = static_cast<size_t>(inner) * esz;
  char* dst = static_cast<char*>(out.raw());
  for (int64_t o = 0; o < outer; ++o)
    for (size_t k = 0; k < items.size(); ++k) {
      std::memcpy(dst, static_cast<const char*>(items[k].raw()) + o * block, block);
      dst += block;
    }
  return out;
}

// Slice index `idx` along `axis`, removing that axis.
Tensor TakeAlong(const Tensor& t, int64_t axis, int64_t idx) {
  Shape s = t.shape();
  int64_t n = s[axis];
  s.erase(s.begin() + axis);
  Tensor out(t.dtype(), s);
  size_t esz = DataTypeSize(t.dtype());
  int64_t outer = 1;
  for (int64_t i = 0; i < axis; ++i) outer *= t.shape()[i];
  int64_t inner = out.numel() / std::max<int64_t>(outer, 1);
  if (out.numel() == 0) return out;
  size_t block = static_cast<size_t>(inner) * esz;
  for (int64_t o = 0; o < outer; ++o)
    std::memcpy(static_cast<char*>(out.raw()) + o * block,
                static_cast<const char*>(t.raw()) + (o * n + idx) * block, block);
  return out;
}

// True when the body's condition output is certainly true in every iteration that starts with a
// true condition: the condition input passed through (directly or by Identity nodes), or a true
// constant of the body (an initializer or a Constant node). Such a loop runs its whole trip count.
bool TrueScalar(const Tensor* t) {
  return t != nullptr && t->numel() == 1 && t->dtype() != DataType::kString && t->ScalarAsDouble() != 0.0;
}

bool ConditionStaysTrue(const Graph& body) {
  if (body.outputs.empty() || body.inputs.size() < 2) return false;
  const GraphIndex index(body);
  std::string v = body.outputs[0].name;
  for (size_t hops = 0; hops <= body.nodes.size(); ++hops) {
    if (v == body.inputs[1].name) return true;
    const int p = index.Producer(v);
    if (p < 0) return TrueScalar(body.FindInitializer(v));  // a body initializer, or a value from outside
    if (body.nodes[p].op_type == "Constant") return TrueScalar(body.nodes[p].GetTensor("value"));
    if (body.nodes[p].op_type != "Identity" || !body.nodes[p].HasInput(0)) return false;
    v = body.nodes[p].inputs[0];
  }
  return false;
}

std::string TripCountText(int64_t max_trip) {
  return max_trip == INT64_MAX ? std::string("no trip count") : fmt::format("trip count {}", max_trip);
}

// A loop that would run past --max-loop-iterations is an error before its first iteration when
// its condition cannot stop it.
void CheckLoopBound(const Node& n, const Graph& body, int64_t max_trip, bool cond) {
  const int64_t limit = GlobalLimits().max_loop_iterations;
  if (!cond || max_trip <= limit || !ConditionStaysTrue(body)) return;
  if (max_trip == INT64_MAX)
    throw Error(fmt::format("{}: has no trip count and its condition stays true, so it would never end (the limit is "
                            "{} iterations, --max-loop-iterations)",
                            n.Describe(), limit));
  throw Error(fmt::format("{}: trip count {} is more than the limit of {} iterations (--max-loop-iterations)",
                          n.Describe(), max_trip, limit));
}

void LoopKernel(KernelContext& ctx) {
  const Node& n = ctx.node;
  const Graph* body = n.GetGraph("body");
  GAF_CHECK(body != nullptr, "{}: missing body attribute", n.Describe());
  int64_t max_trip = ctx.has_input(0) ? ctx.input(0).ScalarAsInt64() : INT64_MAX;
  bool cond = ctx.has_input(1) ? TruthValue(ctx.input(1), n, "the loop condition") : true;
  CheckLoopBound(n, *body, max_trip, cond);
  const int64_t limit = GlobalLimits().max_loop_iterations;
  size_t num_carried = ctx.num_inputs() >= 2 ? ctx.num_inputs() - 2 : 0;
  std::vector<Tensor> carried;
  for (size_t i = 0; i < num_carried; ++i) {
    GAF_CHECK(ctx.has_input(2 + i), "{}: loop-carried input {} is missing (optional types not supported)",
              n.Describe(), i);
    carried.push_back(*ctx.inputs[2 + i]);
  }
  GAF_CHECK(ctx.num_outputs() >= num_carried, "{}: has {} outputs but {} loop-carried inputs", n.Describe(),
            ctx.num_outputs(), num_carried);
  size_t num_scan = ctx.num_outputs() - num_carried;
  GAF_CHECK(body->outputs.size() == 1 + num_carried + num_scan,
            "{}: the body declares {} outputs, expected {} (condition, {} carried, {} scan outputs)", n.Describe(),
            body->outputs.size(), 1 + num_carried + num_scan, num_carried, num_scan);
  std::vector<std::vector<Tensor>> scans(num_scan);
  for (int64_t it = 0; it < max_trip && cond; ++it) {
    if (it == limit)
      throw Error(fmt::format("{}: still running after {} iterations ({}, and its condition is still true): the limit "
                              "of {} iterations (--max-loop-iterations)",
                              n.Describe(), it, TripCountText(max_trip), limit));
    std::vector<Tensor> in;
    in.push_back(Tensor::Scalar<int64_t>(it));
    in.push_back(Tensor::Scalar<bool>(cond));
    for (const Tensor& c : carried) in.push_back(c);
    std::vector<Tensor> out = ctx.subgraphs->RunSubgraph(*body, in);
    GAF_CHECK(out.size() == 1 + num_carried + num_scan, "{}: body returned {} values, expected {}", n.Describe(),
              out.size(), 1 + num_carried + num_scan);
    cond = TruthValue(out[0], n, "the body's condition output");
    for (size_t i = 0; i < num_carried; ++i) carried[i] = out[1 + i];
    for (size_t i = 0; i < num_scan; ++i) scans[i].push_back(out[1 + num_carried + i]);
  }
  for (size_t i = 0; i < num_carried; ++i) ctx.outputs[i] = carried[i];
  bool trial_done = false;
  std::vector<Tensor> trial;
  for (size_t i = 0; i < num_scan; ++i) {
    if (scans[i].empty()) {
      // Zero iterations: an empty tensor [0, ...]. Its element type and per-iteration shape come
      // from the body's declaration, or else from one trial run of the (side-effect free) body.
      const ValueInfo& v = body->outputs[1 + num_carried + i];
      DataType dt = v.dtype;
      Shape s{0};
      bool shaped = v.has_shape;
      if (shaped)
        for (const Dim& d : v.dims) s.push_back(d.known() ? d.value : 0);
      if (dt == DataType::kUndefined || !shaped) {
        if (!trial_done) {
          trial_done = true;
          std::vector<Tensor> in{Tensor::Scalar<int64_t>(0), Tensor::Scalar<bool>(true)};
          for (const Tensor& c : carried) in.push_back(c);
          try {
            trial = ctx.subgraphs->RunSubgraph(*body, in);
          } catch (const Error&) {
            trial.clear();
          }
        }
        if (trial.size() > 1 + num_carried + i) {
          const Tensor& t = trial[1 + num_carried + i];
          dt = t.dtype();
          s = {0};
          for (int64_t d : t.shape()) s.push_back(d);
        }
      }
      ctx.outputs[num_carried + i] = Tensor(dt == DataType::kUndefined ? DataType::kFloat : dt, s);
    } else {
      ctx.outputs[num_carried + i] = Stack(scans[i], 0, n);
    }
  }
}

void ScanKernel(KernelContext& ctx) {
  const Node& n = ctx.node;
  if (ctx.opset < 9) GAF_UNSUPPORTED("{}: Scan before opset 9 (with sequence_lens) is not supported", n.Describe());
  const Graph* body = n.GetGraph("body");
  GAF_CHECK(body != nullptr, "{}: missing body attribute", n.Describe());
  int64_t num_scan_in = n.GetInt("num_scan_inputs", -1);
  GAF_CHECK(num_scan_in >= 0 && num_scan_in <= static_cast<int64_t>(ctx.num_inputs()),
            "{}: invalid num_scan_inputs", n.Describe());
  size_t num_state = ctx.num_inputs() - static_cast<size_t>(num_scan_in);
  GAF_CHECK(ctx.num_outputs() >= num_state, "{}: has {} outputs but {} state variables", n.Describe(),
            ctx.num_outputs(), num_state);
  size_t num_scan_out = ctx.num_outputs() - num_state;
  GAF_CHECK(body->inputs.size() == num_state + static_cast<size_t>(num_scan_in) &&
                body->outputs.size() == num_state + num_scan_out,
            "{}: the body has {} inputs and {} outputs, expected {} and {}", n.Describe(), body->inputs.size(),
            body->outputs.size(), num_state + static_cast<size_t>(num_scan_in), num_state + num_scan_out);
  std::vector<int64_t> in_axes = n.GetInts("scan_input_axes", std::vector<int64_t>(num_scan_in, 0));
  std::vector<int64_t> in_dirs = n.GetInts("scan_input_directions", std::vector<int64_t>(num_scan_in, 0));
  std::vector<int64_t> out_axes = n.GetInts("scan_output_axes", std::vector<int64_t>(num_scan_out, 0));
  std::vector<int64_t> out_dirs = n.GetInts("scan_output_directions", std::vector<int64_t>(num_scan_out, 0));
  GAF_CHECK(in_axes.size() == static_cast<size_t>(num_scan_in) && in_dirs.size() == static_cast<size_t>(num_scan_in) &&
                out_axes.size() == num_scan_out && out_dirs.size() == num_scan_out,
            "{}: scan_input_axes/directions need {} values and scan_output_axes/directions {}", n.Describe(),
            num_scan_in, num_scan_out);
  std::vector<Tensor> state;
  for (size_t i = 0; i < num_state; ++i) state.push_back(ctx.input(i));
  int64_t steps = -1;
  for (int64_t k = 0; k < num_scan_in; ++k) {
    const Tensor& t = ctx.input(num_state + k);
    GAF_CHECK(t.rank() >= 1, "{}: scan input {} is a scalar; it needs an axis to scan", n.Describe(), k);
    in_axes[k] = NormalizeAxis(in_axes[k], t.rank(), n);
    int64_t len = t.shape()[in_axes[k]];
    GAF_CHECK(steps < 0 || steps == len, "{}: scan inputs have different lengths", n.Describe());
    steps = len;
  }
  const int64_t limit = GlobalLimits().max_loop_iterations;
  if (steps > limit)
    throw Error(fmt::format("{}: {} iterations (the length of its scan inputs) is more than the limit of {} iterations "
                            "(--max-loop-iterations)",
                            n.Describe(), steps, limit));
  std::vector<std::vector<Tensor>> scans(num_scan_out);
  for (int64_t it = 0; it < std::max<int64_t>(steps, 0); ++it) {
    std::vector<Tensor> in = state;
    for (int64_t k = 0; k < num_scan_in; ++k) {
      int64_t idx = in_dirs[k] ? steps - 1 - it : it;
      in.push_back(TakeAlong(ctx.input(num_state + k), in_axes[k], idx));
    }
    std::vector<Tensor> out = ctx.subgraphs->RunSubgraph(*body, in);
    GAF_CHECK(out.size() == num_state + num_scan_out, "{}: body returned {} values, expected {}", n.Describe(),
              out.size(), num_state + num_scan_out);
    for (size_t i = 0; i < num_state; ++i) state[i] = out[i];
    for (size_t i = 0; i < num_scan_out; ++i) scans[i].push_back(out[num_state + i]);
  }
  for (size_t i = 0; i < num_state; ++i) ctx.outputs[i] = state[i];
  for (size_t i = 0; i < num_scan_out; ++i) {
    GAF_CHECK(!scans[i].empty(), "{}: scan over zero steps is not supported", n.Describe());
    if (out_dirs[i]) std::reverse(scans[i].begin(), scans[i].end());
    int64_t axis = NormalizeAxis(out_axes[i], scans[i][0].rank() + 1, n);
    ctx.outputs[num_state + i] = Stack(scans[i], axis, n);
  }
}

}  // namespace

void RegisterControlFlowKernels(OpRegistry& r) {
  r.Register({"", "If", OpKind::kOpaque, IfKernel, false});
  r.Register({"", "Loop", OpKind::kOpaque, LoopKernel, false});
  r.Register({"", "Scan", OpKind::kOpaque, ScanKernel, false});
}

}  // namespace gaf
