// Matrix-vector products with a row-major weight (ops/gemv.h): float32 and float16 weights, one
// row and a few, against double precision, and the invariants the decode path relies on.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "ir/half.h"
#include "ops/gemv.h"
#include "test_util.h"

namespace gaf {
namespace {

using testing::RandomFloat;

// Worst |y - (x * w [+ y0])| over every element, the reference in double precision; w's rows ldw apart.
double WorstError(const float* x, const float* w, int64_t ldw, const std::vector<float>& y, int64_t M, int64_t K,
                  int64_t N, const std::vector<float>* y0 = nullptr) {
  double worst = 0;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double ref = y0 ? (*y0)[m * N + n] : 0.0;
      for (int64_t k = 0; k < K; ++k) ref += double(x[m * K + k]) * w[k * ldw + n];
      worst = std::max(worst, std::abs(ref - y[m * N + n]));
    }
  return worst;
}

template <class Fn>
void WithThreads(int threads, Fn&& fn) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  fn();
  omp_set_num_threads(saved);
}

// K around the kernel's step sizes (8-row steps, chunks of at least 96 rows, 4 chunks), N around
// the vector width and the column piece (8192), and large enough products to take the team.
const std::vector<std::pair<int64_t, int64_t>> kShapes = {
    {1, 1}, {7, 15}, {8, 16}, {9, 17}, {95, 33}, {96, 64}, {97, 100}, {389, 257}, {1000, 130}, {300, 8193}, {2051, 70}};

TEST(Gemv, Float32EqualsDoublePrecisionWithTailsAndAccumulate) {
  for (const auto& shape : kShapes) {
    const int64_t K = shape.first, N = shape.second;
    const int64_t ldw = N + 5;  // rows further apart than N
    const Tensor w = RandomFloat({K, ldw}, 3 + K, -0.5f, 0.5f), x = RandomFloat({1, K}, 7 + N);
    std::vector<float> y(N, -9.f);
    GemvF32(x.data<float>(), w.data<float>(), ldw, y.data(), K, N, false);
    EXPECT_LE(WorstError(x.data<float>(), w.data<float>(), ldw, y, 1, K, N), 1e-5 * std::sqrt(double(K)))
        << "K " << K << " N " << N;
    std::vector<float> y0(N);
    for (int64_t n = 0; n < N; ++n) y0[n] = 0.25f * float(n % 7);
    std::vector<float> acc = y0;
    GemvF32(x.data<float>(), w.data<float>(), ldw, acc.data(), K, N, true);
    EXPECT_LE(WorstError(x.data<float>(), w.data<float>(), ldw, acc, 1, K, N, &y0), 1e-5 * std::sqrt(double(K)))
        << "accumulate, K " << K << " N " << N;
  }
}

TEST(Gemv, ResultsDoNotDependOnTheThreadCount) {
  for (const auto& shape : kShapes) {
    const int64_t K = shape.first, N = shape.second;
    const Tensor w = RandomFloat({K, N}, 13 + K, -0.5f, 0.5f), x = RandomFloat({1, K}, 17 + N);
    std::vector<float> one(N), two(N);
    WithThreads(1, [&] { GemvF32(x.data<float>(), w.data<float>(), N, one.data(), K, N, false); });
    WithThreads(2, [&] { GemvF32(x.data<float>(), w.data<float>(), N, two.data(), K, N, false); });
    EXPECT_EQ(0, std::memcmp(one.data(), two.data(), sizeof(float) * N)) << "K " << K << " N " << N;
  }
}

TEST(Gemv, TransposedWeightRowsEqualDoublePrecisionWithAlphaAndBeta) {
  // W stored [N, K] (Gemm transB on one row): K around the 16-lane step, N around the 4-row step,
  // rows further apart than K; alpha and beta as Gemm applies them, and every thread count the same.
  for (const auto& shape : kShapes) {
    const int64_t K = shape.first, N = shape.second;
    const int64_t ldw = K + 3;
    const Tensor w = RandomFloat({N, ldw}, 5 + K, -0.5f, 0.5f), x = RandomFloat({1, K}, 11 + N);
    for (float beta : {0.f, 2.f}) {
      std::vector<float> y0(N), one(N), two(N);
      for (int64_t n = 0; n < N; ++n) y0[n] = beta == 0.f ? std::nanf("") : 0.25f * float(n % 7);  // beta 0 ignores y
      one = y0, two = y0;
      WithThreads(1, [&] { GemvRowsF32(x.data<float>(), w.data<float>(), ldw, one.data(), K, N, 0.5f, beta); });
      WithThreads(2, [&] { GemvRowsF32(x.data<float>(), w.data<float>(), ldw, two.data(), K, N, 0.5f, beta); });
      double worst = 0;
      for (int64_t n = 0; n < N; ++n) {
        double ref = 0;
        for (int64_t k = 0; k < K; ++k) ref += double(x.data<float>()[k]) * w.data<float>()[n * ldw + k];
        ref = 0.5 * ref + (beta == 0.f ? 0.0 : beta * y0[n]);
        worst = std::max(worst, std::abs(ref - one[n]));
        ASSERT_FALSE(std::isnan(one[n])) << "K " << K << " N " << N << " n " << n;
      }
      EXPECT_LE(worst, 1e-5 * std::sqrt(double(K))) << "K " << K << " N " << N << " beta " << beta;
      EXPECT_EQ(0, std::memcmp(one.data(), two.data(), sizeof(float) * N)) << "K " << K << " N " << N;
    }
  }
}

TEST(Gemv, EachRowOfManyRowsIsWhatOneRowGives) {
  // A small batch's decode step (GemvF32ManyRows) gives every row what it would get alone, and
  // sibling products of one x are each what their own GemvF32 gives.
  for (const auto& shape : kShapes) {
    const int64_t K = shape.first, N = shape.second;
    const int64_t M = 3;
    const Tensor w1 = RandomFloat({K, N}, 23 + K, -0.5f, 0.5f), w2 = RandomFloat({K, N + 3}, 29 + K, -0.5f, 0.5f);
    const Tensor x = RandomFloat({M, K}, 31 + N);
    std::vector<float> y1(M * N), y2(M * (N + 3));
    const GemvOutput outs[2] = {{w1.data<float>(), N, y1.data(), N}, {w2.data<float>(), N + 3, y2.data(), N + 3}};
    GemvF32ManyRows(x.data<float>(), M, K, outs, 2);
    EXPECT_LE(WorstError(x.data<float>(), w1.data<float>(), N, y1, M, K, N), 1e-5 * std::sqrt(double(K)));
    for (int64_t m = 0; m < M; ++m) {
      std::vector<float> a(N), b(N + 3);
      GemvF32(x.data<float>() + m * K, w1.data<float>(), N, a.data(), K, N, false);
      GemvF32(x.data<float>() + m * K, w2.data<float>(), N + 3, b.data(), K, N + 3, false);
      EXPECT_EQ(0, std::memcmp(a.data(), y1.data() + m * N, sizeof(float) * N)) << "K " << K << " N " << N << " m " << m;
      EXPECT_EQ(0, std::memcmp(b.data(), y2.data() + m * (N + 3), sizeof(float) * (N + 3)))
          << "K " << K << " N " << N << " m " << m;
    }
  }
}

TEST(Gemv, Float16WeightsGiveTheFloat32ProductOfTheWidenedWeights) {
  // The half weights are widened exactly and summed in the same order: bit for bit the product
  // of the widened float32 weights, at one and two threads, with and without accumulation.
  for (const auto& shape : kShapes) {
    const int64_t K = shape.first, N = shape.second;
    const int64_t ldw = N + 1;
    const Tensor w = RandomFloat({K, ldw}, 37 + K, -2.f, 2.f), x = RandomFloat({1, K}, 41 + N);
    std::vector<uint16_t> half(K * ldw);
    ConvertToHalf(w.data<float>(), half.data(), K * ldw);
    std::vector<float> widened(K * ldw);
    for (int64_t i = 0; i < K * ldw; ++i) widened[i] = HalfBitsToFloat(half[i]);
    for (int threads : {1, 2})
      for (bool accumulate : {false, true}) {
        std::vector<float> a(N, 0.5f), b(N, 0.5f);
        WithThreads(threads, [&] {
          GemvF16(x.data<float>(), half.data(), ldw, a.data(), K, N, accumulate);
          GemvF32(x.data<float>(), widened.data(), ldw, b.data(), K, N, accumulate);
        });
        EXPECT_EQ(0, std::memcmp(a.data(), b.data(), sizeof(float) * N))
            << "K " << K << " N " << N << " threads " << threads << " accumulate " << accumulate;
      }
  }
}

}  // namespace
}  // namespace gaf
