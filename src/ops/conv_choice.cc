// ConvCandidates and MeasureConvCandidates (ops/conv_choice.h).
#include "ops/conv_choice.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>

#include "ops/dnnl_util.h"

namespace gaf {
namespace {

constexpr int kMaxRounds = 7;
constexpr int kMinRounds = 3;
constexpr double kBudgetMs = 15;  // of timed rounds per candidate
constexpr int kMaxImplsVisited = 32;  // a bound on oneDNN's implementation list

bool Reference(const std::string& impl) { return impl.find("ref") != std::string::npos; }

// Appends the optimized implementations of `pd`'s list (from its current one on), at most `max`.
void Collect(ConvPd pd, bool winograd, int max, std::vector<ConvCandidate>* out) {
  int taken = 0;
  for (int visited = 0; visited < kMaxImplsVisited && taken < max; ++visited) {
    const std::string impl = pd.impl_info_str();
    if (!Reference(impl)) {
      out->push_back({pd, impl, winograd});
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
  double Once(dnnl::stream& s) {
    const auto t0 = std::chrono::steady_clock::now();
    prim.execute(s, args);
    s.wait();
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
                                          const dnnl::primitive_attr& attr, bool winograd, int max_direct) {
  std::vector<ConvCandidate> out;
  try {
    const ConvDesc d = desc(dnnl::algorithm::convolution_direct);
    Collect(ConvPd(d, attr, DnnlEngine()), false, max_direct, &out);
  } catch (const dnnl::error&) {
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
    runs[i].args = {{DNNL_ARG_SRC, Zeroed(pd.src_desc())},
                    {DNNL_ARG_WEIGHTS, Zeroed(pd.weights_desc())},
                    {DNNL_ARG_BIAS, Zeroed(pd.bias_desc())},
                    {DNNL_ARG_DST, Zeroed(pd.dst_desc())}};
    for (const auto& [arg, md] : extra) runs[i].args[arg] = Zeroed(md);
    runs[i].Once(s);  // warm-up: first touches of the scratch, caches
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
