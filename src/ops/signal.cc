// Signal operators: HannWindow, HammingWindow, BlackmanWindow, DFT, STFT and MelWeightMatrix.
#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdint>
#include <vector>

#include "ops/kernel_util.h"
#include "ops/loss_quant_internal.h"

namespace gaf::loss_quant_detail {
namespace {

// ---------------------------------------------------------------------------------------------
// Signal: windows, DFT, STFT, MelWeightMatrix
// ---------------------------------------------------------------------------------------------

constexpr double kPi = 3.14159265358979323846;

DataType OutputDataType(const Node& node, const char* attr, DataType def) {
  const DataType dt = static_cast<DataType>(node.GetInt(attr, static_cast<int64_t>(def)));
  switch (dt) {
    case DataType::kFloat: case DataType::kDouble: case DataType::kFloat16: case DataType::kBFloat16:
    case DataType::kUint8: case DataType::kInt8: case DataType::kUint16: case DataType::kInt16:
    case DataType::kUint32: case DataType::kInt32: case DataType::kUint64: case DataType::kInt64:
      return dt;
    default:
      GAF_UNSUPPORTED("{}: {} {} is not supported", node.Describe(), attr, static_cast<int>(dt));
  }
}

}  // namespace

void WindowKernel(KernelContext& ctx, WindowKind kind) {
  const Node& node = ctx.node;
  const Tensor& st = ctx.input(0);
  GAF_CHECK(st.numel() == 1, "{}: size must be a scalar", node.Describe());
  const int64_t size = st.ScalarAsInt64();
  GAF_CHECK(size >= 0, "{}: size must be >= 0, got {}", node.Describe(), size);
  const bool periodic = node.GetInt("periodic", 1) != 0;
  const DataType dt = OutputDataType(node, "output_datatype", DataType::kFloat);
  Tensor t(DataType::kDouble, {size});
  double* p = t.data<double>();
  const double denom = static_cast<double>(periodic ? size : size - 1);
  for (int64_t k = 0; k < size; ++k) {
    if (denom <= 0) {
      p[k] = 1.0;
      continue;
    }
    const double a = 2 * kPi * static_cast<double>(k) / denom;
    switch (kind) {
      case WindowKind::kHann: p[k] = 0.5 - 0.5 * std::cos(a); break;
      case WindowKind::kHamming: p[k] = 25.0 / 46.0 - (21.0 / 46.0) * std::cos(a); break;
      case WindowKind::kBlackman: p[k] = 0.42 - 0.5 * std::cos(a) + 0.08 * std::cos(2 * a); break;
    }
  }
  ctx.outputs[0] = DoublesTo(t, dt);
}

namespace {

using Cd = std::complex<double>;

// A length-L DFT: radix-2 FFT when L is a power of two, direct O(L^2) sum otherwise.
class DftPlan {
 public:
  DftPlan(int64_t len, bool inverse) : len_(len), inverse_(inverse), tw_(static_cast<size_t>(len)) {
    const double sign = inverse ? 2.0 : -2.0;
    for (int64_t j = 0; j < len; ++j) {
      const double a = sign * kPi * static_cast<double>(j) / static_cast<double>(len);
      tw_[j] = Cd(std::cos(a), std::sin(a));
    }
    pow2_ = len > 0 && (len & (len - 1)) == 0;
  }
  // Transforms buf (len_ samples, overwritten) and writes the first out_len bins to out.
  void Run(std::vector<Cd>& buf, Cd* out, int64_t out_len) const {
    const double scale = inverse_ ? 1.0 / static_cast<double>(len_) : 1.0;
    if (pow2_) {
      Fft(buf);
      for (int64_t k = 0; k < out_len; ++k) out[k] = buf[k] * scale;
      return;
    }
    for (int64_t k = 0; k < out_len; ++k) {
      Cd s = 0;
      int64_t idx = 0;
      for (int64_t t = 0; t < len_; ++t) {
        s += buf[t] * tw_[idx];
        idx += k;
        if (idx >= len_) idx -= len_;
      }
      out[k] = s * scale;
    }
  }

 private:
  void Fft(std::vector<Cd>& a) const {
    const int64_t n = len_;
    for (int64_t i = 1, j = 0; i < n; ++i) {
      int64_t bit = n >> 1;
      for (; j & bit; bit >>= 1) j ^= bit;
      j ^= bit;
      if (i < j) std::swap(a[i], a[j]);
    }
    for (int64_t len = 2; len <= n; len <<= 1) {
      const int64_t step = n / len, half = len / 2;
      for (int64_t i = 0; i < n; i += len)
        for (int64_t j = 0; j < half; ++j) {
          const Cd u = a[i + j], v = a[i + j + half] * tw_[j * step];
          a[i + j] = u + v;
          a[i + j + half] = u - v;
        }
    }
  }

  int64_t len_;
  bool inverse_;
  bool pow2_ = false;
  std::vector<Cd> tw_;
};

}  // namespace

void DftKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& x = ctx.input(0);
  const int64_t r = x.rank();
  GAF_CHECK(r >= 2 && (x.dim(-1) == 1 || x.dim(-1) == 2),
            "{}: input must have rank >= 2 and a last dimension of 1 (real) or 2 (complex), got {}",
            node.Describe(), ShapeToString(x.shape()));
  int64_t axis = 1;
  if (ctx.opset >= 20) {
    axis = ctx.has_input(2) && ctx.input(2).numel() > 0 ? ctx.input(2).ScalarAsInt64() : -2;
  } else {
    axis = node.GetInt("axis", 1);
  }
  if (axis < 0) axis += r;
  GAF_CHECK(axis >= 0 && axis <= r - 2, "{}: axis {} is out of range for input shape {}", node.Describe(), axis,
            ShapeToString(x.shape()));
  const int64_t n = x.dim(axis);
  int64_t len = n;
  if (ctx.has_input(1) && ctx.input(1).numel() > 0) len = ctx.input(1).ScalarAsInt64();
  GAF_CHECK(len >= 1, "{}: dft_length must be >= 1, got {}", node.Describe(), len);
  const bool inverse = node.GetInt("inverse", 0) != 0;
  const bool onesided = node.GetInt("onesided", 0) != 0;
  if (inverse && onesided)
    GAF_UNSUPPORTED("{}: onesided inverse DFT is not supported", node.Describe());
  const int64_t out_len = onesided ? len / 2 + 1 : len;
  const int64_t comp = x.dim(-1);
  const int64_t outer = Product(x.shape(), 0, static_cast<size_t>(axis));
  const int64_t inner = Product(x.shape(), static_cast<size_t>(axis) + 1, static_cast<size_t>(r - 1));
  Shape out_shape = x.shape();
  out_shape[axis] = out_len;
  out_shape.back() = 2;
  Tensor y(x.dtype(), out_shape);
  const DftPlan plan(len, inverse);
  const int64_t used = std::min(n, len);
  DispatchFloat(x.dtype(), node, [&](auto tag) {
    using T = decltype(tag);
    const T* xp = x.data<T>();
    T* yp = y.data<T>();
    const int64_t cost = len * (len < 64 ? len : 64);
    ParallelFor(outer * inner, std::max<int64_t>(1, 65536 / std::max<int64_t>(1, cost)), [&](int64_t b, int64_t e) {
      std::vector<Cd> buf(static_cast<size_t>(len)), out(static_cast<size_t>(out_len));
      for (int64_t p = b; p < e; ++p) {
        const int64_t o = p / inner, i = p % inner;
        std::fill(buf.begin(), buf.end(), Cd(0, 0));
        for (int64_t t = 0; t < used; ++t) {
          const T* s = xp + ((o * n + t) * inner + i) * comp;
          buf[t] = Cd(static_cast<double>(s[0]), comp == 2 ? static_cast<double>(s[1]) : 0.0);
        }
        plan.Run(buf, out.data(), out_len);
        for (int64_t k = 0; k < out_len; ++k) {
          T* d = yp + ((o * out_len + k) * inner + i) * 2;
          d[0] = static_cast<T>(out[k].real());
          d[1] = static_cast<T>(out[k].imag());
        }
      }
    });
  });
  ctx.outputs[0] = y;
}

void StftKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& x = ctx.input(0);
  GAF_CHECK(x.rank() == 3 && (x.dim(2) == 1 || x.dim(2) == 2),
            "{}: signal must have shape [batch, length, 1 or 2], got {}", node.Describe(), ShapeToString(x.shape()));
  const int64_t step = ctx.input(1).ScalarAsInt64();
  GAF_CHECK(step > 0, "{}: frame_step must be positive, got {}", node.Describe(), step);
  const Tensor* window = ctx.has_input(2) && ctx.input(2).numel() > 0 ? ctx.inputs[2] : nullptr;
  int64_t len = -1;
  if (ctx.has_input(3) && ctx.input(3).numel() > 0) len = ctx.input(3).ScalarAsInt64();
  if (window != nullptr) {
    GAF_CHECK(window->rank() == 1, "{}: window must be 1-D, got {}", node.Describe(), ShapeToString(window->shape()));
    if (len < 0) len = window->dim(0);
    GAF_CHECK(window->dim(0) == len, "{}: window length {} differs from frame_length {}", node.Describe(),
              window->dim(0), len);
  }
  GAF_CHECK(len > 0, "{}: frame_length (or a window) is required and must be positive", node.Describe());
  const int64_t batch = x.dim(0), sig = x.dim(1), comp = x.dim(2);
  GAF_CHECK(len <= sig, "{}: frame_length {} exceeds the signal length {}", node.Describe(), len, sig);
  const bool onesided = node.GetInt("onesided", 1) != 0;
  const int64_t frames = 1 + (sig - len) / step;
  const int64_t bins = onesided ? len / 2 + 1 : len;
  std::vector<double> win(static_cast<size_t>(len), 1.0);
  if (window != nullptr) win = window->ToDoubles();
  Tensor y(x.dtype(), {batch, frames, bins, 2});
  const DftPlan plan(len, false);
  DispatchFloat(x.dtype(), node, [&](auto tag) {
    using T = decltype(tag);
    const T* xp = x.data<T>();
    T* yp = y.data<T>();
    ParallelFor(batch * frames, std::max<int64_t>(1, 65536 / (len * std::min<int64_t>(len, 64))),
                [&](int64_t b, int64_t e) {
                  std::vector<Cd> buf(static_cast<size_t>(len)), out(static_cast<size_t>(bins));
                  for (int64_t p = b; p < e; ++p) {
                    const int64_t bi = p / frames, f = p % frames;
                    const T* s = xp + (bi * sig + f * step) * comp;
                    for (int64_t t = 0; t < len; ++t)
                      buf[t] = Cd(static_cast<double>(s[t * comp]) * win[t],
                                  comp == 2 ? static_cast<double>(s[t * comp + 1]) * win[t] : 0.0);
                    plan.Run(buf, out.data(), bins);
                    T* d = yp + p * bins * 2;
                    for (int64_t k = 0; k < bins; ++k) {
                      d[2 * k] = static_cast<T>(out[k].real());
                      d[2 * k + 1] = static_cast<T>(out[k].imag());
                    }
                  }
                });
  });
  ctx.outputs[0] = y;
}

// The mel step divides by num_mel_bins + 2, as the ONNX reference and ONNX Runtime do.
void MelWeightMatrixKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const int64_t num_mel = ctx.input(0).ScalarAsInt64();
  const int64_t dft_len = ctx.input(1).ScalarAsInt64();
  const int64_t rate = ctx.input(2).ScalarAsInt64();
  const float lower = static_cast<float>(ctx.input(3).ScalarAsDouble());
  const float upper = static_cast<float>(ctx.input(4).ScalarAsDouble());
  GAF_CHECK(num_mel > 0 && dft_len > 0 && rate > 0,
            "{}: num_mel_bins, dft_length and sample_rate must be positive", node.Describe());
  const DataType dt = OutputDataType(node, "output_datatype", DataType::kFloat);
  const int64_t spec_bins = dft_len / 2 + 1;
  const float low_mel = 2595.0f * std::log10(1.0f + lower / 700.0f);
  const float high_mel = 2595.0f * std::log10(1.0f + upper / 700.0f);
  const double mel_step = static_cast<double>((high_mel - low_mel) / static_cast<float>(num_mel + 2));
  std::vector<int64_t> fb(static_cast<size_t>(num_mel + 2));
  for (int64_t i = 0; i < num_mel + 2; ++i) {
    const double mel = static_cast<double>(i) * mel_step + static_cast<double>(low_mel);
    const double hz = 700.0 * (std::pow(10.0, mel / 2595.0) - 1.0);
    fb[i] = static_cast<int64_t>(std::floor(static_cast<double>(dft_len + 1) * hz / static_cast<double>(rate)));
  }
  Tensor t(DataType::kDouble, {spec_bins, num_mel});
  double* p = t.data<double>();
  auto at = [&](int64_t j, int64_t i) -> double& {
    GAF_CHECK(j >= 0 && j < spec_bins, "{}: frequency bin {} is out of range [0, {})", node.Describe(), j,
              spec_bins);
    return p[j * num_mel + i];
  };
  for (int64_t i = 0; i < num_mel; ++i) {
    const int64_t lo = fb[i], ce = fb[i + 1], hi = fb[i + 2];
    const int64_t low_to_center = ce - lo;
    if (low_to_center == 0) {
      at(ce, i) = 1.0;
    } else {
      for (int64_t j = lo; j <= ce; ++j) at(j, i) = static_cast<double>(j - lo) / static_cast<double>(low_to_center);
    }
    const int64_t center_to_high = hi - ce;
    if (center_to_high > 0)
      for (int64_t j = ce; j < hi; ++j) at(j, i) = static_cast<double>(hi - j) / static_cast<double>(center_to_high);
  }
  ctx.outputs[0] = DoublesTo(t, dt);
}

}  // namespace gaf::loss_quant_detail
