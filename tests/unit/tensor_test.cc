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
