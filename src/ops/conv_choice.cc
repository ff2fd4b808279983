// ConvCandidates and MeasureConvCandidates (ops/conv_choice.h).
#include "ops/conv_choice.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>

#include "ops/dnnl_util.h"
#include "ops/fast_math.h"

namespace gaf {
namespace {

constexpr int kMaxRounds = 7;
constexpr int kMinRounds = 3;
constexpr double kBudgetMs = 15;  // of timed rounds per candidate
constexpr int kMaxImplsVisited = 32;  // a bound on oneDNN's implementation list
constexpr double kMaxTimedMs = 250;   // a first run slower than this: nothing is timed

bool Reference(const std::string& impl) { return impl.find("ref") != std::string::npos; }

// Appends the optimized implementations of `pd`'s list (from its current one on), at most `max`.
void Collect(ConvPd pd, bool winograd, int max, std::vector<ConvCandidate>* out, bool swish_after = false) {
  int taken = 0;
  for (int visited = 0; visited < kMaxImplsVisited && taken < max; ++visited) {
    const std::string impl = pd.impl_info_str();
    if (!Reference(impl)) {
      out->push_back({pd, swish_after ? impl + kSwishPass : impl, winograd, swish_after});
      ++taken;
    }
    // A copy keeps the implementation it holds when the shared iterator moves on.
    ConvPd next = pd;
    if (!next.next_impl()) break;
    pd = next;
  }
}

// Scratch memories for one candidate, zeroed, and the primitive.
struct Timed {
  dnnl::primitive prim;
  std::unordered_map<int, dnnl::memory> args;
  bool swish_after = false;
  // An nhwc candidate: the reorders from the chain's layout and back, and the chain's buffers.
  dnnl::primitive to_nhwc, from_nhwc;
  dnnl::memory outer_src, outer_dst;
  double Once(dnnl::stream& s) {
    const auto t0 = std::chrono::steady_clock::now();
    if (to_nhwc) to_nhwc.execute(s, {{DNNL_ARG_FROM, outer_src}, {DNNL_ARG_TO, args.at(DNNL_ARG_SRC)}});
    prim.execute(s, args);
    if (from_nhwc) from_nhwc.execute(s, {{DNNL_ARG_FROM, args.at(DNNL_ARG_DST)}, {DNNL_ARG_TO, outer_dst}});
    s.wait();
    if (swish_after) {
      const dnnl::memory& d = args.at(DNNL_ARG_DST);
      SwishInPlace(static_cast<float*>(d.get_data_handle()), static_cast<int64_t>(d.get_desc().get_size() / sizeof(float)));
    }
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
};

dnnl::memory Zeroed(const dnnl::memory::desc& md) {
  dnnl::memory m(md, DnnlEngine());
  if (md.get_size() > 0) std::memset(m.get_data_handle(), 0, md.get_size());
  return m;
}

}  // namespace

std::vector<ConvCandidate> ConvCandidates(const std::function<ConvDesc(dnnl::algorithm)>& desc,
                                          const dnnl::primitive_attr& attr, bool winograd, int max_direct,
                                          const dnnl::primitive_attr* attr_without_swish) {
  std::vector<ConvCandidate> out;
  try {
    const ConvDesc d = desc(dnnl::algorithm::convolution_direct);
    Collect(ConvPd(d, attr, DnnlEngine()), false, max_direct, &out);
  } catch (const dnnl::error&) {
  }
  if (attr_without_swish != nullptr && !out.empty()) {
    try {
      const ConvDesc d = desc(dnnl::algorithm::convolution_direct);
      Collect(ConvPd(d, *attr_without_swish, DnnlEngine()), false, max_direct, &out, true);
    } catch (const dnnl::error&) {
    }
  }
  if (winograd && !out.empty()) {
    try {
      const ConvDesc d = desc(dnnl::algorithm::convolution_winograd);
      Collect(ConvPd(d, attr, DnnlEngine()), true, kMaxImplsVisited, &out);
    } catch (const dnnl::error&) {  // no Winograd kernel for this shape, layout or machine
    }
  }
  return out;
}

void AppendNhwcCandidate(const std::function<ConvDesc(dnnl::algorithm)>& nhwc_desc, const dnnl::primitive_attr& attr,
                         std::vector<ConvCandidate>* out) {
  try {
    const ConvDesc d = nhwc_desc(dnnl::algorithm::convolution_direct);
    std::vector<ConvCandidate> found;
    Collect(ConvPd(d, attr, DnnlEngine()), false, 1, &found);
    for (ConvCandidate& c : found) {
      c.name += kNhwcRoundTrip;
      c.nhwc = true;
      out->push_back(std::move(c));
    }
  } catch (const dnnl::error&) {  // no convolution on NHWC with these post-ops
  }
}

ConvChoice MeasureConvCandidates(const std::vector<ConvCandidate>& candidates,
                                 const std::unordered_map<int, dnnl::memory::desc>& extra, double margin) {
  ConvChoice choice;
  choice.ms.assign(candidates.size(), 0.0);
  if (candidates.size() < 2) return choice;
  dnnl::stream s(DnnlEngine());
  std::vector<Timed> runs(candidates.size());
  for (size_t i = 0; i < candidates.size(); ++i) {
    const ConvPd& pd = candidates[i].pd;
    runs[i].prim = dnnl::convolution_forward(pd);
    runs[i].swish_after = candidates[i].swish_after;
    runs[i].args = {{DNNL_ARG_SRC, Zeroed(pd.src_desc())},
                    {DNNL_ARG_WEIGHTS, Zeroed(pd.weights_desc())},
                    {DNNL_ARG_BIAS, Zeroed(pd.bias_desc())},
                    {DNNL_ARG_DST, Zeroed(pd.dst_desc())}};
    for (const auto& [arg, md] : extra) runs[i].args[arg] = Zeroed(md);
    if (candidates[i].nhwc) {
      const ConvPd& outer = candidates[0].pd;
      runs[i].outer_src = Zeroed(outer.src_desc());
      runs[i].outer_dst = Zeroed(outer.dst_desc());
      runs[i].to_nhwc = dnnl::reorder(dnnl::reorder::primitive_desc(DnnlEngine(), outer.src_desc(), DnnlEngine(), pd.src_desc()));
      runs[i].from_nhwc = dnnl::reorder(dnnl::reorder::primitive_desc(DnnlEngine(), pd.dst_desc(), DnnlEngine(), outer.dst_desc()));
    }
    const double warm = runs[i].Once(s);  // warm-up: first touches of the scratch, caches
    // A convolution this slow is not timed over and over (a measurement would take seconds):
    // oneDNN's choice stands.
    if (i == 0 && warm > kMaxTimedMs) return choice;
  }
  std::vector<double> first(candidates.size());
  for (size_t i = 0; i < candidates.size(); ++i) first[i] = runs[i].Once(s);
  const double fastest = *std::min_element(first.begin(), first.end());
  std::vector<size_t> alive;
  for (size_t i = 0; i < candidates.size(); ++i)
    if (i == 0 || first[i] <= 1.5 * fastest) alive.push_back(i);
  const int rounds = std::clamp(static_cast<int>(kBudgetMs / std::max(fastest, 1e-3)), kMinRounds, kMaxRounds);
  std::vector<std::vector<double>> times(candidates.size());
  for (int r = 0; r < rounds; ++r)
    for (size_t i : alive) times[i].push_back(runs[i].Once(s));
  for (size_t i : alive) {
    std::sort(times[i].begin(), times[i].end());
    choice.ms[i] = times[i][times[i].size() / 2];
  }
  size_t best = 0;
  for (size_t i : alive)
    if (choice.ms[i] < choice.ms[best]) best = i;
  choice.index = choice.ms[best] < (1.0 - margin) * choice.ms[0] ? best : 0;
  return choice;
}

void SwishInPlace(float* x, int64_t n) {
  // Blocks of 4096 floats (16 KiB) shared among the threads.
  constexpr int64_t kBlock = 4096;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (blocks > 4)
  for (int64_t b = 0; b < blocks; ++b) {
    float* p = x + b * kBlock;
    const int64_t m = std::min(kBlock, n - b * kBlock);
    int64_t i = 0;
#ifdef __AVX512F__
    // sigmoid(v) = 1 / (1 + e), e = exp(-v) = 2^x with x = -v log2(e), v clamped to [-87, 88]
    // (e stays finite; NaN passes through the final product). x = n + f with n = round(x) and
    // f in [-1/2, 1/2], computed exactly with log2(e) split in two; 2^f by a degree-5 polynomial
    // (relative error 2.3e-7, fitted to 2^f on [-1/2, 1/2]), scaled by 2^n with scalef; the
    // reciprocal by rcp14 and one Newton step. 17 vector operations per 16 elements (Cephes'
    // exp with its two-constant ln 2 took 21).
    const __m512 one = _mm512_set1_ps(1.f), two = _mm512_set1_ps(2.f);
    const __m512 lo = _mm512_set1_ps(-87.f), hi = _mm512_set1_ps(88.f);
    const __m512 nlog2e_hi = _mm512_set1_ps(-1.4426950216293335f), nlog2e_lo = _mm512_set1_ps(-1.925963033500011e-08f);
    const __m512 c5 = _mm512_set1_ps(0.0013276470126584172f), c4 = _mm512_set1_ps(0.009675541892647743f),
                 c3 = _mm512_set1_ps(0.05550713464617729f), c2 = _mm512_set1_ps(0.24022120237350464f),
                 c1 = _mm512_set1_ps(0.6931469440460205f), c0 = _mm512_set1_ps(1.0000001192092896f);
    auto swish16 = [&](__m512 v) {
      const __m512 t = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
      const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(t, nlog2e_hi), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      __m512 f = _mm512_fmsub_ps(t, nlog2e_hi, n);
      f = _mm512_fmadd_ps(t, nlog2e_lo, f);
      __m512 q = _mm512_fmadd_ps(c5, f, c4);
      q = _mm512_fmadd_ps(q, f, c3);
      q = _mm512_fmadd_ps(q, f, c2);
      q = _mm512_fmadd_ps(q, f, c1);
      q = _mm512_fmadd_ps(q, f, c0);
      const __m512 d = _mm512_add_ps(_mm512_scalef_ps(q, n), one);
      const __m512 inv = _mm512_rcp14_ps(d);
      return _mm512_mul_ps(_mm512_mul_ps(v, inv), _mm512_fnmadd_ps(d, inv, two));
    };
    for (; i + 32 <= m; i += 32) {  // two vectors per step: independent chains to overlap
      const __m512 a = swish16(_mm512_loadu_ps(p + i)), b = swish16(_mm512_loadu_ps(p + i + 16));
      _mm512_storeu_ps(p + i, a);
      _mm512_storeu_ps(p + i + 16, b);
    }
    for (; i + 16 <= m; i += 16) _mm512_storeu_ps(p + i, swish16(_mm512_loadu_ps(p + i)));
#endif
    for (; i < m; ++i) p[i] = p[i] * gaf_fast::FastSigmoid(p[i]);
  }
}

namespace {
std::mutex memo_mu;
std::map<std::string, std::string>& Memo() {
  static std::map<std::string, std::string> m;
  return m;
}
}  // namespace

std::string MeasuredConvKernel(const std::string& key) {
  std::lock_guard<std::mutex> lock(memo_mu);
  auto it = Memo().find(key);
  return it == Memo().end() ? std::string() : it->second;
}

void RememberConvKernel(const std::string& key, const std::string& name) {
  std::lock_guard<std::mutex> lock(memo_mu);
  Memo()[key] = name;
}

}  // namespace gaf
