// ops/task_team.h: a team of threads held for a whole run (decode steps), its tasks, its errors,
// and the session runs it leads.
#include "ops/task_team.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <chrono>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "ops/kernel_util.h"
#include "ops/gemm.h"  // kPackedMatMulMinWeight
#include "ops/gemv.h"
#include "runtime/session.h"
#include "test_util.h"

namespace gaf {
namespace {

using testing::MakeNode;
using testing::RandomFloat;

// A team of two threads needs two cores (TaskTeam::Run runs body alone otherwise).
#define NEED_TWO_CORES() \
  if (omp_get_num_procs() < 2) GTEST_SKIP() << "one core: no team"

TEST(TaskTeam, ForEachRunsEveryTaskOnceAndTellsEachItsThreadsNext) {
  NEED_TWO_CORES();
  for (bool ahead : {false, true}) {
    const int64_t n = 2000;
    std::vector<std::atomic<int>> runs(n);
    std::vector<int64_t> next_of(n, -2);
    std::atomic<int> threads_seen{0}, bad_next{0};
    bool active_in_body = false, active_in_task = false;
    TaskTeam::Run(2, [&] {
      TaskTeam* team = TaskTeam::Active();
      active_in_body = team != nullptr;
      ASSERT_NE(team, nullptr);
      std::vector<std::atomic<int>> per_thread(team->threads());
      for (int call = 0; call < 50; ++call) {  // many calls: each a job of its own
        team->ForEach(n / 50, [&](int64_t t, int64_t next) {
          const int64_t i = call * (n / 50) + t;
          runs[i].fetch_add(1);
          next_of[i] = next;
          if (ahead ? (next != -1 && next <= t) : next != -1) bad_next.fetch_add(1);
          per_thread[omp_get_thread_num()].fetch_add(1);
          volatile double spin = 0;  // a few microseconds of work, so both threads take some
          for (int k = 0; k < 2000; ++k) spin = spin + k;
          if (omp_get_thread_num() == 0 && TaskTeam::Active() != nullptr) active_in_task = true;
        }, ahead);
      }
      for (auto& c : per_thread) threads_seen += c.load() > 0;
    });
    EXPECT_TRUE(active_in_body);
    EXPECT_FALSE(active_in_task) << "a task's nested parallel loops must run inline";
    EXPECT_EQ(TaskTeam::Active(), nullptr) << "no team after Run";
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(runs[i].load(), 1) << "task " << i << (ahead ? " (ahead)" : "");
    EXPECT_EQ(bad_next.load(), 0);
    // The tasks are shared (both threads took some) where the runtime gave two threads.
    EXPECT_EQ(threads_seen.load(), 2);
  }
}

TEST(TaskTeam, ParallelForInsideARunCoversTheRangeOnce) {
  std::vector<std::atomic<int>> hits(10000);
  TaskTeam::Run(2, [&] {
    ParallelFor(10000, 16, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
    });
  });
  for (auto& h : hits) ASSERT_EQ(h.load(), 1);
}

TEST(TaskTeam, ALeadersExceptionEndsTheJobAndLeavesRun) {
  NEED_TWO_CORES();
  std::atomic<int> ran{0};
  bool thrown = false;
  EXPECT_THROW(TaskTeam::Run(2,
                             [&] {
                               TaskTeam::Active()->ForEach(1000, [&](int64_t, int64_t) {
                                 ran.fetch_add(1);
                                 if (omp_get_thread_num() == 0 && !thrown) {
                                   thrown = true;
                                   throw std::runtime_error("task failed");
                                 }
                               });
                             }),
               std::runtime_error);
  EXPECT_TRUE(thrown);
  EXPECT_GE(ran.load(), 1);
  // The team is closed: a later team runs.
  int later = 0;
  TaskTeam::Run(2, [&] { TaskTeam::Active()->ForEach(10, [&](int64_t, int64_t) {}); later = 1; });
  EXPECT_EQ(later, 1);
}

TEST(TaskTeam, OneThreadMoreThreadsThanCoresOrANestedRunHasNoTeam) {
  bool one = true, many = true, nested = true;
  TaskTeam::Run(1, [&] { one = TaskTeam::Active() != nullptr; });
  EXPECT_FALSE(one);
  TaskTeam::Run(omp_get_num_procs() + 1, [&] { many = TaskTeam::Active() != nullptr; });
  EXPECT_FALSE(many);
#pragma omp parallel num_threads(2)
  {
    if (omp_get_thread_num() == 0) TaskTeam::Run(2, [&] { nested = TaskTeam::Active() != nullptr; });
  }
  EXPECT_FALSE(nested);
}

// A weight product announces what each thread reads first in it; the team remembers that as what
// follows the product announced before it, and a thread with no task of a product left prefetches
// what followed that product the last time. Without a ReadAhead nothing is learned or prefetched.
TEST(TaskTeam, ReadAheadLearnsWhatFollowsEachProductAndPrefetchesIt) {
  NEED_TWO_CORES();
  constexpr int64_t kBytes = 16 << 10;  // of each of 2 streams; under any L2's budget (64 KiB and up)
  std::vector<char> a(1 << 20), b(1 << 20);
  // The leader (rank 0) reads nothing ahead here, so the bytes counted are the other thread's.
  auto reads_of = [](const std::vector<char>& v, FirstReads* r) {
    r[1].streams = 2;
    r[1].bytes = kBytes;
    r[1].p[0] = v.data();
    r[1].p[1] = v.data() + (1 << 19);
  };
  FirstReads ra_a[2], ra_b[2];
  reads_of(a, ra_a);
  reads_of(b, ra_b);
  for (bool with : {true, false}) {
    ReadAhead learned;
    int64_t after_first_round = -1, at_end = -1, expected = 0;
    TaskTeam::Run(
        2,
        [&] {
          TaskTeam* team = TaskTeam::Active();
          ASSERT_NE(team, nullptr);
          for (int round = 0; round < 2; ++round) {
            for (const FirstReads* r : {ra_a, ra_b}) {
              team->Announce(r == ra_a ? a.data() : b.data(), r, 2);
              std::atomic<bool> worker{false};
              // Tasks long enough for the other thread to join the job.
              team->ForEach(8, [&](int64_t, int64_t) {
                if (omp_get_thread_num() != 0) worker = true;
                std::this_thread::sleep_for(std::chrono::milliseconds(1));
              });
              // One-thread work after the product: the other thread reads ahead meanwhile (up to
              // 2 s for a thread the host does not schedule at once).
              if (with && round == 1 && worker.load()) expected += 2 * kBytes;
              const auto t0 = std::chrono::steady_clock::now();
              while (team->read_ahead_bytes() < expected && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2))
                std::this_thread::sleep_for(std::chrono::milliseconds(1));
            }
            if (round == 0) after_first_round = team->read_ahead_bytes();
          }
          at_end = team->read_ahead_bytes();
        },
        with ? &learned : nullptr);
    if (!with) {
      EXPECT_EQ(at_end, 0) << "no ReadAhead: nothing prefetched";
      continue;
    }
    EXPECT_EQ(after_first_round, 0) << "the first round has nothing learned to read ahead";
    EXPECT_EQ(learned.size(), 2u) << "a -> b and b -> a";
    // In the second round the other thread read ahead its whole share of what came next (b after
    // a, a after b) after each job it took part in.
    if (expected == 0) GTEST_SKIP() << "the other thread took no task of the second round (a busy host)";
    EXPECT_GE(at_end, expected);
  }
}

// Runs a session leads by a team learn the order of their weight products (two products here, so
// each has one after it, the second's being the first of the next run), and read ahead without
// changing a bit of the results.
TEST(TaskTeam, SessionRunsLearnTheirProductsOrderWithTheSameBits) {
  NEED_TWO_CORES();
  const int64_t K = 512, N = 512;
  static_assert(K * N >= kPackedMatMulMinWeight);  // both weights are prepared (panels)
  Graph g;
  g.inputs = {testing::FloatValue("x", {-1, K})};
  g.SetInitializer("w1", RandomFloat({K, N}, 31, -0.1f, 0.1f));
  g.SetInitializer("w2", RandomFloat({N, N}, 32, -0.1f, 0.1f));
  g.nodes.push_back(MakeNode("MatMul", {"x", "w1"}, {"h"}, "first"));
  g.nodes.push_back(MakeNode("MatMul", {"h", "w2"}, {"y"}, "second"));
  g.outputs = {ValueInfo{"y", DataType::kFloat}};
  Model m = testing::MakeModel(std::move(g));
  SessionOptions with{.num_threads = 2}, without{.num_threads = 2};
  without.read_ahead = false;
  Session ahead(m, with), plain(m, without);
  const Tensor x = RandomFloat({1, K}, 33);
  for (int run = 0; run < 4; ++run) {
    const Tensor y1 = ahead.Run({{"x", x}}, {})[0], y2 = plain.Run({{"x", x}}, {})[0];
    ASSERT_EQ(y1.numel(), y2.numel());
    for (int64_t i = 0; i < y1.numel(); ++i) ASSERT_EQ(y1.data<float>()[i], y2.data<float>()[i]) << "run " << run;
  }
  EXPECT_TRUE(ahead.last_run_had_team());
  EXPECT_EQ(ahead.read_ahead_entries(), 2u);
  EXPECT_EQ(plain.read_ahead_entries(), 0u);
}

// A SwiGLU MLP whose weights are packed (its products run on the panels): a decode step's run of
// one or two rows is led by a team from the second run of its shapes on; a prompt's (64 rows) never.
// The results are the bits of a session without teams.
TEST(TaskTeam, SessionLeadsRunsOfFewRowsFromTheSecondOnWithTheSameBits) {
  const int64_t K = 512, F = 520;
  Model m = testing::GatedMlp(K, F, false);
  SessionOptions with{.num_threads = 2}, without{.num_threads = 2};
  without.task_team = false;
  Session led(m, with), plain(m, without);
  for (int64_t rows : {1, 2, 64}) {
    const Tensor x = RandomFloat({rows, K}, 7 + static_cast<uint32_t>(rows));
    for (int run = 0; run < 3; ++run) {
      const Tensor a = led.Run({{"x", x}}, {})[0], b = plain.Run({{"x", x}}, {})[0];
      const bool expected = omp_get_num_procs() >= 2 && rows <= Session::kTeamMaxRows && run > 0;
      EXPECT_EQ(led.last_run_had_team(), expected) << rows << " rows, run " << run;
      EXPECT_FALSE(plain.last_run_had_team());
      ASSERT_EQ(a.numel(), b.numel());
      for (int64_t i = 0; i < a.numel(); ++i)
        ASSERT_EQ(a.data<float>()[i], b.data<float>()[i]) << rows << " rows, run " << run << ", element " << i;
    }
  }
}

// The GEMVs inside a team (a decode step's products by weights too small to pack) hand their tasks
// to the team's threads; each task's partial sums stay its own, so the bits are a call's outside.
TEST(TaskTeam, GemvsInsideATeamGiveTheBitsOfACallOutside) {
  NEED_TWO_CORES();
  const int64_t K = 1024, N0 = 300, N1 = 200;
  const Tensor x = RandomFloat({2, K}, 21), w0 = RandomFloat({K, N0}, 22), w1 = RandomFloat({K, N1}, 23);
  const Tensor wt = RandomFloat({N0, K}, 24);  // [N, K]: GemvRowsF32
  auto products = [&](std::vector<float>& out) {
    out.assign(2 * (N0 + N1) + N0, 0.f);
    const GemvOutput outs[] = {{w0.data<float>(), N0, out.data(), N0},
                               {w1.data<float>(), N1, out.data() + 2 * N0, N1}};
    GemvF32ManyRows(x.data<float>(), 2, K, outs, 2);
    GemvRowsF32(x.data<float>(), wt.data<float>(), K, out.data() + 2 * (N0 + N1), K, N0, 1.f, 0.f);
  };
  std::vector<float> alone, led;
  products(alone);
  TaskTeam::Run(2, [&] { products(led); });
  ASSERT_EQ(alone.size(), led.size());
  for (size_t i = 0; i < alone.size(); ++i) ASSERT_EQ(alone[i], led[i]) << "element " << i;
}

// ONNX's Attention op (opset 23) at a decode step's shape over a long past, inside a run led by a
// team: its tasks run on both threads, each with scratch of its own (they shared one slot when the
// kernel took "inside a parallel region" for "one thread"), and give the bits of a run without.
TEST(TaskTeam, AttentionOpInsideATeamKeepsEachThreadsScratchApart) {
  NEED_TWO_CORES();
  Graph g;
  g.inputs = {testing::FloatValue("Q", {1, -1, -1}), testing::FloatValue("K", {1, -1, -1}),
              testing::FloatValue("V", {1, -1, -1})};
  g.nodes.push_back(MakeNode("Attention", {"Q", "K", "V"}, {"Y"}, "attn",
                             {testing::IntAttr("q_num_heads", 16), testing::IntAttr("kv_num_heads", 8)}));
  g.outputs.push_back(ValueInfo{"Y", DataType::kFloat});
  Model m = testing::MakeModel(std::move(g), 23);
  SessionOptions o{.num_threads = 2};
  Session s(m, o);
  // 8 cache heads x 1 query x 2 heads x 1024 keys x 128: above the kernel's one-thread work.
  const Tensor q = RandomFloat({1, 1, 16 * 64}, 1), k = RandomFloat({1, 1024, 8 * 64}, 2),
               v = RandomFloat({1, 1024, 8 * 64}, 3);
  const Tensor alone = s.Run({{"Q", q}, {"K", k}, {"V", v}})[0];
  for (int rep = 0; rep < 20; ++rep) {
    Tensor led;
    TaskTeam::Run(2, [&] { led = s.Run({{"Q", q}, {"K", k}, {"V", v}})[0]; });
    ASSERT_EQ(led.numel(), alone.numel());
    for (int64_t i = 0; i < led.numel(); ++i)
      ASSERT_EQ(led.data<float>()[i], alone.data<float>()[i]) << "repeat " << rep << ", element " << i;
  }
}

// A convolution (oneDNN or the tiles' own region) in a run whose product takes 2 rows: inside a
// team it would run on one thread, so the session leads no such run by a team.
TEST(TaskTeam, RunsWithAConvolutionAreNotLedByATeam) {
  const int64_t C = 16, H = 16, K = C * H * H, N = 64;
  static_assert(K * N >= kPackedMatMulMinWeight);  // the product's weight is prepared (panels)
  Graph g;
  g.inputs = {testing::FloatValue("x", {-1, C, H, H})};
  g.SetInitializer("cw", RandomFloat({C, C, 3, 3}, 11, -0.1f, 0.1f));
  g.SetInitializer("shape", Tensor::FromVector<int64_t>({-1, K}, {2}));
  g.SetInitializer("w", RandomFloat({K, N}, 12, -0.1f, 0.1f));
  g.nodes.push_back(MakeNode("Conv", {"x", "cw"}, {"c"}, "conv", {testing::IntsAttr("pads", {1, 1, 1, 1})}));
  g.nodes.push_back(MakeNode("Reshape", {"c", "shape"}, {"f"}, "flatten"));
  g.nodes.push_back(MakeNode("MatMul", {"f", "w"}, {"y"}, "fc"));
  g.outputs = {ValueInfo{"y", DataType::kFloat}};
  Model m = testing::MakeModel(std::move(g));
  SessionOptions o{.num_threads = 2};
  Session s(m, o);
  const Tensor x = RandomFloat({2, C, H, H}, 13);
  for (int run = 0; run < 3; ++run) {
    s.Run({{"x", x}}, {});
    EXPECT_FALSE(s.last_run_had_team()) << "run " << run;
  }
}

}  // namespace
}  // namespace gaf
