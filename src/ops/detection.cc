// Detection operators: NonMaxSuppression, RoiAlign and GridSample.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "ops/kernel_util.h"
#include "ops/loss_quant_internal.h"

namespace gaf::loss_quant_detail {
namespace {

// ---------------------------------------------------------------------------------------------
// NonMaxSuppression
// ---------------------------------------------------------------------------------------------

struct BoxCorners {
  float x_min, y_min, x_max, y_max;
};

BoxCorners ToCorners(const float* b, bool center_point) {
  if (center_point) {
    const float hw = b[2] / 2, hh = b[3] / 2;
    return {b[0] - hw, b[1] - hh, b[0] + hw, b[1] + hh};
  }
  return {std::min(b[1], b[3]), std::min(b[0], b[2]), std::max(b[1], b[3]), std::max(b[0], b[2])};
}

bool SuppressByIou(const BoxCorners& a, const BoxCorners& b, float iou_threshold) {
  const float ix_min = std::max(a.x_min, b.x_min), ix_max = std::min(a.x_max, b.x_max);
  if (ix_max <= ix_min) return false;
  const float iy_min = std::max(a.y_min, b.y_min), iy_max = std::min(a.y_max, b.y_max);
  if (iy_max <= iy_min) return false;
  const float inter = (ix_max - ix_min) * (iy_max - iy_min);
  if (inter <= 0.0f) return false;
  const float area_a = (a.x_max - a.x_min) * (a.y_max - a.y_min);
  const float area_b = (b.x_max - b.x_min) * (b.y_max - b.y_min);
  const float uni = area_a + area_b - inter;
  if (area_a <= 0.0f || area_b <= 0.0f || uni <= 0.0f) return false;
  return inter / uni > iou_threshold;
}

}  // namespace

void NonMaxSuppressionKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  Tensor boxes_t = ctx.input(0), scores_t = ctx.input(1);
  GAF_CHECK(boxes_t.rank() == 3 && boxes_t.dim(2) == 4, "{}: boxes must have shape [B, N, 4], got {}",
            node.Describe(), ShapeToString(boxes_t.shape()));
  GAF_CHECK(scores_t.rank() == 3 && scores_t.dim(0) == boxes_t.dim(0) && scores_t.dim(2) == boxes_t.dim(1),
            "{}: scores shape {} does not match boxes shape {} (expected [B, C, N])", node.Describe(),
            ShapeToString(scores_t.shape()), ShapeToString(boxes_t.shape()));
  if (boxes_t.dtype() != DataType::kFloat) boxes_t = boxes_t.CastTo(DataType::kFloat);
  if (scores_t.dtype() != DataType::kFloat) scores_t = scores_t.CastTo(DataType::kFloat);
  int64_t max_out = 0;
  if (ctx.has_input(2) && ctx.input(2).numel() > 0) max_out = ctx.input(2).ScalarAsInt64();
  float iou_th = 0.0f;
  if (ctx.has_input(3) && ctx.input(3).numel() > 0) iou_th = static_cast<float>(ctx.input(3).ScalarAsDouble());
  const bool has_score_th = ctx.has_input(4) && ctx.input(4).numel() > 0;
  const float score_th = has_score_th ? static_cast<float>(ctx.input(4).ScalarAsDouble()) : 0.0f;
  const int64_t center = node.GetInt("center_point_box", 0);
  GAF_CHECK(center == 0 || center == 1, "{}: center_point_box must be 0 or 1, got {}", node.Describe(), center);
  const int64_t nb = boxes_t.dim(0), nbox = boxes_t.dim(1), nc = scores_t.dim(1);
  const float* boxes = boxes_t.data<float>();
  const float* scores = scores_t.data<float>();
  std::vector<int64_t> result;
  if (max_out > 0) {
    std::vector<BoxCorners> corners(static_cast<size_t>(nbox));
    std::vector<int64_t> cand;
    std::vector<int64_t> selected;
    for (int64_t b = 0; b < nb; ++b) {
      for (int64_t i = 0; i < nbox; ++i) corners[i] = ToCorners(boxes + (b * nbox + i) * 4, center == 1);
      for (int64_t c = 0; c < nc; ++c) {
        const float* sc = scores + (b * nc + c) * nbox;
        cand.clear();
        for (int64_t i = 0; i < nbox; ++i)
          if (!has_score_th || sc[i] > score_th) cand.push_back(i);
        std::stable_sort(cand.begin(), cand.end(), [&](int64_t a, int64_t bb) { return sc[a] > sc[bb]; });
        selected.clear();
        for (int64_t i : cand) {
          if (static_cast<int64_t>(selected.size()) >= max_out) break;
          bool keep = true;
          for (int64_t s : selected)
            if (SuppressByIou(corners[s], corners[i], iou_th)) {
              keep = false;
              break;
            }
          if (!keep) continue;
          selected.push_back(i);
          result.insert(result.end(), {b, c, i});
        }
      }
    }
  }
  const int64_t num = static_cast<int64_t>(result.size()) / 3;
  Tensor out(DataType::kInt64, {num, 3});
  std::copy(result.begin(), result.end(), out.data<int64_t>());
  ctx.outputs[0] = out;
}

namespace {

// ---------------------------------------------------------------------------------------------
// RoiAlign
// ---------------------------------------------------------------------------------------------

struct RoiSample {
  int64_t pos[4];
  double w[4];
};

template <class T>
void RoiAlignTyped(const Node& node, const T* x, const T* rois, const int64_t* bidx, T* y, int64_t num_rois,
                   int64_t nc, int64_t h, int64_t w, int64_t oh, int64_t ow, int64_t sampling_ratio,
                   double spatial_scale, bool half_pixel, bool max_mode) {
  (void)node;
  const int64_t work = nc * oh * ow * 4;
  ParallelFor(num_rois, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, work)), [&](int64_t rb, int64_t re) {
    std::vector<RoiSample> pre;
    for (int64_t r = rb; r < re; ++r) {
      const T* roi = rois + r * 4;
      const double off = half_pixel ? 0.5 : 0.0;
      const double sw = roi[0] * spatial_scale - off, sh = roi[1] * spatial_scale - off;
      const double ew = roi[2] * spatial_scale - off, eh = roi[3] * spatial_scale - off;
      double rw = ew - sw, rh = eh - sh;
      if (!half_pixel) {
        rw = std::max(rw, 1.0);
        rh = std::max(rh, 1.0);
      }
      const double bh = rh / static_cast<double>(oh), bw = rw / static_cast<double>(ow);
      int64_t gh = sampling_ratio > 0 ? sampling_ratio : static_cast<int64_t>(std::ceil(rh / oh));
      int64_t gw = sampling_ratio > 0 ? sampling_ratio : static_cast<int64_t>(std::ceil(rw / ow));
      gh = std::max<int64_t>(gh, 0);
      gw = std::max<int64_t>(gw, 0);
      const double count = static_cast<double>(std::max<int64_t>(gh * gw, 1));
      pre.assign(static_cast<size_t>(oh * ow * gh * gw), RoiSample{});
      size_t idx = 0;
      for (int64_t ph = 0; ph < oh; ++ph)
        for (int64_t pw = 0; pw < ow; ++pw)
          for (int64_t iy = 0; iy < gh; ++iy)
            for (int64_t ix = 0; ix < gw; ++ix, ++idx) {
              double yy = sh + ph * bh + (iy + 0.5) * bh / static_cast<double>(gh);
              double xx = sw + pw * bw + (ix + 0.5) * bw / static_cast<double>(gw);
              RoiSample& s = pre[idx];
              if (yy < -1.0 || yy > h || xx < -1.0 || xx > w) continue;  // zero weights
              if (yy <= 0) yy = 0;
              if (xx <= 0) xx = 0;
              int64_t yl = static_cast<int64_t>(yy), xl = static_cast<int64_t>(xx), yh, xh;
              if (yl >= h - 1) {
                yh = yl = h - 1;
                yy = static_cast<double>(yl);
              } else {
                yh = yl + 1;
              }
              if (xl >= w - 1) {
                xh = xl = w - 1;
                xx = static_cast<double>(xl);
              } else {
                xh = xl + 1;
              }
              const double ly = yy - yl, lx = xx - xl, hy = 1 - ly, hx = 1 - lx;
              s.pos[0] = yl * w + xl;
              s.pos[1] = yl * w + xh;
              s.pos[2] = yh * w + xl;
              s.pos[3] = yh * w + xh;
              s.w[0] = hy * hx;
              s.w[1] = hy * lx;
              s.w[2] = ly * hx;
              s.w[3] = ly * lx;
            }
      const int64_t b = bidx[r];
      const int64_t gsz = gh * gw;
      for (int64_t c = 0; c < nc; ++c) {
        const T* xc = x + (b * nc + c) * h * w;
        T* yc = y + (r * nc + c) * oh * ow;
        for (int64_t p = 0; p < oh * ow; ++p) {
          const RoiSample* ps = pre.data() + p * gsz;
          double v = 0;
          if (!max_mode) {
            for (int64_t g = 0; g < gsz; ++g) {
              const RoiSample& s = ps[g];
              v += s.w[0] * xc[s.pos[0]] + s.w[1] * xc[s.pos[1]] + s.w[2] * xc[s.pos[2]] + s.w[3] * xc[s.pos[3]];
            }
            v /= count;
          } else {
            // Matches ONNX Runtime: max over samples of the max weighted corner value.
            for (int64_t g = 0; g < gsz; ++g) {
              const RoiSample& s = ps[g];
              double m = std::max(std::max(s.w[0] * xc[s.pos[0]], s.w[1] * xc[s.pos[1]]),
                                  std::max(s.w[2] * xc[s.pos[2]], s.w[3] * xc[s.pos[3]]));
              v = g == 0 ? m : std::max(v, m);
            }
          }
          yc[p] = static_cast<T>(v);
        }
      }
    }
  });
}

}  // namespace

void RoiAlignKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& x = ctx.input(0);
  const Tensor& rois = ctx.input(1);
  Tensor bidx = ctx.input(2);
  GAF_CHECK(x.rank() == 4, "{}: X must have rank 4, got shape {}", node.Describe(), ShapeToString(x.shape()));
  GAF_CHECK(rois.rank() == 2 && rois.dim(1) == 4, "{}: rois must have shape [num_rois, 4], got {}",
            node.Describe(), ShapeToString(rois.shape()));
  GAF_CHECK(rois.dtype() == x.dtype(), "{}: rois type {} differs from X type {}", node.Describe(),
            DataTypeName(rois.dtype()), DataTypeName(x.dtype()));
  const int64_t num_rois = rois.dim(0);
  GAF_CHECK(bidx.rank() == 1 && bidx.dim(0) == num_rois, "{}: batch_indices shape {} must be [{}]",
            node.Describe(), ShapeToString(bidx.shape()), num_rois);
  if (bidx.dtype() != DataType::kInt64) bidx = bidx.CastTo(DataType::kInt64);
  const int64_t* bi = bidx.data<int64_t>();
  for (int64_t i = 0; i < num_rois; ++i)
    GAF_CHECK(bi[i] >= 0 && bi[i] < x.dim(0), "{}: batch index {} is out of range [0, {})", node.Describe(),
              bi[i], x.dim(0));
  const std::string mode = node.GetString("mode", "avg");
  GAF_CHECK(mode == "avg" || mode == "max", "{}: invalid mode '{}'", node.Describe(), mode);
  const std::string ctm =
      node.GetString("coordinate_transformation_mode", ctx.opset >= 16 ? "half_pixel" : "output_half_pixel");
  GAF_CHECK(ctm == "half_pixel" || ctm == "output_half_pixel", "{}: invalid coordinate_transformation_mode '{}'",
            node.Describe(), ctm);
  const int64_t oh = node.GetInt("output_height", 1), ow = node.GetInt("output_width", 1);
  GAF_CHECK(oh > 0 && ow > 0, "{}: output_height and output_width must be positive", node.Describe());
  const int64_t sr = node.GetInt("sampling_ratio", 0);
  GAF_CHECK(sr >= 0, "{}: sampling_ratio must be >= 0", node.Describe());
  const double ss = node.GetFloat("spatial_scale", 1.0f);
  const int64_t nc = x.dim(1), h = x.dim(2), w = x.dim(3);
  GAF_CHECK(num_rois == 0 || (h > 0 && w > 0), "{}: X has an empty spatial size", node.Describe());
  Tensor y(x.dtype(), {num_rois, nc, oh, ow});
  DispatchFloat(x.dtype(), node, [&](auto tag) {
    using T = decltype(tag);
    RoiAlignTyped<T>(node, x.data<T>(), rois.data<T>(), bi, y.data<T>(), num_rois, nc, h, w, oh, ow, sr, ss,
                     ctm == "half_pixel", mode == "max");
  });
  ctx.outputs[0] = y;
}

namespace {

// ---------------------------------------------------------------------------------------------
// GridSample (2-D spatial; follows ONNX Runtime's reference implementation)
// ---------------------------------------------------------------------------------------------

enum class GsMode { kNearest, kLinear, kCubic };
enum class GsPad { kZeros, kBorder, kReflection };

double GsDenormalize(double n, int64_t len, bool align_corners) {
  return align_corners ? (n + 1) / 2.0 * static_cast<double>(len - 1)
                       : ((n + 1) * static_cast<double>(len) - 1) / 2.0;
}

double GsReflect(double x, double lo, double hi) {
  const double range = hi - lo;
  if (range <= 0) return lo;
  if (x < lo) {
    const double dx = lo - x;
    const int64_t n = static_cast<int64_t>(dx / range);
    const double r = dx - static_cast<double>(n) * range;
    return n % 2 == 0 ? lo + r : hi - r;
  }
  if (x > hi) {
    const double dx = x - hi;
    const int64_t n = static_cast<int64_t>(dx / range);
    const double r = dx - static_cast<double>(n) * range;
    return n % 2 == 0 ? hi - r : lo + r;
  }
  return x;
}

void GsCubicCoeffs(double x, double c[4]) {
  constexpr double a = -0.75;
  x = std::fabs(x);
  c[0] = ((a * (x + 1) - 5 * a) * (x + 1) + 8 * a) * (x + 1) - 4 * a;
  c[1] = ((a + 2) * x - (a + 3)) * x * x + 1;
  c[2] = ((a + 2) * (1 - x) - (a + 3)) * (1 - x) * (1 - x) + 1;
  c[3] = ((a * (2 - x) - 5 * a) * (2 - x) + 8 * a) * (2 - x) - 4 * a;
}

template <class T>
void GridSampleTyped(const T* x, const T* grid, T* y, int64_t n, int64_t nc, int64_t h, int64_t w, int64_t oh,
                     int64_t ow, GsMode mode, GsPad pad, bool align) {
  const double x_min = align ? 0.0 : -0.5, x_max = align ? w - 1.0 : w - 0.5;
  const double y_min = align ? 0.0 : -0.5, y_max = align ? h - 1.0 : h - 0.5;
  const int64_t opix = oh * ow;
  auto pixel = [&](const T* img, int64_t r, int64_t c) -> double {
    if (pad == GsPad::kZeros) {
      return (c >= 0 && c < w && r >= 0 && r < h) ? static_cast<double>(img[r * w + c]) : 0.0;
    }
    if (pad == GsPad::kReflection) {
      c = static_cast<int64_t>(GsReflect(static_cast<double>(c), x_min, x_max));
      r = static_cast<int64_t>(GsReflect(static_cast<double>(r), y_min, y_max));
    }
    c = std::clamp<int64_t>(c, 0, w - 1);
    r = std::clamp<int64_t>(r, 0, h - 1);
    return static_cast<double>(img[r * w + c]);
  };
  ParallelFor(n * oh, std::max<int64_t>(1, 8192 / std::max<int64_t>(1, ow * nc)), [&](int64_t rb, int64_t re) {
    for (int64_t row = rb; row < re; ++row) {
      const int64_t b = row / oh, oy = row % oh;
      const T* img_b = x + b * nc * h * w;
      for (int64_t ox = 0; ox < ow; ++ox) {
        const T* g = grid + ((b * oh + oy) * ow + ox) * 2;
        double gx = GsDenormalize(static_cast<double>(g[0]), w, align);
        double gy = GsDenormalize(static_cast<double>(g[1]), h, align);
        if (mode == GsMode::kNearest) {
          gx = std::nearbyint(gx);
          gy = std::nearbyint(gy);
        }
        if (gx < x_min || gx > x_max || gy < y_min || gy > y_max) {
          if (pad == GsPad::kBorder) {
            gx = std::clamp(gx, 0.0, static_cast<double>(w - 1));
            gy = std::clamp(gy, 0.0, static_cast<double>(h - 1));
          } else if (pad == GsPad::kReflection) {
            gx = GsReflect(gx, x_min, x_max);
            gy = GsReflect(gy, y_min, y_max);
          }
        }
        if (!std::isfinite(gx) || !std::isfinite(gy) || std::fabs(gx) > 1e15 || std::fabs(gy) > 1e15) {
          for (int64_t c = 0; c < nc; ++c) y[(b * nc + c) * opix + oy * ow + ox] = static_cast<T>(0);
          continue;
        }
        const int64_t out_off = oy * ow + ox;
        if (mode == GsMode::kNearest) {
          const int64_t ix = static_cast<int64_t>(gx), iy = static_cast<int64_t>(gy);
          for (int64_t c = 0; c < nc; ++c)
            y[(b * nc + c) * opix + out_off] = static_cast<T>(pixel(img_b + c * h * w, iy, ix));
        } else if (mode == GsMode::kLinear) {
          const int64_t x1 = static_cast<int64_t>(std::floor(gx)), y1 = static_cast<int64_t>(std::floor(gy));
          const int64_t x2 = x1 + 1, y2 = y1 + 1;
          const double dx2 = x2 - gx, dx1 = gx - x1, dy2 = y2 - gy, dy1 = gy - y1;
          for (int64_t c = 0; c < nc; ++c) {
            const T* img = img_b + c * h * w;
            const double p11 = pixel(img, y1, x1), p12 = pixel(img, y1, x2);
            const double p21 = pixel(img, y2, x1), p22 = pixel(img, y2, x2);
            y[(b * nc + c) * opix + out_off] =
                static_cast<T>(dy2 * (dx2 * p11 + dx1 * p12) + dy1 * (dx2 * p21 + dx1 * p22));
          }
        } else {
          const int64_t x0 = static_cast<int64_t>(std::floor(gx)) - 1;
          const int64_t y0 = static_cast<int64_t>(std::floor(gy)) - 1;
          double cx[4], cy[4];
          GsCubicCoeffs(gx - x0 - 1, cx);
          GsCubicCoeffs(gy - y0 - 1, cy);
          for (int64_t c = 0; c < nc; ++c) {
            const T* img = img_b + c * h * w;
            double v = 0;
            for (int i = 0; i < 4; ++i) {
              double row_v = 0;
              for (int j = 0; j < 4; ++j) row_v += cx[j] * pixel(img, y0 + i, x0 + j);
              v += cy[i] * row_v;
            }
            y[(b * nc + c) * opix + out_off] = static_cast<T>(v);
          }
        }
      }
    }
  });
}

}  // namespace

void GridSampleKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& x = ctx.input(0);
  const Tensor& grid = ctx.input(1);
  if (x.rank() != 4)
    GAF_UNSUPPORTED("{}: only 4-D inputs (2-D spatial) are supported, got shape {}", node.Describe(),
                    ShapeToString(x.shape()));
  GAF_CHECK(grid.rank() == 4 && grid.dim(0) == x.dim(0) && grid.dim(3) == 2,
            "{}: grid shape {} must be [N, H_out, W_out, 2] with N = {}", node.Describe(),
            ShapeToString(grid.shape()), x.dim(0));
  GAF_CHECK(grid.dtype() == x.dtype(), "{}: grid type {} differs from X type {}", node.Describe(),
            DataTypeName(grid.dtype()), DataTypeName(x.dtype()));
  const std::string m = node.GetString("mode", ctx.opset >= 20 ? "linear" : "bilinear");
  GsMode mode = GsMode::kLinear;
  if (m == "bilinear" || m == "linear") mode = GsMode::kLinear;
  else if (m == "nearest") mode = GsMode::kNearest;
  else if (m == "bicubic" || m == "cubic") mode = GsMode::kCubic;
  else GAF_CHECK(false, "{}: invalid mode '{}'", node.Describe(), m);
  const std::string p = node.GetString("padding_mode", "zeros");
  GsPad pad = GsPad::kZeros;
  if (p == "zeros") pad = GsPad::kZeros;
  else if (p == "border") pad = GsPad::kBorder;
  else if (p == "reflection") pad = GsPad::kReflection;
  else GAF_CHECK(false, "{}: invalid padding_mode '{}'", node.Describe(), p);
  const bool align = node.GetInt("align_corners", 0) != 0;
  const int64_t n = x.dim(0), nc = x.dim(1), h = x.dim(2), w = x.dim(3), oh = grid.dim(1), ow = grid.dim(2);
  GAF_CHECK(n * nc * oh * ow == 0 || (h > 0 && w > 0), "{}: X has an empty spatial size", node.Describe());
  Tensor y(x.dtype(), {n, nc, oh, ow});
  DispatchFloat(x.dtype(), node, [&](auto tag) {
    using T = decltype(tag);
    GridSampleTyped<T>(x.data<T>(), grid.data<T>(), y.data<T>(), n, nc, h, w, oh, ow, mode, pad, align);
  });
  ctx.outputs[0] = y;
}

}  // namespace gaf::loss_quant_detail
