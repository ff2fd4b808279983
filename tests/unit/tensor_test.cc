#include <gtest/gtest.h>

#include <algorithm>

#include "ir/tensor.h"

namespace gaf {
namespace {

TEST(Tensor, HalfRoundTrip) {
  for (float f : {0.0f, 1.0f, -2.5f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f, 0.333251953125f}) {
    EXPECT_EQ(HalfToFloat(FloatToHalf(f)), f) << f;
  }
  EXPECT_TRUE(std::isinf(HalfToFloat(FloatToHalf(1e6f))));
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(NAN))));
  // 1 + 2^-11 lies halfway between two halves: ties round to even (1.0).
  EXPECT_EQ(HalfToFloat(FloatToHalf(1.0f + 0.00048828125f)), 1.0f);
}

TEST(Tensor, BFloat16RoundTrip) {
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(1.5f)), 1.5f);
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(-3.0f)), -3.0f);
}

TEST(Tensor, ReshapeSharesBufferAndCloneCopies) {
  Tensor t = Tensor::FromVector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor r = t.Reshaped({3, 2});
  EXPECT_EQ(r.raw(), t.raw());
  Tensor c = t.Clone();
  EXPECT_NE(c.raw(), t.raw());
  c.data<float>()[0] = 42;
  EXPECT_EQ(t.data<float>()[0], 1);
  EXPECT_THROW(t.Reshaped({4, 2}), Error);
}

// Key/value caches with room (Tensor::WithCacheRoom): rows appended in place are claimed once,
// a padded cache refuses contiguous access, Dense() gives its values in order, a reshape or a
// single head is a plain tensor.
TEST(Tensor, CachesWithRoomAppendOnceAndCopyWhenPadded) {
  Tensor c = Tensor::WithCacheRoom(DataType::kFloat, {1, 2, 3, 4}, 5);
  EXPECT_TRUE(c.padded());
  EXPECT_EQ(c.head_stride(), 20);
  EXPECT_THROW(c.data<float>(), Error);
  EXPECT_THROW(c.raw(), Error);
  float* base = c.cache_data<float>();
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 12; ++i) base[h * 20 + i] = static_cast<float>(100 * h + i);
  Tensor more = c.AppendInPlace(2);
  ASSERT_TRUE(more.defined());
  EXPECT_EQ(more.shape(), (Shape{1, 2, 5, 4}));
  EXPECT_FALSE(more.padded());  // all the room taken: contiguous again
  EXPECT_EQ(more.cache_data<float>(), base);
  EXPECT_FALSE(c.AppendInPlace(1).defined());     // its next rows belong to `more` now
  EXPECT_FALSE(more.AppendInPlace(1).defined());  // no room left
  const Tensor d = c.Dense();
  EXPECT_FALSE(d.padded());
  ASSERT_EQ(d.shape(), (Shape{1, 2, 3, 4}));
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 12; ++i) EXPECT_EQ(d.data<float>()[h * 12 + i], static_cast<float>(100 * h + i));
  EXPECT_THROW(c.Reshaped({2, 12}), Error);
  // One head: contiguous whatever the room; a reshape of it is a plain tensor.
  Tensor one = Tensor::WithCacheRoom(DataType::kFloat, {1, 1, 3, 4}, 8);
  EXPECT_FALSE(one.padded());
  EXPECT_NO_THROW(one.data<float>());
  const Tensor flat = one.Reshaped({12});
  EXPECT_FALSE(flat.padded());
  EXPECT_FALSE(flat.AppendInPlace(1).defined());
  EXPECT_TRUE(one.AppendInPlace(5).defined());
}

// A cache with room of 64 KiB or more takes whole 2 MiB huge pages: its capacity is rounded up to
// fill them (a decode step's appends then land in pages already there); a smaller one keeps the
// room it asked for, and rows appended into the rounded room keep the heads' values.
TEST(Tensor, CacheRoomFillsWholeHugePages) {
  constexpr int64_t kHuge = int64_t{2} << 20;
  // 16 heads of 64 floats: 4 KiB a row of every head; 81 rows asked (324 KiB) -> 512 rows (2 MiB).
  Tensor c = Tensor::WithCacheRoom(DataType::kFloat, {1, 16, 17, 64}, 81);
  EXPECT_EQ(c.cache_capacity(), 512);
  EXPECT_EQ(c.head_stride(), 512 * 64);
  // 4 heads of 64: 1 KiB a row; 3000 rows asked (about 2.9 MiB) -> 4096 rows (4 MiB, two pages).
  Tensor big = Tensor::WithCacheRoom(DataType::kFloat, {1, 4, 2000, 64}, 3000);
  EXPECT_EQ(big.cache_capacity() * 4 * 64 * 4 % kHuge, 0);
  EXPECT_EQ(big.cache_capacity(), 4096);
  // Below 64 KiB (2 heads of 4 floats, 9 rows): the room as asked.
  EXPECT_EQ(Tensor::WithCacheRoom(DataType::kFloat, {1, 2, 3, 4}, 9).cache_capacity(), 9);
  // float16 rows are half as wide: twice the rows in the same page.
  EXPECT_EQ(Tensor::WithCacheRoom(DataType::kFloat16, {1, 16, 17, 64}, 81).cache_capacity(), 1024);
  // Appends into the rounded room: in place, the earlier rows of each head where they were.
  float* base = c.cache_data<float>();
  for (int h = 0; h < 16; ++h)
    for (int i = 0; i < 17 * 64; ++i) base[h * 512 * 64 + i] = static_cast<float>(h * 10000 + i);
  Tensor more = c.AppendInPlace(400);
  ASSERT_TRUE(more.defined());
  EXPECT_EQ(more.cache_data<float>(), base);
  EXPECT_EQ(more.shape(), (Shape{1, 16, 417, 64}));
  const Tensor d = c.Dense();
  for (int h = 0; h < 16; ++h) EXPECT_EQ(d.data<float>()[h * 17 * 64 + 5], static_cast<float>(h * 10000 + 5));
}

TEST(Tensor, CastAndAccessChecks) {
  Tensor t = Tensor::FromVector<int64_t>({1, -2, 3}, {3});
  Tensor f = t.CastTo(DataType::kFloat);
  EXPECT_EQ(f.data<float>()[1], -2.0f);
  EXPECT_THROW(t.data<float>(), Error);
  EXPECT_EQ(t.ToInt64s(), (std::vector<int64_t>{1, -2, 3}));
}

// Large buffers are recycled by size class while reuse is on: the freed buffer comes back for the
// next tensor of its class, and a zero-filled tensor that gets a used buffer is zeros.
TEST(Tensor, LargeBuffersAreReusedWhileReuseIsOn) {
  const Shape shape{1 << 16};  // 256 KiB: pooled
  void* first = nullptr;
  {
    Tensor t = Tensor::Uninitialized(DataType::kFloat, shape);
    std::fill(t.data<float>(), t.data<float>() + t.numel(), 3.f);
    first = t.raw();
  }
  {
    Tensor z(DataType::kFloat, {(1 << 16) - 5});  // same class
    ASSERT_EQ(z.raw(), first);
    for (int64_t k = 0; k < z.numel(); ++k) ASSERT_EQ(z.data<float>()[k], 0.f) << k;
  }
  SetBufferReuse(false);  // the cached buffers are freed; a round trip leaves the pool working
  { Tensor t = Tensor::Uninitialized(DataType::kFloat, shape); }
  SetBufferReuse(true);
  Tensor a = Tensor::Uninitialized(DataType::kFloat, shape);
  void* p = a.raw();
  a = Tensor();
  EXPECT_EQ(Tensor::Uninitialized(DataType::kFloat, shape).raw(), p);
}

}  // namespace
}  // namespace gaf
