#include <gtest/gtest.h>

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

}  // namespace
}  // namespace gaf
