// Convolutions: the spatial geometry shared with pooling (ConvGeometryOf, PoolGeometryOf,
// ConvOutputShape), im2col, the tiled float32 convolution with its epilogue hook (ConvF32),
// depthwise convolutions, Conv, the quantized ConvInteger and QLinearConv, and ConvTranspose.
#include <omp.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "ops/conv.h"
#include "ops/kernel_util.h"
#include "ops/nn_internal.h"

namespace gaf::nn_detail {

// ------------------------------------------------------------------------------------------
// Spatial geometry shared by Conv and pooling (Geom: ops/nn_internal.h).

std::vector<int64_t> SpatialAttr(const Node& node, const char* name, size_t nsp, int64_t def) {
  std::vector<int64_t> v = node.GetInts(name, {});
  if (v.empty()) v.assign(nsp, def);
  GAF_CHECK(v.size() == nsp, "{}: attribute '{}' has {} values, expected {}", node.Describe(),
            name, v.size(), nsp);
  return v;
}

namespace {

// Output size of one spatial axis of a window (kernel k, stride s, dilation d) sliding over `in`
// with pads *pb, *pe (set here for SAME auto_pad). gaf::Error naming the node when the window does
// not fit in a non-empty padded input, or when the sizes overflow.
int64_t WindowOutputSize(const Node& node, size_t axis, int64_t in, int64_t k, int64_t s, int64_t d,
                         const std::string& auto_pad, bool ceil_mode, int64_t* pb, int64_t* pe) {
  const int64_t ek = CheckedAdd(CheckedMul(k - 1, d, "kernel extent"), 1, "kernel extent");
  if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
    const int64_t out = CeilDiv(in, s);
    const int64_t total = std::max<int64_t>(0, CheckedAdd((out - 1) * s, ek, "padded size") - in);
    *pb = auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
    *pe = total - *pb;
    return out;
  }
  const int64_t padded = CheckedAdd(CheckedAdd(in, *pb, "padded size"), *pe, "padded size");
  if (in == 0 && padded == 0) return 0;  // an empty input gives an empty output
  GAF_CHECK(padded >= ek,
            "{}: kernel extent {} is larger than the padded input size {} along spatial axis {} (input {}, "
            "pads {}+{})",
            node.Describe(), ek, padded, axis, in, *pb, *pe);
  const int64_t span = padded - ek;
  if (!ceil_mode || auto_pad == "VALID") return span / s + 1;
  int64_t out = CeilDiv(span, s) + 1;
  if ((out - 1) * s >= in + *pb) --out;  // last window must start inside the input
  return out;
}

}  // namespace

// Computes output size and pads from the conv/pool attributes (auto_pad, pads, strides,
// dilations, ceil_mode).
Geom MakeGeom(const Node& node, const Shape& x_shape, const std::vector<int64_t>& kernel,
              bool ceil_mode, bool allow_dilations) {
  size_t nsp = kernel.size();
  GAF_CHECK(x_shape.size() == nsp + 2, "{}: input of shape {} does not match a {}-D kernel",
            node.Describe(), ShapeToString(x_shape), nsp);
  if (nsp < 1 || nsp > 3)
    GAF_UNSUPPORTED("{}: {} spatial dimensions are not supported (1 to 3)", node.Describe(), nsp);
  std::vector<int64_t> strides = SpatialAttr(node, "strides", nsp, 1);
  std::vector<int64_t> dil = allow_dilations ? SpatialAttr(node, "dilations", nsp, 1)
                                             : std::vector<int64_t>(nsp, 1);
  std::vector<int64_t> pads = node.GetInts("pads", {});
  if (pads.empty()) pads.assign(2 * nsp, 0);
  GAF_CHECK(pads.size() == 2 * nsp, "{}: 'pads' has {} values, expected {}", node.Describe(),
            pads.size(), 2 * nsp);
  std::string auto_pad = node.GetString("auto_pad", "NOTSET");
  Geom g;
  g.nsp = static_cast<int>(nsp);
  size_t off = 3 - nsp;
  for (size_t i = 0; i < nsp; ++i) {
    int64_t in = x_shape[2 + i], k = kernel[i], s = strides[i], d = dil[i];
    GAF_CHECK(k >= 1 && s >= 1 && d >= 1,
              "{}: kernel, strides and dilations must be positive (got {}, {}, {})",
              node.Describe(), k, s, d);
    int64_t pb = 0, pe = 0;
    if (auto_pad == "NOTSET" || auto_pad.empty()) {
      pb = pads[i];
      pe = pads[i + nsp];
      GAF_CHECK(pb >= 0 && pe >= 0, "{}: negative pads are not allowed", node.Describe());
    } else {
      GAF_CHECK(auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER" || auto_pad == "VALID",
                "{}: invalid auto_pad '{}'", node.Describe(), auto_pad);
    }
    const int64_t out = WindowOutputSize(node, i, in, k, s, d, auto_pad, ceil_mode, &pb, &pe);
    g.in[off + i] = in;
    g.out[off + i] = out;
    g.k[off + i] = k;
    g.s[off + i] = s;
    g.d[off + i] = d;
    g.pb[off + i] = pb;
    g.pe[off + i] = pe;
  }
  return g;
}

Shape OutShape(int64_t n, int64_t c, const Geom& g) {
  Shape s{n, c};
  for (int i = 3 - g.nsp; i < 3; ++i) s.push_back(g.out[i]);
  return s;
}

namespace {

// Rows [r0, r1) of the im2col matrix restricted to output rows [h0, h1) of the flattened
// (depth, height) output rows: col[r, (h - h0) * OW + ow] for r = c * kvol + kernel offset (zero
// where the window hits padding).
template <class T>
void Im2ColRows(const T* x, const Geom& g, T* col, int64_t h0, int64_t h1, int64_t r0, int64_t r1) {
  const int64_t kvol = g.k_size(), isz = g.in_size();
  const int64_t OH = g.out[1], OW = g.out[2], IH = g.in[1], IW = g.in[2];
  const int64_t tc = (h1 - h0) * OW;
  for (int64_t r = r0; r < r1; ++r) {
    int64_t c = r / kvol, kk = r % kvol;
    int64_t kd = kk / (g.k[1] * g.k[2]), kh = (kk / g.k[2]) % g.k[1], kw = kk % g.k[2];
    const T* xc = x + c * isz;
    T* dst = col + r * tc;
    int64_t offw = kw * g.d[2] - g.pb[2];
    int64_t lo, hi;
    KernelRange(offw, g.s[2], OW, IW, &lo, &hi);
    for (int64_t h = h0; h < h1; ++h, dst += OW) {
      int64_t od = h / OH, oh = h % OH;
      int64_t id = od * g.s[0] - g.pb[0] + kd * g.d[0];
      int64_t ih = oh * g.s[1] - g.pb[1] + kh * g.d[1];
      if (id < 0 || id >= g.in[0] || ih < 0 || ih >= IH) {
        std::fill(dst, dst + OW, T{});
        continue;
      }
      const T* src = xc + (id * IH + ih) * IW + offw;
      std::fill(dst, dst + lo, T{});
      if (g.s[2] == 1) {
        std::memcpy(dst + lo, src + lo, sizeof(T) * (hi - lo));
      } else {
        const int64_t sw = g.s[2];
        for (int64_t ow = lo; ow < hi; ++ow) dst[ow] = src[ow * sw];
      }
      std::fill(dst + hi, dst + OW, T{});
    }
  }
}

// col[C*kvol, out_size] from x[C, in...], rows split over the threads.
template <class T>
void Im2Col(const T* x, int64_t C, const Geom& g, T* col) {
  ParallelFor(C * g.k_size(), std::max<int64_t>(1, 32768 / std::max<int64_t>(g.out_size(), 1)),
              [&](int64_t r0, int64_t r1) { Im2ColRows<T>(x, g, col, 0, g.out[0] * g.out[1], r0, r1); });
}

// ------------------------------------------------------------------------------------------
// Conv.

template <class T>
void DepthwiseConv(const T* x, const T* w, const T* bias, T* y, int64_t N, int64_t C,
                   int64_t M, const Geom& g, const ConvEpilogue* epilogue = nullptr) {
  const int64_t mult = M / C, isz = g.in_size(), osz = g.out_size(), kvol = g.k_size();
  const int64_t OD = g.out[0], OH = g.out[1], OW = g.out[2], IH = g.in[1], IW = g.in[2];
  ParallelFor(N * M, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, osz * kvol)),
              [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      int64_t n = p / M, m = p % M, c = m / mult;
      const T* xc = x + (n * C + c) * isz;
      const T* wm = w + m * kvol;
      T* yp = y + p * osz;
      T b = bias ? bias[m] : T{};
      std::fill(yp, yp + osz, b);
      for (int64_t kd = 0; kd < g.k[0]; ++kd)
        for (int64_t kh = 0; kh < g.k[1]; ++kh)
          for (int64_t kw = 0; kw < g.k[2]; ++kw) {
            T wv = wm[(kd * g.k[1] + kh) * g.k[2] + kw];
            int64_t offw = kw * g.d[2] - g.pb[2];
            int64_t lo, hi;
            KernelRange(offw, g.s[2], OW, IW, &lo, &hi);
            for (int64_t od = 0; od < OD; ++od) {
              int64_t id = od * g.s[0] - g.pb[0] + kd * g.d[0];
              if (id < 0 || id >= g.in[0]) continue;
              for (int64_t oh = 0; oh < OH; ++oh) {
                int64_t ih = oh * g.s[1] - g.pb[1] + kh * g.d[1];
                if (ih < 0 || ih >= IH) continue;
                const T* src = xc + (id * IH + ih) * IW + offw;
                T* dst = yp + (od * OH + oh) * OW;
                if (g.s[2] == 1) {
#pragma omp simd
                  for (int64_t ow = lo; ow < hi; ++ow) dst[ow] += wv * src[ow];
                } else {
                  const int64_t sw = g.s[2];
                  for (int64_t ow = lo; ow < hi; ++ow) dst[ow] += wv * src[ow * sw];
                }
              }
            }
          }
      // The plane is still in L1: the fused epilogue reads it there.
      if (epilogue != nullptr && *epilogue) (*epilogue)(p, p + 1, 0, osz);
    }
  });
}

// Depthwise 2-D (or 1-D) float convolution, one channel plane at a time: the plane is copied
// into a zero-bordered scratch plane (no bounds tests in the inner loops), then each output row
// accumulates its kernel taps while it is in L1. (The generic loop above sweeps the whole output
// plane once per kernel tap, with a bounds computation per tap and row.)
void DepthwiseConv2DF32(const float* x, const float* w, const float* bias, float* y, int64_t N,
                        int64_t C, int64_t M, const Geom& g, const ConvEpilogue* epilogue) {
  const int64_t mult = M / C, isz = g.in_size(), osz = g.out_size();
  const int64_t KH = g.k[1], KW = g.k[2], SH = g.s[1], SW = g.s[2], DH = g.d[1], DW = g.d[2];
  const int64_t IH = g.in[1], IW = g.in[2], OH = g.out[1], OW = g.out[2];
  // The scratch plane covers every input position a window reads, padding included.
  const int64_t PH = std::max<int64_t>(IH + g.pb[1], (OH - 1) * SH + (KH - 1) * DH + 1);
  const int64_t PW = std::max<int64_t>(IW + g.pb[2], (OW - 1) * SW + (KW - 1) * DW + 1);
  ParallelFor(N * M, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, osz * KH * KW)),
              [&](int64_t p0, int64_t p1) {
    // Slack after the last row: the stride-1 pass reads up to (KW - 1) * DW past a row's end.
    std::vector<float> pad(static_cast<size_t>(PH * PW + PW + KW * DW)), acc(static_cast<size_t>(OH * PW));
    int64_t loaded = -1;
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t n = p / M, m = p % M, c = m / mult;
      if (n * C + c != loaded) {
        std::fill(pad.begin(), pad.end(), 0.f);
        const float* xc = x + (n * C + c) * isz;
        for (int64_t ih = 0; ih < IH; ++ih)
          std::memcpy(pad.data() + (ih + g.pb[1]) * PW + g.pb[2], xc + ih * IW, sizeof(float) * IW);
        loaded = n * C + c;
      }
      const float* wm = w + m * KH * KW;
      const float b = bias ? bias[m] : 0.f;
      float* yp = y + p * osz;
      if (SH == 1 && SW == 1) {
        // Stride 1: every tap is one contiguous pass over the output laid out with the scratch
        // plane's row pitch (the PW - OW extra columns per row are computed and dropped), so
        // small planes (7x7, 14x14) cost a few long vector loops instead of many short ones.
        const int64_t Q = OH * PW;
        std::fill(acc.begin(), acc.begin() + Q, b);
        for (int64_t kh = 0; kh < KH; ++kh)
          for (int64_t kw = 0; kw < KW; ++kw) {
            const float wv = wm[kh * KW + kw];
            const float* src = pad.data() + kh * DH * PW + kw * DW;
            float* a = acc.data();
#pragma omp simd
            for (int64_t q = 0; q < Q; ++q) a[q] += wv * src[q];
          }
        for (int64_t oh = 0; oh < OH; ++oh) std::memcpy(yp + oh * OW, acc.data() + oh * PW, sizeof(float) * OW);
      } else {
        for (int64_t oh = 0; oh < OH; ++oh) {
          const float* base = pad.data() + oh * SH * PW;
          float* dst = yp + oh * OW;
          std::fill(dst, dst + OW, b);
          for (int64_t kh = 0; kh < KH; ++kh)
            for (int64_t kw = 0; kw < KW; ++kw) {
              const float wv = wm[kh * KW + kw];
              const float* src = base + kh * DH * PW + kw * DW;
              for (int64_t ow = 0; ow < OW; ++ow) dst[ow] += wv * src[ow * SW];
            }
        }
      }
      // The plane is still in L1: the fused epilogue reads it there.
      if (epilogue != nullptr && *epilogue) (*epilogue)(p, p + 1, 0, osz);
    }
  });
}

// Validates Conv attributes against the input and weight shapes and returns the geometry.
Geom ConvGeom(const Node& node, const Shape& xs, const Shape& ws, int64_t* group_out) {
  GAF_CHECK(xs.size() >= 3 && ws.size() == xs.size(),
            "{}: Conv input {} and weight {} ranks are invalid", node.Describe(),
            ShapeToString(xs), ShapeToString(ws));
  int64_t group = node.GetInt("group", 1);
  int64_t C = xs[1], M = ws[0];
  GAF_CHECK(group >= 1 && C % group == 0 && M % group == 0 && ws[1] == C / group,
            "{}: Conv channels do not match: input {}, weight {}, group {}", node.Describe(),
            ShapeToString(xs), ShapeToString(ws), group);
  std::vector<int64_t> kernel(ws.begin() + 2, ws.end());
  std::vector<int64_t> ks = node.GetInts("kernel_shape", {});
  GAF_CHECK(ks.empty() || ks == kernel, "{}: kernel_shape does not match weight shape {}",
            node.Describe(), ShapeToString(ws));
  *group_out = group;
  return MakeGeom(node, xs, kernel, false);
}

// y[N, M, out...] = conv(x, w) + bias; y must be zero-initialized and sized by ConvGeom.
template <class T>
void ConvCore(const Geom& g, int64_t group, int64_t N, int64_t C, int64_t M, const T* x,
              const T* w, const T* bias, T* y) {
  const int64_t isz = g.in_size(), osz = g.out_size(), kvol = g.k_size();
  const int64_t Cg = C / group, Mg = M / group;
  if (group == C && Cg == 1 && group > 1) {
    DepthwiseConv<T>(x, w, bias, y, N, C, M, g);
    return;
  }
  bool pointwise = kvol == 1 && g.s == std::array<int64_t, 3>{1, 1, 1} &&
                   g.pb == std::array<int64_t, 3>{0, 0, 0} && g.pe == g.pb;
  std::vector<T> col;
  if (!pointwise) col.resize(static_cast<size_t>(Cg * kvol * osz));
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t gi = 0; gi < group; ++gi) {
      const T* xg = x + (n * C + gi * Cg) * isz;
      const T* src = xg;
      if (!pointwise) {
        Im2Col<T>(xg, Cg, g, col.data());
        src = col.data();
      }
      T* yg = y + (n * M + gi * Mg) * osz;
      Gemm<T>(false, false, Mg, osz, Cg * kvol, 1.f, w + gi * Mg * Cg * kvol, Cg * kvol, src, osz,
              0.f, yg, osz);
    }
    if (bias) {
      T* yn = y + n * M * osz;
      ParallelFor(M, std::max<int64_t>(1, 32768 / osz), [&](int64_t m0, int64_t m1) {
        for (int64_t m = m0; m < m1; ++m) {
          T b = bias[m];
          T* p = yn + m * osz;
#pragma omp simd
          for (int64_t i = 0; i < osz; ++i) p[i] += b;
        }
      });
    }
  }
}

// Tiled float32 convolution (see ops/conv.h). Per image and group the output rows are cut into
// tiles whose im2col columns take about kTileBytes; each tile is one GEMM from a per-thread
// column buffer that stays in L2, then bias and the epilogue run on the tile while it is hot.
// With enough tiles they run in parallel (one single-threaded GEMM each); with few (deep layers
// on small images) they run in turn and each GEMM uses the threads.
void ConvTiledF32(const Geom& g, int64_t group, int64_t N, int64_t C, int64_t M, const float* x,
                  const float* w, const float* bias, float* y, const ConvEpilogue* epilogue) {
  // Column buffer per tile, and the fewest columns per GEMM (each GEMM packs the weights again).
  constexpr int64_t kTileBytes = 160 * 1024, kMinCols = 128;
  const int64_t isz = g.in_size(), osz = g.out_size(), kvol = g.k_size();
  const int64_t Cg = C / group, Mg = M / group, K = Cg * kvol;
  const int64_t OW = g.out[2], rows = g.out[0] * g.out[1];
  const bool pointwise = kvol == 1 && g.s == std::array<int64_t, 3>{1, 1, 1} &&
                         g.pb == std::array<int64_t, 3>{0, 0, 0} && g.pe == g.pb;
  int64_t per = std::max<int64_t>(1, kTileBytes / (4 * std::max<int64_t>(1, K * OW)));
  per = std::max(per, (kMinCols + OW - 1) / OW);
  per = std::min(per, rows);
  const int64_t tiles = (rows + per - 1) / per;
  const int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
  const bool parallel_tiles = nt > 1 && N * group * tiles >= 2 * nt;
  if (parallel_tiles || ParallelThreads() > 1) NoteOwnParallelRegion();  // its tiles' region, or GEMMs that thread
  auto add_bias_and_epilogue = [&](int64_t n, int64_t gi, int64_t m0, int64_t m1, int64_t c0, int64_t c1) {
    float* yt = y + (n * M + gi * Mg) * osz;
    if (bias != nullptr)
      for (int64_t m = m0; m < m1; ++m) {
        const float b = bias[gi * Mg + m];
        float* p = yt + m * osz;
#pragma omp simd
        for (int64_t i = c0; i < c1; ++i) p[i] += b;
      }
    if (epilogue != nullptr && *epilogue) {
      const int64_t r0 = n * M + gi * Mg;
      (*epilogue)(r0 + m0, r0 + m1, c0, c1);
    }
  };
  if (nt == 1 || parallel_tiles) {
    auto run_tile = [&](int64_t n, int64_t gi, int64_t t) {
      const int64_t h0 = t * per, h1 = std::min(rows, h0 + per);
      const int64_t c0 = h0 * OW, c1 = h1 * OW, tc = c1 - c0;
      const float* xg = x + (n * C + gi * Cg) * isz;
      const float* src = xg + c0;
      int64_t ldb = osz;
      thread_local std::vector<float> col;
      if (!pointwise) {
        if (col.size() < static_cast<size_t>(K * tc)) col.resize(static_cast<size_t>(K * tc));
        Im2ColRows<float>(xg, g, col.data(), h0, h1, 0, K);
        src = col.data();
        ldb = tc;
      }
      Sgemm(false, false, Mg, tc, K, 1.f, w + gi * Mg * K, K, src, ldb, 0.f,
            y + (n * M + gi * Mg) * osz + c0, osz);
      add_bias_and_epilogue(n, gi, 0, Mg, c0, c1);
    };
    const int64_t jobs = N * group * tiles;
    if (parallel_tiles) {
#pragma omp parallel for schedule(dynamic, 1)
      for (int64_t j = 0; j < jobs; ++j) run_tile(j / (group * tiles), (j / tiles) % group, j % tiles);
    } else {
      for (int64_t j = 0; j < jobs; ++j) run_tile(j / (group * tiles), (j / tiles) % group, j % tiles);
    }
    return;
  }
  // Few tiles for the threads: the whole image's columns, one GEMM that uses the threads, then
  // bias and epilogue split over the threads by output channel.
  std::vector<float> col;
  if (!pointwise) col.resize(static_cast<size_t>(K * osz));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t gi = 0; gi < group; ++gi) {
      const float* xg = x + (n * C + gi * Cg) * isz;
      const float* src = xg;
      if (!pointwise) {
        Im2Col<float>(xg, Cg, g, col.data());
        src = col.data();
      }
      Sgemm(false, false, Mg, osz, K, 1.f, w + gi * Mg * K, K, src, osz, 0.f, y + (n * M + gi * Mg) * osz, osz);
      ParallelFor(Mg, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, osz)),
                  [&](int64_t m0, int64_t m1) { add_bias_and_epilogue(n, gi, m0, m1, 0, osz); });
    }
}

template <class T>
void RunConv(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& X = ctx.input(0);
  const Tensor& W = ctx.input(1);
  const Tensor* B = ctx.has_input(2) ? ctx.inputs[2] : nullptr;
  GAF_CHECK(W.dtype() == X.dtype(), "{}: Conv weight type differs from input", node.Describe());
  int64_t group = 1;
  Geom g = ConvGeom(node, X.shape(), W.shape(), &group);
  int64_t N = X.dim(0), C = X.dim(1), M = W.dim(0);
  if (B) {
    GAF_CHECK(B->numel() == M && B->dtype() == X.dtype(), "{}: Conv bias must have {} elements",
              node.Describe(), M);
  }
  if constexpr (std::is_same_v<T, float>) {
    ConvF32(node, X, W, B, &ctx.outputs[0], ConvEpilogue());
    return;
  }
  ctx.outputs[0] = Tensor(X.dtype(), OutShape(N, M, g));
  if (ctx.outputs[0].numel() == 0) return;
  ConvCore<T>(g, group, N, C, M, X.data<T>(), W.data<T>(), B ? B->data<T>() : nullptr,
              ctx.outputs[0].data<T>());
}

}  // namespace

void ConvKernel(KernelContext& ctx) {
  DataType dt = ctx.input(0).dtype();
  if (dt == DataType::kFloat) return RunConv<float>(ctx);
  if (dt == DataType::kDouble) return RunConv<double>(ctx);
  GAF_UNSUPPORTED("{}: Conv of type {} is not supported", ctx.node.Describe(), DataTypeName(dt));
}

// ------------------------------------------------------------------------------------------
// Quantized convolutions: ConvInteger, QLinearConv (zero points and scales: matmul.cc).

namespace {

// int32 convolution of zero-point-shifted x and w; output shape in *out_shape.
std::vector<int32_t> IntegerConv(const Node& node, const Tensor& X, const Tensor* xzp,
                                 const Tensor& W, const Tensor* wzp, const int32_t* bias,
                                 Shape* out_shape) {
  int64_t group = 1;
  Geom g = ConvGeom(node, X.shape(), W.shape(), &group);
  int64_t N = X.dim(0), C = X.dim(1), M = W.dim(0);
  if (xzp)
    GAF_CHECK(xzp->numel() == 1, "{}: input zero point must be a scalar", node.Describe());
  std::vector<int32_t> x = Dequantized(X, xzp, 1, 1, node, "x");
  std::vector<int32_t> w = Dequantized(W, wzp, M, M > 0 ? W.numel() / M : 1, node, "w");
  *out_shape = OutShape(N, M, g);
  std::vector<int32_t> y(static_cast<size_t>(NumElements(*out_shape)), 0);
  if (!y.empty()) ConvCore<int32_t>(g, group, N, C, M, x.data(), w.data(), bias, y.data());
  return y;
}

}  // namespace

void ConvIntegerKernel(KernelContext& ctx) {
  Shape os;
  std::vector<int32_t> y =
      IntegerConv(ctx.node, ctx.input(0), ctx.has_input(2) ? ctx.inputs[2] : nullptr,
                  ctx.input(1), ctx.has_input(3) ? ctx.inputs[3] : nullptr, nullptr, &os);
  ctx.outputs[0] = Tensor(DataType::kInt32, os);
  if (!y.empty()) std::memcpy(ctx.outputs[0].raw(), y.data(), sizeof(int32_t) * y.size());
}

void QLinearConvKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& X = ctx.input(0);
  const Tensor& W = ctx.input(3);
  int64_t M = W.rank() > 0 ? W.dim(0) : 0;
  const int32_t* bias = nullptr;
  if (ctx.has_input(8)) {
    const Tensor& B = *ctx.inputs[8];
    GAF_CHECK(B.dtype() == DataType::kInt32 && B.numel() == M,
              "{}: bias must be int32 with {} elements", node.Describe(), M);
    bias = B.data<int32_t>();
  }
  Shape os;
  std::vector<int32_t> acc = IntegerConv(node, X, &ctx.input(2), W, &ctx.input(5), bias, &os);
  float xs = Scales(ctx.input(1), 1, node, "x_scale")[0];
  float ys = Scales(ctx.input(6), 1, node, "y_scale")[0];
  std::vector<float> scale = Scales(ctx.input(4), M, node, "w_scale");
  for (auto& v : scale) v = v * xs / ys;
  const Tensor& yzp = ctx.input(7);
  ctx.outputs[0] = Tensor(yzp.dtype(), os);
  int64_t inner = os.size() > 2 ? NumElements(Shape(os.begin() + 2, os.end())) : 1;
  Requantize(acc, scale, M, inner, &yzp, ctx.outputs[0], node);
}

namespace {

// ------------------------------------------------------------------------------------------
// ConvTranspose: col = W^T * X per group, then col2im scatter-add into Y.

template <class T>
void RunConvTranspose(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& X = ctx.input(0);
  const Tensor& W = ctx.input(1);
  const Tensor* B = ctx.has_input(2) ? ctx.inputs[2] : nullptr;
  GAF_CHECK(X.rank() >= 3 && W.rank() == X.rank(),
            "{}: ConvTranspose input {} and weight {} ranks are invalid", node.Describe(),
            ShapeToString(X.shape()), ShapeToString(W.shape()));
  GAF_CHECK(W.dtype() == X.dtype(), "{}: weight type differs from input", node.Describe());
  size_t nsp = static_cast<size_t>(X.rank() - 2);
  if (nsp > 3)
    GAF_UNSUPPORTED("{}: {} spatial dimensions are not supported (1 to 3)", node.Describe(), nsp);
  int64_t group = node.GetInt("group", 1);
  int64_t N = X.dim(0), C = X.dim(1);
  GAF_CHECK(group >= 1 && C % group == 0 && W.dim(0) == C,
            "{}: ConvTranspose channels do not match: input {}, weight {}, group {}",
            node.Describe(), ShapeToString(X.shape()), ShapeToString(W.shape()), group);
  int64_t Mg = W.dim(1), M = Mg * group, Cg = C / group;
  std::vector<int64_t> kernel(W.shape().begin() + 2, W.shape().end());
  std::vector<int64_t> ks = node.GetInts("kernel_shape", {});
  GAF_CHECK(ks.empty() || ks == kernel, "{}: kernel_shape does not match weight shape {}",
            node.Describe(), ShapeToString(W.shape()));
  std::vector<int64_t> strides = SpatialAttr(node, "strides", nsp, 1);
  std::vector<int64_t> dil = SpatialAttr(node, "dilations", nsp, 1);
  std::vector<int64_t> opad = SpatialAttr(node, "output_padding", nsp, 0);
  std::vector<int64_t> pads = node.GetInts("pads", {});
  std::vector<int64_t> oshape = node.GetInts("output_shape", {});
  std::string auto_pad = node.GetString("auto_pad", "NOTSET");
  if (!oshape.empty()) {
    GAF_CHECK(oshape.size() >= nsp, "{}: output_shape has too few values", node.Describe());
    oshape.erase(oshape.begin(), oshape.end() - nsp);
  }
  bool have_pads = !pads.empty();
  if (pads.empty()) pads.assign(2 * nsp, 0);
  GAF_CHECK(pads.size() == 2 * nsp, "{}: 'pads' has {} values, expected {}", node.Describe(),
            pads.size(), 2 * nsp);
  Geom g;  // here "in" is X's spatial size and "out" is Y's
  g.nsp = static_cast<int>(nsp);
  size_t off = 3 - nsp;
  for (size_t i = 0; i < nsp; ++i) {
    int64_t in = X.dim(2 + i), k = kernel[i], s = strides[i], d = dil[i];
    GAF_CHECK(s >= 1 && d >= 1, "{}: strides and dilations must be positive", node.Describe());
    int64_t ek = CheckedAdd(CheckedMul(k - 1, d, "kernel extent"), 1, "kernel extent");
    int64_t full = CheckedAdd(CheckedAdd(CheckedMul(s, in - 1, "output size"), opad[i], "output size"), ek,
                              "output size");
    int64_t pb, pe, out;
    bool same = auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER";
    if (!oshape.empty() || (same && !have_pads)) {
      out = !oshape.empty() ? oshape[i] : CheckedMul(in, s, "output size");
      int64_t total = 0;
      GAF_CHECK(out >= 0 && !__builtin_sub_overflow(full, out, &total), "{}: invalid output size {}",
                node.Describe(), out);
      if (auto_pad == "SAME_UPPER") {
        pb = FloorDiv(total, 2);
        pe = total - pb;
      } else {
        pe = FloorDiv(total, 2);
        pb = total - pe;
      }
    } else {
      if (auto_pad == "VALID") {
        pb = pe = 0;
      } else {
        pb = pads[i];
        pe = pads[i + nsp];
      }
      GAF_CHECK(!__builtin_sub_overflow(full, CheckedAdd(pb, pe, "pads"), &out), "{}: output size overflows",
                node.Describe());
    }
    GAF_CHECK(out >= 0, "{}: ConvTranspose output size is negative", node.Describe());
    g.in[off + i] = in;
    g.out[off + i] = out;
    g.k[off + i] = k;
    g.s[off + i] = s;
    g.d[off + i] = d;
    g.pb[off + i] = pb;
    g.pe[off + i] = pe;
  }
  if (B) {
    GAF_CHECK(B->numel() == M && B->dtype() == X.dtype(),
              "{}: ConvTranspose bias must have {} elements", node.Describe(), M);
  }
  ctx.outputs[0] = Tensor(X.dtype(), OutShape(N, M, g));
  T* y = ctx.outputs[0].data<T>();
  if (ctx.outputs[0].numel() == 0) return;
  const T* x = X.data<T>();
  const T* w = W.data<T>();
  const int64_t isz = g.in_size(), osz = g.out_size(), kvol = g.k_size();
  const int64_t ID = g.in[0], IH = g.in[1], IW = g.in[2];
  const int64_t OH = g.out[1], OW = g.out[2];
  std::vector<T> col(static_cast<size_t>(Mg * kvol * isz));
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t gi = 0; gi < group; ++gi) {
      // col[Mg*kvol, isz] = W_g^T [Mg*kvol, Cg] * X_g [Cg, isz]
      Gemm<T>(true, false, Mg * kvol, isz, Cg, 1.f, w + gi * Cg * Mg * kvol, Mg * kvol,
              x + (n * C + gi * Cg) * isz, isz, 0.f, col.data(), isz);
      T* yg = y + (n * M + gi * Mg) * osz;
      ParallelFor(Mg, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, kvol * isz)),
                  [&](int64_t m0, int64_t m1) {
        for (int64_t m = m0; m < m1; ++m) {
          T* ym = yg + m * osz;
          const T* cm = col.data() + m * kvol * isz;
          for (int64_t kd = 0; kd < g.k[0]; ++kd)
            for (int64_t kh = 0; kh < g.k[1]; ++kh)
              for (int64_t kw = 0; kw < g.k[2]; ++kw) {
                const T* crow = cm + ((kd * g.k[1] + kh) * g.k[2] + kw) * isz;
                int64_t offw = kw * g.d[2] - g.pb[2];
                int64_t lo, hi;
                KernelRange(offw, g.s[2], IW, OW, &lo, &hi);  // iw range with ow in [0, OW)
                for (int64_t id = 0; id < ID; ++id) {
                  int64_t od = id * g.s[0] - g.pb[0] + kd * g.d[0];
                  if (od < 0 || od >= g.out[0]) continue;
                  for (int64_t ih = 0; ih < IH; ++ih) {
                    int64_t oh = ih * g.s[1] - g.pb[1] + kh * g.d[1];
                    if (oh < 0 || oh >= OH) continue;
                    T* dst = ym + (od * OH + oh) * OW + offw;
                    const T* srow = crow + (id * IH + ih) * IW;
                    const int64_t sw = g.s[2];
                    for (int64_t iw = lo; iw < hi; ++iw) dst[iw * sw] += srow[iw];
                  }
                }
              }
          if (B) {
            T b = B->data<T>()[gi * Mg + m];
            for (int64_t i = 0; i < osz; ++i) ym[i] += b;
          }
        }
      });
    }
  }
}

}  // namespace

void ConvTransposeKernel(KernelContext& ctx) {
  DataType dt = ctx.input(0).dtype();
  if (dt == DataType::kFloat) return RunConvTranspose<float>(ctx);
  if (dt == DataType::kDouble) return RunConvTranspose<double>(ctx);
  GAF_UNSUPPORTED("{}: ConvTranspose of type {} is not supported", ctx.node.Describe(),
                  DataTypeName(dt));
}

}  // namespace gaf::nn_detail

namespace gaf {

using namespace nn_detail;

ConvGeometry ConvGeometryOf(const Node& node, const Shape& x, const Shape& w) {
  ConvGeometry c;
  Geom g = ConvGeom(node, x, w, &c.group);
  c.nsp = g.nsp;
  c.in = g.in;
  c.out = g.out;
  c.k = g.k;
  c.s = g.s;
  c.d = g.d;
  c.pb = g.pb;
  c.pe = g.pe;
  return c;
}

ConvGeometry PoolGeometryOf(const Node& node, const Shape& x, const std::vector<int64_t>& kernel) {
  Geom g = MakeGeom(node, x, kernel, node.GetInt("ceil_mode", 0) != 0);
  ConvGeometry c;
  c.nsp = g.nsp;
  c.in = g.in;
  c.out = g.out;
  c.k = g.k;
  c.s = g.s;
  c.d = g.d;
  c.pb = g.pb;
  c.pe = g.pe;
  return c;
}

Shape ConvOutputShape(const Node& node, const Shape& x, const Shape& w) {
  int64_t group = 1;
  Geom g = ConvGeom(node, x, w, &group);
  return OutShape(x[0], w[0], g);
}

void ConvF32(const Node& node, const Tensor& X, const Tensor& W, const Tensor* B, Tensor* Y,
             const ConvEpilogue& epilogue) {
  GAF_CHECK(X.dtype() == DataType::kFloat && W.dtype() == DataType::kFloat,
            "{}: ConvF32 needs float32 input and weight", node.Describe());
  int64_t group = 1;
  Geom g = ConvGeom(node, X.shape(), W.shape(), &group);
  const int64_t N = X.dim(0), C = X.dim(1), M = W.dim(0);
  if (B != nullptr)
    GAF_CHECK(B->numel() == M && B->dtype() == DataType::kFloat, "{}: Conv bias must have {} elements",
              node.Describe(), M);
  const Shape out = OutShape(N, M, g);
  if (Y->dtype() != DataType::kFloat || Y->shape() != out) *Y = Tensor::Uninitialized(DataType::kFloat, out);
  if (Y->numel() == 0) return;
  const float* bias = B != nullptr ? B->data<float>() : nullptr;
  if (group == C && group > 1 && M % C == 0 && W.dim(1) == 1) {
    if (g.k[0] == 1 && g.in[0] == 1)
      DepthwiseConv2DF32(X.data<float>(), W.data<float>(), bias, Y->data<float>(), N, C, M, g, &epilogue);
    else
      DepthwiseConv<float>(X.data<float>(), W.data<float>(), bias, Y->data<float>(), N, C, M, g,
                           &epilogue);
    return;
  }
  ConvTiledF32(g, group, N, C, M, X.data<float>(), W.data<float>(), bias, Y->data<float>(),
               &epilogue);
}

}  // namespace gaf
