// The static memory plan (ir/memory_plan.h): the second run of a sequence takes its buffers from
// the arena; buffers alive together never share memory; a tensor kept past its run keeps its
// contents while later runs go on; a grown request re-plans; runs that never repeat stop the plan;
// a session's results are the same with and without it.
#include <gtest/gtest.h>

#include <random>

#include "ir/memory_plan.h"
#include "ir/sanitizer.h"
#include "runtime/session.h"
#include "test_util.h"

namespace gaf {
namespace {

// One run: allocates tensors of the given element counts in order, each freed `life` allocations
// later (the last ones at the end of the run), filling each with its index and checking, before
// freeing it, that nothing overwrote it. Returns the tensors listed in `keep` (alive afterwards).
std::vector<Tensor> FakeRun(MemoryPlan* plan, const std::vector<int64_t>& sizes, size_t life,
                            const std::vector<size_t>& keep = {}) {
  std::vector<Tensor> kept;
  MemoryPlan::Scope scope(plan);
  std::vector<std::pair<size_t, Tensor>> alive;
  auto check_and_drop = [&](size_t i) {
    const Tensor& t = alive[i].second;
    for (int64_t e = 0; e < t.numel(); ++e)
      ASSERT_EQ(t.data<float>()[e], static_cast<float>(alive[i].first)) << "tensor " << alive[i].first << " element " << e;
    alive.erase(alive.begin() + static_cast<std::ptrdiff_t>(i));
  };
  for (size_t k = 0; k < sizes.size(); ++k) {
    Tensor t = Tensor::Uninitialized(DataType::kFloat, {sizes[k]});
    std::fill(t.data<float>(), t.data<float>() + t.numel(), static_cast<float>(k));
    if (std::find(keep.begin(), keep.end(), k) != keep.end()) kept.push_back(t);
    alive.emplace_back(k, t);
    if (alive.size() > life) check_and_drop(0);
  }
  while (!alive.empty()) check_and_drop(0);
  return kept;
}

TEST(MemoryPlan, LaterRunsTakeTheirBuffersFromTheArena) {
  MemoryPlan plan;
  const std::vector<int64_t> sizes = {1000, 20, 5000, 300, 300, 70000, 16, 1000, 4096};
  FakeRun(&plan, sizes, 2);  // the first run: the allocator's, nothing recorded
  EXPECT_EQ(plan.stats().plans, 0);
  EXPECT_EQ(plan.stats().last_served, 0);
  FakeRun(&plan, sizes, 2);  // records
  MemoryPlanStats s = plan.stats();
  EXPECT_EQ(s.plans, 1);
  EXPECT_EQ(s.last_served, 0);  // the recording run: the allocator's
  EXPECT_EQ(s.planned, static_cast<int64_t>(sizes.size()));
  // Three alive at a time: the arena is far smaller than the sum of all.
  int64_t all = 0;
  for (int64_t n : sizes) all += n * 4;
  EXPECT_LT(s.arena_bytes, all);
  for (int run = 0; run < 3; ++run) {
    FakeRun(&plan, sizes, 2);
    s = plan.stats();
    EXPECT_EQ(s.last_served, static_cast<int64_t>(sizes.size())) << "run " << run;
    EXPECT_EQ(s.plans, 1);
  }
}

TEST(MemoryPlan, KeptTensorsKeepTheirContentsAndRandomLifetimesNeverShareMemory) {
  std::mt19937 rng(7);
  std::vector<int64_t> sizes;
  for (int i = 0; i < 60; ++i) sizes.push_back(1 + static_cast<int64_t>(rng() % 20000));
  for (size_t life : {1u, 3u, 9u}) {
    MemoryPlan plan;
    FakeRun(&plan, sizes, life);  // the allocator's
    FakeRun(&plan, sizes, life);  // records
    // Tensors kept from a served run: the next runs must not write into them.
    std::vector<Tensor> kept = FakeRun(&plan, sizes, life, {0, 7, 33, 59});
    ASSERT_EQ(kept.size(), 4u);
    // The kept ones hold their arena (and took slots later buffers of that run were planned in:
    // those came from the allocator, so the next run records again); the runs after take a fresh
    // arena, whole.
    for (int run = 0; run < 3; ++run) {
      FakeRun(&plan, sizes, life);
      if (run > 0)
        EXPECT_EQ(plan.stats().last_served, static_cast<int64_t>(sizes.size())) << "life " << life << " run " << run;
    }
    const size_t ids[] = {0, 7, 33, 59};
    for (size_t i = 0; i < kept.size(); ++i)
      for (int64_t e = 0; e < kept[i].numel(); ++e)
        ASSERT_EQ(kept[i].data<float>()[e], static_cast<float>(ids[i])) << "life " << life << " kept " << ids[i];
  }
}

TEST(MemoryPlan, AGrownRequestReplansAndRunsThatNeverRepeatStopIt) {
  MemoryPlan plan;
  std::vector<int64_t> sizes = {100, 200, 100};
  FakeRun(&plan, sizes, 1);
  FakeRun(&plan, sizes, 1);
  FakeRun(&plan, sizes, 1);
  EXPECT_EQ(plan.stats().last_served, 3);
  sizes[1] = 400;  // past the slot's headroom: served by the allocator, re-planned next run
  FakeRun(&plan, sizes, 1);
  EXPECT_EQ(plan.stats().last_served, 2);
  FakeRun(&plan, sizes, 1);  // records
  EXPECT_EQ(plan.stats().plans, 2);
  FakeRun(&plan, sizes, 1);
  EXPECT_EQ(plan.stats().last_served, 3);
  sizes[1] = 410;  // within the headroom: no new plan
  FakeRun(&plan, sizes, 1);
  EXPECT_EQ(plan.stats().last_served, 3);
  EXPECT_EQ(plan.stats().plans, 2);

  MemoryPlan wild;
  int64_t n = 100;
  for (int run = 0; run < 2 * MemoryPlan::kMaxReplans + 4; ++run) FakeRun(&wild, {n *= 2, 10}, 1);
  EXPECT_TRUE(wild.stats().stopped);
  EXPECT_LE(wild.stats().plans, MemoryPlan::kMaxReplans + 1);
  EXPECT_EQ(wild.stats().last_served, 0);
}

TEST(MemoryPlan, RunsOfMoreBuffersThanItPlansKeepThePlan) {
  MemoryPlan plan;
  const std::vector<int64_t> sizes(MemoryPlan::kMaxRequests + 50, 16);
  for (int run = 0; run < 5; ++run) FakeRun(&plan, sizes, 1);
  EXPECT_FALSE(plan.stats().stopped);
  EXPECT_EQ(plan.stats().plans, 1);
  EXPECT_EQ(plan.stats().last_served, static_cast<int64_t>(MemoryPlan::kMaxRequests));
}

#if GAF_ASAN
// Under AddressSanitizer an arena slot no tensor holds is poisoned: reading a freed tensor's
// buffer is reported as it is for the allocator's buffers.
TEST(MemoryPlanDeathTest, AFreedArenaBufferIsPoisonedUnderAddressSanitizer) {
  MemoryPlan plan;
  FakeRun(&plan, {100, 100}, 1);  // the allocator's
  FakeRun(&plan, {100, 100}, 1);  // records
  EXPECT_DEATH(
      {
        const float* p = nullptr;
        {
          MemoryPlan::Scope scope(&plan);
          Tensor t = Tensor::Uninitialized(DataType::kFloat, {100});
          if (plan.stats().runs == 3) p = t.data<float>();
        }
        volatile float x = p[0];
        (void)x;
      },
      "use-after-poison");
}
#endif

TEST(MemoryPlan, SessionResultsAreTheSameWithAndWithoutIt) {
  // x -> Relu -> Mul(x) -> Add(x) -> Sigmoid: intermediates freed within the run.
  Graph g;
  g.inputs = {testing::FloatValue("x", {-1, 64})};
  g.nodes.push_back(testing::MakeNode("Relu", {"x"}, {"a"}, "relu"));
  g.nodes.push_back(testing::MakeNode("Mul", {"a", "x"}, {"b"}, "mul"));
  g.nodes.push_back(testing::MakeNode("Add", {"b", "x"}, {"c"}, "add"));
  g.nodes.push_back(testing::MakeNode("Sigmoid", {"c"}, {"y"}, "sigmoid"));
  g.outputs = {ValueInfo{"y", DataType::kFloat}};
  Model m = testing::MakeModel(std::move(g));
  // Without the plan rewrites, which would run the four operators as one ElementwiseChain.
  SessionOptions on, off;
  on.rewrite_products = off.rewrite_products = false;
  off.memory_plan = false;
  Session planned(m, on), plain(m, off);
  std::vector<Tensor> kept;
  int64_t served = 0;  // the most buffers a run took from the arena
  for (int64_t rows : {3, 3, 3, 5, 5, 5, 2, 300, 300}) {
    std::map<std::string, Tensor> feeds = {{"x", testing::RandomFloat({rows, 64}, static_cast<uint32_t>(rows))}};
    std::vector<Tensor> a = planned.Run(feeds), b = plain.Run(feeds);
    ASSERT_EQ(a[0].ToDoubles(), b[0].ToDoubles()) << rows << " rows";
    served = std::max(served, planned.memory_plan_stats().last_served);
    kept.push_back(a[0]);
  }
  EXPECT_EQ(served, 3);  // Relu's, Mul's and Add's outputs; the output is the caller's
  EXPECT_EQ(plain.memory_plan_stats().runs, 0);
  // The outputs returned earlier are intact.
  size_t i = 0;
  for (int64_t rows : {3, 3, 3, 5, 5, 5, 2, 300, 300}) {
    std::map<std::string, Tensor> feeds = {{"x", testing::RandomFloat({rows, 64}, static_cast<uint32_t>(rows))}};
    ASSERT_EQ(kept[i++].ToDoubles(), plain.Run(feeds)[0].ToDoubles()) << rows << " rows";
  }
}

}  // namespace
}  // namespace gaf
