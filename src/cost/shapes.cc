// RecordShapes: concrete dtype and shape of every value, by running the model once.
//
// Symbolic dimensions are bound from `dims`; an unbound one is kDefaultSequenceLength when its
// name says it is a sequence length ("seq", "sequence", case-insensitive), else 1. If the run
// fails with those bindings (e.g. a model that requires total_sequence_length =
// past_sequence_length + sequence_length), it is retried with every unbound dim = 1; if that
// fails too, the values produced before the failure are kept and the rest come from the model's
// declared value infos (where fully known).
#include <algorithm>
#include <cctype>
#include <random>

#include "cost/cost_model.h"
#include "ir/error.h"
#include "runtime/session.h"

namespace gaf {
namespace {

constexpr int64_t kDefaultSequenceLength = 8;

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool LooksLikeSequence(const std::string& name) {
  const std::string l = Lower(name);
  return l.find("seq") != std::string::npos;  // "seq", "seq_len", "sequence", "sequence_length"
}

// Binds one dimension; returns -1 if it cannot.
int64_t BindDim(const Dim& d, const std::map<std::string, int64_t>& dims, bool sequence_defaults) {
  if (d.known()) return d.value;
  if (!d.param.empty()) {
    auto it = dims.find(d.param);
    if (it != dims.end()) return it->second;
    // Exporters write sums of dims ("past_sequence_length + sequence_length"): bind each term.
    if (d.param.find('+') != std::string::npos) {
      int64_t sum = 0;
      size_t start = 0;
      while (start <= d.param.size()) {
        size_t plus = d.param.find('+', start);
        std::string term = d.param.substr(start, plus == std::string::npos ? std::string::npos : plus - start);
        term.erase(0, term.find_first_not_of(' '));
        term.erase(term.find_last_not_of(' ') + 1);
        Dim t;
        if (!term.empty() && std::all_of(term.begin(), term.end(), ::isdigit)) t.value = std::stoll(term);
        else t.param = term;
        sum += BindDim(t, dims, sequence_defaults);
        if (plus == std::string::npos) break;
        start = plus + 1;
      }
      return sum;
    }
    if (sequence_defaults && LooksLikeSequence(d.param)) return kDefaultSequenceLength;
  }
  return 1;
}

Tensor RandomInput(const ValueInfo& v, const Shape& shape, std::mt19937& rng) {
  DataType dt = v.dtype == DataType::kUndefined ? DataType::kFloat : v.dtype;
  if (IsFloatingPoint(dt)) {
    Tensor f(DataType::kFloat, shape);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    float* p = f.data<float>();
    for (int64_t i = 0; i < f.numel(); ++i) p[i] = u(rng);
    return dt == DataType::kFloat ? f : f.CastTo(dt);
  }
  if (dt == DataType::kString) return Tensor(dt, shape);
  // Integer and bool inputs: token ids, positions and indices are safest at 0; masks at 1
  // (everything visible) so that softmax rows are not all masked.
  const bool mask = Lower(v.name).find("mask") != std::string::npos;
  Tensor t(DataType::kInt64, shape);
  int64_t* p = t.data<int64_t>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = mask ? 1 : 0;
  if (dt == DataType::kBool) {
    Tensor b(DataType::kBool, shape);
    bool* q = b.data<bool>();
    for (int64_t i = 0; i < b.numel(); ++i) q[i] = true;
    return b;
  }
  return dt == DataType::kInt64 ? t : t.CastTo(dt);
}

bool TryRun(const Model& model, const std::map<std::string, int64_t>& dims, bool sequence_defaults,
            ShapeMap& out) {
  SessionOptions opts;
  opts.observer = [&out](const std::string& name, const Tensor& t) {
    out[name] = ValueShape{t.dtype(), t.shape(), true};
  };
  try {
    Session session(model, opts);
    std::mt19937 rng(0);
    std::map<std::string, Tensor> feeds;
    for (const ValueInfo& v : session.inputs()) {
      if (!v.non_tensor_type.empty()) return false;
      Shape shape;
      if (v.has_shape) {
        for (const Dim& d : v.dims) shape.push_back(BindDim(d, dims, sequence_defaults));
      } else {
        shape = {1};
      }
      Tensor t = RandomInput(v, shape, rng);
      out[v.name] = ValueShape{t.dtype(), t.shape(), true};
      feeds.emplace(v.name, std::move(t));
    }
    session.Run(feeds);
    return true;
  } catch (const Error&) {
    return false;
  }
}

}  // namespace

std::map<std::string, Tensor> RandomFeeds(const Model& model, const std::map<std::string, int64_t>& dims,
                                          uint32_t seed) {
  std::mt19937 rng(seed);
  std::map<std::string, Tensor> feeds;
  for (const ValueInfo& v : model.graph.inputs) {
    if (model.graph.FindInitializer(v.name) != nullptr) continue;
    GAF_CHECK(v.non_tensor_type.empty(), "input '{}' is a {}, not a tensor", v.name, v.non_tensor_type);
    Shape shape;
    if (v.has_shape) {
      for (const Dim& d : v.dims) shape.push_back(BindDim(d, dims, true));
    } else {
      shape = {1};
    }
    feeds.emplace(v.name, RandomInput(v, shape, rng));
  }
  return feeds;
}

ShapeMap RecordShapes(const Model& model, const std::map<std::string, int64_t>& dims) {
  ShapeMap declared;
  auto add_declared = [&](const ValueInfo& v) {
    if (!v.has_shape || !v.non_tensor_type.empty()) return;
    Shape s;
    for (const Dim& d : v.dims) s.push_back(BindDim(d, dims, true));
    declared[v.name] = ValueShape{v.dtype, s, true};
  };
  for (const ValueInfo& v : model.graph.inputs) add_declared(v);
  for (const ValueInfo& v : model.graph.value_info) add_declared(v);
  for (const ValueInfo& v : model.graph.outputs) add_declared(v);

  ShapeMap observed;
  bool ok = TryRun(model, dims, /*sequence_defaults=*/true, observed);
  if (!ok) {
    ShapeMap retry;
    if (TryRun(model, dims, /*sequence_defaults=*/false, retry)) {
      observed = std::move(retry);
      ok = true;
    }
  }
  ShapeMap out = ok ? ShapeMap{} : declared;
  for (auto& [name, vs] : observed) out[name] = std::move(vs);
  for (const auto& [name, t] : model.graph.initializers) out[name] = ValueShape{t.dtype(), t.shape(), true};
  return out;
}

}  // namespace gaf
