// ONNX's recent transformer operators (ops/attention_op.cc, ops/transformer_ops.cc) beyond what
// ONNX's own node tests cover (tests/conformance/opset28.sh): a long prompt's query rows in blocks,
// inputs of the wrong form, and the plan taking SwiGLU as its SiLUGate.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <random>

#include "ops/attention_kernels.h"
#include "ops/fused_attention.h"
#include "runtime/session.h"
#include "test_util.h"

namespace gaf {
namespace {

using testing::ErrorOf;
using testing::FloatValue;
using testing::IntAttr;
using testing::MakeModel;
using testing::MakeNode;
using testing::RandomFloat;

// Attention(Q, K, V) with 3-D inputs: q_heads query heads over kv_heads cache heads.
Model Attention3d(int64_t q_heads, int64_t kv_heads) {
  Graph g;
  g.inputs = {FloatValue("Q", {1, -1, -1}), FloatValue("K", {1, -1, -1}), FloatValue("V", {1, -1, -1})};
  g.nodes.push_back(MakeNode("Attention", {"Q", "K", "V"}, {"Y"}, "attn",
                             {IntAttr("q_num_heads", q_heads), IntAttr("kv_num_heads", kv_heads)}));
  g.outputs.push_back(ValueInfo{"Y", DataType::kFloat});
  return MakeModel(std::move(g), 23);
}

// Rows [s0, s0 + n) of a [1, S, w] tensor.
Tensor Rows(const Tensor& t, int64_t s0, int64_t n) {
  const int64_t w = t.dim(2);
  Tensor out(DataType::kFloat, {1, n, w});
  std::copy_n(t.data<float>() + s0 * w, n * w, out.data<float>());
  return out;
}

// A prompt whose scores exceed what a task holds at once (4M floats; 2 query heads x 4096 rows x
// 2048 keys here) runs its query rows in blocks; each row's arithmetic is the same, so the result
// has the bits of the prompt's quarters run apart (2 x 1024 rows x 2048 keys: one block each).
TEST(AttentionOp, LongPromptRowsInBlocksGiveTheSameBits) {
  Session s(Attention3d(2, 1));
  const Tensor q = RandomFloat({1, 4096, 32}, 1), k = RandomFloat({1, 2048, 16}, 2), v = RandomFloat({1, 2048, 16}, 3);
  const Tensor whole = s.Run({{"Q", q}, {"K", k}, {"V", v}})[0];
  ASSERT_EQ(whole.shape(), (Shape{1, 4096, 32}));
  for (int64_t s0 = 0; s0 < 4096; s0 += 1024) {
    const Tensor half = s.Run({{"Q", Rows(q, s0, 1024)}, {"K", k}, {"V", v}})[0];
    const Tensor expect = Rows(whole, s0, 1024);
    for (int64_t i = 0; i < half.numel(); ++i)
      ASSERT_EQ(half.data<float>()[i], expect.data<float>()[i]) << "rows from " << s0 << ", element " << i;
  }
}

// A causal prompt computes, per block of query rows (64: here the first 64 positions of a head
// compute 64 keys of 160), only the keys its rows may attend; asking for
// qk_matmul_output makes it compute every key. Both give the same outputs (to rounding), also
// where a value the skipped keys would multiply is infinite (then the block takes every key: the
// probability 0 times inf is NaN, as in the operator's definition). Head sizes 64 and 128 take the
// prompt's register-tile kernels for the values (the run with qk_matmul_output, the general
// products), 16 the general products in both.
TEST(AttentionOp, CausalPromptSkipsOnlyKeysOfProbabilityZero) {
  for (int64_t d : {16, 64, 128}) {
    auto model = [d](bool with_qk) {
      Graph g;
      g.inputs = {FloatValue("Q", {1, 2, 160, d}), FloatValue("K", {1, 1, 160, d}), FloatValue("V", {1, 1, 160, d})};
      std::vector<std::string> outs = {"Y"};
      if (with_qk) outs = {"Y", "", "", "qk"};
      g.nodes.push_back(MakeNode("Attention", {"Q", "K", "V"}, outs, "attn", {IntAttr("is_causal", 1)}));
      g.outputs.push_back(ValueInfo{"Y", DataType::kFloat});
      if (with_qk) g.outputs.push_back(ValueInfo{"qk", DataType::kFloat});
      return MakeModel(std::move(g), 23);
    };
    Session skip(model(false)), all(model(true));
    for (bool poison : {false, true}) {
      Tensor v = RandomFloat({1, 1, 160, d}, 3);
      if (poison) v.data<float>()[159 * d + 5] = std::numeric_limits<float>::infinity();  // the last key's value
      const std::map<std::string, Tensor> feeds = {
          {"Q", RandomFloat({1, 2, 160, d}, 1)}, {"K", RandomFloat({1, 1, 160, d}, 2)}, {"V", v}};
      const Tensor a = skip.Run(feeds)[0], b = all.Run(feeds)[0];
      int64_t nans = 0;
      for (int64_t i = 0; i < a.numel(); ++i) {
        const float x = a.data<float>()[i], y = b.data<float>()[i];
        if (std::isnan(y)) {
          ++nans;
          ASSERT_TRUE(std::isnan(x)) << d << " " << poison << " " << i;
        } else if (std::isinf(y)) {  // the last row attends the last key: its infinite value
          ASSERT_EQ(x, y) << d << " " << poison << " " << i;
        } else {
          ASSERT_NEAR(x, y, 1e-5f * (1 + std::fabs(y))) << d << " " << poison << " " << i;
        }
      }
      EXPECT_EQ(nans > 0, poison) << d;  // every row's probability of the last key is 0 but one's, and 0 * inf
    }
  }
}

// The kept extent of a mask row and the largest skipped value (MaskTail scans back 16 values at a
// time) against the value-by-value definition: rows of every length to 70, candidates (at most
// kMaskCandidate) after a kept value at every position, a NaN (never a candidate) among them, a
// row of candidates only (all kept), and an empty tail.
TEST(MaskTail, EqualsTheValueByValueScan) {
  const float lowest = std::numeric_limits<float>::lowest(), nan = std::numeric_limits<float>::quiet_NaN();
  auto reference = [](const std::vector<float>& m, int64_t* extent, float* tail) {
    const int64_t T = static_cast<int64_t>(m.size());
    int64_t j = T;
    while (j > 0 && m[j - 1] <= kMaskCandidate) --j;
    if (j == 0) j = T;
    float top = -std::numeric_limits<float>::infinity();
    for (int64_t i = j; i < T; ++i) top = std::max(top, m[i]);
    *extent = j;
    *tail = top;
  };
  int checked = 0;
  for (int64_t T = 1; T <= 70; ++T)
    for (int64_t keep = 0; keep <= T; ++keep)
      for (int variant = 0; variant < 3; ++variant) {
        std::vector<float> m(T);
        for (int64_t i = 0; i < T; ++i) m[i] = i < keep ? 0.f : (i % 3 == 0 ? lowest : -2e4f - i);
        if (variant == 1 && keep < T) m[keep + (T - keep) / 2] = nan;  // a NaN among the candidates
        if (variant == 2 && keep > 0) m[keep - 1] = kMaskCandidate + 1.f;  // kept by a hair
        int64_t want_e = 0, got_e = 0;
        float want_t = 0.f, got_t = 0.f;
        reference(m, &want_e, &want_t);
        MaskTail(m.data(), T, &got_e, &got_t);
        ASSERT_EQ(got_e, want_e) << "T " << T << " keep " << keep << " variant " << variant;
        ASSERT_EQ(got_t, want_t) << "T " << T << " keep " << keep << " variant " << variant;
        ++checked;
      }
  EXPECT_GT(checked, 7000);
}

#if GAF_ATTENTION_AVX512
// The prompt attention's scores tiles with their epilogue (ScoresPackedScaled) against the scalar
// definition: each product summed over d in order, then ScaleAndMaskRow's scale and mask, and each
// row's maximum (NaN when the row holds a NaN). Row counts of every tile size and past the 32 rows
// one call holds at once, column counts off the 32-column chunks, masks per column, one per row
// and none, the three scales; the columns past N are left as they were.
TEST(ScoresPackedScaled, EqualsTheScaledMaskedProductAndItsRowMaxima) {
  const int64_t D = 24, ldb = 80, ldc = 80, T = 80;
  const Tensor a = RandomFloat({45, D}, 61), bt = RandomFloat({D, ldb}, 62), mk = RandomFloat({45, T}, 63, -5.f, 5.f);
  int checked = 0;
  for (int64_t M : {1, 3, 4, 5, 8, 9, 13, 40, 45})
    for (int64_t N : {16, 32, 45, 70})
      for (int64_t scale : {0, 1, 2})
        for (int mask_kind : {0, 1, 2}) {  // none, per column, one value per row
          const std::string what = fmt::format("M {} N {} scale {} mask {}", M, N, scale, mask_kind);
          const float c = 0.37f;
          std::vector<float> A(a.data<float>(), a.data<float>() + 45 * D);
          if (M == 9) A[5 * D + 3] = std::numeric_limits<float>::quiet_NaN();  // row 5: NaN scores
          ScoreEpilogue e{scale, c, mask_kind == 0 ? nullptr : mk.data<float>(), T, mask_kind == 1 ? 1 : 0};
          std::vector<float> C(static_cast<size_t>(M * ldc), -7.f), top(static_cast<size_t>(M), 0.f);
          ScoresPackedScaled(M, N, D, A.data(), bt.data<float>(), ldb, C.data(), ldc, e, top.data());
          for (int64_t i = 0; i < M; ++i) {
            std::vector<float> row(static_cast<size_t>(N));
            for (int64_t j = 0; j < N; ++j) {
              float sum = 0.f;
              for (int64_t k = 0; k < D; ++k) sum = std::fma(A[i * D + k], bt.data<float>()[k * ldb + j], sum);
              row[j] = sum;
            }
            ScaleAndMaskRow(row.data(), row.data(), N, scale, c, e.m != nullptr ? e.m + i * T : nullptr, e.m_last);
            float want = -std::numeric_limits<float>::infinity();
            bool nan = false;
            for (int64_t j = 0; j < N; ++j) {
              const float got = C[i * ldc + j];
              if (std::isnan(row[j])) {
                nan = true;
                ASSERT_TRUE(std::isnan(got)) << what << " row " << i << " column " << j;
                continue;
              }
              ASSERT_EQ(got, row[j]) << what << " row " << i << " column " << j;
              want = std::max(want, row[j]);
            }
            for (int64_t j = N; j < ldc; ++j) ASSERT_EQ(C[i * ldc + j], -7.f) << what << " row " << i << " past N";
            if (nan) EXPECT_TRUE(std::isnan(top[i])) << what << " row " << i;
            else EXPECT_EQ(top[i], want) << what << " row " << i;
            ++checked;
          }
        }
  EXPECT_GT(checked, 1000);
}

// ScoresPackedScaled with columns per group of 8 rows (group_cols: a causal block's groups) and the
// leading columns where the mask is 0 (group_zero, where the tiles do not read it): each row equals
// its group's columns of the call without them (the same bits; a score plus a mask's 0 may differ
// only in a zero's sign, which == ignores), the columns past its group's are left as they were,
// and its maximum is over its group's columns.
TEST(ScoresPackedScaled, TakesColumnsAndMaskZerosPerGroupOfRows) {
  const int64_t D = 64, ld = 112, T = 112;
  const Tensor a = RandomFloat({40, D}, 64), bt = RandomFloat({D, ld}, 65), mk = RandomFloat({40, T}, 66, -5.f, 5.f);
  std::mt19937 rng(67);
  int checked = 0;
  for (int64_t M : {8, 13, 20, 32, 40})
    for (int trial = 0; trial < 12; ++trial) {
      const int64_t groups = (M + 7) / 8;
      std::vector<int64_t> cols(static_cast<size_t>(groups)), zero(static_cast<size_t>(groups));
      int64_t N = 0;
      for (int64_t g = 0; g < groups; ++g) {
        cols[g] = 16 * static_cast<int64_t>(rng() % 8);  // 0 .. 112
        zero[g] = static_cast<int64_t>(rng() % (T + 1));
        N = std::max(N, cols[g]);
      }
      // The mask: 0 (or -0) in each group's leading zero[g] columns, random past them.
      std::vector<float> mask(mk.data<float>(), mk.data<float>() + 40 * T);
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < zero[i / 8]; ++j) mask[i * T + j] = (i + j) % 3 == 0 ? -0.f : 0.f;
      const ScoreEpilogue e{2, 0.125f, mask.data(), T, 1};
      std::vector<float> want(static_cast<size_t>(M * ld), -7.f), wtop(static_cast<size_t>(M));
      ScoresPackedScaled(M, N, D, a.data<float>(), bt.data<float>(), ld, want.data(), ld, e, wtop.data());
      std::vector<float> got(static_cast<size_t>(M * ld), -7.f), top(static_cast<size_t>(M));
      ScoresPackedScaled(M, N, D, a.data<float>(), bt.data<float>(), ld, got.data(), ld, e, top.data(), cols.data(),
                         zero.data());
      for (int64_t i = 0; i < M; ++i) {
        const int64_t n = cols[i / 8];
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < n; ++j) {
          ASSERT_EQ(got[i * ld + j], want[i * ld + j]) << "M " << M << " trial " << trial << " row " << i << " col " << j;
          mx = std::max(mx, want[i * ld + j]);
        }
        for (int64_t j = n; j < ld; ++j) ASSERT_EQ(got[i * ld + j], -7.f) << "M " << M << " row " << i << " past its columns";
        EXPECT_EQ(top[i], mx) << "M " << M << " trial " << trial << " row " << i;
        ++checked;
      }
    }
  EXPECT_GT(checked, 1000);
}

// MaskZeroLead counts a row's leading 0s and -0s, up to n.
TEST(MaskZeroLead, CountsLeadingZerosOfEitherSign) {
  std::vector<float> row(70, 0.f);
  EXPECT_EQ(MaskZeroLead(row.data(), 70), 70);
  EXPECT_EQ(MaskZeroLead(row.data(), 33), 33);
  row[5] = -0.f;
  row[40] = -1e-30f;
  EXPECT_EQ(MaskZeroLead(row.data(), 70), 40);
  row[3] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(MaskZeroLead(row.data(), 70), 3);
  row[0] = -std::numeric_limits<float>::infinity();
  EXPECT_EQ(MaskZeroLead(row.data(), 70), 0);
}

// The attention divides its scores by a power of two as a product by its reciprocal: the same bits
// for normal, subnormal, huge, signed-zero, infinite and NaN scores; other divisors keep the division.
TEST(ExactReciprocal, DividesAsAProductOnlyWhereTheBitsAreTheSame) {
  const float big = std::numeric_limits<float>::max(), tiny = std::numeric_limits<float>::denorm_min();
  const std::vector<float> xs = {1.f, -3.7f, 0.f, -0.f, 1e-40f, -2.5e-39f, 1e-38f, big, -big, tiny, 12345.678f,
                                 std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()};
  int checked = 0;
  for (float c : {8.f, 0.125f, -4.f, 1.f, 0x1p-126f, 0x1p126f}) {
    ASSERT_TRUE(ExactReciprocal(c)) << c;
    const float r = 1.f / c;
    for (float x : xs) {
      const float q = x / c, p = x * r;
      if (std::isnan(q)) {
        EXPECT_TRUE(std::isnan(p));
        continue;
      }
      uint32_t qb, pb;
      std::memcpy(&qb, &q, 4);
      std::memcpy(&pb, &p, 4);
      EXPECT_EQ(qb, pb) << x << " / " << c;
      ++checked;
    }
  }
  EXPECT_GT(checked, 70);
  for (float c : {3.f, 11.3137085f, 0.1f, 0.f, -0.f, 0x1p127f, 0x1p-149f, std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::quiet_NaN()})
    EXPECT_FALSE(ExactReciprocal(c)) << c;
}

// A decode step's scores (DecodeScores: the query rows in registers, 16 dot products advancing
// together) have the bits of the kernel they replaced (ScoresRowByRow: one cache row's dot product
// at a time, 16 summed across lanes together), for any number of query rows up to 16 and cache
// rows (the last rows of a group one at a time), d 64 and 128, with and without the requests
// ahead (DecodeAhead, which only prefetch); and they are the dot products (against double sums).
// The values product with its requests ahead has the bits of the one without.
TEST(DecodeScores, HasTheBitsOfOneDotProductAtATime) {
  int checked = 0;
  for (int64_t D : {64, 128}) {
    const Tensor a = RandomFloat({16, D}, 71), b = RandomFloat({70, D}, 72), v = RandomFloat({70, D}, 73);
    const float* A = a.data<float>();
    const float* B = b.data<float>();
    for (int64_t M = 1; M <= 16; ++M)
      for (int64_t N : {0, 1, 3, 4, 5, 15, 16, 17, 33, 70})
        for (bool ahead : {false, true}) {
          const std::string what = fmt::format("D {} M {} N {} ahead {}", D, M, N, ahead);
          const int64_t ldc = 75;
          std::vector<float> C(static_cast<size_t>(M * ldc), -7.f);
          DecodeAhead pf;
          if (ahead) pf.ahead = 256, pf.next = v.data<float>(), pf.next_bytes = N * D * 4;
          ASSERT_TRUE(DecodeScores(M, N, D, A, B, C.data(), ldc, pf));
          std::vector<float> want(static_cast<size_t>(M * ldc), -7.f);
          ScoresRowByRow(M, N, D, A, B, want.data(), ldc);
          for (int64_t m = 0; m < M; ++m) {
            for (int64_t n = 0; n < N; ++n) {
              const float got = C[m * ldc + n];
              ASSERT_EQ(got, want[m * ldc + n]) << what << " row " << m << " key " << n;
              double exact = 0;
              for (int64_t c = 0; c < D; ++c) exact += static_cast<double>(A[m * D + c]) * B[n * D + c];
              ASSERT_NEAR(got, exact, 1e-4 * (1 + std::abs(exact))) << what;
              ++checked;
            }
            for (int64_t j = N; j < ldc; ++j) ASSERT_EQ(C[m * ldc + j], -7.f) << what << " past N";
          }
        }
    // P [4, 70] by V [70, D]: with and without the requests ahead, the same bits.
    const Tensor p = RandomFloat({4, 70}, 74);
    std::vector<float> y0(static_cast<size_t>(4 * D)), y1(y0.size());
    if (D == 64) {
      ValuesAvx512<4, 4>(4, 70, p.data<float>(), 70, v.data<float>(), y0.data(), false);
      ValuesAvx512<4, 4, true>(4, 70, p.data<float>(), 70, v.data<float>(), y1.data(), false, 512);
    } else {
      ValuesAvx512<8, 2>(4, 70, p.data<float>(), 70, v.data<float>(), y0.data(), false);
      ValuesAvx512<8, 2, true>(4, 70, p.data<float>(), 70, v.data<float>(), y1.data(), false, 512);
    }
    EXPECT_EQ(y0, y1) << "D " << D;
  }
  EXPECT_GT(checked, 10000);
}
#endif

// A float causal mask of large finite negatives (finfo.min, as exports write an additive mask)
// lets a prompt's blocks stop at their rows' last unmasked key, each row checking that what it
// skips weighs exactly 0 (its mask's skipped values plus a bound on the scores, below its largest
// score by more than the softmax's exp resolves). With a mask of -15000 and queries scaled up so
// far that the masked future keys do carry weight, the check fails and the block takes every key.
// Both must give what the all-keys path (qk_matmul_output asked for) gives.
TEST(AttentionOp, FloatMaskedPromptSkipsKeysOnlyWhereTheyWeighNothing) {
  const int64_t S = 160, d = 64;
  auto model = [&](bool with_qk) {
    Graph g;
    g.inputs = {FloatValue("Q", {1, 2, S, d}), FloatValue("K", {1, 1, S, d}), FloatValue("V", {1, 1, S, d}),
                FloatValue("M", {1, 1, S, S})};
    std::vector<std::string> outs = {"Y"};
    if (with_qk) outs = {"Y", "", "", "qk"};
    g.nodes.push_back(MakeNode("Attention", {"Q", "K", "V", "M"}, outs, "attn"));
    g.outputs.push_back(ValueInfo{"Y", DataType::kFloat});
    if (with_qk) g.outputs.push_back(ValueInfo{"qk", DataType::kFloat});
    return MakeModel(std::move(g), 23);
  };
  Session skip(model(false)), all(model(true));
  for (const float low : {std::numeric_limits<float>::lowest(), -15000.f}) {
    Tensor m(DataType::kFloat, {1, 1, S, S});
    for (int64_t i = 0; i < S; ++i)
      for (int64_t j = 0; j < S; ++j) m.data<float>()[i * S + j] = j <= i ? 0.f : low;
    Tensor q = RandomFloat({1, 2, S, d}, 1);
    if (low > -1e5f)
      for (int64_t i = 0; i < q.numel(); ++i) q.data<float>()[i] *= 8000.f;
    const std::map<std::string, Tensor> feeds = {
        {"Q", q}, {"K", RandomFloat({1, 1, S, d}, 2)}, {"V", RandomFloat({1, 1, S, d}, 3)}, {"M", m}};
    const Tensor a = skip.Run(feeds)[0], b = all.Run(feeds)[0];
    for (int64_t i = 0; i < a.numel(); ++i)
      ASSERT_NEAR(a.data<float>()[i], b.data<float>()[i], 1e-5f * (1 + std::fabs(b.data<float>()[i])))
          << low << " " << i;
  }
}

TEST(AttentionOp, InputsOfTheWrongFormAreErrorsNamingTheNode) {
  Session gqa(Attention3d(3, 2));  // 3 query heads over 2 cache heads
  const std::string e1 = ErrorOf([&] {
    gqa.Run({{"Q", RandomFloat({1, 2, 48}, 1)}, {"K", RandomFloat({1, 2, 32}, 2)}, {"V", RandomFloat({1, 2, 32}, 3)}});
  });
  EXPECT_NE(e1.find("attn"), std::string::npos) << e1;
  EXPECT_NE(e1.find("not a multiple"), std::string::npos) << e1;

  Session s(Attention3d(2, 1));
  const std::string e2 = ErrorOf([&] {  // a last dimension the heads do not divide
    s.Run({{"Q", RandomFloat({1, 2, 33}, 1)}, {"K", RandomFloat({1, 2, 16}, 2)}, {"V", RandomFloat({1, 2, 16}, 3)}});
  });
  EXPECT_NE(e2.find("q_num_heads"), std::string::npos) << e2;

  // A past cache of the wrong rank is refused before any of its dimensions is read.
  Graph g;
  g.inputs = {FloatValue("Q", {1, 2, 1, 16}), FloatValue("K", {1, 2, 1, 16}), FloatValue("V", {1, 2, 1, 16}),
              FloatValue("pk", {-1}), FloatValue("pv", {-1})};
  g.nodes.push_back(MakeNode("Attention", {"Q", "K", "V", "", "pk", "pv"}, {"Y", "present_key", "present_value"}, "attn"));
  for (const char* o : {"Y", "present_key", "present_value"}) g.outputs.push_back(ValueInfo{o, DataType::kFloat});
  Session past(MakeModel(std::move(g), 23));
  const std::string e3 = ErrorOf([&] {
    past.Run({{"Q", RandomFloat({1, 2, 1, 16}, 1)}, {"K", RandomFloat({1, 2, 1, 16}, 2)},
              {"V", RandomFloat({1, 2, 1, 16}, 3)}, {"pk", RandomFloat({5}, 4)}, {"pv", RandomFloat({5}, 5)}});
  });
  EXPECT_NE(e3.find("past_key of shape [5]"), std::string::npos) << e3;
}

TEST(RotaryEmbeddingOp, PositionIdsOutsideTheCachesAreErrors) {
  Graph g;
  g.inputs = {FloatValue("x", {1, 1, 2, 8}), FloatValue("cos", {4, 4}), FloatValue("sin", {4, 4})};
  ValueInfo pos{"pos", DataType::kInt64};
  g.inputs.push_back(pos);
  g.nodes.push_back(MakeNode("RotaryEmbedding", {"x", "cos", "sin", "pos"}, {"y"}, "rope"));
  g.outputs.push_back(ValueInfo{"y", DataType::kFloat});
  Session s(MakeModel(std::move(g), 23));
  const std::string e = ErrorOf([&] {
    s.Run({{"x", RandomFloat({1, 1, 2, 8}, 1)}, {"cos", RandomFloat({4, 4}, 2)}, {"sin", RandomFloat({4, 4}, 3)},
           {"pos", Tensor::FromVector<int64_t>({1, 9}, {1, 2})}});
  });
  EXPECT_NE(e.find("position id 9 outside"), std::string::npos) << e;
}

// SwiGLU(G, U) with alpha 1 runs as the plan's SiLUGate (the SiLUGate kernel's arithmetic: the
// same bits as the operator's own kernel), and with another alpha as itself.
TEST(SwiGLUOp, AlphaOneRunsAsSiLUGate) {
  for (float alpha : {1.f, 0.5f}) {
    Graph g;
    g.inputs = {FloatValue("a", {3, 40}), FloatValue("b", {3, 40})};
    g.nodes.push_back(MakeNode("SwiGLU", {"a", "b"}, {"y"}, "swiglu", {testing::FloatAttr("alpha", alpha)}));
    g.outputs.push_back(ValueInfo{"y", DataType::kFloat});
    const Model m = MakeModel(std::move(g), 28);
    SessionOptions profiled;
    profiled.profile = true;
    SessionOptions plain;
    plain.rewrite_products = false;
    Session s(m, profiled), ref(m, plain);
    const std::map<std::string, Tensor> feeds = {{"a", RandomFloat({3, 40}, 1)}, {"b", RandomFloat({3, 40}, 2)}};
    const Tensor y = s.Run(feeds)[0], r = ref.Run(feeds)[0];
    EXPECT_EQ(testing::ProfiledCalls(s, "SiLUGate"), alpha == 1.f ? 1 : 0) << alpha;
    EXPECT_EQ(testing::ProfiledCalls(s, "SwiGLU"), alpha == 1.f ? 0 : 1) << alpha;
    for (int64_t i = 0; i < y.numel(); ++i) ASSERT_EQ(y.data<float>()[i], r.data<float>()[i]) << alpha << " " << i;
  }
}

}  // namespace
}  // namespace gaf
