// Workloads: sample inputs for a model, and consistent bindings of its symbolic dims.
//
// How symbolic input dims are bound (BindDims, CompleteFeeds, DefaultWorkload, RecordShapes):
//
//  1. Fixed bindings: every dim of a given input binds the dim param declared at that axis
//     (two given inputs that disagree are an error naming both); then --dim NAME=N. A declared
//     param that is a sum ("past_sequence_length + 1", "past_sequence_length + sequence_length")
//     is evaluated from its terms; a given input at such an axis binds the one unbound term.
//     Fixed bindings are never changed below.
//  2. Defaults for the rest: 8 for a name that says sequence ("seq"), else 1.
//  3. Relations from the graph, found by running it (one Session, reused): every value the run
//     produced whose shape the model declares (graph outputs and value_info) must have, at an axis
//     declared with param P, the size bound to P. Where it does not (a present output
//     [batch, heads, total_sequence_length, hd] produced as Concat(past, new) is past + seq long,
//     while the attention_mask input [batch, total_sequence_length] was bound independently),
//     the free P takes the observed size (or, for a sum param, its one free term is solved for),
//     and the model runs again, up to a fixed point. Values produced before a failing node are
//     observed too, so a run that fails at the attention's mask Add still yields the presents.
//  4. If that does not give a run that succeeds: the same from all free dims = 1; then candidate
//     relations between pairs of free dims, tried one at a time from the defaults: P = A + B
//     (P, A, B distinct input dim params), then P = A; the first binding that runs wins.
//  5. Still failing: gaf::Error naming the node, its message, the bindings tried and the dims
//     that appear in the failing node's input shapes, and how to bind them (--dim / -i).
//
// Values of inputs not given (FillInput):
//  - floats: uniform in [-1, 1]; an input whose name says "mask": 1 (everything visible).
//  - integers that index a Gather table (through Cast/Reshape/Unsqueeze/...): uniform in
//    [0, table size) (token ids below the vocabulary), or, when the name says "position",
//    past + 0 .. past + n-1 along the last axis (past: the binding of a dim param named "past...",
//    else the mask's length minus the positions' length), kept below the table size;
//  - integer scalars the model compares with constants (Equal, Less, Greater, ... also inside
//    If/Loop bodies; silero VAD's `sr` against 16000 and 8000): the first constant an Equal
//    compares it with, else the largest constant of the ordering comparisons;
//  - masks 1 / bool true; other integers 0.
#include "cost/workload.h"

#include <algorithm>
#include <cctype>
#include <functional>
#include <memory>
#include <random>
#include <set>

#include "cost/cost_model.h"
#include "ir/error.h"
#include "runtime/session.h"

namespace gaf {
namespace {

constexpr int64_t kDefaultSequenceLength = 8;
constexpr int kMaxFixedPointRuns = 6;
constexpr int kMaxCandidateRuns = 24;

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool Has(const std::string& name, const char* word) { return Lower(name).find(word) != std::string::npos; }

std::string Trim(std::string s) {
  s.erase(0, s.find_first_not_of(' '));
  s.erase(s.find_last_not_of(' ') + 1);
  return s;
}

// A dim param as a sum of terms: names and integer constants ("past_sequence_length + 1").
struct SumTerms {
  std::vector<std::string> names;
  int64_t constant = 0;
};

SumTerms ParseSum(const std::string& param) {
  SumTerms s;
  size_t start = 0;
  while (true) {
    const size_t plus = param.find('+', start);
    const std::string term = Trim(param.substr(start, plus == std::string::npos ? std::string::npos : plus - start));
    if (!term.empty() && term.size() < 18 && std::all_of(term.begin(), term.end(), ::isdigit))
      s.constant += std::stoll(term);
    else if (!term.empty())
      s.names.push_back(term);
    if (plus == std::string::npos) break;
    start = plus + 1;
  }
  return s;
}

bool IsSum(const std::string& param) { return param.find('+') != std::string::npos; }

std::vector<const ValueInfo*> ModelInputs(const Model& model) {
  std::vector<const ValueInfo*> out;
  for (const ValueInfo& v : model.graph.inputs)
    if (model.graph.FindInitializer(v.name) == nullptr) out.push_back(&v);
  return out;
}

// Every simple dim param of the model's inputs (sum params contribute their terms), in order.
std::vector<std::string> InputDimParams(const Model& model) {
  std::vector<std::string> out;
  auto add = [&](const std::string& p) {
    if (std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
  };
  for (const ValueInfo* v : ModelInputs(model)) {
    if (!v->has_shape) continue;
    for (const Dim& d : v->dims) {
      if (d.known() || d.param.empty()) continue;
      if (IsSum(d.param)) {
        for (const std::string& t : ParseSum(d.param).names) add(t);
      } else {
        add(d.param);
      }
    }
  }
  return out;
}

int64_t DefaultFor(const std::string& param) { return Has(param, "seq") ? kDefaultSequenceLength : 1; }

// The binding being searched for: values and which of them are fixed (given inputs, --dim).
struct Binding {
  std::map<std::string, int64_t> values;
  std::set<std::string> fixed;

  int64_t Get(const std::string& p) {
    auto it = values.find(p);
    if (it != values.end()) return it->second;
    return values[p] = DefaultFor(p);
  }
  int64_t Eval(const Dim& d) {
    if (d.known()) return d.value;
    if (d.param.empty()) return 1;
    auto it = values.find(d.param);  // a sum param bound as a whole (--dim "a + b"=N)
    if (it != values.end()) return it->second;
    if (!IsSum(d.param)) return Get(d.param);
    const SumTerms s = ParseSum(d.param);
    int64_t sum = s.constant;
    for (const std::string& t : s.names) sum += Get(t);
    return sum;
  }
  // Makes the dim `d` equal `size` by changing one free param; returns whether anything changed.
  // `may_fix`: record the param as fixed (given inputs).
  bool Require(const Dim& d, int64_t size, bool may_fix) {
    if (d.known() || d.param.empty() || Eval(d) == size) return false;
    std::string var;
    int64_t rest = 0;
    if (!IsSum(d.param) || values.count(d.param)) {
      var = d.param;
    } else {
      const SumTerms s = ParseSum(d.param);
      rest = s.constant;
      std::vector<std::string> free_terms;
      for (const std::string& t : s.names) {
        if (fixed.count(t)) rest += Get(t);
        else free_terms.push_back(t);
      }
      if (free_terms.empty()) return false;
      for (size_t i = 1; i < free_terms.size(); ++i) rest += Get(free_terms[i]);
      var = free_terms[0];
    }
    if (fixed.count(var) || size - rest < 0) return false;
    values[var] = size - rest;
    if (may_fix) fixed.insert(var);
    return true;
  }
};

// ---- what the graph says about integer inputs ----

struct IntHints {
  std::map<std::string, int64_t> table_size;  // input -> smallest Gather table it indexes
  std::map<std::string, std::vector<double>> equal_constants, order_constants;
};

const Tensor* ConstantValue(const Graph& g, const std::map<std::string, const Tensor*>& consts,
                            const std::string& name) {
  if (const Tensor* t = g.FindInitializer(name)) return t;
  auto it = consts.find(name);
  return it == consts.end() ? nullptr : it->second;
}

void CollectHints(const Graph& g, std::map<std::string, std::string>& alias,  // value -> graph input it copies
                  std::map<std::string, const Tensor*>& consts, IntHints& hints, int depth) {
  if (depth > 8) return;
  static const std::set<std::string> kPassThrough = {"Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten",
                                                     "Identity", "Expand", "CastLike"};
  for (const Node& n : g.nodes) {
    if (n.op_type == "Constant" && n.HasOutput(0)) {
      if (const Attribute* a = n.FindAttr("value"); a != nullptr && a->t.defined()) consts[n.outputs[0]] = &a->t;
    }
    auto source = [&](size_t i) -> std::string {
      if (!n.HasInput(i)) return "";
      auto it = alias.find(n.inputs[i]);
      return it == alias.end() ? "" : it->second;
    };
    if (kPassThrough.count(n.op_type) && n.HasOutput(0)) {
      const std::string s = source(0);
      if (!s.empty()) alias[n.outputs[0]] = s;
    }
    if (n.op_type == "Gather" && n.inputs.size() >= 2) {
      const std::string s = source(1);
      const Tensor* table = ConstantValue(g, consts, n.inputs[0]);
      if (!s.empty() && table != nullptr && table->rank() > 0) {
        int64_t axis = n.GetInt("axis", 0);
        if (axis < 0) axis += table->rank();
        if (axis >= 0 && axis < table->rank()) {
          const int64_t size = table->dim(axis);
          auto it = hints.table_size.find(s);
          if (it == hints.table_size.end() || size < it->second) hints.table_size[s] = size;
        }
      }
    }
    const bool eq = n.op_type == "Equal";
    const bool ord = n.op_type == "Less" || n.op_type == "Greater" || n.op_type == "LessOrEqual" ||
                     n.op_type == "GreaterOrEqual";
    if ((eq || ord) && n.inputs.size() == 2) {
      for (size_t i = 0; i < 2; ++i) {
        const std::string s = source(i);
        const Tensor* c = ConstantValue(g, consts, n.inputs[1 - i]);
        if (s.empty() || c == nullptr || c->numel() != 1 || c->dtype() == DataType::kString) continue;
        (eq ? hints.equal_constants : hints.order_constants)[s].push_back(c->DoubleAt(0));
      }
    }
    for (const Attribute& a : n.attributes) {
      if (a.g) CollectHints(*a.g, alias, consts, hints, depth + 1);
      for (const auto& sg : a.graphs) CollectHints(*sg, alias, consts, hints, depth + 1);
    }
  }
}

IntHints HintsOf(const Model& model) {
  IntHints h;
  std::map<std::string, std::string> alias;
  for (const ValueInfo* v : ModelInputs(model)) alias[v->name] = v->name;
  std::map<std::string, const Tensor*> consts;
  CollectHints(model.graph, alias, consts, h, 0);
  return h;
}

Tensor FilledInt64(const Shape& shape, const std::function<int64_t(int64_t)>& value) {
  Tensor t(DataType::kInt64, shape);
  int64_t* p = t.data<int64_t>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = value(i);
  return t;
}

Tensor AsType(const Tensor& t, DataType dt) { return t.dtype() == dt ? t : t.CastTo(dt); }

Tensor FillInput(const ValueInfo& v, const Shape& shape, int64_t past, const IntHints& hints, std::mt19937& rng) {
  const DataType dt = v.dtype == DataType::kUndefined ? DataType::kFloat : v.dtype;
  const bool mask = Has(v.name, "mask");
  if (IsFloatingPoint(dt)) {
    Tensor f(DataType::kFloat, shape);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    float* p = f.data<float>();
    for (int64_t i = 0; i < f.numel(); ++i) p[i] = mask ? 1.f : u(rng);
    return AsType(f, dt);
  }
  if (dt == DataType::kString) return Tensor(dt, shape);
  if (dt == DataType::kBool) {
    Tensor b(DataType::kBool, shape);
    for (int64_t i = 0; i < b.numel(); ++i) b.data<bool>()[i] = true;
    return b;
  }
  auto table = hints.table_size.find(v.name);
  const int64_t limit = table == hints.table_size.end() ? -1 : table->second;
  if (mask) return AsType(FilledInt64(shape, [](int64_t) { return int64_t{1}; }), dt);
  if (Has(v.name, "position")) {
    const int64_t last = shape.empty() ? 1 : std::max<int64_t>(1, shape.back());
    return AsType(FilledInt64(shape,
                              [&](int64_t i) {
                                const int64_t p = past + i % last;
                                return limit > 0 ? std::min(p, limit - 1) : p;
                              }),
                  dt);
  }
  if (limit > 0) {
    std::uniform_int_distribution<int64_t> u(0, limit - 1);
    return AsType(FilledInt64(shape, [&](int64_t) { return u(rng); }), dt);
  }
  int64_t value = 0;
  if (auto it = hints.equal_constants.find(v.name); it != hints.equal_constants.end() && !it->second.empty()) {
    value = static_cast<int64_t>(it->second.front());
  } else if (auto jt = hints.order_constants.find(v.name); jt != hints.order_constants.end() && !jt->second.empty()) {
    value = static_cast<int64_t>(*std::max_element(jt->second.begin(), jt->second.end()));
  }
  return AsType(FilledInt64(shape, [&](int64_t) { return value; }), dt);
}

// ---- the search ----

struct Solver {
  const Model& model;
  const Feeds& given;  // must outlive the solver (callers pass a named object, never a temporary)
  uint32_t seed;
  std::vector<const ValueInfo*> inputs;
  std::vector<const ValueInfo*> declared;  // values with a declared shape holding a param
  IntHints hints;
  std::unique_ptr<Session> session;
  ShapeMap* observing = nullptr;

  Solver(const Model& m, const Feeds& g, uint32_t s) : model(m), given(g), seed(s), inputs(ModelInputs(m)) {
    auto add = [&](const ValueInfo& v) {
      if (!v.has_shape) return;
      for (const Dim& d : v.dims)
        if (!d.known() && !d.param.empty()) {
          declared.push_back(&v);
          return;
        }
    };
    for (const ValueInfo& v : m.graph.outputs) add(v);
    for (const ValueInfo& v : m.graph.value_info) add(v);
    hints = HintsOf(m);
  }

  Binding Fixed(const std::map<std::string, int64_t>& dims) {
    Binding b;
    // Given inputs first: simple params, then sums (their other terms bound by then).
    for (int pass = 0; pass < 2; ++pass) {
      for (const ValueInfo* v : inputs) {
        auto it = given.find(v->name);
        if (it == given.end() || !v->has_shape || it->second.rank() != static_cast<int64_t>(v->dims.size())) continue;
        for (size_t i = 0; i < v->dims.size(); ++i) {
          const Dim& d = v->dims[i];
          if (d.known() || d.param.empty() || IsSum(d.param) != (pass == 1)) continue;
          const int64_t size = it->second.shape()[i];
          if (pass == 0) {
            auto bt = b.values.find(d.param);
            if (bt != b.values.end() && bt->second != size) {
              std::string other;
              for (const ValueInfo* w : inputs) {
                auto gt = given.find(w->name);
                if (gt == given.end() || !w->has_shape || gt->second.rank() != static_cast<int64_t>(w->dims.size())) continue;
                for (size_t k = 0; k < w->dims.size() && other.empty(); ++k)
                  if (w->dims[k].param == d.param && gt->second.shape()[k] == bt->second) other = w->name;
                if (!other.empty()) break;
              }
              throw Error(fmt::format("inputs '{}' {} and '{}' {} disagree about the symbolic dim '{}' ({} vs {})",
                                      other, ShapeToString(given.at(other).shape()), v->name,
                                      ShapeToString(it->second.shape()), d.param, bt->second, size));
            }
            b.values[d.param] = size;
            b.fixed.insert(d.param);
          } else {
            b.Require(d, size, /*may_fix=*/true);
          }
        }
      }
    }
    for (const auto& [name, value] : dims) {
      if (b.fixed.count(name)) continue;  // the given inputs' shapes win over --dim
      b.values[name] = value;
      b.fixed.insert(name);
    }
    return b;
  }

  int64_t PastLength(Binding& b) {
    for (const ValueInfo* v : inputs) {
      if (!v->has_shape) continue;
      for (const Dim& d : v->dims)
        if (!d.known() && !d.param.empty() && !IsSum(d.param) && Has(d.param, "past")) return b.Get(d.param);
    }
    // Else: the mask's length minus the positions' length.
    int64_t mask_len = -1, pos_len = -1;
    for (const ValueInfo* v : inputs) {
      if (!v->has_shape || v->dims.empty()) continue;
      if (Has(v->name, "mask")) mask_len = b.Eval(v->dims.back());
      if (Has(v->name, "position")) pos_len = b.Eval(v->dims.back());
    }
    return mask_len > pos_len && pos_len > 0 ? mask_len - pos_len : 0;
  }

  Feeds MakeFeeds(Binding& b) {
    std::mt19937 rng(seed);
    const int64_t past = PastLength(b);
    Feeds feeds;
    for (const ValueInfo* v : inputs) {
      auto it = given.find(v->name);
      if (it != given.end()) {
        feeds.emplace(v->name, it->second);
        continue;
      }
      GAF_CHECK(v->non_tensor_type.empty(), "input '{}' is a {}, not a tensor: give it with -i", v->name,
                v->non_tensor_type);
      Shape shape;
      if (v->has_shape) {
        for (const Dim& d : v->dims) shape.push_back(b.Eval(d));
      } else {
        shape = {1};
      }
      feeds.emplace(v->name, FillInput(*v, shape, past, hints, rng));
    }
    return feeds;
  }

  // One run; `observed` gets the shapes of everything produced, also when it fails.
  bool Run(const Feeds& feeds, ShapeMap& observed, std::string* error) {
    if (!session) {
      SessionOptions opts;
      opts.observer = [this](const std::string& name, const Tensor& t) {
        if (observing) (*observing)[name] = ValueShape{t.dtype(), t.shape(), true};
      };
      session = std::make_unique<Session>(model, opts);
    }
    observed.clear();
    for (const auto& [name, t] : feeds) observed[name] = ValueShape{t.dtype(), t.shape(), true};
    observing = &observed;
    try {
      session->Run(feeds);
      observing = nullptr;
      return true;
    } catch (const UnsupportedError&) {
      observing = nullptr;
      throw;
    } catch (const Error& e) {
      observing = nullptr;
      if (error) *error = e.what();
      return false;
    }
  }

  // Step 3: runs, then moves free params to what the produced values' declared shapes say,
  // until a run succeeds with nothing to change or the budget is spent.
  bool FixedPoint(Binding& b, Feeds& feeds, ShapeMap& observed, std::string* error) {
    for (int run = 0; run < kMaxFixedPointRuns; ++run) {
      feeds = MakeFeeds(b);
      const bool ok = Run(feeds, observed, error);
      bool changed = false;
      for (const ValueInfo* v : declared) {
        auto it = observed.find(v->name);
        if (it == observed.end() || it->second.shape.size() != v->dims.size()) continue;
        for (size_t i = 0; i < v->dims.size(); ++i) changed |= b.Require(v->dims[i], it->second.shape[i], false);
      }
      if (!changed) return ok;
    }
    return false;
  }

  struct Result {
    Binding binding;
    Feeds feeds;
    ShapeMap observed;
  };

  Result Solve(const std::map<std::string, int64_t>& dims) {
    const Binding fixed = Fixed(dims);
    Result r;
    std::string first_error, error;
    std::vector<std::string> tried;
    auto describe = [&](Binding& b) {
      std::string s;
      for (const std::string& p : InputDimParams(model)) s += fmt::format("{}{}={}", s.empty() ? "" : ", ", p, b.Get(p));
      return s.empty() ? std::string("(no symbolic dims)") : s;
    };
    r.binding = fixed;
    if (FixedPoint(r.binding, r.feeds, r.observed, &first_error)) return r;
    tried.push_back(describe(r.binding));
    Binding failed_binding = r.binding;
    ShapeMap failed_observed = r.observed;

    // Step 4a: all free dims 1.
    const std::vector<std::string> params = InputDimParams(model);
    r.binding = fixed;
    for (const std::string& p : params)
      if (!r.binding.fixed.count(p)) r.binding.values[p] = 1;
    if (FixedPoint(r.binding, r.feeds, r.observed, &error)) return r;
    if (describe(r.binding) != tried[0]) tried.push_back(describe(r.binding));

    // Step 4b: candidate relations P = A + B, then P = A, from the defaults.
    std::vector<std::function<void(Binding&)>> candidates;
    for (const std::string& p : params) {
      if (fixed.fixed.count(p)) continue;
      for (size_t a = 0; a < params.size(); ++a)
        for (size_t c = a + 1; c < params.size(); ++c)
          if (params[a] != p && params[c] != p)
            candidates.push_back([&, p, a, c](Binding& b) { b.values[p] = b.Get(params[a]) + b.Get(params[c]); });
    }
    for (const std::string& p : params) {
      if (fixed.fixed.count(p)) continue;
      for (const std::string& q : params)
        if (q != p) candidates.push_back([p, q](Binding& b) { b.values[p] = b.Get(q); });
    }
    int runs = 0;
    for (const auto& apply : candidates) {
      if (++runs > kMaxCandidateRuns) break;
      r.binding = fixed;
      apply(r.binding);
      r.feeds = MakeFeeds(r.binding);
      if (Run(r.feeds, r.observed, &error)) return r;
    }

    // Step 5: name the node and the dims in its input shapes.
    std::set<std::string> involved;
    for (const Node& n : model.graph.nodes) {
      if (first_error.rfind(n.Describe(), 0) != 0) continue;
      std::set<int64_t> sizes;
      for (const std::string& in : n.inputs) {
        auto it = failed_observed.find(in);
        if (it != failed_observed.end())
          for (int64_t s : it->second.shape) sizes.insert(s);
      }
      for (const std::string& p : params)
        if (sizes.count(failed_binding.Get(p)) && failed_binding.Get(p) != 1) involved.insert(p);
      break;
    }
    std::string inv;
    for (const std::string& p : involved) inv += (inv.empty() ? "" : ", ") + p;
    throw Error(fmt::format(
        "the model does not run on inputs made for it: {} (symbolic dims bound as {}{}{}{}); bind the "
        "dims with --dim NAME=N, or give sample inputs with -i NAME=FILE.npy|FILE.pb or -i test_data_set_DIR",
        first_error, tried[0], inv.empty() ? "" : "; the failing node's input shapes hold " + inv,
        tried.size() > 1 ? "; also tried " + tried[1] : "",
        candidates.empty() ? "" : fmt::format("; and {} relations between dims", std::min<size_t>(candidates.size(), kMaxCandidateRuns))));
  }
};

void CheckGiven(const Model& model, const Feeds& given) {
  const std::vector<const ValueInfo*> inputs = ModelInputs(model);
  for (const auto& [name, t] : given) {
    const ValueInfo* v = nullptr;
    for (const ValueInfo* w : inputs)
      if (w->name == name) v = w;
    if (v == nullptr) {
      std::string names;
      for (const ValueInfo* w : inputs) names += (names.empty() ? "" : ", ") + w->name;
      throw Error(fmt::format("the model has no input '{}' (its inputs: {})", name, names));
    }
    GAF_CHECK(t.defined(), "input '{}' was given an empty tensor", name);
    GAF_CHECK(v->dtype == DataType::kUndefined || t.dtype() == v->dtype, "input '{}' expects {} but was given {}",
              name, DataTypeName(v->dtype), DataTypeName(t.dtype()));
    if (!v->has_shape) continue;
    bool ok = t.rank() == static_cast<int64_t>(v->dims.size());
    for (size_t i = 0; ok && i < v->dims.size(); ++i) ok = !v->dims[i].known() || v->dims[i].value == t.shape()[i];
    GAF_CHECK(ok, "input '{}' expects shape {} but was given {}", name, DimsToString(v->dims),
              ShapeToString(t.shape()));
  }
}

}  // namespace

std::map<std::string, int64_t> BindDims(const Model& model, const Feeds& given,
                                        const std::map<std::string, int64_t>& dims, uint32_t seed) {
  CheckGiven(model, given);
  Solver s(model, given, seed);
  Solver::Result r = s.Solve(dims);
  std::map<std::string, int64_t> out;
  for (const std::string& p : InputDimParams(model)) out[p] = r.binding.Get(p);
  return out;
}

Feeds CompleteFeeds(const Model& model, const Feeds& given, const std::map<std::string, int64_t>& dims,
                    uint32_t seed) {
  CheckGiven(model, given);
  Solver s(model, given, seed);
  // When the given inputs and --dim bind every dim, nothing needs searching (and no run).
  Binding b = s.Fixed(dims);
  bool all_fixed = true;
  for (const std::string& p : InputDimParams(model)) all_fixed &= b.fixed.count(p) > 0;
  if (all_fixed) return s.MakeFeeds(b);
  return s.Solve(dims).feeds;
}

Workload DefaultWorkload(const Model& model, const std::map<std::string, int64_t>& dims, uint32_t seed) {
  Workload w;
  w.samples.push_back(CompleteFeeds(model, {}, dims, seed));
  w.source = "random inputs (symbolic dims bound consistently with the graph)";
  return w;
}

int64_t GatherTableSize(const Model& model, const std::string& input) {
  const IntHints h = HintsOf(model);
  auto it = h.table_size.find(input);
  return it == h.table_size.end() ? -1 : it->second;
}

// Declared in cost/cost_model.h.
std::map<std::string, Tensor> RandomFeeds(const Model& model, const std::map<std::string, int64_t>& dims,
                                          uint32_t seed) {
  return CompleteFeeds(model, {}, dims, seed);
}

ShapeMap RecordShapes(const Model& model, const std::map<std::string, int64_t>& dims) {
  const Feeds none;  // the solver keeps a reference: not a temporary
  Solver s(model, none, 0);
  ShapeMap out = s.Solve(dims).observed;
  for (const auto& [name, t] : model.graph.initializers) out[name] = ValueShape{t.dtype(), t.shape(), true};
  return out;
}

ShapeMap RecordShapes(const Model& model, const Feeds& feeds) {
  CheckGiven(model, feeds);
  Solver s(model, feeds, 0);
  // Inputs not given are filled with the binding the given ones imply (no search: one run).
  Binding b = s.Fixed({});
  Feeds all = s.MakeFeeds(b);
  ShapeMap out;
  std::string error;
  if (!s.Run(all, out, &error)) throw Error(fmt::format("the model does not run on the given inputs: {}", error));
  for (const auto& [name, t] : model.graph.initializers) out[name] = ValueShape{t.dtype(), t.shape(), true};
  return out;
}

}  // namespace gaf
