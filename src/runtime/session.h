// The reference CPU runtime: executes a model's graph on given inputs.
//
// At construction the session inlines model-local functions, resolves a kernel for every node
// (an operator without a kernel is a gaf::UnsupportedError naming the node), assigns each value a
// slot and computes where each value is used last, so a tensor's memory is released right after
// its last consumer runs.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "ir/graph.h"
#include "ir/memory_plan.h"
#include "ops/kernel.h"
#include "ops/task_team.h"  // ReadAhead
#include "runtime/plan_rewrite.h"

namespace gaf {

struct SessionOptions {
  int num_threads = 0;   // 0 = all cores
  bool profile = false;  // accumulate time per op type (see Session::Profile)
  // Called with every value a node of the main graph produces (name, tensor), in execution order.
  // Used to record concrete shapes for the cost model and intermediate values for debugging.
  std::function<void(const std::string&, const Tensor&)> observer;
  // Kernels for calls of model-local functions (fused operators): when it returns a kernel for
  // a call node, the call is kept as one node run by that kernel instead of being inlined.
  std::function<std::optional<KernelInfo>(const Node& call, const Function& function)> function_kernels;
  // Kernels for other nodes of the main graph (after inlining): when it returns a kernel, the node
  // runs it instead of the registry's (e.g. float16 weight storage for MatMul).
  std::function<std::optional<KernelInfo>(const Node& node, const Model& model)> node_kernels;
  // node_kernels also gives the kernels of the plan's SiblingMatMul nodes (MatMuls of one input by
  // several weights, runtime/plan_rewrite.h), so the plan may group siblings; otherwise it does
  // not, and each MatMul keeps the kernel node_kernels gives it.
  bool node_kernels_take_siblings = false;
  // node_kernels also gives the kernels of the plan's ResidualMatMul nodes (a product by a constant
  // weight and the residual Add after it, perhaps the RMSNorm of the sum), so the plan may fold
  // them; otherwise it does not, and the MatMul keeps the kernel node_kernels gives it.
  bool node_kernels_take_residuals = false;
  // Conv nodes of the main graph with a float32 initializer weight run a convolution prepared once
  // for that weight where it is faster (ops/conv.h, PreparedConv: oneDNN's blocked layouts), and
  // MatMuls by a float32 [K, N] initializer (of kPackedMatMulMinWeight elements or more) run
  // products of 2 rows or more on a copy of the weight packed once (ops/gemm.h, PreparedMatMul:
  // column panels to 128 rows, oneDNN's matmul above); false keeps the registry's kernels.
  bool prepared_kernels = true;
  // Steps of the main graph whose inputs are all constant are computed once, when the session is
  // made (Constant nodes, shape arithmetic on constants); shape computation (Shape/Size and the
  // pure operators on their results and constants) runs again only when a value it reads changed
  // since the last run, else its outputs of the last run are used (a decoder's decode steps).
  bool fold_shapes = true;
  // Within a run, a shape step (fold_shapes) with the same operator, attributes and constants as
  // one already run, and the same values read (Shape and its kind: the same input shapes), takes
  // that step's outputs instead of running: a decoder's layers compute the same shape values from
  // their caches, and a decode step's past length changes them every step.
  bool memo_shapes = true;
  // MatMuls read a transposed operand, and a key/value cache repeated per query head, where they
  // are instead of through the copies the graph makes (runtime/plan_rewrite.h). Off while an
  // observer is set (it sees the graph's values as written).
  bool rewrite_products = true;
  // Runs of the main graph take their tensor buffers from a static memory plan (ir/memory_plan.h):
  // recorded on a run, placed in one arena by liveness, reused by later runs (re-planned when a
  // run asks for what the plan does not hold, e.g. a grown shape).
  bool memory_plan = true;
  // In runs whose caller feeds the present caches back (Run's cache_room: Generate), a decode
  // step's attention keeps each key/value cache in storage with room to grow and appends the new
  // rows in place: a step writes its new rows instead of copying the whole cache into a new present
  // (at past 2,047 the bench Llama's copies move 100 MB a step). Off: the present is a new tensor
  // every step, as in other runs.
  bool cache_in_place = true;
  // Runs whose weight products all took few rows (kTeamMaxRows: a decode step of up to 4
  // sequences) on the last run of the same shapes are led by a team of threads held for the whole
  // run (ops/task_team.h): the products', GEMVs' and ParallelFor's tasks go to threads already
  // waiting instead of a parallel region per node. The first run of a shape signature, runs of
  // more rows (a prompt), and runs where a kernel opened a parallel region of its own (oneDNN,
  // convolutions, a prompt's attention: inside a team it would get one thread) run without one.
  bool task_team = true;
  // In runs led by a team, the threads with no task left in a weight product prefetch what they
  // read first in the next one (ops/task_team.h ReadAhead, learned over the runs of this
  // session). Off: they wait (for comparison).
  bool read_ahead = true;
};

struct OpProfile {
  std::string op_type;
  std::string node;  // Session::NodeProfile: the node's name (Node::Describe() when it has none)
  int64_t calls = 0;
  double seconds = 0;
};

class Session {
 public:
  Session(const Model& model, SessionOptions options = {});
  ~Session();

  // Graph inputs that must be fed (initializers excluded), and graph outputs.
  const std::vector<ValueInfo>& inputs() const { return inputs_; }
  const std::vector<ValueInfo>& outputs() const { return outputs_; }
  const Model& model() const { return model_; }

  // Runs the graph. Outputs may share their buffers with the session's constants and cached
  // shape values (fold_shapes) or with the feeds: never write into them (Clone() first).
  // Feeds are checked against the declared input types and known dimensions;
  // a mismatch is a gaf::Error naming the input. Returns the requested outputs (all graph outputs
  // when `output_names` is empty), in that order. cache_room: the caller feeds the present caches
  // back as the next run's past (Generate): they may come back as caches with room
  // (Tensor::WithCacheRoom, SessionOptions::cache_in_place), which only Dense() or feeding them
  // back reads; otherwise every output is contiguous. last_position_only: the caller reads only
  // the last position of the outputs the plan made LastPosition nodes for (a decoder's logits,
  // ProductRewrites::last_positions): those come back as [batch, 1, ...].
  std::vector<Tensor> Run(const std::map<std::string, Tensor>& feeds,
                          const std::vector<std::string>& output_names = {}, bool cache_room = false,
                          bool last_position_only = false);

  // Per op type totals since construction (only with options.profile), largest first.
  std::vector<OpProfile> Profile() const;
  // The same per node of the plan (rewritten nodes under their plan names), slowest first.
  std::vector<OpProfile> NodeProfile() const;
  // Forgets the totals so far (a caller's warm-up runs, say).
  void ResetProfile();
  // What the plan rewrote (SessionOptions::rewrite_products).
  const ProductRewrites& product_rewrites() const { return rewrites_; }
  // The counts of the memory plan the last run used (SessionOptions::memory_plan; all 0 when off).
  MemoryPlanStats memory_plan_stats() const;

  struct Plan;      // compiled form of one graph
  struct PlanStep;  // one node of a plan
  struct Frame;     // values of one graph execution

 private:
  const Plan& PlanFor(const Graph& g);
  // Runs one step on `slots` (its inputs there, its outputs written there); `top`: a step of the
  // main graph (the observer sees its outputs).
  void RunStep(const PlanStep& st, std::vector<Tensor>& slots, SubgraphRunner& runner, bool top);
  // Constant folding and shape caching of the main graph's plan (SessionOptions::fold_shapes).
  void FoldAndMarkShapeSteps(Plan& plan);
  // Empties the slots whose last use is `st`.
  static void Release(const Plan& plan, const PlanStep& st, std::vector<Tensor>& slots);
  // Keeps a shape step's outputs as its cache, and marks the derived steps reading an output that
  // differs from the last run's dirty.
  static void RememberShapeStep(const Plan& plan, size_t index, const std::vector<Tensor>& slots,
                                std::vector<char>& dirty);
  std::vector<Tensor> Execute(const Plan& plan, Frame* parent, const std::vector<Tensor>& graph_inputs,
                              const std::map<std::string, Tensor>* feeds);
  friend class FrameRunner;

  Model model_;  // with functions inlined
  SessionOptions options_;
  std::vector<ValueInfo> inputs_, outputs_;
  std::unordered_map<const Graph*, std::unique_ptr<Plan>> plans_;
  std::map<std::string, OpProfile> profile_;
  std::map<std::string, OpProfile, std::less<>> node_profile_;  // found by name without a copy
  std::mutex run_mutex_;
  bool cache_room_ = false;  // the current run's Run(..., cache_room) and options_.cache_in_place
  bool last_position_only_ = false;  // the current run's Run(..., last_position_only)
  ProductRewrites rewrites_;
  std::deque<KernelInfo> call_kernels_;                 // kernels of kept function calls
  std::unordered_map<const Node*, const KernelInfo*> call_kernel_of_;
  // Memory plans by the feeds' shapes with each dimension rounded up to a power of two (a prompt
  // and the decode steps after it have plans of their own; a cache's length moves between plans
  // as it doubles); the plan of the last run.
  std::map<std::string, std::unique_ptr<MemoryPlan>> memory_plans_;
  const MemoryPlan* last_memory_plan_ = nullptr;
  // The most rows a weight product took in the last run of each shape signature (the memory
  // plans' keys; -1 where a kernel opened a parallel region of its own): whether the next run is
  // led by a task team (SessionOptions::task_team).
  std::map<std::string, int64_t> product_rows_;
  bool last_run_team_ = false;
  int64_t memo_hits_ = 0;
  ReadAhead read_ahead_;  // the products' order, for the runs led by a team (SessionOptions::read_ahead)

 public:
  static constexpr int64_t kTeamMaxRows = 4;
  // Whether the last run was led by a task team (tests, `run --profile`).
  bool last_run_had_team() const { return last_run_team_; }
  // Shape steps that took an earlier step's outputs in their run (memo_shapes), over all runs.
  int64_t shape_memo_hits() const { return memo_hits_; }
  // The weight products whose successor the runs led by a team have learned (ReadAhead; tests).
  size_t read_ahead_entries() const { return read_ahead_.size(); }
};

// Replaces every call of a model-local function (in the graph and its subgraphs) with the
// function's body, values renamed apart and attribute references resolved. Exposed for tests.
// Checks first (CheckInlining) what the expansion would make, so a hostile file ends in a
// gaf::Error instead of exhausting memory or the stack.
void InlineFunctions(Model& model);
// Same, leaving the calls for which `keep` returns true.
void InlineFunctions(Model& model, const std::function<bool(const Node&, const Function&)>& keep);

// Throws gaf::Error naming the call or graph when inlining the model's functions would pass a
// limit of GlobalLimits() (ir/limits.h): more than max_nodes nodes, calls and subgraphs nested
// deeper than max_nesting_depth, or a recursive function. Measures each function once.
void CheckInlining(const Model& model);

// The body of a model-local function as a graph (formal inputs and outputs as graph inputs and
// outputs), for running it as a subgraph.
Graph FunctionBodyGraph(const Function& f);

}  // namespace gaf
