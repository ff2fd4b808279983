#include "codegen/fused_kernels.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <set>

namespace gaf {

namespace {

constexpr const char* kTemporarySymbol = "gaf_fused_kernel_tmp";

// Gives the row stages of `k` their symbols, gaf_k<N>_<hash of the source>, N counting distinct
// sources in the batch: call sites with identical code share one compiled function. No name from
// the model reaches generated code or the cache key; the sources depend on structure only.
void NameStages(StagedKernel& k, std::map<std::string, std::string>& symbol_of_source, std::vector<KernelSource>& sources) {
  for (auto& st : k.stages) {
    if (st.library) continue;
    auto [it, added] = symbol_of_source.try_emplace(st.row.source);
    if (added) it->second = fmt::format("gaf_k{}_{:016x}", sources.size(), StableHash(st.row.source));
    const std::string old = st.row.symbol;
    const std::string& sym = it->second;
    for (size_t pos = 0; (pos = st.row.source.find(old, pos)) != std::string::npos; pos += sym.size())
      st.row.source.replace(pos, old.size(), sym);
    st.row.symbol = sym;
    if (added) sources.push_back({sym, st.row.source});
  }
}

// How often each node name occurs in the model's graph and all its subgraphs (and function
// bodies): kernels are found by the call's node name, so a call whose name is empty or shared
// gets none (it runs its body) instead of another call's kernel and constants.
std::map<std::string, int> NodeNameCounts(const Model& model) {
  std::map<std::string, int> counts;
  std::vector<const Graph*> todo = {&model.graph};
  for (const Function& f : model.functions)
    for (const Node& n : f.nodes) ++counts[n.name];
  for (size_t i = 0; i < todo.size(); ++i) {  // a work list: no recursion a file can drive deep
    for (const Node& n : todo[i]->nodes) {
      ++counts[n.name];
      for (const Attribute& a : n.attributes) {
        if (a.g) todo.push_back(a.g.get());
        for (const auto& sg : a.graphs) todo.push_back(sg.get());
      }
    }
  }
  return counts;
}

bool IsIntegerType(DataType t) {
  return t == DataType::kInt64 || t == DataType::kInt32 || t == DataType::kInt16 || t == DataType::kInt8 ||
         t == DataType::kUint8 || t == DataType::kUint16 || t == DataType::kUint32 || t == DataType::kUint64;
}

// A call site grows variants only to this many; beyond that its other calls run the body (with
// the reason), so a model whose shapes keep changing class cannot compile without end.
constexpr size_t kMaxVariants = 8;
// After this many calls of one site whose variant could not be generated, no more are tried (a
// decoder's growing past length makes every call a new key).
constexpr size_t kMaxFailures = 3;

// What decides a variant's code, for deduplication: the row stages' sources, the library stages'
// operators and the notes (rewrites), and the values folded into the code.
std::string VariantSignature(const KernelVariant& v) {
  std::string s;
  for (const auto& st : v.kernel.stages) s += (st.library ? "L:" + st.node.op_type : "R:" + st.row.source) + "\n";
  for (const auto& n : v.kernel.notes) s += "N:" + n + "\n";
  for (const auto& [i, t] : v.guards) {
    s += fmt::format("G{}:", i);
    for (int64_t x : t.ToInt64s()) s += fmt::format("{},", x);
  }
  return s;
}

bool GuardsHold(const KernelVariant& v, const std::vector<const Tensor*>& inputs) {
  for (const auto& [i, want] : v.guards) {
    const Tensor* t = i < inputs.size() ? inputs[i] : nullptr;
    // Same integer type and shape: the values compare byte for byte (no copies on every call).
    if (t == nullptr || t->dtype() != want.dtype() || t->shape() != want.shape() ||
        std::memcmp(t->raw(), want.raw(), want.nbytes()) != 0)
      return false;
  }
  return true;
}

// Types, shapes and (for shape data) values of one call, as a key for calls that cannot be
// generated (so a failing class is not regenerated on every call).
std::string CallKey(const std::vector<const Tensor*>& inputs, const std::vector<bool>& shape_data) {
  std::string k;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor* t = inputs[i];
    if (t == nullptr) {
      k += "-|";
      continue;
    }
    k += fmt::format("{}{}", static_cast<int>(t->dtype()), ShapeToString(t->shape()));
    if (i < shape_data.size() && shape_data[i] && t->numel() <= kMaxShapeDataElements)
      for (int64_t x : t->ToInt64s()) k += fmt::format(",{}", x);
    k += "|";
  }
  return k;
}

}  // namespace

// Run-time state of a call site: its variants and what generating another takes.
struct FusedKernelSet::Entry::Variants {
  mutable std::mutex mu;       // guards list, failed, exhausted, jit counters (held briefly)
  std::mutex generating;       // held while a variant is generated and compiled (seconds)
  std::shared_ptr<const std::vector<std::shared_ptr<const KernelVariant>>> list =
      std::make_shared<std::vector<std::shared_ptr<const KernelVariant>>>();
  mutable std::atomic<size_t> last{0};  // the variant that ran the last call (tried first)
  std::map<std::string, std::string> failed;  // call key -> why no variant can be generated
  std::string exhausted;  // set after kMaxFailures failed generations: why (no more are tried)
  int64_t jit = 0;
  double jit_seconds = 0;
  // Generation context.
  std::shared_ptr<const Function> function;
  std::vector<const Tensor*> constants;  // per input: constant value (owned by the set), else null
  std::vector<bool> shape_data;          // per input: an integer input that only feeds shape computation
  bool approx_math = false;
  HalfWeights half_weights = HalfWeights::kOff;
  int64_t opset = 17;
  std::string cache_root;

  std::shared_ptr<const std::vector<std::shared_ptr<const KernelVariant>>> Snapshot() const {
    std::lock_guard<std::mutex> lock(mu);
    return list;
  }
  void Add(std::shared_ptr<const KernelVariant> v) {  // mu held
    auto next = std::make_shared<std::vector<std::shared_ptr<const KernelVariant>>>(*list);
    next->push_back(std::move(v));
    list = std::move(next);
  }
  // The request for a call of the given types and shapes; `values` gives the values of inputs
  // folded in as shape data (null where the value is unknown). Fills the variant's guards.
  RowKernelRequest Request(const std::vector<DataType>& types, const std::vector<Shape>& shapes,
                           const std::vector<const Tensor*>& values, KernelVariant* v) const {
    RowKernelRequest req;
    req.function = function.get();
    req.approx_math = approx_math;
    req.half_weights = half_weights;
    req.opset = opset;
    req.layout_cache_root = cache_root;
    req.input_types = types;
    req.input_shapes = shapes;
    req.constants = constants;
    for (size_t i = 0; i < constants.size(); ++i) {
      // Only integer shape data is folded (guards compare integer values exactly).
      if (constants[i] != nullptr || !shape_data[i] || values[i] == nullptr || !IsIntegerType(values[i]->dtype()) ||
          values[i]->numel() > kMaxShapeDataElements)
        continue;
      v->guards.emplace_back(i, *values[i]);
    }
    for (const auto& [i, t] : v->guards) req.constants[i] = &t;
    return req;
  }
};

bool FeedsOnlyShapeData(const Function& f, size_t input) {
  // (op, input position) pairs that read shape data, and integer ops that pass it on.
  static const std::set<std::pair<std::string, int>> kShapeSlots = {
      {"Slice", 1}, {"Slice", 2}, {"Slice", 3}, {"Slice", 4}, {"Reshape", 1}, {"Unsqueeze", 1}, {"Squeeze", 1},
      {"Expand", 1}, {"Tile", 1}, {"Pad", 1}, {"Pad", 3}, {"ReduceMean", 1}, {"ReduceSum", 1}, {"ReduceMax", 1},
      {"ReduceMin", 1}, {"ReduceSumSquare", 1}, {"ReduceL2", 1}, {"ConstantOfShape", 0}, {"Split", 1},
      {"Resize", 2}, {"Resize", 3}, {"TopK", 1}, {"CumSum", 1}};
  static const std::set<std::string> kShapeArithmetic = {"Add", "Sub", "Mul", "Div", "Cast", "Unsqueeze", "Squeeze",
                                                         "Concat", "Gather", "Reshape", "Identity", "Neg", "Max",
                                                         "Min", "Abs"};
  if (input >= f.inputs.size()) return false;
  std::vector<std::string> todo = {f.inputs[input]};
  std::set<std::string> seen;
  bool used = false;
  while (!todo.empty()) {
    const std::string v = todo.back();
    todo.pop_back();
    if (!seen.insert(v).second) continue;
    if (std::find(f.outputs.begin(), f.outputs.end(), v) != f.outputs.end()) return false;
    for (const Node& n : f.nodes) {
      if (!n.domain.empty()) {
        if (std::find(n.inputs.begin(), n.inputs.end(), v) != n.inputs.end()) return false;
        continue;
      }
      for (size_t k = 0; k < n.inputs.size(); ++k) {
        if (n.inputs[k] != v) continue;
        used = true;
        if (kShapeSlots.count({n.op_type, static_cast<int>(k)})) continue;
        if (!kShapeArithmetic.count(n.op_type)) return false;
        for (const auto& o : n.outputs)
          if (!o.empty()) todo.push_back(o);
      }
    }
  }
  return used;
}

std::shared_ptr<FusedKernelSet> FusedKernelSet::Build(const Model& model, const std::vector<CallShapes>& samples,
                                                      KernelCompiler& compiler, const std::string& domain,
                                                      HalfWeights half_weights) {
  // One entry per call site: calls of one function differ in their constants (weights folded
  // into a kernel, scalars baked into its code) and in the classes their inputs take.
  auto set = std::make_shared<FusedKernelSet>();
  std::vector<KernelSource> sources;
  std::map<std::string, std::string> symbol_of_source;
  std::map<std::string, Graph> bodies;
  std::map<std::string, std::shared_ptr<const Function>> functions;
  const std::map<std::string, int> name_counts = NodeNameCounts(model);
  std::vector<std::vector<std::shared_ptr<KernelVariant>>> planned;
  for (const Node& call : model.graph.nodes) {
    if (call.domain != domain) continue;
    const Function* f = model.FindFunction(call.domain, call.op_type);
    if (f == nullptr) continue;
    Entry e;
    e.function = f->name;
    e.node = call.name;
    if (!bodies.count(f->name)) {
      bodies[f->name] = FunctionBodyGraph(*f);
      functions[f->name] = std::make_shared<const Function>(*f);
    }
    e.body = bodies[f->name];
    e.calls = std::make_shared<std::atomic<int64_t>>(0);
    e.fallbacks = std::make_shared<std::atomic<int64_t>>(0);
    e.variants = std::make_shared<Entry::Variants>();
    Entry::Variants& vs = *e.variants;
    vs.function = functions[f->name];
    vs.approx_math = f->doc_string.find("kernel-math=approx") != std::string::npos;
    vs.half_weights = half_weights;
    vs.opset = model.OpsetVersion("");
    vs.cache_root = compiler.cache_root();
    for (size_t i = 0; i < call.inputs.size(); ++i) {
      const Tensor* c = call.inputs[i].empty() ? nullptr : model.graph.FindInitializer(call.inputs[i]);
      if (c != nullptr) {
        set->constants_.push_back(*c);
        c = &set->constants_.back();
      }
      vs.constants.push_back(c);
      vs.shape_data.push_back(c == nullptr && FeedsOnlyShapeData(*f, i));
    }
    std::vector<std::shared_ptr<KernelVariant>> mine;
    std::set<std::string> signatures;
    const bool unique_name = !call.name.empty() && name_counts.at(call.name) == 1;
    std::string first_failure;
    bool any_shapes = false;
    for (const CallShapes& shapes : samples) {
      if (!unique_name) break;
      std::vector<DataType> types;
      std::vector<Shape> in_shapes;
      std::vector<const Tensor*> values;
      bool known = true;
      for (size_t i = 0; i < call.inputs.size() && known; ++i) {
        if (vs.constants[i] != nullptr) {
          types.push_back(vs.constants[i]->dtype());
          in_shapes.push_back(vs.constants[i]->shape());
          values.push_back(nullptr);
          continue;
        }
        auto it = shapes.find(call.inputs[i]);
        known = it != shapes.end();
        if (!known) break;
        types.push_back(it->second.dtype);
        in_shapes.push_back(it->second.shape);
        values.push_back(vs.shape_data[i] && IsIntegerType(it->second.dtype) ? it->second.value.get() : nullptr);
      }
      if (!known) continue;
      any_shapes = true;
      auto v = std::make_shared<KernelVariant>();
      RowKernelRequest req = vs.Request(types, in_shapes, values, v.get());
      v->kernel = GenerateStagedKernel(req, kTemporarySymbol, vs.opset);
      if (!v->kernel.ok) {
        if (first_failure.empty()) first_failure = v->kernel.reason;
        continue;
      }
      if (!signatures.insert(VariantSignature(*v)).second) continue;
      NameStages(v->kernel, symbol_of_source, sources);
      mine.push_back(std::move(v));
    }
    if (!unique_name) {
      e.status = "not generated: the call node has no unique name (it runs its body)";
    } else if (!any_shapes) {
      e.status = "input shapes unknown (no recorded run): generated when called";
      e.generate_when_called = true;
    } else if (mine.empty()) {
      e.status = "not generated: " + first_failure;
    }
    if (unique_name) set->by_node_[call.name] = set->entries_.size();
    set->entries_.push_back(std::move(e));
    planned.push_back(std::move(mine));
  }
  set->library_ = compiler.Compile(sources);
  for (size_t k = 0; k < set->entries_.size(); ++k) {
    Entry& e = set->entries_[k];
    std::string bind_failure;
    for (auto& v : planned[k]) {
      if (!v->kernel.Bind(*set->library_)) {
        if (bind_failure.empty()) bind_failure = v->kernel.reason;
        continue;
      }
      v->library = set->library_;
      if (!e.bound) e.kernel = v->kernel;
      e.bound = true;
      std::lock_guard<std::mutex> lock(e.variants->mu);
      e.variants->Add(v);
    }
    if (!planned[k].empty())
      e.status = !e.bound ? bind_failure : (set->library_->from_cache() ? "cached" : "compiled");
  }
  return set;
}

std::vector<std::shared_ptr<const KernelVariant>> FusedKernelSet::Entry::Bound() const {
  if (!variants) return {};
  return *variants->Snapshot();
}

int64_t FusedKernelSet::Entry::JitCompiles() const {
  if (!variants) return 0;
  std::lock_guard<std::mutex> lock(variants->mu);
  return variants->jit;
}

double FusedKernelSet::Entry::JitSeconds() const {
  if (!variants) return 0;
  std::lock_guard<std::mutex> lock(variants->mu);
  return variants->jit_seconds;
}

bool FusedKernelSet::Entry::Run(const std::vector<const Tensor*>& given, int num_threads, bool generate,
                                std::vector<Tensor>* outputs, std::string* reason, size_t* used) const {
  if (!variants) {
    *reason = status;
    return false;
  }
  for (const Tensor* t : given)
    if (t == nullptr) {
      *reason = "an optional input is absent";
      return false;
    }
  // Half inputs are widened (the kernels compute in float32 and narrow each output to its type).
  std::vector<Tensor> widened;
  std::vector<const Tensor*> inputs = given;
  widened.reserve(inputs.size());
  for (const Tensor*& t : inputs)
    if (IsHalf(t->dtype())) {
      widened.push_back(t->CastTo(DataType::kFloat));
      t = &widened.back();
    }
  auto finish = [&](const KernelVariant& v, std::vector<Tensor>&& outs) {
    for (size_t o = 0; o < outs.size(); ++o) {
      const DataType want = o < v.kernel.output_types.size() ? v.kernel.output_types[o] : DataType::kFloat;
      if (want != DataType::kFloat && outs[o].dtype() == DataType::kFloat) outs[o] = outs[o].CastTo(want);
    }
    *outputs = std::move(outs);
  };
  // Runs variant `idx` of `list` when it fits the call.
  auto attempt = [&](const std::vector<std::shared_ptr<const KernelVariant>>& list, size_t idx) {
    const KernelVariant& v = *list[idx];
    if (!GuardsHold(v, given)) {
      *reason = "shape data differs from every variant's";
      return false;
    }
    try {
      std::vector<Tensor> outs = RunStagedKernel(v.kernel, inputs, num_threads);
      variants->last.store(idx, std::memory_order_relaxed);
      if (used != nullptr) *used = idx;
      finish(v, std::move(outs));
      return true;
    } catch (const Error& ex) {
      *reason = ex.what();  // another broadcast class: try the next variant
      return false;
    }
  };
  auto list = variants->Snapshot();
  const size_t n = list->size(), start = n == 0 ? 0 : variants->last.load(std::memory_order_relaxed) % n;
  for (size_t k = 0; k < n; ++k)
    if (attempt(*list, (start + k) % n)) return true;
  if (!generate) return false;
  // No variant fits: generate one for this call's classes, compile it (the cache makes a class
  // seen before free), check it runs the call, add it. Calls that cannot be generated are
  // remembered by their key; after kMaxFailures of them, or kMaxVariants variants, no more are
  // generated for the site.
  Variants& vs = *variants;
  const std::string key = CallKey(given, vs.shape_data);
  auto refuse = [&](const std::string& why) {  // mu held
    vs.failed[key] = *reason = why;
    if (vs.failed.size() >= kMaxFailures && vs.exhausted.empty())
      vs.exhausted = fmt::format("{} (no variant for {} calls of other classes; no more are tried)", why, vs.failed.size());
    return false;
  };
  // One generation at a time per call site (the list stays readable meanwhile); a variant another
  // thread added while this one waited is tried first.
  std::lock_guard<std::mutex> gen(vs.generating);
  auto now = vs.Snapshot();
  for (size_t idx = n; idx < now->size(); ++idx)
    if (attempt(*now, idx)) return true;
  {
    std::lock_guard<std::mutex> lock(vs.mu);
    auto failed = vs.failed.find(key);
    if (failed != vs.failed.end()) {
      *reason = failed->second;
      return false;
    }
    if (!vs.exhausted.empty()) {
      *reason = vs.exhausted;
      return false;
    }
    if (vs.list->size() >= kMaxVariants) {
      vs.exhausted = fmt::format("the call site has {} kernel variants already; this call ({}) fits none of them",
                                 kMaxVariants, reason->substr(0, 200));
      *reason = vs.exhausted;
      return false;
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<DataType> types;
  std::vector<Shape> shapes;
  for (const Tensor* t : given) {
    types.push_back(t->dtype());
    shapes.push_back(t->shape());
  }
  auto v = std::make_shared<KernelVariant>();
  v->jit = true;
  RowKernelRequest req = vs.Request(types, shapes, given, v.get());
  v->kernel = GenerateStagedKernel(req, kTemporarySymbol, vs.opset);
  std::string why;
  if (v->kernel.ok) {
    std::map<std::string, std::string> symbols;
    std::vector<KernelSource> sources;
    NameStages(v->kernel, symbols, sources);
    try {
      KernelCompiler compiler(vs.cache_root);
      v->library = compiler.Compile(sources);
      if (!v->kernel.Bind(*v->library)) why = v->kernel.reason;
    } catch (const Error& ex) {
      why = ex.what();
    }
  } else {
    why = "no kernel can be generated for this call: " + v->kernel.reason;
  }
  std::vector<Tensor> outs;
  if (why.empty()) {
    try {
      outs = RunStagedKernel(v->kernel, inputs, num_threads);  // a variant is added only once it ran
    } catch (const Error& ex) {
      why = std::string("the kernel generated for this call does not run it: ") + ex.what();
    }
  }
  std::lock_guard<std::mutex> lock(vs.mu);
  vs.jit_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!why.empty()) return refuse(why);
  ++vs.jit;
  vs.Add(v);
  vs.last.store(vs.list->size() - 1, std::memory_order_relaxed);
  if (used != nullptr) *used = vs.list->size() - 1;
  finish(*v, std::move(outs));
  return true;
}

const FusedKernelSet::Entry* FusedKernelSet::EntryForNode(const std::string& node) const {
  auto it = by_node_.find(node);
  return it == by_node_.end() ? nullptr : &entries_[it->second];
}

std::function<std::optional<KernelInfo>(const Node&, const Function&)> FusedKernelSet::Provider() {
  return [this](const Node& call, const Function& f) -> std::optional<KernelInfo> {
    std::function<void(const std::string&)> hook = hook_;
    const Entry* e = EntryForNode(call.name);
    if (e == nullptr || e->function != f.name) return std::nullopt;
    // Without a kernel the call runs inlined, through the reference kernels; a call site whose
    // shapes were not recorded generates its variants when called.
    if (!e->bound && !e->generate_when_called) return std::nullopt;
    KernelInfo info;
    info.domain = call.domain;
    info.op_type = call.op_type;
    info.kind = OpKind::kOpaque;
    // Conversions are done here, per value: half inputs widened, each output narrowed to its own
    // declared type (a group may mix float32 and half values).
    info.upcast_half = false;
    info.declined = [e](const std::string& why) {
      std::lock_guard<std::mutex> lock(e->last_fallback->mu);
      e->last_fallback->declined = why;
    };
    info.fn = [e, hook](KernelContext& ctx) {
      e->calls->fetch_add(1, std::memory_order_relaxed);
      if (hook) hook(e->function);
      std::vector<Tensor> outs;
      std::string reason;
      if (e->Run(ctx.inputs, ctx.num_threads, /*generate=*/true, &outs, &reason)) {
        for (size_t o = 0; o < ctx.outputs.size() && o < outs.size(); ++o) ctx.outputs[o] = std::move(outs[o]);
        return;
      }
      {
        std::lock_guard<std::mutex> lock(e->last_fallback->mu);
        e->last_fallback->reason = reason;
      }
      e->fallbacks->fetch_add(1, std::memory_order_relaxed);
      std::vector<Tensor> ins;
      for (const Tensor* t : ctx.inputs) ins.push_back(t ? *t : Tensor());
      std::vector<Tensor> body_outs = ctx.subgraphs->RunSubgraph(e->body, ins);
      for (size_t o = 0; o < ctx.outputs.size() && o < body_outs.size(); ++o) ctx.outputs[o] = std::move(body_outs[o]);
    };
    return info;
  };
}

}  // namespace gaf
