// Products of rows on weights packed into column panels (ops/panel_gemm.h): k-blocked tiles up to
// kPanelMaxRows rows, whole-K tiles for a prompt's rows, and the PreparedMatMul / SiblingMatMul /
// GatedMatMul paths that take them.
#include <gtest/gtest.h>

#include <cstring>
#include <omp.h>

#include <cmath>
#include <initializer_list>
#include <map>
#include <string>
#include <vector>

#include "codegen/half_weights.h"
#include "ir/half.h"
#include "ops/gemm.h"
#include "ops/panel_gemm.h"
#include "ops/panel_tiles.h"
#include "runtime/session.h"
#include "test_util.h"

namespace gaf {
namespace {

using testing::MakeModel;
using testing::MakeNode;
using testing::RandomFloat;

// Worst |x * w - y| against double precision, over every element.
double WorstError(const Tensor& x, const Tensor& w, const std::vector<float>& y, int64_t M) {
  const int64_t K = w.dim(0), N = w.dim(1);
  double worst = 0;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double ref = 0;
      for (int64_t k = 0; k < K; ++k) ref += double(x.data<float>()[m * K + k]) * w.data<float>()[k * N + n];
      worst = std::max(worst, std::abs(ref - y[m * N + n]));
    }
  return worst;
}

TEST(PanelGemm, EqualsDoublePrecisionForEveryRowCountAndTail) {
  // N not a multiple of the panel width (a padded last panel), K not a multiple of the k-block,
  // and a K below it; every row count the kernel takes (one tile, and several over k-blocks).
  for (auto [K, N] : {std::pair<int64_t, int64_t>{300, 130}, {37, 64}, {129, 1}, {1, 200}, {0, 50}}) {
    const Tensor w = RandomFloat({K, N}, 3 + K, -0.5f, 0.5f);
    const PanelWeight pw(w.data<float>(), K, N);
    EXPECT_EQ(pw.panels(), (N + kPanelCols - 1) / kPanelCols);
    for (int64_t M : {1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 13, 16, 17, 31, 64, 101, 128, 129, 135, 200}) {
      static_assert(kPanelMaxRows == 128);
      const Tensor x = RandomFloat({M, K}, 11 + M);
      std::vector<float> y(M * N, -7.f);
      const PanelProduct p{&pw, y.data()};
      PanelGemmMany(x.data<float>(), M, K, &p, 1);
      EXPECT_LE(WorstError(x, w, y, M), 1e-4 * std::sqrt(double(K))) << "K " << K << " N " << N << " M " << M;
    }
  }
}

TEST(PanelGemm, RowsDoNotDependOnTilingOrThreads) {
  const int64_t K = 700, N = 450;  // several k-blocks and panels
  const Tensor w = RandomFloat({K, N}, 5, -0.5f, 0.5f);
  const PanelWeight pw(w.data<float>(), K, N);
  const int64_t kRows = 300;  // beyond kPanelMaxRows: the whole-K tiles
  static_assert(kRows > kPanelMaxRows + 8);
  const Tensor x = RandomFloat({kRows, K}, 6);
  auto run = [&](int64_t M, const float* rows, int threads) {
    std::vector<float> y(M * N);
    const PanelProduct p{&pw, y.data()};
    const int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    PanelGemmMany(rows, M, K, &p, 1);
    omp_set_num_threads(saved);
    return y;
  };
  const std::vector<float> all = run(kRows, x.data<float>(), 2);
  EXPECT_EQ(run(kRows, x.data<float>(), 1), all);
  EXPECT_EQ(run(kRows, x.data<float>(), 3), all);  // other row ranges per task
  // A few rows on several panels at once (1-4 rows: 9 full panels in tasks of 4 or 2, then the
  // padded one), one tile, tiles of other sizes, k-blocked tiles up to kPanelMaxRows rows, and a
  // prompt's whole-K tiles starting at another row than a multiple of 8: the same bits as in the
  // 300-row product.
  for (int64_t M : std::initializer_list<int64_t>{1, 2, 3, 4, 5, 6, 7, 11, kPanelMaxRows, kPanelMaxRows + 1, 250}) {
    const std::vector<float> part = run(M, x.data<float>() + K * 3, 2);  // rows 3 .. 3+M
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) ASSERT_EQ(part[m * N + n], all[(3 + m) * N + n]) << M << " rows, row " << m;
  }
}

// A prompt's tasks: every (unit, row) exactly once, ranges in whole tiles (but the last row's),
// whole units while there are more than 2 per thread left, the last units split, and with few
// units every unit split so that each thread has several tasks.
TEST(PanelGemm, RowRangeTasksCoverEveryRowOfEveryUnitOnce) {
  const int saved = omp_get_max_threads();
  for (int threads : {1, 2, 3, 8})
    for (int64_t units : {0, 1, 3, 7, 22, 100})
      for (int64_t M : {1, 5, 129, 256, 1000})
        for (int64_t tile : {6, 8}) {
          omp_set_num_threads(threads);
          const std::vector<panel_detail::RowRangeTask> tasks = panel_detail::RowRangeTasks(units, M, tile);
          omp_set_num_threads(saved);
          const std::string what = fmt::format("{} threads, {} units, {} rows, tiles of {}", threads, units, M, tile);
          std::vector<int> seen(static_cast<size_t>(units * M), 0);
          for (const auto& t : tasks) {
            ASSERT_TRUE(t.unit >= 0 && t.unit < units && t.m0 >= 0 && t.m0 < t.m1 && t.m1 <= M) << what;
            ASSERT_EQ(t.m0 % tile, 0) << what;
            ASSERT_TRUE(t.m1 == M || t.m1 % tile == 0) << what;
            for (int64_t m = t.m0; m < t.m1; ++m) ++seen[static_cast<size_t>(t.unit * M + m)];
          }
          for (int c : seen) ASSERT_EQ(c, 1) << what;
          if (units >= 4 * threads) {  // whole units first, then the last 2 per thread split
            for (int64_t i = 0; i < units - 2 * threads; ++i) EXPECT_TRUE(tasks[i].m0 == 0 && tasks[i].m1 == M) << what;
            if (M >= 4 * tile) EXPECT_EQ(static_cast<int64_t>(tasks.size()), units - 2 * threads + 2 * threads * 4) << what;
          } else if (units > 0 && M >= 4 * threads * tile) {
            EXPECT_GE(static_cast<int64_t>(tasks.size()), 4 * threads) << what;
          }
        }
}

// The chunks a task's tile calls prefetch: with enough calls, the next panel's bytes exactly once,
// in order, ending with the last call; with fewer calls, its first chunks, one a call.
TEST(PanelGemm, NextPanelChunksCoverTheNextPanelOnceEndingWithTheLastCall) {
  alignas(64) static char panel[4 * 3 * 64 * 7];
  for (int64_t K : {1, 7})
    for (int64_t lines : {1, 2, 3, 6})  // chunks of K lines: a panel of `lines` lines a k
      for (int64_t calls : {1, 2, 5, 12, 32}) {
        const panel_detail::NextPanels next{panel, K * 64 * lines};
        const std::string what = fmt::format("K {}, {} chunks, {} calls", K, lines, calls);
        std::vector<int64_t> offsets;
        int64_t first_call = -1;
        for (int64_t c = 0; c < calls; ++c)
          if (const char* pf = panel_detail::NextPanelChunk(next, K, c, calls)) {
            if (first_call < 0) first_call = c;
            ASSERT_EQ(c - first_call, static_cast<int64_t>(offsets.size())) << what;  // consecutive calls
            offsets.push_back(pf - panel);
          }
        const int64_t expect = std::min(lines, calls);
        ASSERT_EQ(static_cast<int64_t>(offsets.size()), expect) << what;
        for (int64_t i = 0; i < expect; ++i) EXPECT_EQ(offsets[static_cast<size_t>(i)], i * K * 64) << what;
        if (calls >= lines) EXPECT_EQ(first_call + lines, calls) << what;  // the last chunk at the last call
        EXPECT_EQ(panel_detail::NextPanelChunk({}, K, calls - 1, calls), nullptr) << what;
      }
}

// Every task runs once, and the `next` a task is told is the task its thread runs next (-1 after a
// thread's last), in parallel and serially.
TEST(PanelGemm, RunPanelTasksAheadTellsEachTaskItsThreadsNext) {
  for (int64_t n : {0, 1, 2, 3, 17, 200})
    for (int64_t work : {int64_t{0}, int64_t{1} << 30}) {
      std::vector<std::vector<std::pair<int64_t, int64_t>>> by_thread(static_cast<size_t>(omp_get_max_threads()));
      std::vector<int> runs(static_cast<size_t>(n), 0);
      panel_detail::RunPanelTasksAhead(n, work, int64_t{1} << 18, [&](int64_t t, int64_t next) {
        by_thread[static_cast<size_t>(omp_get_thread_num())].push_back({t, next});
#pragma omp atomic
        ++runs[static_cast<size_t>(t)];
      });
      const std::string what = fmt::format("{} tasks, work {}", n, work);
      for (int r : runs) EXPECT_EQ(r, 1) << what;
      for (const auto& seq : by_thread)
        for (size_t i = 0; i < seq.size(); ++i)
          EXPECT_EQ(seq[i].second, i + 1 < seq.size() ? seq[i + 1].first : -1) << what << ", task " << seq[i].first;
    }
}

TEST(PanelGemm, SeveralProductsInOneTaskSet) {
  const int64_t K = 256, M = 5;
  const Tensor w1 = RandomFloat({K, 1000}, 7, -0.5f, 0.5f), w2 = RandomFloat({K, 70}, 8, -0.5f, 0.5f);
  const PanelWeight p1(w1.data<float>(), K, 1000), p2(w2.data<float>(), K, 70);
  const Tensor x = RandomFloat({M, K}, 9);
  std::vector<float> y1(M * 1000), y2(M * 70), a(M * 1000), b(M * 70);
  const PanelProduct ps[2] = {{&p1, y1.data()}, {&p2, y2.data()}};
  PanelGemmMany(x.data<float>(), M, K, ps, 2);
  const PanelProduct one1{&p1, a.data()}, one2{&p2, b.data()};
  PanelGemmMany(x.data<float>(), M, K, &one1, 1);
  PanelGemmMany(x.data<float>(), M, K, &one2, 1);
  EXPECT_EQ(y1, a);
  EXPECT_EQ(y2, b);
  EXPECT_LT(WorstError(x, w2, y2, M), 1e-4 * 16);
}

// A decode product's tasks after BalanceSpanTasks: every panel in exactly one task, gate pairs
// whole, and the threads claiming them in order end nearer together than in the order they were
// made (or as near, with no split, when they already do).
TEST(PanelGemm, BalancedTasksCoverEveryPanelOnceAndEndTogether) {
  using panel_detail::SpanTask;
  auto made = [](std::initializer_list<std::pair<int64_t, int64_t>> weights, int64_t group, int64_t unit) {
    // (full panels, vectors of a last partial panel (0: none)) per weight, in tasks of `group`.
    std::vector<SpanTask> tasks;
    int w = 0;
    for (const auto& [full, partial] : weights) {
      for (int64_t p = 0; p < full; p += group) {
        const int64_t n = std::min(group, full - p);
        tasks.push_back({w, p, n, 3 * n, unit});
      }
      if (partial > 0) tasks.push_back({w, full, 1, partial, 1});
      ++w;
    }
    return tasks;
  };
  auto covered = [](const std::vector<SpanTask>& tasks) {
    std::map<std::pair<int, int64_t>, int> seen;
    for (const SpanTask& t : tasks) {
      EXPECT_EQ(t.p % t.unit, 0);
      EXPECT_EQ(t.n % t.unit, 0);
      for (int64_t q = t.p; q < t.p + t.n; ++q) ++seen[{t.w, q}];
    }
    return seen;
  };
  struct Case {
    const char* what;
    std::vector<SpanTask> tasks;
    int64_t balanced_end;  // the ideal: the cost over the threads, rounded up, within a panel
  };
  const std::vector<Case> cases = {
      {"attention output: 21 panels and a 1-vector one", made({{21, 1}}, 4, 1), 32},
      {"q, k, v: 21 + 1 vector, 5 + 1, 5 + 1", made({{21, 1}, {5, 1}, {5, 1}}, 4, 1), 48},
      {"32 panels: already even", made({{32, 0}}, 4, 1), 48},
      {"gate pairs: 118 panels", made({{118, 0}}, 4, 2), 177},
  };
  for (const Case& c : cases) {
    std::vector<SpanTask> tasks = c.tasks;
    const int64_t before = panel_detail::ClaimedEnd(tasks, 2);
    panel_detail::BalanceSpanTasks(tasks, 2);
    const int64_t after = panel_detail::ClaimedEnd(tasks, 2);
    EXPECT_EQ(covered(tasks), covered(c.tasks)) << c.what;
    for (const auto& [panel, times] : covered(tasks)) EXPECT_EQ(times, 1) << c.what;
    EXPECT_LE(after, before) << c.what;
    EXPECT_LE(after, c.balanced_end + 3) << c.what << ": within a panel of the even share";
    for (size_t i = 1; i < tasks.size(); ++i) EXPECT_GE(tasks[i - 1].cost, tasks[i].cost) << c.what << ": largest first";
  }
  std::vector<SpanTask> even = made({{32, 0}}, 4, 1);
  panel_detail::BalanceSpanTasks(even, 2);
  EXPECT_EQ(even.size(), 8u) << "no split where the threads already end together";
  std::vector<SpanTask> o = made({{21, 1}}, 4, 1);
  EXPECT_EQ(panel_detail::ClaimedEnd(o, 2), 36) << "in the order made, one thread takes 36 vectors of 64";
  panel_detail::BalanceSpanTasks(o, 2);
  EXPECT_EQ(panel_detail::ClaimedEnd(o, 2), 33);
}

// Decode products whose tasks were reordered and split for a team of two give the bits of one
// thread running the tasks as made.
TEST(PanelGemm, BalancedDecodeProductsUnderATeamGiveTheSameBits) {
  const int64_t K = 320;
  const Tensor wq = RandomFloat({K, 1024}, 11, -0.5f, 0.5f), wk = RandomFloat({K, 256}, 12, -0.5f, 0.5f);
  const PanelWeight pq(wq.data<float>(), K, 1024), pk(wk.data<float>(), K, 256);
  for (int64_t M : {1, 2, 4}) {
    const Tensor x = RandomFloat({M, K}, 13 + static_cast<uint32_t>(M));
    std::vector<float> yq(M * 1024), yk(M * 256), aq(M * 1024), ak(M * 256);
    const PanelProduct team_ps[2] = {{&pq, yq.data()}, {&pk, yk.data()}};
    TaskTeam::Run(2, [&] { PanelGemmMany(x.data<float>(), M, K, team_ps, 2); });
    const PanelProduct one_ps[2] = {{&pq, aq.data()}, {&pk, ak.data()}};
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    PanelGemmMany(x.data<float>(), M, K, one_ps, 2);
    omp_set_num_threads(threads);
    EXPECT_EQ(yq, aq) << M << " rows";
    EXPECT_EQ(yk, ak) << M << " rows";
    EXPECT_LT(WorstError(x, wq, yq, M), 1e-4 * 16);
  }
}

// Each thread keeps the task lists it made by shape (PanelTaskCache): products of other weights of
// the same shapes, and of other shapes in between, get the bits of one thread running them.
TEST(PanelGemm, TaskListsKeptByShapeServeOtherWeightsOfThatShape) {
  const int64_t K = 192;
  auto check = [&](int64_t N1, int64_t N2, uint32_t seed) {
    const Tensor w1 = RandomFloat({K, N1}, seed, -0.5f, 0.5f), w2 = RandomFloat({K, N2}, seed + 1, -0.5f, 0.5f);
    const PanelWeight p1(w1.data<float>(), K, N1), p2(w2.data<float>(), K, N2);
    const Tensor x = RandomFloat({1, K}, seed + 2);
    std::vector<float> a1(N1), a2(N2), b1(N1), b2(N2);
    const PanelProduct team_ps[2] = {{&p1, a1.data()}, {&p2, a2.data()}};
    TaskTeam::Run(2, [&] { PanelGemmMany(x.data<float>(), 1, K, team_ps, 2); });
    const PanelProduct one_ps[2] = {{&p1, b1.data()}, {&p2, b2.data()}};
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    PanelGemmMany(x.data<float>(), 1, K, one_ps, 2);
    omp_set_num_threads(threads);
    EXPECT_EQ(a1, b1) << N1 << ", " << N2 << " seed " << seed;
    EXPECT_EQ(a2, b2) << N1 << ", " << N2 << " seed " << seed;
  };
  check(1024, 256, 1);
  check(1024, 256, 10);  // other weights, the same shapes: the kept list
  check(1000, 300, 20);
  check(1024, 256, 30);
}

TEST(PanelGemm, RejectsRowCountsOutsideItsRange) {
  const Tensor w = RandomFloat({8, 8}, 1);
  const PanelWeight pw(w.data<float>(), 8, 8);
  std::vector<float> x(8 * (kPanelMaxRows + 1)), y(8 * (kPanelMaxRows + 1));
  const PanelProduct p{&pw, y.data()};
  EXPECT_THROW(PanelGemmMany(x.data(), 0, 8, &p, 1), Error);
  EXPECT_THROW(PanelGemmMany(x.data(), 2, 7, &p, 1), Error);  // K of another weight
}

TEST(PanelGemm, SiblingProductsOfAFewRowsShareOneTaskSet) {
  const int64_t K = 512;
  static_assert(512 * 520 >= kPackedMatMulMinWeight);
  Model m = testing::SiblingProjections(K, {700, 520, 520}, 60);  // every weight prepared
  SessionOptions on{.profile = true}, off;
  off.rewrite_products = false;
  off.prepared_kernels = false;
  Session fast(m, on), plain(m, off);
  ASSERT_EQ(fast.product_rewrites().siblings, 3);
  for (int64_t rows : {2, 5, 8, 16, 17, 128, 129}) {  // the panels, then the library (129)
    std::map<std::string, Tensor> feeds = {{"x", RandomFloat({rows, K}, 80 + rows)}};
    const std::vector<Tensor> a = fast.Run(feeds), b = plain.Run(feeds);
    ASSERT_EQ(a.size(), 3u);
    for (int i = 0; i < 3; ++i) {
      ASSERT_EQ(a[i].shape(), b[i].shape());
      const std::vector<double> x = a[i].ToDoubles(), y = b[i].ToDoubles();
      double worst = 0;
      for (size_t j = 0; j < x.size(); ++j) worst = std::max(worst, std::abs(x[j] - y[j]));
      EXPECT_LT(worst, 1e-4) << rows << " rows, output " << i;
    }
  }
}

// Gemm nodes with a constant B (a classifier head: transB 1, a bias of N values) run on the
// prepared weight: the same results as the registry's Gemm for every row count (panels, then the
// library), transB 0 and 1, a bias [N] or [1, N], beta != 1, no bias; a C of [M, N] and transA 1
// run the registry's kernel.
TEST(PanelGemm, GemmWithAConstantWeightRunsOnThePreparedWeight) {
  const int64_t K = 640, N = 520;
  static_assert(640 * 520 >= kPackedMatMulMinWeight);
  struct Case {
    int64_t trans_a, trans_b;
    float beta;
    std::vector<int64_t> c;  // shape of C; empty: none; {-1, N}: one row per row of A
    bool prepared;
  };
  const std::vector<Case> cases = {{0, 1, 1.f, {N}, true},  {0, 0, 1.f, {1, N}, true}, {0, 1, 0.5f, {N}, true},
                                   {0, 1, 1.f, {}, true},   {0, 1, 1.f, {-1, N}, true}, {1, 1, 1.f, {N}, false}};
  for (const Case& c : cases) {
    for (int64_t rows : {1, 3, 9, 129}) {
      Graph g;
      g.inputs = {testing::FloatValue("a", c.trans_a ? std::vector<int64_t>{K, rows} : std::vector<int64_t>{rows, K})};
      g.SetInitializer("b", RandomFloat(c.trans_b ? Shape{N, K} : Shape{K, N}, 5, -0.1f, 0.1f));
      std::vector<std::string> ins = {"a", "b"};
      if (!c.c.empty()) {
        Shape cs = c.c;
        if (cs[0] == -1) cs[0] = rows;
        g.SetInitializer("c", RandomFloat(cs, 6));
        ins.push_back("c");
      }
      g.nodes.push_back(testing::MakeNode("Gemm", ins, {"y"}, "gemm",
                                          {testing::IntAttr("transA", c.trans_a), testing::IntAttr("transB", c.trans_b),
                                           testing::FloatAttr("beta", c.beta)}));
      g.outputs.push_back(ValueInfo{"y", DataType::kFloat});
      Model m = testing::MakeModel(std::move(g));
      SessionOptions off;
      off.prepared_kernels = false;
      Session fast(m), plain(m, off);
      const std::map<std::string, Tensor> feeds = {
          {"a", RandomFloat(c.trans_a ? Shape{K, rows} : Shape{rows, K}, 7 + static_cast<uint32_t>(rows))}};
      const Tensor x = fast.Run(feeds)[0], y = plain.Run(feeds)[0];
      ASSERT_EQ(x.shape(), (Shape{rows, N}));
      ASSERT_EQ(y.shape(), x.shape());
      double worst = 0;
      const std::vector<double> xs = x.ToDoubles(), ys = y.ToDoubles();
      for (size_t j = 0; j < xs.size(); ++j) worst = std::max(worst, std::abs(xs[j] - ys[j]));
      EXPECT_LT(worst, 1e-4) << "transB " << c.trans_b << ", " << rows << " rows";
    }
    Node n = testing::MakeNode("Gemm", {"a", "b"}, {"y"}, "gemm",
                               {testing::IntAttr("transA", c.trans_a), testing::IntAttr("transB", c.trans_b)});
    EXPECT_EQ(PrepareGemm(n, RandomFloat(c.trans_b ? Shape{N, K} : Shape{K, N}, 5)) != nullptr, c.prepared);
  }
  // A weight below kPackedMatMulMinWeight keeps the registry's kernel.
  EXPECT_EQ(PrepareGemm(testing::MakeNode("Gemm", {"a", "b"}, {"y"}), RandomFloat({64, 64}, 1)), nullptr);
}

// Float16 panels: each element is the double-precision sum of x times the weight rounded to
// float16 (to float32 rounding), a row alone or in a batch of up to 4 has the bits it has in a
// prompt of 40 rows (the whole-K tiles), at 1, 2 and 3 threads, and sibling weights in one task
// set give what each gives alone.
TEST(HalfPanelGemm, EqualsTheRoundedWeightsProductAndRowsDoNotDependOnTheBatch) {
  for (auto [K, N] : {std::pair<int64_t, int64_t>{300, 650}, {37, 64}, {129, 1}, {1, 200}, {0, 50}}) {
    const Tensor w = RandomFloat({K, N}, 13 + K, -0.5f, 0.5f);
    const HalfPanelWeight hw(w.data<float>(), K, N);
    EXPECT_EQ(hw.panels(), (N + kHalfPanelCols - 1) / kHalfPanelCols);
    Tensor rounded = w.Clone();  // what the panels hold, as float32
    for (int64_t i = 0; i < rounded.numel(); ++i)
      rounded.data<float>()[i] = HalfToFloat(FloatToHalf(rounded.data<float>()[i]));
    constexpr int64_t kRows = 40;  // a prompt: more than kHalfPanelMaxRows
    const Tensor x = RandomFloat({kRows, K}, 17);
    std::vector<float> all(kRows * N, -7.f);
    const HalfPanelProduct pa{&hw, all.data()};
    HalfPanelGemmMany(x.data<float>(), kRows, K, &pa, 1);
    EXPECT_LE(WorstError(x, rounded, all, kRows), 1e-4 * std::sqrt(double(K) + 1)) << K << " x " << N;
    for (int threads : {1, 2, 3})
      for (int64_t M : {1, 2, 3, 4, 5, 7, 13, 34}) {
        std::vector<float> part(M * N, -7.f);
        const HalfPanelProduct pp{&hw, part.data()};
        const int saved = omp_get_max_threads();
        omp_set_num_threads(threads);
        HalfPanelGemmMany(x.data<float>() + (kRows - M) * K, M, K, &pp, 1);  // the last M rows
        omp_set_num_threads(saved);
        for (int64_t m = 0; m < M; ++m)
          for (int64_t n = 0; n < N; ++n)
            ASSERT_EQ(part[m * N + n], all[(kRows - M + m) * N + n])
                << K << " x " << N << ", " << M << " rows, row " << m << ", " << threads << " threads";
      }
  }
  const int64_t K = 200;
  const Tensor w1 = RandomFloat({K, 1000}, 21, -0.5f, 0.5f), w2 = RandomFloat({K, 70}, 22, -0.5f, 0.5f);
  const HalfPanelWeight h1(w1.data<float>(), K, 1000), h2(w2.data<float>(), K, 70);
  const Tensor x = RandomFloat({2, K}, 23);
  std::vector<float> y1(2 * 1000), y2(2 * 70), a(2 * 1000), b(2 * 70);
  const HalfPanelProduct both[2] = {{&h1, y1.data()}, {&h2, y2.data()}}, one1{&h1, a.data()}, one2{&h2, b.data()};
  HalfPanelGemmMany(x.data<float>(), 2, K, both, 2);
  HalfPanelGemmMany(x.data<float>(), 2, K, &one1, 1);
  HalfPanelGemmMany(x.data<float>(), 2, K, &one2, 1);
  EXPECT_EQ(y1, a);
  EXPECT_EQ(y2, b);
  EXPECT_THROW(HalfPanelGemmMany(x.data<float>(), 0, K, &one1, 1), Error);
  EXPECT_THROW(HalfPanelGemmMany(x.data<float>(), 2, K + 1, &one1, 1), Error);
}

// A SwiGLU gate and up as one weight (PanelWeight::GatePair): SiLU(x G) * (x U) applied inside
// each task equals the two products run apart followed by the gate (StoreGated, the SiLUGate
// kernel's arithmetic), bit for bit, for every row count (a prompt's too) and thread count; F not a multiple of the
// panel width (zeros past it), K of one, and K zero (empty sums: zeros).
TEST(PanelGemm, GatePairAppliesTheGateInsideItsTasks) {
  for (auto [K, F] : {std::pair<int64_t, int64_t>{300, 130}, {37, 96}, {1, 200}, {0, 50}}) {
    const Tensor wg = RandomFloat({K, F}, 31 + K, -0.5f, 0.5f), wu = RandomFloat({K, F}, 32 + K, -0.5f, 0.5f);
    const PanelWeight pg(wg.data<float>(), K, F), pu(wu.data<float>(), K, F);
    const PanelWeight pair = PanelWeight::GatePair(wg.data<float>(), wu.data<float>(), K, F);
    ASSERT_EQ(pair.N(), 2 * ((F + kPanelCols - 1) / kPanelCols) * kPanelCols);
    const Tensor x = RandomFloat({200, K}, 33, -2.f, 2.f);
    for (int threads : {1, 2, 3})
      for (int64_t M : {1, 2, 3, 4, 5, 8, 17, 128, 129, 200}) {  // whole-K tiles above kPanelMaxRows
        std::vector<float> g(M * F), u(M * F), want(M * F), got(M * F, -7.f);
        const PanelProduct apart[2] = {{&pg, g.data()}, {&pu, u.data()}};
        const PanelProduct gated{&pair, got.data(), F};
        const int saved = omp_get_max_threads();
        omp_set_num_threads(threads);
        PanelGemmMany(x.data<float>(), M, K, apart, 2);
        PanelGemmMany(x.data<float>(), M, K, &gated, 1);
        omp_set_num_threads(saved);
        StoreGated(g.data(), F, u.data(), F, M, F, want.data(), F);
        ASSERT_EQ(got, want) << "K " << K << " F " << F << ", " << M << " rows, " << threads << " threads";
        for (int64_t i = 0; i < M * F; ++i) {  // and the gate is SiLU(g) * u
          const double silu = g[i] / (1.0 + std::exp(-double(g[i])));
          ASSERT_NEAR(want[i], silu * u[i], 1e-5 * (1 + std::abs(silu * u[i]))) << i;
        }
      }
  }
  const Tensor w = RandomFloat({8, 48}, 1);
  const PanelWeight plain(w.data<float>(), 8, 48);
  std::vector<float> x(8), y(48);
  const PanelProduct wrong{&plain, y.data(), 48};  // 48 columns: a pair of two panels, not one
  EXPECT_THROW(PanelGemmMany(x.data(), 1, 8, &wrong, 1), Error);
}

// The float16 pair (HalfPanelWeight::GatePair) likewise: bit for bit the two float16 products and
// the gate, at 1 to 4 rows (4 rows run the pair's two panels one after the other) and in a
// prompt's whole-K tiles.
TEST(HalfPanelGemm, GatePairAppliesTheGateInsideItsTasks) {
  for (auto [K, F] : {std::pair<int64_t, int64_t>{300, 650}, {37, 64}, {1, 200}, {0, 50}}) {
    const Tensor wg = RandomFloat({K, F}, 41 + K, -0.5f, 0.5f), wu = RandomFloat({K, F}, 42 + K, -0.5f, 0.5f);
    const HalfPanelWeight hg(wg.data<float>(), K, F), hu(wu.data<float>(), K, F);
    const HalfPanelWeight pair = HalfPanelWeight::GatePair(wg.data<float>(), wu.data<float>(), K, F);
    const Tensor x = RandomFloat({30, K}, 43, -2.f, 2.f);
    for (int threads : {1, 2, 3})
      for (int64_t M : {1, 2, 3, 4, 5, 6, 7, 30}) {  // a prompt's whole-K tiles past 4 rows
        std::vector<float> g(M * F), u(M * F), want(M * F), got(M * F, -7.f);
        const HalfPanelProduct apart[2] = {{&hg, g.data()}, {&hu, u.data()}};
        const HalfPanelProduct gated{&pair, got.data(), F};
        const int saved = omp_get_max_threads();
        omp_set_num_threads(threads);
        HalfPanelGemmMany(x.data<float>(), M, K, apart, 2);
        HalfPanelGemmMany(x.data<float>(), M, K, &gated, 1);
        omp_set_num_threads(saved);
        StoreGated(g.data(), F, u.data(), F, M, F, want.data(), F);
        ASSERT_EQ(got, want) << "K " << K << " F " << F << ", " << M << " rows, " << threads << " threads";
      }
  }
}

// An addend given with a product (PanelProduct::add, a residual) goes in where each task stores its
// sums: bit for bit the product followed by Add's arithmetic (r + p), for every row count (a
// prompt's whole-K tiles too), thread count, tail panel, K of one and K zero (empty sums: +0 + r),
// signed zeros among the addends; a second product of the same call without one is untouched; a
// gate pair takes none.
TEST(PanelGemm, AddendGoesInWhereTheTasksStoreTheirSums) {
  for (auto [K, N] : {std::pair<int64_t, int64_t>{300, 130}, {37, 96}, {1, 200}, {0, 50}}) {
    const Tensor w = RandomFloat({K, N}, 81 + K, -0.5f, 0.5f), w2 = RandomFloat({K, 64}, 82 + K, -0.5f, 0.5f);
    const PanelWeight pw(w.data<float>(), K, N), pw2(w2.data<float>(), K, 64);
    const Tensor x = RandomFloat({200, K}, 83, -2.f, 2.f), radd = RandomFloat({200, N}, 84, -3.f, 3.f);
    std::vector<float> r(radd.data<float>(), radd.data<float>() + 200 * N);
    for (size_t i = 0; i < r.size(); i += 7) r[i] = i % 2 ? -0.f : 0.f;
    for (int threads : {1, 2, 3})
      for (int64_t M : {1, 2, 3, 4, 5, 8, 17, 128, 129, 200}) {
        std::vector<float> p(M * N), want(M * N), got(M * N, -7.f), other(M * 64), other_want(M * 64);
        const PanelProduct plain[2] = {{&pw, p.data()}, {&pw2, other_want.data()}};
        const PanelProduct added[2] = {{&pw, got.data(), 0, r.data()}, {&pw2, other.data()}};
        const int saved = omp_get_max_threads();
        omp_set_num_threads(threads);
        PanelGemmMany(x.data<float>(), M, K, plain, 2);
        PanelGemmMany(x.data<float>(), M, K, added, 2);
        omp_set_num_threads(saved);
        for (int64_t i = 0; i < M * N; ++i) want[i] = r[i] + p[i];
        const std::string where = "K " + std::to_string(K) + " N " + std::to_string(N) + ", " + std::to_string(M) +
                                  " rows, " + std::to_string(threads) + " threads";
        ASSERT_EQ(0, std::memcmp(got.data(), want.data(), sizeof(float) * M * N)) << where;
        ASSERT_EQ(other, other_want) << where;
      }
  }
  const Tensor wg = RandomFloat({8, 48}, 2), wu = RandomFloat({8, 48}, 3);
  const PanelWeight pair = PanelWeight::GatePair(wg.data<float>(), wu.data<float>(), 8, 48);
  std::vector<float> x(8), y(48), r(48);
  const PanelProduct gated_added{&pair, y.data(), 48, r.data()};
  EXPECT_THROW(PanelGemmMany(x.data(), 1, 8, &gated_added, 1), Error);
}

// y = Add(r, MatMul(x, W)) with W a constant weight and r a fed value (a transformer's residual):
// the plan makes one ResidualMatMul, which has the bits of the prepared product followed by the Add
// at every row count; a broadcast addend at run time takes the MatMul and the Add (its fallback);
// a constant addend (a bias), a product that is also a graph output, or a weight too small to
// pack is left alone.
TEST(PanelGemm, ResidualAddRunsInsideTheProduct) {
  const int64_t K = 512, N = 520;
  static_assert(512 * 520 >= kPackedMatMulMinWeight);
  auto model = [&](bool r_const, bool p_out, int64_t k, bool add_first) {
    Graph g;
    g.inputs = {testing::FloatValue("x", {-1, k})};
    if (!r_const) g.inputs.push_back(testing::FloatValue("r", {-1, N}));
    else g.SetInitializer("r", RandomFloat({N}, 91));
    g.SetInitializer("w", RandomFloat({k, N}, 92, -0.1f, 0.1f));
    g.nodes.push_back(testing::MakeNode("MatMul", {"x", "w"}, {"p"}, "o_proj"));
    g.nodes.push_back(testing::MakeNode("Add", add_first ? std::vector<std::string>{"r", "p"}
                                                         : std::vector<std::string>{"p", "r"},
                                        {"y"}, "residual"));
    g.outputs = {ValueInfo{"y", DataType::kFloat}};
    if (p_out) g.outputs.push_back(ValueInfo{"p", DataType::kFloat});
    return testing::MakeModel(std::move(g), 17);
  };
  SessionOptions on{.profile = true}, off{.profile = true};
  off.rewrite_products = false;  // the prepared MatMul, then the Add
  for (bool add_first : {true, false}) {
    const Model m = model(false, false, K, add_first);
    Session fast(m, on), plain(m, off);
    ASSERT_EQ(fast.product_rewrites().residual_products, 1);
    int runs = 0;
    for (int64_t rows : {1, 3, 5, 128, 129, 300}) {
      std::map<std::string, Tensor> feeds = {{"x", RandomFloat({rows, K}, 100 + rows)},
                                             {"r", RandomFloat({rows, N}, 200 + rows, -2.f, 2.f)}};
      const Tensor a = fast.Run(feeds)[0], b = plain.Run(feeds)[0];
      ASSERT_EQ(a.shape(), b.shape());
      EXPECT_EQ(0, std::memcmp(a.data<float>(), b.data<float>(), a.nbytes())) << rows << " rows";
      ++runs;
    }
    EXPECT_EQ(testing::ProfiledCalls(fast, "ResidualMatMul"), runs);
    EXPECT_EQ(testing::ProfiledCalls(fast, "Add") + testing::ProfiledCalls(fast, "MatMul"), 0);  // no fallback ran
    // A broadcast addend ([1, N] against [rows, N]): the fallback's MatMul (the registry's: sums in
    // another order) and Add.
    std::map<std::string, Tensor> feeds = {{"x", RandomFloat({6, K}, 300)}, {"r", RandomFloat({1, N}, 301)}};
    const Tensor a = fast.Run(feeds)[0], b = plain.Run(feeds)[0];
    ASSERT_EQ(a.shape(), b.shape());
    const std::vector<double> av = a.ToDoubles(), bv = b.ToDoubles();
    for (size_t i = 0; i < av.size(); ++i) ASSERT_NEAR(av[i], bv[i], 1e-4) << i;
    EXPECT_EQ(testing::ProfiledCalls(fast, "Add"), 1);
  }
  EXPECT_EQ(Session(model(true, false, K, true), on).product_rewrites().residual_products, 0);   // a bias
  EXPECT_EQ(Session(model(false, true, K, true), on).product_rewrites().residual_products, 0);   // p an output
  EXPECT_EQ(Session(model(false, false, 16, true), on).product_rewrites().residual_products, 0);  // too small
}

// A residual Add after a product, then the RMSNorm of the sum as exporters write it (the sum also
// an output, as the residual stream goes on): the plan makes one ResidualMatMul with the norm as a
// second output, bit for bit the original graph's at every row count (the addend in the tasks up
// to 128 rows, one pass after the product past them), with and without the norm's weight, in the
// Div(1, s) then Mul and the Div(X, s) forms; no RMSNorm node or its fallback runs.
// y = r + x W (W [K, N]) and the RMSNorm of y as exporters write it (the sum also an output, as
// the residual stream goes on): with and without the norm's weight, in the Div(1, s) then Mul and
// the Div(X, s) forms; `constant_eps`: eps from a Constant node written after the Add, as
// torch.onnx.export places it.
Model ResidualNormModel(int64_t K, int64_t N, bool weighted, bool divide, bool constant_eps = false) {
  Graph g;
  g.inputs = {testing::FloatValue("x", {-1, K}), testing::FloatValue("r", {-1, N})};
  g.SetInitializer("w", RandomFloat({K, N}, 93, -0.1f, 0.1f));
  g.SetInitializer("two", Tensor::FromVector<float>({2.f}, {}));
  g.SetInitializer("one", Tensor::FromVector<float>({1.f}, {}));
  if (!constant_eps) g.SetInitializer("eps", Tensor::FromVector<float>({1e-6f}, {}));
  g.nodes.push_back(testing::MakeNode("MatMul", {"x", "w"}, {"p"}, "down_proj"));
  g.nodes.push_back(testing::MakeNode("Add", {"r", "p"}, {"y"}, "residual"));
  if (constant_eps) {
    g.nodes.push_back(testing::MakeNode("Constant", {}, {"eps"}, "eps_constant",
                                        {testing::TensorAttr("value", Tensor::FromVector<float>({1e-6f}, {}))}));
  }
  g.nodes.push_back(testing::MakeNode("Pow", {"y", "two"}, {"sq"}, "pow"));
  g.nodes.push_back(testing::MakeNode("ReduceMean", {"sq"}, {"m"}, "mean", {testing::IntsAttr("axes", {-1})}));
  g.nodes.push_back(testing::MakeNode("Add", {"m", "eps"}, {"v"}, "add_eps"));
  g.nodes.push_back(testing::MakeNode("Sqrt", {"v"}, {"s"}, "sqrt"));
  const std::string normed = weighted ? "n" : "z";
  if (divide) {
    g.nodes.push_back(testing::MakeNode("Div", {"y", "s"}, {normed}, "scale"));
  } else {
    g.nodes.push_back(testing::MakeNode("Div", {"one", "s"}, {"inv"}, "recip"));
    g.nodes.push_back(testing::MakeNode("Mul", {"y", "inv"}, {normed}, "scale"));
  }
  if (weighted) {
    std::vector<float> gamma(N);
    for (int64_t i = 0; i < N; ++i) gamma[i] = 0.5f + 0.002f * static_cast<float>(i);
    g.SetInitializer("gamma", Tensor::FromVector<float>(gamma, {N}));
    g.nodes.push_back(testing::MakeNode("Mul", {"gamma", "n"}, {"z"}, "weight"));
  }
  g.outputs = {ValueInfo{"z", DataType::kFloat}, ValueInfo{"y", DataType::kFloat}};
  return testing::MakeModel(std::move(g), 17);
}

// Runs both sessions on x [rows, K] and r [rows, N] (seeded by `seed` and the row count) for each
// row count and expects the same bits in each of their two outputs; the runs made.
int ExpectSameBitsPerRowCount(Session& fast, Session& plain, int64_t K, int64_t N,
                              std::initializer_list<int64_t> row_counts, uint32_t seed, const std::string& what) {
  int runs = 0;
  for (int64_t rows : row_counts) {
    std::map<std::string, Tensor> feeds = {{"x", RandomFloat({rows, K}, seed + rows)},
                                           {"r", RandomFloat({rows, N}, seed + 100 + rows, -2.f, 2.f)}};
    const std::vector<Tensor> a = fast.Run(feeds), b = plain.Run(feeds);
    EXPECT_EQ(a.size(), 2u) << what;
    for (size_t o = 0; o < 2 && o < a.size(); ++o) {
      EXPECT_EQ(a[o].shape(), b[o].shape()) << what;
      if (a[o].shape() == b[o].shape())
        EXPECT_EQ(0, std::memcmp(a[o].data<float>(), b[o].data<float>(), a[o].nbytes()))
            << what << ", " << rows << " rows, output " << o;
    }
    ++runs;
  }
  return runs;
}

TEST(PanelGemm, ResidualAddAndItsRMSNormRunInTheProductsNode) {
  const int64_t K = 512, N = 520;
  auto model = [&](bool weighted, bool divide, bool constant_eps = false) {
    return ResidualNormModel(K, N, weighted, divide, constant_eps);
  };
  for (bool weighted : {true, false})
    for (bool divide : {false, true})
      for (bool constant_eps : {false, true}) {
      // With eps a Constant node, also without folding the session's constants: the node runs in
      // the plan's order, moved before the product that now reads it.
      SessionOptions on{.profile = true}, off;
      off.rewrite_products = false;  // the prepared MatMul, the Add, the norm's operators
      if (constant_eps) on.fold_shapes = off.fold_shapes = false;
      const std::string what = std::string(weighted ? "weighted" : "unweighted") + (divide ? ", Div(X, s)" : ", Mul") +
                               (constant_eps ? ", eps a Constant node" : "");
      const Model m = model(weighted, divide, constant_eps);
      Session fast(m, on), plain(m, off);
      ASSERT_EQ(fast.product_rewrites().residual_products, 1) << what;
      ASSERT_EQ(fast.product_rewrites().residual_norms, 1) << what;
      const int runs = ExpectSameBitsPerRowCount(fast, plain, K, N, {1, 3, 128, 129, 300}, 400, what);
      EXPECT_EQ(testing::ProfiledCalls(fast, "ResidualMatMul"), runs) << what;
      EXPECT_EQ(testing::ProfiledCalls(fast, "RMSNorm") + testing::ProfiledCalls(fast, "ReduceMean") +
                    testing::ProfiledCalls(fast, "Add"),
                0)
          << what;  // no fallback ran
    }
}

// With float16 weight storage (--half-weights: the session's kernels given per node) the residual
// Add and its RMSNorm fold into the product's node too: bit for bit the float16 MatMul, the Add and
// the norm's operators, for decode rows on the float16 panels, a kDecode session's prompt rows on
// the float32 ones, and an addend that broadcasts (the float16 product, then the fallback past it:
// no float32 MatMul runs).
TEST(HalfPanelGemm, ResidualAddAndItsRMSNormRunInTheFloat16ProductsNode) {
  const int64_t K = 512, N = 520;
  for (HalfWeights mode : {HalfWeights::kAll, HalfWeights::kDecode})
    for (bool weighted : {true, false}) {
      const std::string what = std::string(mode == HalfWeights::kAll ? "every product" : "decode rows") +
                               (weighted ? ", weighted" : ", unweighted");
      SessionOptions on{.profile = true}, off;
      UseHalfWeights(on, mode);
      UseHalfWeights(off, mode);
      off.rewrite_products = false;  // the float16 MatMul, the Add, the norm's operators
      const Model m = ResidualNormModel(K, N, weighted, /*divide=*/false);
      Session fast(m, on), plain(m, off);
      ASSERT_EQ(fast.product_rewrites().residual_products, 1) << what;
      ASSERT_EQ(fast.product_rewrites().residual_norms, 1) << what;
      const int runs = ExpectSameBitsPerRowCount(fast, plain, K, N, {1, 3, 4, 5, 129}, 700, what);
      EXPECT_EQ(testing::ProfiledCalls(fast, "ResidualMatMul"), runs) << what;
      EXPECT_EQ(testing::ProfiledCalls(fast, "MatMul") + testing::ProfiledCalls(fast, "Add"), 0) << what;
      // A broadcast addend at 2 rows: the float16 product, then the Add and the norm.
      std::map<std::string, Tensor> feeds = {{"x", RandomFloat({2, K}, 900)}, {"r", RandomFloat({1, N}, 901)}};
      const std::vector<Tensor> a = fast.Run(feeds), b = plain.Run(feeds);
      for (size_t o = 0; o < 2; ++o) {
        ASSERT_EQ(a[o].shape(), b[o].shape()) << what;
        EXPECT_EQ(0, std::memcmp(a[o].data<float>(), b[o].data<float>(), a[o].nbytes())) << what << ", broadcast, output " << o;
      }
      EXPECT_EQ(testing::ProfiledCalls(fast, "Add"), 1) << what;
      EXPECT_EQ(testing::ProfiledCalls(fast, "MatMul"), 0) << what;
      // No rows and a broadcast addend: empty results, as the unfolded session's.
      feeds = {{"x", Tensor::Uninitialized(DataType::kFloat, {0, K})}, {"r", RandomFloat({1, N}, 902)}};
      const std::vector<Tensor> e = fast.Run(feeds), f = plain.Run(feeds);
      ASSERT_EQ(e.size(), 2u);
      for (size_t o = 0; o < 2; ++o) EXPECT_EQ(e[o].shape(), f[o].shape()) << what << ", no rows, output " << o;
    }
}

TEST(PanelGemm, GatedMlpRunsAsOneGatedMatMul) {
  const int64_t K = 512, F = 520;
  static_assert(512 * 520 >= kPackedMatMulMinWeight);  // both weights prepared
  SessionOptions on{.profile = true}, off;
  off.rewrite_products = false;
  off.prepared_kernels = false;
  for (bool up_out : {false, true}) {
    Model m = testing::GatedMlp(K, F, up_out);
    Session fast(m, on), plain(m, off);
    EXPECT_EQ(fast.product_rewrites().gated_products, up_out ? 0 : 1);
    EXPECT_EQ(fast.product_rewrites().silu_gates, 1);
    int runs = 0;
    for (int64_t rows : {1, 2, 5, 128, 129}) {
      std::map<std::string, Tensor> feeds = {{"x", RandomFloat({rows, K}, 60 + rows)}};
      const std::vector<Tensor> a = fast.Run(feeds), b = plain.Run(feeds);
      ASSERT_EQ(a.size(), b.size());
      for (size_t i = 0; i < a.size(); ++i) {
        ASSERT_EQ(a[i].shape(), b[i].shape());
        const std::vector<double> x = a[i].ToDoubles(), y = b[i].ToDoubles();
        double worst = 0;
        for (size_t j = 0; j < x.size(); ++j) worst = std::max(worst, std::abs(x[j] - y[j]));
        EXPECT_LT(worst, 1e-4) << rows << " rows, output " << i << (up_out ? ", up an output" : "");
      }
      ++runs;
    }
    EXPECT_EQ(testing::ProfiledCalls(fast, "GatedMatMul"), up_out ? 0 : runs);
    EXPECT_EQ(testing::ProfiledCalls(fast, "SiLUGate"), up_out ? runs : 0);
    EXPECT_EQ(testing::ProfiledCalls(fast, "SiblingMatMul"), up_out ? runs : 0);
    EXPECT_EQ(testing::ProfiledCalls(fast, "Sigmoid"), 0);  // no fallback ran
  }
  // Weights too small to pack: the registry's GatedMatMul (the sibling products as given, then the
  // gate), with no fallback either.
  Model small = testing::GatedMlp(16, 40, false);
  Session fast(small, on), plain(small, off);
  ASSERT_EQ(fast.product_rewrites().gated_products, 1);
  for (int64_t rows : {1, 3, 9}) {
    std::map<std::string, Tensor> feeds = {{"x", RandomFloat({rows, 16}, 70 + rows)}};
    const std::vector<double> x = fast.Run(feeds)[0].ToDoubles(), y = plain.Run(feeds)[0].ToDoubles();
    ASSERT_EQ(x.size(), y.size());
    for (size_t j = 0; j < x.size(); ++j) EXPECT_NEAR(x[j], y[j], 1e-5) << rows << " rows, " << j;
  }
  EXPECT_EQ(testing::ProfiledCalls(fast, "GatedMatMul"), 3);
  EXPECT_EQ(testing::ProfiledCalls(fast, "SiblingMatMul") + testing::ProfiledCalls(fast, "SiLUGate"), 0);
}

}  // namespace
}  // namespace gaf
