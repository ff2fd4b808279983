// Einsum: diagonals, sums and pairwise contractions reduced to batched GEMMs.
#include <algorithm>
#include <cctype>
#include <cstring>
#include <string>
#include <vector>

#include "ops/kernel_util.h"
#include "ops/nn_internal.h"

namespace gaf::nn_detail {
namespace {

template <class T>
struct Labeled {
  std::vector<T> data;
  std::vector<int> labels;
  std::vector<int64_t> dims;
};

// dst (row-major over dims) = src[sum_i idx_i * strides_i].
template <class T>
void StridedCopy(const T* src, const std::vector<int64_t>& dims,
                 const std::vector<int64_t>& strides, T* dst) {
  int64_t n = NumElements(dims);
  if (n == 0) return;
  if (dims.empty()) {
    dst[0] = src[0];
    return;
  }
  size_t r = dims.size();
  int64_t inner = dims[r - 1], is = strides[r - 1];
  std::vector<int64_t> idx(r, 0);
  int64_t off = 0;
  for (int64_t o = 0; o < n; o += inner) {
    for (int64_t j = 0; j < inner; ++j) dst[o + j] = src[off + j * is];
    for (int64_t d = static_cast<int64_t>(r) - 2; d >= 0; --d) {
      if (++idx[d] < dims[d]) {
        off += strides[d];
        break;
      }
      off -= strides[d] * (dims[d] - 1);
      idx[d] = 0;
    }
  }
}

template <class T>
Labeled<T> Permute(const Labeled<T>& x, const std::vector<int>& order_labels) {
  std::vector<int64_t> st = Strides(x.dims);
  Labeled<T> y;
  y.labels = order_labels;
  std::vector<int64_t> ps;
  for (int l : order_labels) {
    size_t i = std::find(x.labels.begin(), x.labels.end(), l) - x.labels.begin();
    y.dims.push_back(x.dims[i]);
    ps.push_back(st[i]);
  }
  if (y.labels == x.labels) {
    y.data = x.data;
    return y;
  }
  y.data.resize(NumElements(y.dims));
  StridedCopy(x.data.data(), y.dims, ps, y.data.data());
  return y;
}

// Sums out the labels for which drop(label) is true.
template <class T, class Pred>
Labeled<T> SumOut(const Labeled<T>& x, Pred drop) {
  std::vector<int> keep, gone;
  for (int l : x.labels) (drop(l) ? gone : keep).push_back(l);
  if (gone.empty()) return x;
  std::vector<int> order = keep;
  order.insert(order.end(), gone.begin(), gone.end());
  Labeled<T> p = Permute(x, order);
  Labeled<T> y;
  y.labels = keep;
  int64_t inner = 1;
  for (size_t i = 0; i < p.dims.size(); ++i) {
    if (i < keep.size()) {
      y.dims.push_back(p.dims[i]);
    } else {
      inner *= p.dims[i];
    }
  }
  int64_t outer = NumElements(y.dims);
  y.data.assign(outer, T{});
  for (int64_t o = 0; o < outer; ++o) {
    T s{};
    const T* row = p.data.data() + o * inner;
    for (int64_t j = 0; j < inner; ++j) s += row[j];
    y.data[o] = s;
  }
  return y;
}

template <class T>
Labeled<T> Contract(const Labeled<T>& a0, const Labeled<T>& b0, const std::vector<int>& keep) {
  auto has = [](const std::vector<int>& v, int l) {
    return std::find(v.begin(), v.end(), l) != v.end();
  };
  Labeled<T> a = SumOut(a0, [&](int l) { return !has(keep, l) && !has(b0.labels, l); });
  Labeled<T> b = SumOut(b0, [&](int l) { return !has(keep, l) && !has(a.labels, l); });
  std::vector<int> bat, ms, ks, ns;
  for (int l : a.labels) {
    if (has(b.labels, l)) {
      (has(keep, l) ? bat : ks).push_back(l);
    } else {
      ms.push_back(l);
    }
  }
  for (int l : b.labels)
    if (!has(a.labels, l)) ns.push_back(l);
  auto dim_of = [](const Labeled<T>& x, int l) {
    return x.dims[std::find(x.labels.begin(), x.labels.end(), l) - x.labels.begin()];
  };
  int64_t nb = 1, M = 1, K = 1, N = 1;
  for (int l : bat) nb *= dim_of(a, l);
  for (int l : ms) M *= dim_of(a, l);
  for (int l : ks) K *= dim_of(a, l);
  for (int l : ns) N *= dim_of(b, l);
  std::vector<int> ao = bat, bo = bat;
  ao.insert(ao.end(), ms.begin(), ms.end());
  ao.insert(ao.end(), ks.begin(), ks.end());
  bo.insert(bo.end(), ks.begin(), ks.end());
  bo.insert(bo.end(), ns.begin(), ns.end());
  Labeled<T> ap = Permute(a, ao), bp = Permute(b, bo);
  Labeled<T> y;
  y.labels = bat;
  y.labels.insert(y.labels.end(), ms.begin(), ms.end());
  y.labels.insert(y.labels.end(), ns.begin(), ns.end());
  for (int l : bat) y.dims.push_back(dim_of(a, l));
  for (int l : ms) y.dims.push_back(dim_of(a, l));
  for (int l : ns) y.dims.push_back(dim_of(b, l));
  y.data.assign(nb * M * N, T{});
  if (nb * M * N > 0) {
    std::vector<int64_t> aoff(nb), boff(nb);
    for (int64_t i = 0; i < nb; ++i) {
      aoff[i] = i * M * K;
      boff[i] = i * K * N;
    }
    BatchedGemm<T>(nb, M, N, K, ap.data.data(), aoff, bp.data.data(), boff, y.data.data());
  }
  return y;
}

struct EinsumSpec {
  std::vector<std::vector<int>> in_labels;  // per operand, one label per dimension
  std::vector<int> out_labels;
};

constexpr int kEllipsisLabel = 256;  // ellipsis dims get labels 256 + j

EinsumSpec ParseEinsum(const std::string& eq_raw, const std::vector<const Tensor*>& ins,
                       const Node& node) {
  std::string eq;
  for (char ch : eq_raw)
    if (ch != ' ') eq += ch;
  EinsumSpec spec;
  size_t arrow = eq.find("->");
  std::string lhs = arrow == std::string::npos ? eq : eq.substr(0, arrow);
  std::vector<std::string> terms;
  size_t start = 0;
  while (true) {
    size_t c = lhs.find(',', start);
    terms.push_back(lhs.substr(start, c == std::string::npos ? std::string::npos : c - start));
    if (c == std::string::npos) break;
    start = c + 1;
  }
  GAF_CHECK(terms.size() == ins.size(), "{}: Einsum equation '{}' has {} operands but {} inputs",
            node.Describe(), eq_raw, terms.size(), ins.size());
  // Parse a term into letters and an ellipsis position.
  auto parse_term = [&](const std::string& t, int64_t rank, int64_t* ell_rank_out,
                        int64_t max_ell) {
    std::vector<int> labels;
    size_t e = t.find("...");
    std::string pre = e == std::string::npos ? t : t.substr(0, e);
    std::string post = e == std::string::npos ? "" : t.substr(e + 3);
    for (char ch : pre + post)
      GAF_CHECK(std::isalpha(static_cast<unsigned char>(ch)),
                "{}: invalid character '{}' in Einsum equation '{}'", node.Describe(), ch, eq_raw);
    int64_t nletters = static_cast<int64_t>(pre.size() + post.size());
    int64_t ell = 0;
    if (e != std::string::npos) {
      ell = rank >= 0 ? rank - nletters : max_ell;
      GAF_CHECK(ell >= 0, "{}: Einsum term '{}' does not match input rank {}", node.Describe(), t,
                rank);
    } else {
      GAF_CHECK(rank < 0 || rank == nletters, "{}: Einsum term '{}' does not match input rank {}",
                node.Describe(), t, rank);
    }
    for (char ch : pre) labels.push_back(static_cast<unsigned char>(ch));
    int64_t base = max_ell >= 0 ? max_ell - ell : 0;
    for (int64_t j = 0; j < ell; ++j) labels.push_back(kEllipsisLabel + static_cast<int>(base + j));
    for (char ch : post) labels.push_back(static_cast<unsigned char>(ch));
    if (ell_rank_out) *ell_rank_out = ell;
    return labels;
  };
  int64_t max_ell = 0;
  std::vector<int64_t> ells(terms.size());
  for (size_t i = 0; i < terms.size(); ++i) {
    parse_term(terms[i], ins[i]->rank(), &ells[i], 0);
    max_ell = std::max(max_ell, ells[i]);
  }
  for (size_t i = 0; i < terms.size(); ++i)
    spec.in_labels.push_back(parse_term(terms[i], ins[i]->rank(), nullptr, max_ell));
  if (arrow != std::string::npos) {
    std::string rhs = eq.substr(arrow + 2);
    spec.out_labels = parse_term(rhs, -1, nullptr, max_ell);
    std::vector<int> sorted = spec.out_labels;
    std::sort(sorted.begin(), sorted.end());
    GAF_CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end(),
              "{}: Einsum output '{}' repeats a label", node.Describe(), rhs);
  } else {
    for (int64_t j = 0; j < max_ell; ++j) spec.out_labels.push_back(kEllipsisLabel + static_cast<int>(j));
    std::vector<int> count(kEllipsisLabel, 0);
    for (auto& ls : spec.in_labels)
      for (int l : ls)
        if (l < kEllipsisLabel) ++count[l];
    for (int l = 0; l < kEllipsisLabel; ++l)
      if (count[l] == 1) spec.out_labels.push_back(l);
  }
  return spec;
}

template <class T>
void RunEinsum(KernelContext& ctx, const EinsumSpec& spec) {
  const Node& node = ctx.node;
  size_t nin = ctx.num_inputs();
  // Global size of each label (size-1 dims broadcast).
  std::vector<int64_t> size(kEllipsisLabel * 2, -1);
  for (size_t i = 0; i < nin; ++i) {
    const Tensor& t = *ctx.inputs[i];
    for (size_t d = 0; d < spec.in_labels[i].size(); ++d) {
      int l = spec.in_labels[i][d];
      int64_t v = t.dim(static_cast<int64_t>(d));
      if (size[l] < 0 || size[l] == 1) {
        size[l] = v;
      } else {
        GAF_CHECK(v == size[l] || v == 1, "{}: Einsum dimension sizes {} and {} conflict",
                  node.Describe(), size[l], v);
      }
    }
  }
  for (int l : spec.out_labels)
    GAF_CHECK(size[l] >= 0, "{}: Einsum output label does not appear in any input",
              node.Describe());
  std::vector<Labeled<T>> ops;
  for (size_t i = 0; i < nin; ++i) {
    const Tensor& t = *ctx.inputs[i];
    std::vector<int64_t> st = Strides(t.shape());
    // Unique labels (diagonal for repeats), broadcast size-1 dims to the global size.
    Labeled<T> x;
    std::vector<int64_t> xs;
    const auto& ls = spec.in_labels[i];
    for (size_t d = 0; d < ls.size(); ++d) {
      auto it = std::find(x.labels.begin(), x.labels.end(), ls[d]);
      int64_t dimv = t.dim(static_cast<int64_t>(d));
      if (it == x.labels.end()) {
        x.labels.push_back(ls[d]);
        x.dims.push_back(size[ls[d]]);
        xs.push_back(dimv == 1 && size[ls[d]] != 1 ? 0 : st[d]);
      } else {
        size_t j = it - x.labels.begin();
        GAF_CHECK(dimv == x.dims[j], "{}: Einsum diagonal dimensions differ", node.Describe());
        xs[j] += st[d];
      }
    }
    x.data.resize(NumElements(x.dims));
    StridedCopy(t.data<T>(), x.dims, xs, x.data.data());
    ops.push_back(std::move(x));
  }
  auto has = [](const std::vector<int>& v, int l) {
    return std::find(v.begin(), v.end(), l) != v.end();
  };
  // Labels needed after operand i: output labels and those of later operands.
  auto needed_after = [&](size_t i) {
    std::vector<int> keep = spec.out_labels;
    for (size_t j = i + 1; j < ops.size(); ++j)
      for (int l : ops[j].labels)
        if (!has(keep, l)) keep.push_back(l);
    return keep;
  };
  Labeled<T> acc = SumOut(ops[0], [&](int l) {
    std::vector<int> k = needed_after(0);
    return !has(k, l);
  });
  for (size_t i = 1; i < ops.size(); ++i) acc = Contract(acc, ops[i], needed_after(i));
  acc = SumOut(acc, [&](int l) { return !has(spec.out_labels, l); });
  Labeled<T> out = Permute(acc, spec.out_labels);
  Shape oshape;
  for (int l : spec.out_labels) oshape.push_back(size[l]);
  ctx.outputs[0] = Tensor(ctx.inputs[0]->dtype(), oshape);
  if (!out.data.empty()) std::memcpy(ctx.outputs[0].raw(), out.data.data(), sizeof(T) * out.data.size());
}

}  // namespace

void EinsumKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  GAF_CHECK(ctx.num_inputs() >= 1, "{}: Einsum needs at least one input", node.Describe());
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    GAF_CHECK(ctx.has_input(i), "{}: Einsum input {} is missing", node.Describe(), i);
    GAF_CHECK(ctx.inputs[i]->dtype() == ctx.inputs[0]->dtype(), "{}: Einsum input types differ",
              node.Describe());
  }
  std::string eq = node.GetString("equation", "");
  GAF_CHECK(!eq.empty(), "{}: Einsum requires the 'equation' attribute", node.Describe());
  EinsumSpec spec = ParseEinsum(eq, ctx.inputs, node);
  DataType dt = ctx.inputs[0]->dtype();
  switch (dt) {
    case DataType::kFloat: return RunEinsum<float>(ctx, spec);
    case DataType::kDouble: return RunEinsum<double>(ctx, spec);
    case DataType::kInt32: return RunEinsum<int32_t>(ctx, spec);
    case DataType::kInt64: return RunEinsum<int64_t>(ctx, spec);
    case DataType::kUint32: return RunEinsum<uint32_t>(ctx, spec);
    case DataType::kUint64: return RunEinsum<uint64_t>(ctx, spec);
    default:
      GAF_UNSUPPORTED("{}: Einsum of type {} is not supported", node.Describe(), DataTypeName(dt));
  }
}

}  // namespace gaf::nn_detail
