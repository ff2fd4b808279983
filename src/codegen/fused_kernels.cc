#include "codegen/fused_kernels.h"

#include <fmt/format.h>

#include <functional>

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

}  // namespace

std::shared_ptr<FusedKernelSet> FusedKernelSet::Build(const Model& model, const std::map<std::string, ValueType>& shapes,
                                                      KernelCompiler& compiler, const std::string& domain,
                                                      HalfWeights half_weights) {
  // One kernel per call site: calls of one function differ in their constants (weights folded
  // into a kernel, scalars baked into its code) and shapes (NameStages).
  auto set = std::make_shared<FusedKernelSet>();
  std::vector<KernelSource> sources;
  std::map<std::string, std::string> symbol_of_source;
  std::map<std::string, Graph> bodies;
  const std::map<std::string, int> name_counts = NodeNameCounts(model);
  for (const Node& call : model.graph.nodes) {
    if (call.domain != domain) continue;
    const Function* f = model.FindFunction(call.domain, call.op_type);
    if (f == nullptr) continue;
    Entry e;
    e.function = f->name;
    e.node = call.name;
    if (!bodies.count(f->name)) bodies[f->name] = FunctionBodyGraph(*f);
    e.body = bodies[f->name];
    e.calls = std::make_shared<std::atomic<int64_t>>(0);
    e.fallbacks = std::make_shared<std::atomic<int64_t>>(0);
    RowKernelRequest req;
    req.function = f;
    req.approx_math = f->doc_string.find("kernel-math=approx") != std::string::npos;
    req.half_weights = half_weights;
    req.opset = model.OpsetVersion("");
    bool shapes_known = true;
    for (const std::string& in : call.inputs) {
      const Tensor* c = model.graph.FindInitializer(in);
      if (c != nullptr) {
        set->constants_.push_back(*c);
        req.constants.push_back(&set->constants_.back());
        req.input_types.push_back(c->dtype());
        req.input_shapes.push_back(c->shape());
        continue;
      }
      auto it = shapes.find(in);
      if (it == shapes.end()) {
        shapes_known = false;
        break;
      }
      req.constants.push_back(nullptr);
      req.input_types.push_back(it->second.dtype);
      req.input_shapes.push_back(it->second.shape);
    }
    const bool unique_name = !call.name.empty() && name_counts.at(call.name) == 1;
    if (!unique_name) {
      e.status = "not generated: the call node has no unique name (it runs its body)";
    } else if (!shapes_known) {
      e.status = "input shapes unknown (no recorded run)";
    } else {
      e.kernel = GenerateStagedKernel(req, kTemporarySymbol, model.OpsetVersion(""));
      if (e.kernel.ok) NameStages(e.kernel, symbol_of_source, sources);
      else e.status = "not generated: " + e.kernel.reason;
    }
    if (unique_name) set->by_node_[call.name] = set->entries_.size();
    set->entries_.push_back(std::move(e));
  }
  set->library_ = compiler.Compile(sources);
  for (Entry& e : set->entries_) {
    if (!e.kernel.ok) continue;
    e.bound = e.kernel.Bind(*set->library_);
    e.status = !e.bound ? e.kernel.reason : (set->library_->from_cache() ? "cached" : "compiled");
  }
  return set;
}

const FusedKernelSet::Entry* FusedKernelSet::EntryForNode(const std::string& node) const {
  auto it = by_node_.find(node);
  return it == by_node_.end() ? nullptr : &entries_[it->second];
}

std::function<std::optional<KernelInfo>(const Node&, const Function&)> FusedKernelSet::Provider() {
  return [this](const Node& call, const Function& f) -> std::optional<KernelInfo> {
    const Entry* e = EntryForNode(call.name);
    if (e == nullptr || e->function != f.name) return std::nullopt;
    if (!e->bound) return std::nullopt;  // runs inlined, through the reference kernels
    KernelInfo info;
    info.domain = call.domain;
    info.op_type = call.op_type;
    info.kind = OpKind::kOpaque;
    // Conversions are done here, per value: half inputs widened, each output narrowed to its own
    // declared type (a group may mix float32 and half values).
    info.upcast_half = false;
    info.fn = [e](KernelContext& ctx) {
      e->calls->fetch_add(1, std::memory_order_relaxed);
      bool usable = true;
      for (const Tensor* t : ctx.inputs) usable &= t != nullptr;
      if (usable) {
        try {
          bool any_half = false;
          for (const Tensor* t : ctx.inputs)
            any_half |= t->dtype() == DataType::kFloat16 || t->dtype() == DataType::kBFloat16;
          std::vector<Tensor> widened;
          std::vector<const Tensor*> half_ins;
          if (any_half) {
            half_ins = ctx.inputs;
            widened.reserve(half_ins.size());
            for (const Tensor*& t : half_ins)
              if (t->dtype() == DataType::kFloat16 || t->dtype() == DataType::kBFloat16) {
                widened.push_back(t->CastTo(DataType::kFloat));
                t = &widened.back();
              }
          }
          std::vector<Tensor> outs = RunStagedKernel(e->kernel, any_half ? half_ins : ctx.inputs, ctx.num_threads);
          for (size_t o = 0; o < ctx.outputs.size() && o < outs.size(); ++o) {
            const DataType want = o < e->kernel.output_types.size() ? e->kernel.output_types[o] : DataType::kFloat;
            ctx.outputs[o] = want != DataType::kFloat && outs[o].dtype() == DataType::kFloat ? outs[o].CastTo(want)
                                                                                             : std::move(outs[o]);
          }
          return;
        } catch (const Error& ex) {
          // Inputs broadcast differently than at generation: run the body below (and say why).
          std::lock_guard<std::mutex> lock(e->last_fallback->mu);
          e->last_fallback->reason = ex.what();
        }
      }
      e->fallbacks->fetch_add(1, std::memory_order_relaxed);
      std::vector<Tensor> ins;
      for (const Tensor* t : ctx.inputs) ins.push_back(t ? *t : Tensor());
      std::vector<Tensor> outs = ctx.subgraphs->RunSubgraph(e->body, ins);
      for (size_t o = 0; o < ctx.outputs.size() && o < outs.size(); ++o) ctx.outputs[o] = std::move(outs[o]);
    };
    return info;
  };
}

}  // namespace gaf
