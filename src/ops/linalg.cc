// Linear algebra: Det.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "ops/kernel_util.h"
#include "ops/loss_quant_internal.h"

namespace gaf::loss_quant_detail {
namespace {

// ---------------------------------------------------------------------------------------------
// Det
// ---------------------------------------------------------------------------------------------

template <class T>
double Determinant(const T* a, int64_t m, std::vector<double>& buf) {
  buf.assign(a, a + m * m);
  double det = 1.0;
  for (int64_t k = 0; k < m; ++k) {
    int64_t piv = k;
    for (int64_t i = k + 1; i < m; ++i)
      if (std::fabs(buf[i * m + k]) > std::fabs(buf[piv * m + k])) piv = i;
    if (buf[piv * m + k] == 0.0) return 0.0;
    if (piv != k) {
      for (int64_t j = 0; j < m; ++j) std::swap(buf[k * m + j], buf[piv * m + j]);
      det = -det;
    }
    const double d = buf[k * m + k];
    det *= d;
    for (int64_t i = k + 1; i < m; ++i) {
      const double f = buf[i * m + k] / d;
      if (f == 0.0) continue;
      for (int64_t j = k + 1; j < m; ++j) buf[i * m + j] -= f * buf[k * m + j];
    }
  }
  return det;
}

}  // namespace

void DetKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const Tensor& x = ctx.input(0);
  GAF_CHECK(x.rank() >= 2 && x.dim(-1) == x.dim(-2), "{}: input must have shape [*, M, M], got {}",
            node.Describe(), ShapeToString(x.shape()));
  Shape out_shape(x.shape().begin(), x.shape().end() - 2);
  const int64_t m = x.dim(-1);
  const int64_t batch = NumElements(out_shape);
  Tensor y(x.dtype(), out_shape);
  DispatchFloat(x.dtype(), node, [&](auto tag) {
    using T = decltype(tag);
    const T* xp = x.data<T>();
    T* yp = y.data<T>();
    ParallelFor(batch, std::max<int64_t>(1, 4096 / std::max<int64_t>(1, m * m * m)), [&](int64_t b, int64_t e) {
      std::vector<double> buf;
      for (int64_t i = b; i < e; ++i) yp[i] = static_cast<T>(Determinant<T>(xp + i * m * m, m, buf));
    });
  });
  ctx.outputs[0] = y;
}

}  // namespace gaf::loss_quant_detail
