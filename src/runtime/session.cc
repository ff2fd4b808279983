#include "runtime/session.h"

#include "ir/limits.h"
#include "ops/conv.h"
#include "ops/gemm.h"
#include "ops/task_team.h"
#include "runtime/plan_calls.h"

#include <omp.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstring>
#include <string_view>
#include <set>
#include <unordered_set>

namespace gaf {

// ---------------- function inlining ----------------

namespace {

using KeepFn = std::function<bool(const Node&, const Function&)>;
using FunctionIndex = std::unordered_map<std::string, const Function*>;  // "domain\nname" -> function

std::string FunctionKey(const std::string& domain, const std::string& name) { return domain + "\n" + name; }

std::string FunctionName(const Function& f) { return f.domain.empty() ? f.name : f.domain + "::" + f.name; }

FunctionIndex IndexFunctions(const Model& m) {
  FunctionIndex index;
  for (const Function& f : m.functions) index.emplace(FunctionKey(f.domain, f.name), &f);  // the first one wins
  return index;
}

const Function* FindIn(const FunctionIndex& index, const Node& n) {
  auto it = index.find(FunctionKey(n.domain, n.op_type));
  return it == index.end() ? nullptr : it->second;
}

template <typename Fn>
void ForEachSubgraph(const Node& n, Fn&& fn) {
  for (const Attribute& a : n.attributes) {
    if (a.g) fn(*a.g);
    for (const auto& sg : a.graphs)
      if (sg) fn(*sg);
  }
}

int64_t SaturatingAdd(int64_t a, int64_t b, int64_t cap) { return a >= cap - b ? cap : a + b; }

// What inlining would make of a graph, measured before anything is expanded: the nodes it would
// hold (subgraphs included, saturating just past max_nodes), how deeply function calls and
// subgraphs nest (at most max_nesting_depth), and no recursive function. Each function is
// measured once, so a file whose functions each call the next twice costs its size, not 2^depth.
class InlineBudget {
 public:
  struct Measure {
    int64_t nodes = 0;
    int height = 0;  // levels of calls and subgraphs below
  };

  explicit InlineBudget(const FunctionIndex& functions) : functions_(functions), limits_(GlobalLimits()) {}

  Measure OfGraph(const Graph& g, int depth) {
    if (depth > limits_.max_nesting_depth)
      throw Error(fmt::format("graph '{}': subgraphs and function calls nest deeper than {} levels (the nesting limit)",
                              g.name, limits_.max_nesting_depth));
    Measure m;
    for (const Node& n : g.nodes) Add(m, OfNode(n, depth), 0);
    return m;
  }

 private:
  int64_t Cap() const { return limits_.max_nodes + 1; }

  void Add(Measure& total, const Measure& part, int levels) const {
    total.nodes = SaturatingAdd(total.nodes, part.nodes, Cap());
    total.height = std::max(total.height, part.height + levels);
  }

  Measure OfNode(const Node& n, int depth) {
    Measure m;
    ForEachSubgraph(n, [&](const Graph& sg) { Add(m, OfGraph(sg, depth + 1), 1); });
    const Function* f = FindIn(functions_, n);
    Add(m, f != nullptr ? OfCall(*f, n, depth + 1) : Measure{1, 0}, f != nullptr ? 1 : 0);
    return m;
  }

  // "f0 -> f1 -> f2 -> ... -> f9 -> last": the calls that lead to `last`.
  std::string Chain(const Function& last) const {
    std::string chain;
    const size_t n = chain_.size();
    for (size_t i = 0; i < n; ++i) {
      if (n > 6 && i == 3) chain += "... -> ";
      if (n <= 6 || i < 3 || i + 2 >= n) chain += FunctionName(*chain_[i]) + " -> ";
    }
    return chain + FunctionName(last);
  }

  // The body of `f` called by `call` at nesting level `depth`.
  Measure OfCall(const Function& f, const Node& call, int depth) {
    if (std::find(chain_.begin(), chain_.end(), &f) != chain_.end())
      throw Error(fmt::format("{} calls function '{}', which calls itself ({}): recursive functions cannot be inlined",
                              call.Describe(), FunctionName(f), Chain(f)));
    if (depth > limits_.max_nesting_depth)
      throw Error(fmt::format("{}: function calls nest deeper than {} levels ({}) (the nesting limit)", call.Describe(),
                              limits_.max_nesting_depth, Chain(f)));
    auto it = measured_.find(&f);
    if (it == measured_.end()) {
      chain_.push_back(&f);
      Measure m;
      for (const Node& b : f.nodes) Add(m, OfNode(b, depth), 0);
      chain_.pop_back();
      it = measured_.emplace(&f, m).first;
    }
    const Measure& m = it->second;
    if (depth + m.height > limits_.max_nesting_depth)
      throw Error(fmt::format("{}: function '{}' nests calls and subgraphs {} levels deep below this call, past the "
                              "limit of {} levels (the nesting limit)",
                              call.Describe(), FunctionName(f), m.height, limits_.max_nesting_depth));
    if (m.nodes > limits_.max_nodes)
      throw Error(fmt::format("{}: inlining function '{}' ({}) would make more than {} nodes (--max-nodes)",
                              call.Describe(), FunctionName(f), Chain(f), limits_.max_nodes));
    return m;
  }

  const FunctionIndex& functions_;
  const Limits& limits_;
  std::unordered_map<const Function*, Measure> measured_;
  std::vector<const Function*> chain_;
};


// Resolves ref_attr_name attributes of body nodes against the caller's attributes.
std::vector<Attribute> ResolveAttributes(const std::vector<Attribute>& attrs, const Node& caller) {
  std::vector<Attribute> out;
  for (const Attribute& a : attrs) {
    if (a.ref_attr_name.empty()) {
      out.push_back(a);
      continue;
    }
    if (const Attribute* ca = caller.FindAttr(a.ref_attr_name)) {
      Attribute r = *ca;
      r.name = a.name;
      out.push_back(std::move(r));
    }  // absent: the attribute takes its default
  }
  return out;
}

std::vector<Node> ExpandCall(const Node& call, const Function& f, int& counter) {
  GAF_CHECK(call.inputs.size() <= f.inputs.size(), "{}: passes {} inputs to function {} which takes {}",
            call.Describe(), call.inputs.size(), f.name, f.inputs.size());
  std::string prefix = fmt::format("{}__{}_{}/", call.name.empty() ? f.name : call.name, f.name, counter++);
  std::unordered_map<std::string, std::string> rename;
  for (size_t i = 0; i < f.inputs.size(); ++i) rename[f.inputs[i]] = i < call.inputs.size() ? call.inputs[i] : "";
  for (size_t i = 0; i < f.outputs.size(); ++i)
    if (i < call.outputs.size()) rename[f.outputs[i]] = call.outputs[i];
  auto map_name = [&](const std::string& n) -> std::string {
    if (n.empty()) return n;
    auto it = rename.find(n);
    if (it != rename.end()) return it->second;
    return prefix + n;
  };
  std::vector<Node> out;
  for (const Node& b : f.nodes) {
    Node n = b;
    n.name = prefix + b.name;
    for (auto& i : n.inputs) i = map_name(i);
    for (auto& o : n.outputs) {
      // A function output the caller did not bind still needs a unique name.
      auto it = rename.find(o);
      o = (it != rename.end() && !it->second.empty()) ? it->second : (o.empty() ? o : prefix + o);
    }
    n.attributes = ResolveAttributes(b.attributes, call);
    out.push_back(std::move(n));
  }
  return out;
}

// Replaces calls by their bodies in place, depth first over an explicit stack of bodies being
// expanded (the budget above bounds it); subgraphs are inlined as their nodes are reached.
void InlineInGraph(Graph& g, const FunctionIndex& functions, int& counter, const KeepFn& keep) {
  struct Pending {
    std::vector<Node> nodes;
    size_t next = 0;
  };
  std::vector<Pending> stack;
  stack.push_back({std::move(g.nodes), 0});
  std::vector<Node> result;
  while (!stack.empty()) {
    Pending& top = stack.back();
    if (top.next == top.nodes.size()) {
      stack.pop_back();
      continue;
    }
    Node n = std::move(top.nodes[top.next++]);
    for (Attribute& a : n.attributes) {
      if (a.g) InlineInGraph(*a.g, functions, counter, keep);
      for (auto& sg : a.graphs)
        if (sg) InlineInGraph(*sg, functions, counter, keep);
    }
    const Function* f = FindIn(functions, n);
    if (f != nullptr && !(keep && keep(n, *f)))
      stack.push_back({ExpandCall(n, *f, counter), 0});  // `top` is not used after this
    else
      result.push_back(std::move(n));
  }
  g.nodes = std::move(result);
}

}  // namespace

void CheckInlining(const Model& model) {
  const FunctionIndex functions = IndexFunctions(model);
  const InlineBudget::Measure m = InlineBudget(functions).OfGraph(model.graph, 0);
  const int64_t limit = GlobalLimits().max_nodes;
  if (!model.functions.empty() && m.nodes > limit)
    throw Error(fmt::format("graph '{}' would have more than {} nodes with its functions inlined (--max-nodes)",
                            model.graph.name, limit));
}

void InlineFunctions(Model& model) { InlineFunctions(model, nullptr); }

void InlineFunctions(Model& model, const std::function<bool(const Node&, const Function&)>& keep) {
  CheckInlining(model);
  if (model.functions.empty()) return;
  const FunctionIndex functions = IndexFunctions(model);
  int counter = 0;
  InlineInGraph(model.graph, functions, counter, keep);
}

Graph FunctionBodyGraph(const Function& f) {
  Graph g;
  g.name = f.domain + "." + f.name;
  for (const std::string& i : f.inputs) g.inputs.push_back(ValueInfo{i});
  for (const std::string& o : f.outputs) g.outputs.push_back(ValueInfo{o});
  g.nodes = f.nodes;
  return g;
}

// ---------------- plans ----------------

struct Session::PlanStep {
  const Node* node = nullptr;
  const KernelInfo* kernel = nullptr;
  int64_t opset = 0;
  std::vector<int> in_slots;   // -1 = absent optional input
  std::vector<int> out_slots;  // -1 = absent output
  std::vector<int> release;    // slots whose last use is this step
  // Shape computation (main graph only): a root (Shape, Size) always runs; a derived step (a
  // deterministic operator whose inputs are constants, roots' or derived steps' outputs) is a
  // function of those values alone, so when none of them changed since the last run its outputs
  // are the ones it produced then (`cached`), and it does not run.
  bool root = false, derived = false;
  mutable bool cache_valid = false;
  mutable std::vector<Tensor> cached;
  // The step's operator, attributes and constant inputs as an id (equal ids: the same function of
  // the other inputs; -1: not shared, SessionOptions::memo_shapes), and which inputs are constant.
  int memo = -1;
  std::vector<char> memo_const;
  // The step whose outputs this one took in the last run that shared them (-1: none yet), and a
  // root's input shapes in this run (rank, then dims, per input that is not constant): a step reads
  // the same values as its partner far more cheaply than it finds them by signature.
  mutable int memo_partner = -1;
  mutable std::vector<int64_t> memo_dims;
  // Slots whose last use is this step and whose values the main graph's frame keeps from run to
  // run while their producer's cache is valid: (slot, that producer's step index).
  std::vector<std::pair<int, int>> release_if_uncached;
};

struct Session::Plan {
  using Step = PlanStep;
  const Graph* graph = nullptr;
  std::unordered_map<std::string, int> slot_of;  // local values
  std::vector<std::string> slot_names;
  std::vector<int> input_slots;                        // formal graph inputs
  std::vector<std::pair<int, const Tensor*>> consts;   // initializers and folded values
  std::deque<Tensor> folded;                           // values of steps computed once when planned
  std::vector<std::pair<std::string, const Tensor*>> folded_values;  // reported to the observer
  int folded_steps = 0, derived_steps = 0;
  std::vector<int> output_slots;
  std::vector<std::string> outer_names;  // values read from enclosing scopes
  std::vector<int> outer_slots;
  std::vector<Step> steps;
  // The main graph's slots between runs (resident): its constants, and the outputs of shape steps
  // whose cache is valid (they hold the cached values), so that a run neither copies the constants
  // in again nor the unchanged shape values; every other slot is empty between runs. Empty until
  // the first run, and again after a run that failed.
  bool resident = false;
  mutable std::vector<Tensor> resident_slots;
  std::vector<char> is_const_slot;  // (resident plans) slots of constants: never released
  std::vector<int> producer;        // (resident plans) the shape step making a slot, or -1
  // Shape steps (main graph): per slot, the derived steps reading it; per step, whether it is a
  // derived step with a valid cache (PlanStep::cache_valid, kept here too so that the run's walk
  // over the steps it skips reads one byte a step).
  std::vector<std::vector<int>> shape_readers;
  mutable std::vector<char> skip_if_clean;
};

struct Session::Frame {
  const Plan* plan = nullptr;
  Frame* parent = nullptr;
  std::vector<Tensor> slots;

  const Tensor* Lookup(const std::string& name) const {
    for (const Frame* f = this; f != nullptr; f = f->parent) {
      auto it = f->plan->slot_of.find(name);
      if (it != f->plan->slot_of.end() && f->slots[it->second].defined()) return &f->slots[it->second];
    }
    return nullptr;
  }
};

const Session::Plan& Session::PlanFor(const Graph& g) {
  auto it = plans_.find(&g);
  if (it != plans_.end()) return *it->second;
  auto plan = std::make_unique<Plan>();
  plan->graph = &g;
  auto slot = [&](const std::string& n) {
    auto [pos, inserted] = plan->slot_of.emplace(n, static_cast<int>(plan->slot_names.size()));
    if (inserted) plan->slot_names.push_back(n);
    return pos->second;
  };
  std::unordered_set<std::string> defined;
  for (const ValueInfo& v : g.inputs) {
    plan->input_slots.push_back(slot(v.name));
    defined.insert(v.name);
  }
  for (const auto& [n, t] : g.initializers) {
    plan->consts.emplace_back(slot(n), &t);
    defined.insert(n);
  }
  // Outer-scope values get local slots too, filled from the parent frame at the start.
  for (const std::string& n : OuterScopeValues(g)) {
    plan->outer_names.push_back(n);
    plan->outer_slots.push_back(slot(n));
  }
  OpRegistry& reg = OpRegistry::Global();
  for (const Node& node : g.nodes) {
    Plan::Step st;
    st.node = &node;
    auto kept = call_kernel_of_.find(&node);
    st.kernel = kept != call_kernel_of_.end() ? kept->second : reg.Find(node.domain, node.op_type);
    if (st.kernel == nullptr) {
      std::string dom = node.domain.empty() ? "ai.onnx" : node.domain;
      throw UnsupportedError(fmt::format("unsupported operator {}::{} ({})", dom, node.op_type, node.Describe()));
    }
    // Every ONNX operator has at least one output, and kernels write output 0.
    GAF_CHECK(!node.outputs.empty(), "{}: has no outputs", node.Describe());
    st.opset = model_.OpsetVersion(node.domain);
    for (const std::string& i : node.inputs) st.in_slots.push_back(i.empty() ? -1 : slot(i));
    for (const std::string& o : node.outputs) st.out_slots.push_back(o.empty() ? -1 : slot(o));
    plan->steps.push_back(std::move(st));
  }
  for (const ValueInfo& v : g.outputs) plan->output_slots.push_back(slot(v.name));
  if (&g == &model_.graph && options_.fold_shapes) FoldAndMarkShapeSteps(*plan);

  // Last use of each slot: the last step reading it directly or through a subgraph.
  std::vector<int> last(plan->slot_names.size(), -1);
  for (int s = 0; s < static_cast<int>(plan->steps.size()); ++s) {
    const Plan::Step& st = plan->steps[s];
    for (int i : st.in_slots)
      if (i >= 0) last[i] = s;
    for (const Attribute& a : st.node->attributes) {
      std::vector<const Graph*> subs;
      if (a.g) subs.push_back(a.g.get());
      for (const auto& sg : a.graphs) subs.push_back(sg.get());
      for (const Graph* sg : subs)
        for (const std::string& n : OuterScopeValues(*sg)) {
          auto f = plan->slot_of.find(n);
          if (f != plan->slot_of.end()) last[f->second] = s;
        }
    }
  }
  std::unordered_set<int> keep(plan->output_slots.begin(), plan->output_slots.end());
  if (&g == &model_.graph) {
    // The main graph's frame stays resident between runs (Plan::resident): its constants are never
    // released, shape steps' outputs only when their step keeps no cache.
    plan->resident = true;
    plan->is_const_slot.assign(plan->slot_names.size(), 0);
    for (const auto& [s, t] : plan->consts) plan->is_const_slot[s] = 1;
    for (int s : plan->input_slots) plan->is_const_slot[s] = 0;  // an initializer a feed may override
    plan->producer.assign(plan->slot_names.size(), -1);
    plan->shape_readers.assign(plan->slot_names.size(), {});
    plan->skip_if_clean.assign(plan->steps.size(), 0);
    for (int i = 0; i < static_cast<int>(plan->steps.size()); ++i)
      if (plan->steps[i].root || plan->steps[i].derived) {
        for (int o : plan->steps[i].out_slots)
          if (o >= 0) plan->producer[o] = i;
        if (plan->steps[i].derived)
          for (int in : plan->steps[i].in_slots)
            if (in >= 0) plan->shape_readers[in].push_back(i);
      }
  }
  for (int s = 0; s < static_cast<int>(last.size()); ++s) {
    if (last[s] < 0 || keep.count(s)) continue;
    Plan::Step& at = plan->steps[last[s]];
    if (plan->resident && plan->is_const_slot[s]) continue;
    if (plan->resident && plan->producer[s] >= 0) {
      at.release_if_uncached.emplace_back(s, plan->producer[s]);
    } else {
      at.release.push_back(s);
    }
  }
  // Outputs that are never consumed (unused optional results) are released right away.
  for (int s = 0; s < static_cast<int>(plan->steps.size()); ++s)
    for (int o : plan->steps[s].out_slots)
      if (o >= 0 && last[o] < 0 && !keep.count(o)) plan->steps[s].release.push_back(o);

  const Plan& ref = *plan;
  plans_.emplace(&g, std::move(plan));
  return ref;
}

// ---------------- execution ----------------

class FrameRunner : public SubgraphRunner {
 public:
  FrameRunner(Session* s, Session::Frame* f) : session_(s), frame_(f) {}
  std::vector<Tensor> RunSubgraph(const Graph& body, const std::vector<Tensor>& inputs) override {
    const Session::Plan& plan = session_->PlanFor(body);
    return session_->Execute(plan, frame_, inputs, nullptr);
  }

 private:
  Session* session_;
  Session::Frame* frame_;
};

Session::Session(const Model& model, SessionOptions options) : model_(model), options_(options) {
  std::vector<std::pair<std::string, KernelInfo>> kept;  // node name/outputs -> kernel
  const bool rewrite = options_.rewrite_products && !options_.observer;
  const bool group_siblings = !options_.node_kernels || options_.node_kernels_take_siblings;
  const bool fold_residuals = !options_.node_kernels || options_.node_kernels_take_residuals;
  if (options_.function_kernels) {
    // Calls whose every operator the plan rewrites into its own operators run that way, inlined.
    const std::map<std::string, std::string> by_plan =
        rewrite ? CallsThePlanRewrites(model_, group_siblings, fold_residuals) : std::map<std::string, std::string>();
    InlineFunctions(model_, [&](const Node& call, const Function& f) {
      std::optional<KernelInfo> k = options_.function_kernels(call, f);
      if (!k) return false;
      auto plan = by_plan.find(call.outputs.empty() ? call.name : call.outputs[0]);
      if (plan != by_plan.end()) {
        if (k->declined) k->declined("the runtime's plan runs its operators as " + plan->second);
        return false;
      }
      kept.emplace_back(call.outputs.empty() ? call.name : call.outputs[0], std::move(*k));
      return true;
    });
  } else {
    InlineFunctions(model_);
  }
  // The observer sees every value the graph names: it gets the graph as it is.
  if (rewrite) rewrites_ = RewriteProducts(model_, group_siblings, fold_residuals);
  // Bind kernels to the kept call nodes (identified by their first output, which is unique).
  for (auto& [key, info] : kept) {
    for (const Node& n : model_.graph.nodes) {
      if ((n.outputs.empty() ? n.name : n.outputs[0]) == key) {
        call_kernels_.push_back(std::move(info));
        call_kernel_of_[&n] = &call_kernels_.back();
        break;
      }
    }
  }
  if (options_.node_kernels) {
    for (const Node& n : model_.graph.nodes) {
      if (call_kernel_of_.count(&n)) continue;
      std::optional<KernelInfo> k = options_.node_kernels(n, model_);
      if (!k) continue;
      call_kernels_.push_back(std::move(*k));
      call_kernel_of_[&n] = &call_kernels_.back();
    }
  }
  if (options_.prepared_kernels) {
    // Initializers no feed can override: an IR < 4 initializer that is also a graph input is only
    // a default, so a kernel prepared from it would ignore the value fed.
    std::unordered_set<std::string> fed;
    for (const ValueInfo& v : model_.graph.inputs) fed.insert(v.name);
    auto fixed = [&](const std::string& name) -> const Tensor* {
      return fed.count(name) ? nullptr : model_.graph.FindInitializer(name);
    };
    // MatMuls by float32 [K, N] initializers: products of several rows on a packed weight.
    auto prepared = [&](const std::string& w) -> std::shared_ptr<PreparedMatMul> {
      const Tensor* t = fixed(w);
      if (t == nullptr || t->dtype() != DataType::kFloat || t->rank() != 2 || t->numel() < kPackedMatMulMinWeight)
        return nullptr;
      return std::make_shared<PreparedMatMul>(*t);
    };
    for (const Node& n : model_.graph.nodes) {
      if (call_kernel_of_.count(&n)) continue;
      if (n.op_type == "MatMul" && n.domain.empty() && n.inputs.size() == 2) {
        if (auto mm = prepared(n.inputs[1])) {
          call_kernels_.push_back(PreparedMatMulKernel(std::move(mm)));
          call_kernel_of_[&n] = &call_kernels_.back();
        }
      } else if (n.op_type == "Gemm" && n.domain.empty() && n.inputs.size() >= 2 && n.inputs.size() <= 3) {
        const Tensor* b = fixed(n.inputs[1]);
        if (std::shared_ptr<PreparedMatMul> mm = b != nullptr ? PrepareGemm(n, *b) : nullptr) {
          call_kernels_.push_back(PreparedGemmKernel(std::move(mm)));
          call_kernel_of_[&n] = &call_kernels_.back();
        }
      } else if (n.op_type == "SiblingMatMul" && n.domain == kPlanDomain) {
        std::vector<std::shared_ptr<PreparedMatMul>> mms;  // null: that weight is not prepared
        bool any = false;
        for (size_t i = 1; i < n.inputs.size(); ++i) {
          mms.push_back(prepared(n.inputs[i]));
          any |= mms.back() != nullptr;
        }
        if (any) {
          call_kernels_.push_back(PreparedSiblingMatMulKernel(std::move(mms)));
          call_kernel_of_[&n] = &call_kernels_.back();
        }
      } else if (n.op_type == "ResidualMatMul" && n.domain == kPlanDomain && n.inputs.size() >= 3) {
        if (auto mm = prepared(n.inputs[1])) {  // else the registry's kernel: the MatMul and the Add
          call_kernels_.push_back(PreparedResidualMatMulKernel(std::move(mm)));
          call_kernel_of_[&n] = &call_kernels_.back();
        }
      } else if (n.op_type == "GatedMatMul" && n.domain == kPlanDomain && n.inputs.size() == 3) {
        std::shared_ptr<PreparedMatMul> gate = prepared(n.inputs[1]), up = prepared(n.inputs[2]);
        if (gate && up) {  // else the registry's kernel: the SiblingMatMul and SiLUGate it replaced
          call_kernels_.push_back(PreparedGatedMatMulKernel(std::move(gate), std::move(up)));
          call_kernel_of_[&n] = &call_kernels_.back();
        }
      }
    }
    for (const Node& n : model_.graph.nodes) {
      if (call_kernel_of_.count(&n) || n.op_type != "Conv" || !n.domain.empty() || n.inputs.size() < 2) continue;
      const Tensor* w = fixed(n.inputs[1]);
      const Tensor* b = n.HasInput(2) ? fixed(n.inputs[2]) : nullptr;
      if (w == nullptr || (n.HasInput(2) && b == nullptr)) continue;
      std::shared_ptr<PreparedConv> conv = PreparedConv::Create(n, *w, b);
      if (!conv) continue;
      call_kernels_.push_back(PreparedConvKernel(std::move(conv)));
      call_kernel_of_[&n] = &call_kernels_.back();
    }
  }
  std::unordered_set<std::string> inits;
  for (const auto& [n, t] : model_.graph.initializers) inits.insert(n);
  for (const ValueInfo& v : model_.graph.inputs)
    if (!inits.count(v.name)) inputs_.push_back(v);
  outputs_ = model_.graph.outputs;
  // Graph inputs that are also initializers (IR < 4) become overridable defaults: the plan
  // binds formal inputs only to the fed ones.
  PlanFor(model_.graph);
}

Session::~Session() = default;

namespace {

void CheckFeed(const ValueInfo& v, const Tensor& t) {
  GAF_CHECK(t.defined(), "input '{}' was given an empty tensor", v.name);
  if (v.dtype != DataType::kUndefined)
    GAF_CHECK(t.dtype() == v.dtype, "input '{}' expects {} but was given {}", v.name, DataTypeName(v.dtype),
              DataTypeName(t.dtype()));
  if (v.has_shape) {
    GAF_CHECK(t.rank() == static_cast<int64_t>(v.dims.size()), "input '{}' expects shape {} but was given {}",
              v.name, DimsToString(v.dims), ShapeToString(t.shape()));
    for (size_t i = 0; i < v.dims.size(); ++i)
      GAF_CHECK(!v.dims[i].known() || v.dims[i].value == t.shape()[i],
                "input '{}' expects shape {} but was given {}", v.name, DimsToString(v.dims),
                ShapeToString(t.shape()));
  }
}

}  // namespace

void Session::RunStep(const PlanStep& st, std::vector<Tensor>& slots, SubgraphRunner& runner, bool top) {
  const Node& node = *st.node;
  KernelContext ctx{node, st.opset, {}, {}, &runner, omp_get_max_threads()};
  ctx.cache_room = cache_room_;
  ctx.last_position_only = last_position_only_;
  ctx.inputs.resize(st.in_slots.size(), nullptr);
  // Keeps converted inputs alive (contiguous copies of caches with room, half types as float):
  // reserved once for both kinds, so the pointers into it stay valid.
  std::vector<Tensor> upcast;
  DataType half_type = DataType::kUndefined;
  for (size_t i = 0; i < st.in_slots.size(); ++i) {
    int s = st.in_slots[i];
    if (s < 0) continue;
    const Tensor& t = slots[s];
    GAF_CHECK(t.defined(), "{}: input '{}' has no value (produced by an earlier failed or skipped node?)",
              node.Describe(), node.inputs[i]);
    ctx.inputs[i] = &t;
    if (t.padded() && !st.kernel->reads_padded_caches) {  // a cache with room, to a kernel that reads it whole
      if (upcast.capacity() == 0) upcast.reserve(2 * ctx.inputs.size());
      upcast.push_back(t.Dense());
      ctx.inputs[i] = &upcast.back();
    }
    if (st.kernel->upcast_half && IsHalf(t.dtype())) half_type = t.dtype();
  }
  if (half_type != DataType::kUndefined) {
    if (upcast.capacity() == 0) upcast.reserve(2 * ctx.inputs.size());
    for (auto& in : ctx.inputs) {
      if (in != nullptr && IsHalf(in->dtype())) {
        upcast.push_back(in->CastTo(DataType::kFloat));
        in = &upcast.back();
      }
    }
  }
  ctx.outputs.resize(node.outputs.size());
  auto t0 = std::chrono::steady_clock::now();
  try {
    st.kernel->fn(ctx);
  } catch (const UnsupportedError&) {
    throw;
  } catch (const Error& e) {
    std::string msg = e.what();
    // A plan rewrite's node reports its original operators' errors as they are.
    if (msg.find(node.Describe()) == std::string::npos && node.domain != kPlanDomain)
      msg = node.Describe() + ": " + msg;
    throw Error(msg);
  } catch (const std::exception& e) {
    throw Error(fmt::format("{}: {}", node.Describe(), e.what()));
  }
  if (options_.profile) {
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    OpProfile& p = profile_[node.op_type];
    p.op_type = node.op_type;
    p.calls++;
    p.seconds += dt;
    auto it = node.name.empty() ? node_profile_.end() : node_profile_.find(std::string_view(node.name));
    if (it == node_profile_.end()) {
      std::string key = node.name.empty() ? node.Describe() : node.name;
      it = node_profile_.try_emplace(key, OpProfile{node.op_type, key}).first;
    }
    it->second.calls++;
    it->second.seconds += dt;
  }
  for (size_t o = 0; o < st.out_slots.size(); ++o) {
    if (st.out_slots[o] < 0) continue;
    Tensor& out = ctx.outputs[o];
    GAF_CHECK(out.defined(), "{}: kernel produced no value for output '{}'", node.Describe(), node.outputs[o]);
    if (half_type != DataType::kUndefined && out.dtype() == DataType::kFloat) out = out.CastTo(half_type);
    if (options_.observer && top) options_.observer(node.outputs[o], out.Dense());
    slots[st.out_slots[o]] = std::move(out);
  }
}

namespace {

// Values kept per shape step between runs: small (shape data is a few integers; a mask built from
// shapes can be larger, and is kept up to this size).
constexpr size_t kMaxCachedBytes = 1 << 20;
// Values up to this many elements are compared with the last run's, so an unchanged result (the
// batch dim of a changed shape) keeps its consumers cached.
constexpr int64_t kMaxComparedElements = 64;

bool SameValue(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape() || a.dtype() == DataType::kString) return false;
  return a.raw() == b.raw() || std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

bool HasSubgraph(const Node& n) {
  for (const Attribute& a : n.attributes)
    if (a.g || !a.graphs.empty()) return true;
  return false;
}

// ---- shape steps shared within a run (SessionOptions::memo_shapes) ----

// Inputs of a derived step up to this many elements are compared by value; a step reading a
// larger one is not shared.
constexpr int64_t kMemoMaxElements = 64;
// Constants up to this many bytes are part of a step's signature by value (a decoder's layers
// each have their own copies of the same small constants), larger ones by identity.
constexpr size_t kMemoConstBytes = 256;

void AppendBytes(std::string& out, const void* p, size_t n) { out.append(static_cast<const char*>(p), n); }

void AppendTensor(std::string& out, const Tensor& t) {
  const int dt = static_cast<int>(t.dtype());
  AppendBytes(out, &dt, sizeof dt);
  const int64_t r = t.rank();
  AppendBytes(out, &r, sizeof r);
  for (int64_t d : t.shape()) AppendBytes(out, &d, sizeof d);
  if (t.dtype() != DataType::kString && t.defined()) AppendBytes(out, t.raw(), t.nbytes());
}

// The signature of a shape step: operator, opset, attributes and constant inputs (is_const per
// slot, their values in slots). False when the step is not shared (a graph or string-list
// attribute, a string constant).
bool MemoSignature(const Session::PlanStep& st, const std::vector<char>& is_const, const std::vector<Tensor>& slots,
                   std::string* sig) {
  const Node& n = *st.node;
  *sig = fmt::format("{}|{}|{}|{}|", n.domain, n.op_type, st.opset, n.attributes.size());
  for (const Attribute& a : n.attributes) {
    // A plan root's fallback (ConcatShape's, TransposeShape's: the nodes it replaced) computes the
    // same shape; it is not part of the signature.
    if (st.root && n.domain == kPlanDomain && a.name == "fallback" && a.g) continue;
    if (a.g || !a.graphs.empty() || !a.tensors.empty() || !a.strings.empty() || !a.ref_attr_name.empty()) return false;
    *sig += a.name;
    const int type = static_cast<int>(a.type);
    AppendBytes(*sig, &type, sizeof type);
    AppendBytes(*sig, &a.f, sizeof a.f);
    AppendBytes(*sig, &a.i, sizeof a.i);
    const size_t ls = a.s.size(), lf = a.floats.size(), li = a.ints.size();
    AppendBytes(*sig, &ls, sizeof ls);
    *sig += a.s;
    AppendBytes(*sig, &lf, sizeof lf);
    AppendBytes(*sig, a.floats.data(), lf * sizeof(float));
    AppendBytes(*sig, &li, sizeof li);
    AppendBytes(*sig, a.ints.data(), li * sizeof(int64_t));
    if (a.t.defined()) {
      if (a.t.dtype() == DataType::kString || a.t.nbytes() > kMemoConstBytes) return false;
      *sig += 't';
      AppendTensor(*sig, a.t);
    }
  }
  // Which outputs the step makes (a step whose node leaves one out must not lend it to one that needs it).
  for (int o : st.out_slots) *sig += o >= 0 ? '+' : '_';
  *sig += '|';
  for (int s : st.in_slots) {
    if (s < 0) {
      *sig += '-';
    } else if (!is_const[s]) {
      *sig += 'd';
    } else {
      const Tensor& t = slots[s];
      if (!t.defined() || t.dtype() == DataType::kString) return false;
      if (t.nbytes() <= kMemoConstBytes) {
        *sig += 'c';
        AppendTensor(*sig, t);
      } else {
        *sig += 'p';
        const void* p = t.raw();
        AppendBytes(*sig, &p, sizeof p);
      }
    }
  }
  return true;
}

// The steps one run has computed, by signature and the values they read.
class ShapeMemo {
 public:
  // The outputs of an earlier step of this run with st's signature that read the same values as
  // st does now, or null (then `key` is what Remember takes).
  const std::vector<Tensor>* Find(const Session::PlanStep& st, const std::vector<Tensor>& slots, std::string* key,
                                  int* step) {
    key->clear();
    AppendBytes(*key, &st.memo, sizeof st.memo);
    for (size_t i = 0; i < st.in_slots.size(); ++i) {
      const int s = st.in_slots[i];
      if (s < 0 || st.memo_const[i]) continue;
      const Tensor& t = slots[s];
      if (!t.defined()) return Refuse(key);
      if (st.root) {  // Shape and its kind read the input's shape alone
        const int64_t r = t.rank();
        AppendBytes(*key, &r, sizeof r);
        for (int64_t d : t.shape()) AppendBytes(*key, &d, sizeof d);
      } else {
        if (t.dtype() == DataType::kString || t.numel() > kMemoMaxElements) return Refuse(key);
        AppendTensor(*key, t);
      }
    }
    auto it = seen_.find(*key);
    if (it == seen_.end()) return nullptr;
    *step = it->second.first;
    return &it->second.second;
  }
  void Remember(const Session::PlanStep& st, int step, const std::vector<Tensor>& slots, std::string&& key) {
    if (key.empty()) return;
    std::vector<Tensor> out;
    out.reserve(st.out_slots.size());
    size_t bytes = 0;
    for (int o : st.out_slots) {
      out.push_back(o >= 0 ? slots[o] : Tensor());
      bytes += out.back().defined() ? out.back().nbytes() : 0;
    }
    if (bytes <= kMaxCachedBytes) seen_.emplace(std::move(key), std::make_pair(step, std::move(out)));
  }

 private:
  static const std::vector<Tensor>* Refuse(std::string* key) {
    key->clear();
    return nullptr;
  }
  std::unordered_map<std::string, std::pair<int, std::vector<Tensor>>> seen_;  // -> step, its outputs
};

// A root's input shapes as ShapeMemo::Find reads them (rank, then dims, of each input that is not
// constant; -1 for one without a value, which no shape matches), into `dims`.
void RootDims(const Session::PlanStep& st, const std::vector<Tensor>& slots, std::vector<int64_t>& dims) {
  dims.clear();
  for (size_t i = 0; i < st.in_slots.size(); ++i) {
    const int s = st.in_slots[i];
    if (s < 0 || st.memo_const[i]) continue;
    if (!slots[s].defined()) {
      dims.push_back(-1);
      continue;
    }
    dims.push_back(slots[s].rank());
    dims.insert(dims.end(), slots[s].shape().begin(), slots[s].shape().end());
  }
}

// Whether `st` reads now what `partner` (an earlier step of this run with its signature) read: then
// its outputs are partner's (its cache, which holds this run's values). Roots: the same input
// shapes; derived steps: the same tensors or the same small values in the slots partner read.
bool ReadsWhatPartnerRead(const Session::PlanStep& st, const Session::PlanStep& partner,
                          const std::vector<Tensor>& slots) {
  if (!partner.cache_valid || partner.memo != st.memo) return false;
  if (st.root) {
    size_t at = 0;
    const std::vector<int64_t>& d = partner.memo_dims;
    for (size_t i = 0; i < st.in_slots.size(); ++i) {
      const int s = st.in_slots[i];
      if (s < 0 || st.memo_const[i]) continue;
      const Tensor& t = slots[s];
      if (!t.defined() || at + 1 + t.shape().size() > d.size() || d[at] != t.rank() ||
          !std::equal(t.shape().begin(), t.shape().end(), d.begin() + static_cast<std::ptrdiff_t>(at) + 1))
        return false;
      at += 1 + t.shape().size();
    }
    return at == d.size();
  }
  for (size_t i = 0; i < st.in_slots.size(); ++i) {
    const int s = st.in_slots[i], ps = partner.in_slots[i];
    if (s < 0 || st.memo_const[i]) continue;
    const Tensor& a = slots[s];
    const Tensor& b = slots[ps];
    if (!a.defined() || !b.defined() || a.dtype() == DataType::kString || a.numel() > kMemoMaxElements ||
        !SameValue(a, b))
      return false;
  }
  return true;
}

// Operators whose outputs are a function of their input values and attributes (no state, no
// randomness, no subgraph): these may be computed once when planned or reused across runs.
bool IsPureOperator(const Node& n) {
  static const std::unordered_set<std::string> kImpure = {"RandomUniform", "RandomNormal", "RandomUniformLike",
                                                          "RandomNormalLike", "Bernoulli", "Multinomial", "Dropout"};
  // FusedCopy's subgraph is its fallback: the data-movement operators it replaces, all pure.
  if (n.domain == kPlanDomain && n.op_type == "FusedCopy") return true;
  return n.domain.empty() && !kImpure.count(n.op_type) && !HasSubgraph(n);
}

}  // namespace

void Session::RememberShapeStep(const Plan& plan, size_t index, const std::vector<Tensor>& slots,
                                std::vector<char>& dirty) {
  const PlanStep& st = plan.steps[index];
  size_t bytes = 0;
  for (int o : st.out_slots) bytes += o >= 0 ? slots[o].nbytes() : 0;
  const bool had = st.cache_valid;
  st.cached.resize(st.out_slots.size());
  for (size_t o = 0; o < st.out_slots.size(); ++o) {
    const int s = st.out_slots[o];
    if (s < 0) continue;
    const Tensor& t = slots[s];
    if (!(had && t.numel() <= kMaxComparedElements && SameValue(t, st.cached[o])))
      for (int reader : plan.shape_readers[s]) dirty[reader] = 1;
    st.cached[o] = bytes <= kMaxCachedBytes ? t : Tensor();
  }
  st.cache_valid = bytes <= kMaxCachedBytes;
  plan.skip_if_clean[index] = st.derived && st.cache_valid;
}

void Session::FoldAndMarkShapeSteps(Plan& plan) {
  // Constant slots: initializers that no feed can override (an IR < 4 initializer that is also a
  // graph input can be fed), then the outputs of steps folded here.
  std::vector<char> is_const(plan.slot_names.size(), 0), is_shape(plan.slot_names.size(), 0);
  std::unordered_set<std::string> fed;
  for (const ValueInfo& v : plan.graph->inputs) fed.insert(v.name);
  for (const auto& [s, t] : plan.consts) is_const[s] = !fed.count(plan.slot_names[s]);
  std::vector<Tensor> slots(plan.slot_names.size());
  for (const auto& [s, t] : plan.consts) slots[s] = *t;
  std::vector<Plan::Step> kept;
  kept.reserve(plan.steps.size());
  std::unordered_map<std::string, int> memo_ids;  // shape steps' signatures (memo_shapes)
  FrameRunner runner(this, nullptr);
  const bool profile = options_.profile;
  options_.profile = false;  // folding is not running: the profile counts runs only
  for (Plan::Step& st : plan.steps) {
    const Node& n = *st.node;
    const bool own_kernel = call_kernel_of_.count(&n) > 0;
    const bool pure = !own_kernel && IsPureOperator(n);
    bool all_const = pure, all_known = pure;
    for (int i : st.in_slots) {
      if (i < 0) continue;
      all_const = all_const && is_const[i];
      all_known = all_known && (is_const[i] || is_shape[i]);
    }
    if (all_const) {
      // Computed now, once; a failure is left to the run (the same error then, with the feeds).
      bool ok = true;
      try {
        RunStep(st, slots, runner, false);
      } catch (const std::exception&) {
        ok = false;
      }
      size_t bytes = 0;
      for (int o : st.out_slots) bytes += ok && o >= 0 ? slots[o].nbytes() : 0;
      // A Constant shares its attribute's tensor; anything else is kept when it is small.
      if (ok && !(n.op_type == "Constant" || bytes <= kMaxCachedBytes))
        for (int o : st.out_slots)
          if (o >= 0) slots[o] = Tensor();  // too large to keep: computed in every run instead
      if (ok && (n.op_type == "Constant" || bytes <= kMaxCachedBytes)) {
        for (size_t o = 0; o < st.out_slots.size(); ++o) {
          const int s = st.out_slots[o];
          if (s < 0) continue;
          plan.folded.push_back(slots[s]);
          plan.consts.emplace_back(s, &plan.folded.back());
          plan.folded_values.emplace_back(n.outputs[o], &plan.folded.back());
          is_const[s] = 1;
        }
        ++plan.folded_steps;
        continue;
      }
    }
    st.root = !own_kernel && ((n.domain.empty() && (n.op_type == "Shape" || n.op_type == "Size")) ||
                              (n.domain == kPlanDomain && (n.op_type == "ConcatShape" || n.op_type == "TransposeShape")));
    st.derived = !st.root && all_known && !all_const;
    if (st.root || st.derived) {
      for (int o : st.out_slots)
        if (o >= 0) is_shape[o] = 1;
      plan.derived_steps += st.derived;
      std::string sig;
      if (options_.memo_shapes && MemoSignature(st, is_const, slots, &sig)) {
        st.memo = memo_ids.emplace(std::move(sig), static_cast<int>(memo_ids.size())).first->second;
        for (int i : st.in_slots) st.memo_const.push_back(i >= 0 && is_const[i]);
      }
    }
    kept.push_back(std::move(st));
  }
  plan.steps = std::move(kept);
  options_.profile = profile;
}

std::vector<Tensor> Session::Execute(const Plan& plan, Frame* parent, const std::vector<Tensor>& graph_inputs,
                                     const std::map<std::string, Tensor>* feeds) {
  Frame frame;
  frame.plan = &plan;
  frame.parent = parent;
  // The main graph's frame is resident between runs (Plan::resident): taken from the plan here and
  // given back at the end; a run that fails leaves none, and no shape step's cache valid.
  const bool resident = plan.resident && parent == nullptr && feeds != nullptr;
  struct GiveBack {
    const Plan& plan;
    Frame& frame;
    bool resident, done = false;
    ~GiveBack() {
      if (!resident) return;
      if (done) {
        plan.resident_slots.swap(frame.slots);
        return;
      }
      plan.resident_slots.clear();
      for (const Plan::Step& st : plan.steps) st.cache_valid = false;
      std::fill(plan.skip_if_clean.begin(), plan.skip_if_clean.end(), 0);
    }
  } give_back{plan, frame, resident};
  if (resident && !plan.resident_slots.empty()) {
    frame.slots.swap(plan.resident_slots);
  } else {
    frame.slots.resize(plan.slot_names.size());
    for (const auto& [s, t] : plan.consts) frame.slots[s] = *t;
  }
  const Graph& g = *plan.graph;
  if (feeds != nullptr) {
    for (size_t i = 0; i < g.inputs.size(); ++i) {
      const ValueInfo& v = g.inputs[i];
      auto it = feeds->find(v.name);
      if (it == feeds->end()) {
        const Tensor* init = g.FindInitializer(v.name);
        GAF_CHECK(init != nullptr, "input '{}' was not given", v.name);
        if (resident) frame.slots[plan.input_slots[i]] = *init;  // not the last run's feed
        continue;  // initializer default
      }
      CheckFeed(v, it->second);
      frame.slots[plan.input_slots[i]] = it->second;
    }
  } else {
    GAF_CHECK(graph_inputs.size() <= g.inputs.size(), "subgraph '{}' takes {} inputs, {} given", g.name,
              g.inputs.size(), graph_inputs.size());
    for (size_t i = 0; i < graph_inputs.size(); ++i) frame.slots[plan.input_slots[i]] = graph_inputs[i];
  }
  for (size_t i = 0; i < plan.outer_names.size(); ++i) {
    if (frame.slots[plan.outer_slots[i]].defined()) continue;
    const Tensor* t = parent ? parent->Lookup(plan.outer_names[i]) : nullptr;
    if (t != nullptr) frame.slots[plan.outer_slots[i]] = *t;
  }

  FrameRunner runner(this, &frame);
  const bool top = parent == nullptr;
  if (top && options_.observer)
    for (const auto& [name, t] : plan.folded_values) options_.observer(name, *t);
  // Shape steps: a derived step with a valid cache runs only when one of its inputs differs from
  // the last run's (`dirty`, set by the steps that made them; constants never do). In a resident
  // frame a clean one costs two bytes read: its values are in their slots since the last run (the
  // slots of shape steps with a valid cache are not released), and releases nothing (what it
  // reads is constant or cached). A decoder's step skips about half its steps so.
  const bool shapes = plan.derived_steps > 0;
  const bool observe = top && options_.observer;
  std::vector<char> dirty;
  if (shapes) dirty.assign(plan.steps.size(), 0);
  ShapeMemo memo;
  std::string memo_key;
  for (size_t index = 0; index < plan.steps.size(); ++index) {
    if (shapes && plan.skip_if_clean[index] && !dirty[index]) {
      if (resident && !observe) continue;
      const Plan::Step& st = plan.steps[index];
      for (size_t o = 0; o < st.out_slots.size(); ++o) {
        if (st.out_slots[o] < 0) continue;
        if (!resident) frame.slots[st.out_slots[o]] = st.cached[o];
        if (observe) options_.observer(st.node->outputs[o], st.cached[o]);
      }
      Release(plan, st, frame.slots);
      continue;
    }
    const Plan::Step& st = plan.steps[index];
    if (st.memo >= 0) {
      const std::vector<Tensor>* same = nullptr;
      if (st.memo_partner >= 0 && ReadsWhatPartnerRead(st, plan.steps[st.memo_partner], frame.slots)) {
        same = &plan.steps[st.memo_partner].cached;
        memo_key.clear();
      } else {
        int partner = -1;
        same = memo.Find(st, frame.slots, &memo_key, &partner);
        if (same != nullptr) st.memo_partner = partner;
      }
      if (st.root) RootDims(st, frame.slots, st.memo_dims);
      if (same != nullptr) {
        for (size_t o = 0; o < st.out_slots.size(); ++o) {
          if (st.out_slots[o] < 0) continue;
          frame.slots[st.out_slots[o]] = (*same)[o];
          if (observe) options_.observer(st.node->outputs[o], (*same)[o]);
        }
        ++memo_hits_;
        if (shapes) RememberShapeStep(plan, index, frame.slots, dirty);
        Release(plan, st, frame.slots);
        continue;
      }
    }
    RunStep(st, frame.slots, runner, top);
    if (st.memo >= 0) memo.Remember(st, static_cast<int>(index), frame.slots, std::move(memo_key));
    if ((st.root || st.derived) && shapes) RememberShapeStep(plan, index, frame.slots, dirty);
    Release(plan, st, frame.slots);
  }
  std::vector<Tensor> results;
  results.reserve(plan.output_slots.size());
  for (size_t i = 0; i < plan.output_slots.size(); ++i) {
    const Tensor& t = frame.slots[plan.output_slots[i]];
    if (t.defined()) {
      results.push_back(t);
    } else {
      const Tensor* outer = parent ? parent->Lookup(g.outputs[i].name) : nullptr;
      GAF_CHECK(outer != nullptr, "graph output '{}' was not produced", g.outputs[i].name);
      results.push_back(*outer);
    }
  }
  if (resident) {
    // A resident frame keeps constants and cached shape values only (an output kept would share
    // its buffer with the caller: a cache could no longer grow in place).
    for (int s : plan.output_slots)
      if (!plan.is_const_slot[s] && !(plan.producer[s] >= 0 && plan.steps[plan.producer[s]].cache_valid))
        frame.slots[s] = Tensor();
  }
  give_back.done = true;
  return results;
}

void Session::Release(const Plan& plan, const PlanStep& st, std::vector<Tensor>& slots) {
  for (int s : st.release) slots[s] = Tensor();
  for (const auto& [s, producer] : st.release_if_uncached)
    if (!plan.steps[producer].cache_valid) slots[s] = Tensor();
}

std::vector<Tensor> Session::Run(const std::map<std::string, Tensor>& feeds,
                                 const std::vector<std::string>& output_names, bool cache_room,
                                 bool last_position_only) {
  for (const auto& [name, t] : feeds) {
    bool known = false;
    for (const ValueInfo& v : model_.graph.inputs) known |= v.name == name;
    GAF_CHECK(known, "'{}' is not an input of the model", name);
  }
  std::lock_guard<std::mutex> lock(run_mutex_);  // one run at a time (plans keep shape caches)
  static const int procs = omp_get_num_procs();  // a system call: asked once
  int threads = options_.num_threads > 0 ? options_.num_threads : procs;
  // The calling thread's OpenMP setting is restored afterwards: a host program sharing the OpenMP
  // runtime (PyTorch in the Python package) keeps its own thread count.
  struct RestoreThreads {
    int n = omp_get_max_threads();
    ~RestoreThreads() { omp_set_num_threads(n); }
  } restore;
  omp_set_num_threads(threads);
  // The shape signature: the feeds' shapes with each dimension rounded up to a power of two (absurd
  // sizes of empty tensors as they are).
  // (Appended by hand: fmt::format per dimension took about 3 us of a decode step.)
  std::string key;
  char digits[24];
  auto number = [&](int64_t v, char end) {
    key.append(digits, std::to_chars(digits, digits + sizeof digits, v).ptr);
    key += end;
  };
  for (const auto& [name, t] : feeds) {
    key += name;
    key += ':';
    number(static_cast<int>(t.dtype()), ':');
    for (int64_t d : t.shape())
      number(d <= 1 || d > (int64_t{1} << 40) ? d : int64_t{1} << (64 - __builtin_clzll(d - 1)), ',');
    key += ';';
  }
  if (last_position_only) key += "last position";  // smaller outputs than the same feeds make otherwise
  MemoryPlan* plan = nullptr;
  if (options_.memory_plan) {
    constexpr size_t kMaxPlans = 16;
    auto it = memory_plans_.find(key);
    if (it == memory_plans_.end()) {
      if (memory_plans_.size() >= kMaxPlans) memory_plans_.erase(memory_plans_.begin());
      it = memory_plans_.emplace(key, std::make_unique<MemoryPlan>()).first;
    }
    plan = it->second.get();
    last_memory_plan_ = plan;
  }
  MemoryPlan::Scope buffers(plan);
  cache_room_ = cache_room && options_.cache_in_place;
  last_position_only_ = last_position_only;
  // A team for the whole run where the last run of these shapes made only products of few rows and
  // no kernel opened a parallel region of its own (inside a team it would get one thread).
  auto rows = product_rows_.find(key);
  const bool team = options_.task_team && threads > 1 && rows != product_rows_.end() && rows->second >= 1 &&
                    rows->second <= kTeamMaxRows;
  ThisThreadRunHints() = RunHints{};
  std::vector<Tensor> all;
  const Plan& graph_plan = PlanFor(model_.graph);
  if (team) {
    TaskTeam::Run(threads, [&] { all = Execute(graph_plan, nullptr, {}, &feeds); },
                  options_.read_ahead ? &read_ahead_ : nullptr);
  } else {
    all = Execute(graph_plan, nullptr, {}, &feeds);
  }
  last_run_team_ = team;
  if (product_rows_.size() >= 64 && rows == product_rows_.end()) product_rows_.erase(product_rows_.begin());
  const RunHints& hints = ThisThreadRunHints();
  product_rows_[key] = hints.own_regions ? -1 : hints.max_product_rows;
  if (!cache_room)  // a caller that does not feed them back gets contiguous tensors
    for (Tensor& t : all) t = t.Dense();
  if (output_names.empty()) return all;
  std::vector<Tensor> out;
  for (const std::string& n : output_names) {
    size_t i = 0;
    while (i < outputs_.size() && outputs_[i].name != n) ++i;
    GAF_CHECK(i < outputs_.size(), "'{}' is not an output of the model", n);
    out.push_back(all[i]);
  }
  return out;
}

MemoryPlanStats Session::memory_plan_stats() const {
  return last_memory_plan_ != nullptr ? last_memory_plan_->stats() : MemoryPlanStats{};
}

void Session::ResetProfile() {
  std::lock_guard<std::mutex> lock(run_mutex_);
  profile_.clear();
  node_profile_.clear();
}

namespace {
template <class Map>
std::vector<OpProfile> SlowestFirst(const Map& m) {
  std::vector<OpProfile> out;
  for (const auto& [k, v] : m) out.push_back(v);
  std::sort(out.begin(), out.end(), [](const OpProfile& a, const OpProfile& b) { return a.seconds > b.seconds; });
  return out;
}
}  // namespace

std::vector<OpProfile> Session::Profile() const { return SlowestFirst(profile_); }

std::vector<OpProfile> Session::NodeProfile() const { return SlowestFirst(node_profile_); }

}  // namespace gaf
