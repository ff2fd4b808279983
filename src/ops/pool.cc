// Pooling: MaxPool, AveragePool, LpPool, their global variants and MaxUnpool.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "ops/kernel_util.h"
#include "ops/nn_internal.h"

namespace gaf::nn_detail {
namespace {

std::vector<int64_t> PoolKernelShape(const Node& node, const Tensor& X) {
  std::vector<int64_t> k = node.GetInts("kernel_shape", {});
  GAF_CHECK(!k.empty(), "{}: 'kernel_shape' attribute is required", node.Describe());
  GAF_CHECK(X.rank() == static_cast<int64_t>(k.size()) + 2,
            "{}: input of shape {} does not match kernel_shape of {} dims", node.Describe(),
            ShapeToString(X.shape()), k.size());
  return k;
}

// Per output index o along one dim: the valid kernel range [lo, hi) inside the input and
// (for count_include_pad) inside the padded input.
struct DimRanges {
  std::vector<int64_t> base, lo, hi, plo, phi;
};
DimRanges MakeRanges(const Geom& g, int i) {
  DimRanges r;
  for (int64_t o = 0; o < g.out[i]; ++o) {
    int64_t b = o * g.s[i] - g.pb[i], lo, hi, plo, phi;
    KernelRange(b, g.d[i], g.k[i], g.in[i], &lo, &hi);
    KernelRange(b + g.pb[i], g.d[i], g.k[i], g.in[i] + g.pb[i] + g.pe[i], &plo, &phi);
    r.base.push_back(b);
    r.lo.push_back(lo);
    r.hi.push_back(hi);
    r.plo.push_back(plo);
    r.phi.push_back(phi);
  }
  return r;
}

// MaxPool values (no indices) of a float 2-D/1-D pooling whose windows each hold at least one
// input element: each channel plane is copied into a -inf-bordered scratch plane, then every
// output row takes the max over the kernel taps in vector passes with no bounds tests. (The
// generic loop below computes one output element at a time with per-element window bounds.)
void MaxPool2DF32(const float* x, float* y, int64_t planes, const Geom& g) {
  const int64_t KH = g.k[1], KW = g.k[2], SH = g.s[1], SW = g.s[2], DH = g.d[1], DW = g.d[2];
  const int64_t IH = g.in[1], IW = g.in[2], OH = g.out[1], OW = g.out[2], isz = g.in_size(), osz = g.out_size();
  const int64_t PH = std::max<int64_t>(IH + g.pb[1], (OH - 1) * SH + (KH - 1) * DH + 1);
  const int64_t PW = std::max<int64_t>(IW + g.pb[2], (OW - 1) * SW + (KW - 1) * DW + 1);
  ParallelFor(planes, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, osz * KH * KW)), [&](int64_t p0, int64_t p1) {
    std::vector<float> pad(static_cast<size_t>(PH * PW));
    for (int64_t p = p0; p < p1; ++p) {
      std::fill(pad.begin(), pad.end(), -std::numeric_limits<float>::infinity());
      const float* xp = x + p * isz;
      for (int64_t ih = 0; ih < IH; ++ih)
        std::memcpy(pad.data() + (ih + g.pb[1]) * PW + g.pb[2], xp + ih * IW, sizeof(float) * IW);
      float* yp = y + p * osz;
      for (int64_t oh = 0; oh < OH; ++oh) {
        float* dst = yp + oh * OW;
        std::fill(dst, dst + OW, -std::numeric_limits<float>::infinity());
        for (int64_t kh = 0; kh < KH; ++kh)
          for (int64_t kw = 0; kw < KW; ++kw) {
            const float* src = pad.data() + (oh * SH + kh * DH) * PW + kw * DW;
            if (SW == 1) {
#pragma omp simd
              for (int64_t ow = 0; ow < OW; ++ow) dst[ow] = std::max(dst[ow], src[ow]);
            } else {
              for (int64_t ow = 0; ow < OW; ++ow) dst[ow] = std::max(dst[ow], src[ow * SW]);
            }
          }
      }
    }
  });
}

template <class T>
void RunMaxPool(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& X = ctx.input(0);
  std::vector<int64_t> kernel = PoolKernelShape(node, X);
  bool ceil_mode = node.GetInt("ceil_mode", 0) != 0;
  int64_t storage_order = node.GetInt("storage_order", 0);
  Geom g = MakeGeom(node, X.shape(), kernel, ceil_mode);
  int64_t N = X.dim(0), C = X.dim(1);
  bool want_idx = ctx.num_outputs() > 1 && ctx.has_output(1);
  if constexpr (std::is_same_v<T, float>) {
    // Every window holds an input element when the pads are smaller than the dilated kernel
    // (then no window lies entirely in padding, whose ONNX value would be 0 rather than -inf).
    bool inside = g.in[0] == 1 && g.k[0] == 1 && !want_idx;
    for (int i = 1; i < 3 && inside; ++i) inside = g.pb[i] < (g.k[i] - 1) * g.d[i] + 1 && g.pe[i] < (g.k[i] - 1) * g.d[i] + 1;
    // ceil_mode may add an output whose window starts in the end padding: MakeGeom keeps the last
    // window starting inside the input, so its taps include input elements.
    if (inside) {
      ctx.outputs[0] = Tensor::Uninitialized(DataType::kFloat, OutShape(N, C, g));
      if (ctx.outputs[0].numel() > 0) MaxPool2DF32(X.data<float>(), ctx.outputs[0].data<float>(), N * C, g);
      return;
    }
  }
  ctx.outputs[0] = Tensor(X.dtype(), OutShape(N, C, g));
  if (want_idx) ctx.outputs[1] = Tensor(DataType::kInt64, OutShape(N, C, g));
  const T* x = X.data<T>();
  T* y = ctx.outputs[0].data<T>();
  int64_t* yi = want_idx ? ctx.outputs[1].data<int64_t>() : nullptr;
  const int64_t isz = g.in_size(), osz = g.out_size();
  const int64_t ID = g.in[0], IH = g.in[1], IW = g.in[2];
  const int64_t OD = g.out[0], OH = g.out[1], OW = g.out[2];
  const DimRanges rd = MakeRanges(g, 0), rh = MakeRanges(g, 1), rw = MakeRanges(g, 2);
  ParallelFor(N * C, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, osz * g.k_size())),
              [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const T* xp = x + p * isz;
      T* yp = y + p * osz;
      for (int64_t od = 0; od < OD; ++od) {
        const int64_t bd = rd.base[od], dlo = rd.lo[od], dhi = rd.hi[od];
        for (int64_t oh = 0; oh < OH; ++oh) {
          const int64_t bh = rh.base[oh], hlo = rh.lo[oh], hhi = rh.hi[oh];
          for (int64_t ow = 0; ow < OW; ++ow) {
            const int64_t bw = rw.base[ow], wlo = rw.lo[ow], whi = rw.hi[ow];
            T best = std::numeric_limits<T>::lowest();
            int64_t arg = -1;
            if (!yi) {
              // Values only: branch-free max over the window.
              const int64_t dw = g.d[2];
              for (int64_t kd = dlo; kd < dhi; ++kd) {
                const int64_t id = bd + kd * g.d[0];
                for (int64_t kh = hlo; kh < hhi; ++kh) {
                  const T* row = xp + (id * IH + bh + kh * g.d[1]) * IW + bw;
                  for (int64_t kw = wlo; kw < whi; ++kw) best = std::max(best, row[kw * dw]);
                }
              }
              if (dhi > dlo && hhi > hlo && whi > wlo) arg = 0;
            } else {
            for (int64_t kd = dlo; kd < dhi; ++kd) {
              int64_t id = bd + kd * g.d[0];
              for (int64_t kh = hlo; kh < hhi; ++kh) {
                int64_t ih = bh + kh * g.d[1];
                const T* row = xp + (id * IH + ih) * IW;
                for (int64_t kw = wlo; kw < whi; ++kw) {
                  int64_t iw = bw + kw * g.d[2];
                  T v = row[iw];
                  if (v > best || arg < 0) {
                    best = v;
                    arg = (id * IH + ih) * IW + iw;
                  }
                }
              }
            }
            }
            int64_t o = (od * OH + oh) * OW + ow;
            if (arg < 0) best = T{};  // window entirely in padding
            yp[o] = best;
            if (yi) {
              int64_t idx = 0;
              if (arg >= 0) {
                if (storage_order == 0) {
                  idx = arg;
                } else {
                  int64_t iw = arg % IW, ih = (arg / IW) % IH, id = arg / (IW * IH);
                  // Column-major over the original spatial dims.
                  if (g.nsp == 3) {
                    idx = id + ih * ID + iw * ID * IH;
                  } else {
                    idx = ih + iw * IH;
                  }
                }
              }
              yi[p * osz + o] = p * isz + idx;
            }
          }
        }
      }
    }
  });
}

}  // namespace

void MaxPoolKernel(KernelContext& ctx) {
  DataType dt = ctx.input(0).dtype();
  switch (dt) {
    case DataType::kFloat: return RunMaxPool<float>(ctx);
    case DataType::kDouble: return RunMaxPool<double>(ctx);
    case DataType::kInt8: return RunMaxPool<int8_t>(ctx);
    case DataType::kUint8: return RunMaxPool<uint8_t>(ctx);
    case DataType::kInt32: return RunMaxPool<int32_t>(ctx);
    case DataType::kInt64: return RunMaxPool<int64_t>(ctx);
    default:
      GAF_UNSUPPORTED("{}: MaxPool of type {} is not supported", ctx.node.Describe(),
                      DataTypeName(dt));
  }
}

namespace {

// AveragePool (lp == 0) and LpPool (lp = p).
template <class T>
void RunAvgLpPool(KernelContext& ctx, bool is_lp) {
  const Node& node = ctx.node;
  const Tensor& X = ctx.input(0);
  std::vector<int64_t> kernel = PoolKernelShape(node, X);
  bool ceil_mode = node.GetInt("ceil_mode", 0) != 0;
  bool include_pad = node.GetInt("count_include_pad", 0) != 0;
  double p_norm = is_lp ? static_cast<double>(node.GetInt("p", 2)) : 0.0;
  Geom g = MakeGeom(node, X.shape(), kernel, ceil_mode);
  int64_t N = X.dim(0), C = X.dim(1);
  ctx.outputs[0] = Tensor(X.dtype(), OutShape(N, C, g));
  const T* x = X.data<T>();
  T* y = ctx.outputs[0].data<T>();
  const int64_t isz = g.in_size(), osz = g.out_size();
  const int64_t IH = g.in[1], IW = g.in[2];
  const int64_t OD = g.out[0], OH = g.out[1], OW = g.out[2];
  const DimRanges rd = MakeRanges(g, 0), rh = MakeRanges(g, 1), rw = MakeRanges(g, 2);
  ParallelFor(N * C, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, osz * g.k_size())),
              [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const T* xp = x + p * isz;
      T* yp = y + p * osz;
      for (int64_t od = 0; od < OD; ++od) {
        const int64_t bd = rd.base[od], dlo = rd.lo[od], dhi = rd.hi[od];
        const int64_t pdlo = rd.plo[od], pdhi = rd.phi[od];
        for (int64_t oh = 0; oh < OH; ++oh) {
          const int64_t bh = rh.base[oh], hlo = rh.lo[oh], hhi = rh.hi[oh];
          const int64_t phlo = rh.plo[oh], phhi = rh.phi[oh];
          for (int64_t ow = 0; ow < OW; ++ow) {
            const int64_t bw = rw.base[ow], wlo = rw.lo[ow], whi = rw.hi[ow];
            const int64_t pwlo = rw.plo[ow], pwhi = rw.phi[ow];
            double acc = 0;
            for (int64_t kd = dlo; kd < dhi; ++kd) {
              int64_t id = bd + kd * g.d[0];
              for (int64_t kh = hlo; kh < hhi; ++kh) {
                int64_t ih = bh + kh * g.d[1];
                const T* row = xp + (id * IH + ih) * IW + bw;
                if (!is_lp) {
                  for (int64_t kw = wlo; kw < whi; ++kw) acc += static_cast<double>(row[kw * g.d[2]]);
                } else if (p_norm == 2.0) {
                  for (int64_t kw = wlo; kw < whi; ++kw) {
                    double v = static_cast<double>(row[kw * g.d[2]]);
                    acc += v * v;
                  }
                } else {
                  for (int64_t kw = wlo; kw < whi; ++kw)
                    acc += std::pow(std::abs(static_cast<double>(row[kw * g.d[2]])), p_norm);
                }
              }
            }
            double r;
            if (is_lp) {
              r = p_norm == 2.0 ? std::sqrt(acc) : p_norm == 1.0 ? acc : std::pow(acc, 1.0 / p_norm);
            } else {
              int64_t cnt = include_pad ? (pdhi - pdlo) * (phhi - phlo) * (pwhi - pwlo)
                                        : (dhi - dlo) * (hhi - hlo) * (whi - wlo);
              r = cnt > 0 ? acc / static_cast<double>(cnt) : 0.0;
            }
            yp[(od * OH + oh) * OW + ow] = static_cast<T>(r);
          }
        }
      }
    }
  });
}

}  // namespace

void AveragePoolKernel(KernelContext& ctx) {
  DataType dt = ctx.input(0).dtype();
  if (dt == DataType::kFloat) return RunAvgLpPool<float>(ctx, false);
  if (dt == DataType::kDouble) return RunAvgLpPool<double>(ctx, false);
  GAF_UNSUPPORTED("{}: AveragePool of type {} is not supported", ctx.node.Describe(),
                  DataTypeName(dt));
}

void LpPoolKernel(KernelContext& ctx) {
  DataType dt = ctx.input(0).dtype();
  if (dt == DataType::kFloat) return RunAvgLpPool<float>(ctx, true);
  if (dt == DataType::kDouble) return RunAvgLpPool<double>(ctx, true);
  GAF_UNSUPPORTED("{}: LpPool of type {} is not supported", ctx.node.Describe(), DataTypeName(dt));
}

namespace {

template <class T>
void RunGlobalPool(KernelContext& ctx, GlobalMode mode) {
  const Node& node = ctx.node;
  const Tensor& X = ctx.input(0);
  GAF_CHECK(X.rank() >= 2, "{}: input must have rank >= 2 (got {})", node.Describe(),
            ShapeToString(X.shape()));
  int64_t N = X.dim(0), C = X.dim(1);
  int64_t sp = 1;
  Shape os{N, C};
  for (int64_t i = 2; i < X.rank(); ++i) {
    sp *= X.dim(i);
    os.push_back(1);
  }
  double p = mode == GlobalMode::kLp ? static_cast<double>(node.GetInt("p", 2)) : 0.0;
  ctx.outputs[0] = Tensor(X.dtype(), os);
  const T* x = X.data<T>();
  T* y = ctx.outputs[0].data<T>();
  ParallelFor(N * C, std::max<int64_t>(1, 32768 / std::max<int64_t>(1, sp)),
              [&](int64_t p0, int64_t p1) {
    for (int64_t c = p0; c < p1; ++c) {
      const T* xp = x + c * sp;
      if (mode == GlobalMode::kMax) {
        T m = sp > 0 ? xp[0] : T{};
        for (int64_t i = 1; i < sp; ++i) m = xp[i] > m ? xp[i] : m;
        y[c] = m;
      } else if (mode == GlobalMode::kAvg) {
        T s{};
#pragma omp simd reduction(+ : s)
        for (int64_t i = 0; i < sp; ++i) s += xp[i];
        y[c] = sp > 0 ? static_cast<T>(s / static_cast<T>(sp)) : T{};
      } else {
        double s = 0;
        if (p == 2.0) {
          for (int64_t i = 0; i < sp; ++i) s += static_cast<double>(xp[i]) * xp[i];
          y[c] = static_cast<T>(std::sqrt(s));
        } else {
          for (int64_t i = 0; i < sp; ++i) s += std::pow(std::abs(static_cast<double>(xp[i])), p);
          y[c] = static_cast<T>(std::pow(s, 1.0 / p));
        }
      }
    }
  });
}

}  // namespace

template <GlobalMode kMode>
void GlobalPoolKernel(KernelContext& ctx) {
  DataType dt = ctx.input(0).dtype();
  switch (dt) {
    case DataType::kFloat: return RunGlobalPool<float>(ctx, kMode);
    case DataType::kDouble: return RunGlobalPool<double>(ctx, kMode);
    default:
      if (kMode == GlobalMode::kMax) {
        if (dt == DataType::kInt8) return RunGlobalPool<int8_t>(ctx, kMode);
        if (dt == DataType::kUint8) return RunGlobalPool<uint8_t>(ctx, kMode);
      }
      GAF_UNSUPPORTED("{}: type {} is not supported", ctx.node.Describe(), DataTypeName(dt));
  }
}
template void GlobalPoolKernel<GlobalMode::kAvg>(KernelContext& ctx);
template void GlobalPoolKernel<GlobalMode::kMax>(KernelContext& ctx);
template void GlobalPoolKernel<GlobalMode::kLp>(KernelContext& ctx);

// MaxUnpool: scatters X into a zero tensor at the flat indices I (as produced by MaxPool).
void MaxUnpoolKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& X = ctx.input(0);
  const Tensor& I = ctx.input(1);
  GAF_CHECK(I.shape() == X.shape(), "{}: indices shape {} differs from input shape {}",
            node.Describe(), ShapeToString(I.shape()), ShapeToString(X.shape()));
  std::vector<int64_t> kernel = PoolKernelShape(node, X);
  size_t nsp = kernel.size();
  std::vector<int64_t> strides = SpatialAttr(node, "strides", nsp, 1);
  std::vector<int64_t> pads = node.GetInts("pads", {});
  if (pads.empty()) pads.assign(2 * nsp, 0);
  GAF_CHECK(pads.size() == 2 * nsp, "{}: 'pads' has {} values, expected {}", node.Describe(),
            pads.size(), 2 * nsp);
  // Indices address the default output shape; a given output_shape keeps coordinates and
  // pads (or crops) at the end of each spatial dim, as the ONNX reference does.
  Shape ds{X.dim(0), X.dim(1)};
  for (size_t i = 0; i < nsp; ++i) {
    GAF_CHECK(strides[i] >= 1 && kernel[i] >= 1 && pads[i] >= 0 && pads[i + nsp] >= 0,
              "{}: kernel and strides must be positive, pads not negative", node.Describe());
    const int64_t full =
        CheckedAdd(CheckedMul(X.dim(2 + i) - 1, strides[i], "output size"), kernel[i], "output size");
    ds.push_back(CheckedAdd(full, -CheckedAdd(pads[i], pads[i + nsp], "pads"), "output size"));
  }
  Shape os = ds;
  if (ctx.has_input(2)) {
    os = ctx.inputs[2]->ToInt64s();
    GAF_CHECK(os.size() == ds.size() && os[0] == X.dim(0) && os[1] == X.dim(1),
              "{}: output_shape {} does not match input {}", node.Describe(), ShapeToString(os),
              ShapeToString(X.shape()));
  }
  for (int64_t v : ds)
    GAF_CHECK(v >= 0, "{}: negative output size {}", node.Describe(), ShapeToString(ds));
  ctx.outputs[0] = Tensor(X.dtype(), os);
  std::vector<int64_t> idx = I.ToInt64s();
  int64_t total = NumElements(ds);
  std::vector<int64_t> dst = Strides(ds), ost = Strides(os);
  DispatchBySize(X.dtype(), node, [&](auto tag) {
    using U = decltype(tag);
    const U* x = static_cast<const U*>(X.raw());
    U* y = static_cast<U*>(ctx.outputs[0].raw());
    for (size_t i = 0; i < idx.size(); ++i) {
      GAF_CHECK(idx[i] >= 0 && idx[i] < total, "{}: index {} is outside the output of {} elements",
                node.Describe(), idx[i], total);
      int64_t rem = idx[i], o = 0;
      bool inside = true;
      for (size_t d = 0; d < ds.size(); ++d) {
        int64_t c = rem / dst[d];
        rem %= dst[d];
        if (c >= os[d]) inside = false;
        o += c * ost[d];
      }
      if (inside) y[o] = x[i];
    }
  });
}

}  // namespace gaf::nn_detail
