// Recurrent kernels: LSTM, GRU and RNN (ONNX semantics, opsets 7 to 22).
//
// Per direction, the input projection of all time steps is one GEMM (X * W^T + biases); each
// step then adds H_{t-1} * R^T (a GEMM over the batch) and applies the gate activations.
// layout=1 inputs are transposed to layout 0 first and outputs transposed back.
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "ops/kernel.h"
#include "ops/kernel_util.h"

namespace gaf {
namespace {

// C[M,N] = A[M,K] * B[N,K]^T + beta * C (row-major, leading dimensions given).
template <class T>
void GemmNT(int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb,
            float beta, T* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  if constexpr (std::is_same_v<T, float>) {
    if (K > 0) {
      dnnl_status_t st = dnnl_sgemm('N', 'T', M, N, K, 1.f, A, lda, B, ldb, beta, C, ldc);
      GAF_CHECK(st == dnnl_success, "oneDNN sgemm failed with status {}", static_cast<int>(st));
      return;
    }
  }
  ParallelFor(M * N, std::max<int64_t>(1, 16384 / std::max<int64_t>(K, 1)),
              [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      int64_t m = i / N, n = i % N;
      const T* a = A + m * lda;
      const T* b = B + n * ldb;
      T s{};
      for (int64_t k = 0; k < K; ++k) s += a[k] * b[k];
      T& c = C[m * ldc + n];
      c = beta == 0.f ? s : static_cast<T>(s + beta * c);
    }
  });
}

// ------------------------------------------------------------------------------------------
// Activations.

enum class Act {
  kSigmoid,
  kTanh,
  kRelu,
  kAffine,
  kLeakyRelu,
  kThresholdedRelu,
  kScaledTanh,
  kHardSigmoid,
  kElu,
  kSoftsign,
  kSoftplus
};

struct ActFn {
  Act kind = Act::kSigmoid;
  float alpha = 0.f, beta = 0.f;
};

// Clips to [-clip, clip] when clip > 0, then applies the activation in place.
template <class T>
void Apply(const ActFn& f, T* p, int64_t n, float clip) {
  if (clip > 0.f) {
    T c = static_cast<T>(clip);
    for (int64_t i = 0; i < n; ++i) p[i] = std::min(std::max(p[i], -c), c);
  }
  const T a = static_cast<T>(f.alpha), b = static_cast<T>(f.beta);
  switch (f.kind) {
    case Act::kSigmoid:
      for (int64_t i = 0; i < n; ++i) p[i] = T(1) / (T(1) + std::exp(-p[i]));
      break;
    case Act::kTanh:
      for (int64_t i = 0; i < n; ++i) p[i] = std::tanh(p[i]);
      break;
    case Act::kRelu:
      for (int64_t i = 0; i < n; ++i) p[i] = std::max(p[i], T(0));
      break;
    case Act::kAffine:
      for (int64_t i = 0; i < n; ++i) p[i] = a * p[i] + b;
      break;
    case Act::kLeakyRelu:
      for (int64_t i = 0; i < n; ++i) p[i] = p[i] >= T(0) ? p[i] : a * p[i];
      break;
    case Act::kThresholdedRelu:
      for (int64_t i = 0; i < n; ++i) p[i] = p[i] > a ? p[i] : T(0);
      break;
    case Act::kScaledTanh:
      for (int64_t i = 0; i < n; ++i) p[i] = a * std::tanh(b * p[i]);
      break;
    case Act::kHardSigmoid:
      for (int64_t i = 0; i < n; ++i) p[i] = std::min(T(1), std::max(T(0), a * p[i] + b));
      break;
    case Act::kElu:
      for (int64_t i = 0; i < n; ++i) p[i] = p[i] >= T(0) ? p[i] : a * (std::exp(p[i]) - T(1));
      break;
    case Act::kSoftsign:
      for (int64_t i = 0; i < n; ++i) p[i] = p[i] / (T(1) + std::abs(p[i]));
      break;
    case Act::kSoftplus:
      for (int64_t i = 0; i < n; ++i)
        p[i] = p[i] > T(20) ? p[i] : std::log1p(std::exp(p[i]));
      break;
  }
}

// Parses `activations` (with activation_alpha / activation_beta consumed in order by the
// functions that take them) into per * num_dirs functions.
std::vector<ActFn> ParseActivations(const Node& node, int64_t num_dirs,
                                    const std::vector<std::string>& defaults) {
  size_t per = defaults.size();
  std::vector<std::string> names = node.GetStrings("activations", {});
  if (names.empty()) {
    for (int64_t d = 0; d < num_dirs; ++d) names.insert(names.end(), defaults.begin(), defaults.end());
  } else if (names.size() == per && num_dirs == 2) {
    std::vector<std::string> twice = names;
    names.insert(names.end(), twice.begin(), twice.end());
  }
  GAF_CHECK(names.size() == per * num_dirs,
            "{}: 'activations' has {} entries, expected {} ({} per direction)", node.Describe(),
            names.size(), per * num_dirs, per);
  std::vector<float> alphas = node.GetFloats("activation_alpha", {});
  std::vector<float> betas = node.GetFloats("activation_beta", {});
  size_t ai = 0, bi = 0;
  std::vector<ActFn> fns;
  for (const std::string& raw : names) {
    std::string s;
    for (char ch : raw) s += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    ActFn f;
    bool need_alpha = false, need_beta = false;
    float da = 0.f, db = 0.f;
    if (s == "sigmoid") {
      f.kind = Act::kSigmoid;
    } else if (s == "tanh") {
      f.kind = Act::kTanh;
    } else if (s == "relu") {
      f.kind = Act::kRelu;
    } else if (s == "affine") {
      f.kind = Act::kAffine;
      need_alpha = need_beta = true;
      da = 1.f;
    } else if (s == "leakyrelu") {
      f.kind = Act::kLeakyRelu;
      need_alpha = true;
      da = 0.01f;
    } else if (s == "thresholdedrelu") {
      f.kind = Act::kThresholdedRelu;
      need_alpha = true;
      da = 1.f;
    } else if (s == "scaledtanh") {
      f.kind = Act::kScaledTanh;
      need_alpha = need_beta = true;
      da = 1.f;
      db = 1.f;
    } else if (s == "hardsigmoid") {
      f.kind = Act::kHardSigmoid;
      need_alpha = need_beta = true;
      da = 0.2f;
      db = 0.5f;
    } else if (s == "elu") {
      f.kind = Act::kElu;
      need_alpha = true;
      da = 1.f;
    } else if (s == "softsign") {
      f.kind = Act::kSoftsign;
    } else if (s == "softplus") {
      f.kind = Act::kSoftplus;
    } else {
      GAF_UNSUPPORTED("{}: activation function '{}' is not supported", node.Describe(), raw);
    }
    f.alpha = da;
    f.beta = db;
    if (need_alpha && ai < alphas.size()) f.alpha = alphas[ai++];
    if (need_beta && bi < betas.size()) f.beta = betas[bi++];
    fns.push_back(f);
  }
  return fns;
}

// ------------------------------------------------------------------------------------------
// Shared setup.

enum class Cell { kRnn, kGru, kLstm };

template <class T>
struct RnnSetup {
  int64_t seq = 0, batch = 0, input = 0, hidden = 0, dirs = 1, gates = 1;
  bool layout1 = false;
  std::string direction;
  std::vector<T> x;       // [seq, batch, input] (layout 0)
  std::vector<T> init_h;  // [dirs, batch, hidden]
  std::vector<T> init_c;  // [dirs, batch, hidden] (LSTM)
  std::vector<int64_t> lens;
  float clip = 0.f;
};

// [a, b, rest] -> [b, a, rest]
template <class T>
std::vector<T> Swap01(const T* src, int64_t a, int64_t b, int64_t rest) {
  std::vector<T> out(static_cast<size_t>(a * b * rest));
  for (int64_t i = 0; i < a; ++i)
    for (int64_t j = 0; j < b; ++j)
      std::memcpy(out.data() + (j * a + i) * rest, src + (i * b + j) * rest, sizeof(T) * rest);
  return out;
}

template <class T>
RnnSetup<T> Setup(KernelContext& ctx, Cell cell) {
  const Node& node = ctx.node;
  RnnSetup<T> s;
  const Tensor& X = ctx.input(0);
  const Tensor& W = ctx.input(1);
  const Tensor& R = ctx.input(2);
  s.gates = cell == Cell::kLstm ? 4 : cell == Cell::kGru ? 3 : 1;
  s.layout1 = node.GetInt("layout", 0) != 0;
  GAF_CHECK(X.rank() == 3 && W.rank() == 3 && R.rank() == 3,
            "{}: X, W and R must be 3-D (got {}, {}, {})", node.Describe(),
            ShapeToString(X.shape()), ShapeToString(W.shape()), ShapeToString(R.shape()));
  GAF_CHECK(W.dtype() == X.dtype() && R.dtype() == X.dtype(), "{}: W and R types differ from X",
            node.Describe());
  s.seq = s.layout1 ? X.dim(1) : X.dim(0);
  s.batch = s.layout1 ? X.dim(0) : X.dim(1);
  s.input = X.dim(2);
  s.direction = node.GetString("direction", "forward");
  GAF_CHECK(s.direction == "forward" || s.direction == "reverse" || s.direction == "bidirectional",
            "{}: invalid direction '{}'", node.Describe(), s.direction);
  s.dirs = s.direction == "bidirectional" ? 2 : 1;
  s.hidden = node.GetInt("hidden_size", R.dim(2));
  const int64_t H = s.hidden, G = s.gates;
  GAF_CHECK(W.dim(0) == s.dirs && W.dim(1) == G * H && W.dim(2) == s.input,
            "{}: W of shape {} does not match [{},{},{}]", node.Describe(),
            ShapeToString(W.shape()), s.dirs, G * H, s.input);
  GAF_CHECK(R.dim(0) == s.dirs && R.dim(1) == G * H && R.dim(2) == H,
            "{}: R of shape {} does not match [{},{},{}]", node.Describe(),
            ShapeToString(R.shape()), s.dirs, G * H, H);
  if (ctx.has_input(3)) {
    const Tensor& B = *ctx.inputs[3];
    GAF_CHECK(B.dtype() == X.dtype() && B.numel() == s.dirs * 2 * G * H,
              "{}: B of shape {} does not match [{},{}]", node.Describe(),
              ShapeToString(B.shape()), s.dirs, 2 * G * H);
  }
  const T* xp = X.data<T>();
  s.x = s.layout1 ? Swap01<T>(xp, s.batch, s.seq, s.input)
                  : std::vector<T>(xp, xp + X.numel());
  s.lens.assign(s.batch, s.seq);
  if (ctx.has_input(4)) {
    std::vector<int64_t> l = ctx.inputs[4]->ToInt64s();
    GAF_CHECK(static_cast<int64_t>(l.size()) == s.batch,
              "{}: sequence_lens has {} values, expected batch size {}", node.Describe(), l.size(),
              s.batch);
    for (int64_t b = 0; b < s.batch; ++b) {
      GAF_CHECK(l[b] >= 0 && l[b] <= s.seq, "{}: sequence_lens[{}]={} is outside [0, {}]",
                node.Describe(), b, l[b], s.seq);
      s.lens[b] = l[b];
    }
  }
  auto load_state = [&](size_t idx, const char* what) {
    std::vector<T> v(static_cast<size_t>(s.dirs * s.batch * H), T{});
    if (ctx.has_input(idx)) {
      const Tensor& t = *ctx.inputs[idx];
      GAF_CHECK(t.dtype() == X.dtype() && t.numel() == s.dirs * s.batch * H,
                "{}: {} of shape {} does not match {} directions, batch {}, hidden {}",
                node.Describe(), what, ShapeToString(t.shape()), s.dirs, s.batch, H);
      const T* p = t.data<T>();
      v = s.layout1 ? Swap01<T>(p, s.batch, s.dirs, H) : std::vector<T>(p, p + t.numel());
    }
    return v;
  };
  s.init_h = load_state(5, "initial_h");
  if (cell == Cell::kLstm) s.init_c = load_state(6, "initial_c");
  s.clip = node.HasAttr("clip") ? node.GetFloat("clip", 0.f) : 0.f;
  GAF_CHECK(!node.HasAttr("clip") || s.clip > 0.f, "{}: clip must be positive", node.Describe());
  return s;
}

// Writes Y ([seq, dirs, batch, H] in layout 0), Y_h and Y_c from the computed buffers.
template <class T>
void WriteOutputs(KernelContext& ctx, const RnnSetup<T>& s, const std::vector<T>& y,
                  const std::vector<T>& yh, const std::vector<T>* yc) {
  DataType dt = ctx.input(0).dtype();
  const int64_t H = s.hidden;
  if (ctx.num_outputs() > 0 && ctx.has_output(0)) {
    if (s.layout1) {
      // [seq, dirs, batch, H] -> [batch, seq, dirs, H]
      ctx.outputs[0] = Tensor(dt, {s.batch, s.seq, s.dirs, H});
      T* o = ctx.outputs[0].data<T>();
      for (int64_t t = 0; t < s.seq; ++t)
        for (int64_t d = 0; d < s.dirs; ++d)
          for (int64_t b = 0; b < s.batch; ++b)
            std::memcpy(o + ((b * s.seq + t) * s.dirs + d) * H,
                        y.data() + ((t * s.dirs + d) * s.batch + b) * H, sizeof(T) * H);
    } else {
      ctx.outputs[0] = Tensor(dt, {s.seq, s.dirs, s.batch, H});
      if (!y.empty()) std::memcpy(ctx.outputs[0].raw(), y.data(), sizeof(T) * y.size());
    }
  }
  auto write_state = [&](size_t i, const std::vector<T>& v) {
    if (ctx.num_outputs() <= i || !ctx.has_output(i)) return;
    if (s.layout1) {
      ctx.outputs[i] = Tensor(dt, {s.batch, s.dirs, H});
      std::vector<T> sw = Swap01<T>(v.data(), s.dirs, s.batch, H);
      if (!sw.empty()) std::memcpy(ctx.outputs[i].raw(), sw.data(), sizeof(T) * sw.size());
    } else {
      ctx.outputs[i] = Tensor(dt, {s.dirs, s.batch, H});
      if (!v.empty()) std::memcpy(ctx.outputs[i].raw(), v.data(), sizeof(T) * v.size());
    }
  };
  write_state(1, yh);
  if (yc) write_state(2, *yc);
}

// xw[seq*batch, G*H] = x * W_d^T + bias (bias excluded for gates >= skip_rb_from, whose
// recurrent bias is applied inside the step).
template <class T>
std::vector<T> InputProjection(const RnnSetup<T>& s, const T* w, const T* wb, const T* rb,
                               int64_t skip_rb_from) {
  const int64_t GH = s.gates * s.hidden, rows = s.seq * s.batch;
  std::vector<T> xw(static_cast<size_t>(rows * GH), T{});
  if (wb) {
    std::vector<T> bias(GH);
    for (int64_t j = 0; j < GH; ++j)
      bias[j] = wb[j] + (j < skip_rb_from * s.hidden ? rb[j] : T{});
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(xw.data() + r * GH, bias.data(), sizeof(T) * GH);
  }
  GemmNT<T>(rows, GH, s.input, s.x.data(), s.input, w, s.input, wb ? 1.f : 0.f, xw.data(), GH);
  return xw;
}

inline bool Reverse(const std::string& direction, int64_t d) {
  return direction == "reverse" || (direction == "bidirectional" && d == 1);
}

// ------------------------------------------------------------------------------------------
// RNN: H = f(X W^T + H R^T + Wb + Rb)

template <class T>
void RunRnn(KernelContext& ctx) {
  RnnSetup<T> s = Setup<T>(ctx, Cell::kRnn);
  std::vector<ActFn> acts = ParseActivations(ctx.node, s.dirs, {"Tanh"});
  const int64_t H = s.hidden, B = s.batch;
  const T* W = ctx.input(1).data<T>();
  const T* R = ctx.input(2).data<T>();
  const T* Bias = ctx.has_input(3) ? ctx.inputs[3]->data<T>() : nullptr;
  std::vector<T> y(static_cast<size_t>(s.seq * s.dirs * B * H), T{});
  std::vector<T> yh = s.init_h;
  std::vector<T> g(static_cast<size_t>(B * H));
  for (int64_t d = 0; d < s.dirs; ++d) {
    std::vector<T> xw = InputProjection<T>(s, W + d * H * s.input, Bias ? Bias + d * 2 * H : nullptr,
                                           Bias ? Bias + d * 2 * H + H : nullptr, 1);
    const T* rd = R + d * H * H;
    T* h = yh.data() + d * B * H;
    bool rev = Reverse(s.direction, d);
    for (int64_t step = 0; step < s.seq; ++step) {
      int64_t t = rev ? s.seq - 1 - step : step;
      std::memcpy(g.data(), xw.data() + t * B * H, sizeof(T) * B * H);
      GemmNT<T>(B, H, H, h, H, rd, H, 1.f, g.data(), H);
      for (int64_t b = 0; b < B; ++b) {
        if (t >= s.lens[b]) continue;
        T* gb = g.data() + b * H;
        Apply(acts[d], gb, H, s.clip);
        std::memcpy(h + b * H, gb, sizeof(T) * H);
        std::memcpy(y.data() + ((t * s.dirs + d) * B + b) * H, gb, sizeof(T) * H);
      }
    }
  }
  WriteOutputs<T>(ctx, s, y, yh, nullptr);
}

// ------------------------------------------------------------------------------------------
// GRU (gate order z, r, h).

template <class T>
void RunGru(KernelContext& ctx) {
  RnnSetup<T> s = Setup<T>(ctx, Cell::kGru);
  std::vector<ActFn> acts = ParseActivations(ctx.node, s.dirs, {"Sigmoid", "Tanh"});
  bool lbr = ctx.node.GetInt("linear_before_reset", 0) != 0;
  const int64_t H = s.hidden, B = s.batch, GH = 3 * H;
  const T* W = ctx.input(1).data<T>();
  const T* R = ctx.input(2).data<T>();
  const T* Bias = ctx.has_input(3) ? ctx.inputs[3]->data<T>() : nullptr;
  std::vector<T> y(static_cast<size_t>(s.seq * s.dirs * B * H), T{});
  std::vector<T> yh = s.init_h;
  std::vector<T> g(static_cast<size_t>(B * GH)), rec(static_cast<size_t>(B * GH)),
      rh(static_cast<size_t>(B * H)), hn(static_cast<size_t>(B * H));
  for (int64_t d = 0; d < s.dirs; ++d) {
    const T* wb = Bias ? Bias + d * 2 * GH : nullptr;
    const T* rb = Bias ? Bias + d * 2 * GH + GH : nullptr;
    // Rb_h is folded into the projection only when applied outside the reset gate.
    std::vector<T> xw = InputProjection<T>(s, W + d * GH * s.input, wb, rb, lbr ? 2 : 3);
    const T* rd = R + d * GH * H;
    const ActFn& f = acts[d * 2];
    const ActFn& gf = acts[d * 2 + 1];
    T* h = yh.data() + d * B * H;
    bool rev = Reverse(s.direction, d);
    for (int64_t step = 0; step < s.seq; ++step) {
      int64_t t = rev ? s.seq - 1 - step : step;
      std::memcpy(g.data(), xw.data() + t * B * GH, sizeof(T) * B * GH);
      if (lbr) {
        // rec = H * R^T (+ Rb_h on the h part)
        GemmNT<T>(B, GH, H, h, H, rd, H, 0.f, rec.data(), GH);
        for (int64_t b = 0; b < B; ++b) {
          T* gb = g.data() + b * GH;
          T* rcb = rec.data() + b * GH;
          for (int64_t j = 0; j < 2 * H; ++j) gb[j] += rcb[j];
          if (rb)
            for (int64_t j = 0; j < H; ++j) rcb[2 * H + j] += rb[2 * H + j];
          Apply(f, gb, 2 * H, s.clip);
          for (int64_t j = 0; j < H; ++j) gb[2 * H + j] += gb[H + j] * rcb[2 * H + j];
          Apply(gf, gb + 2 * H, H, s.clip);
        }
      } else {
        // z, r from H * [Rz; Rr]^T, then h from (r . H) * Rh^T
        GemmNT<T>(B, 2 * H, H, h, H, rd, H, 1.f, g.data(), GH);
        for (int64_t b = 0; b < B; ++b) {
          T* gb = g.data() + b * GH;
          Apply(f, gb, 2 * H, s.clip);
          for (int64_t j = 0; j < H; ++j) rh[b * H + j] = gb[H + j] * h[b * H + j];
        }
        GemmNT<T>(B, H, H, rh.data(), H, rd + 2 * H * H, H, 1.f, g.data() + 2 * H, GH);
        for (int64_t b = 0; b < B; ++b) Apply(gf, g.data() + b * GH + 2 * H, H, s.clip);
      }
      for (int64_t b = 0; b < B; ++b) {
        if (t >= s.lens[b]) continue;
        const T* gb = g.data() + b * GH;
        T* hb = h + b * H;
        T* yb = y.data() + ((t * s.dirs + d) * B + b) * H;
        for (int64_t j = 0; j < H; ++j) {
          T z = gb[j];
          hb[j] = (T(1) - z) * gb[2 * H + j] + z * hb[j];
          yb[j] = hb[j];
        }
      }
    }
  }
  WriteOutputs<T>(ctx, s, y, yh, nullptr);
}

// ------------------------------------------------------------------------------------------
// LSTM (gate order i, o, f, c; peepholes P in order i, o, f).

template <class T>
void RunLstm(KernelContext& ctx) {
  RnnSetup<T> s = Setup<T>(ctx, Cell::kLstm);
  std::vector<ActFn> acts = ParseActivations(ctx.node, s.dirs, {"Sigmoid", "Tanh", "Tanh"});
  bool input_forget = ctx.node.GetInt("input_forget", 0) != 0;
  const int64_t H = s.hidden, B = s.batch, GH = 4 * H;
  const T* W = ctx.input(1).data<T>();
  const T* R = ctx.input(2).data<T>();
  const T* Bias = ctx.has_input(3) ? ctx.inputs[3]->data<T>() : nullptr;
  const T* P = nullptr;
  if (ctx.has_input(7)) {
    const Tensor& pt = *ctx.inputs[7];
    GAF_CHECK(pt.dtype() == ctx.input(0).dtype() && pt.numel() == s.dirs * 3 * H,
              "{}: P of shape {} does not match [{},{}]", ctx.node.Describe(),
              ShapeToString(pt.shape()), s.dirs, 3 * H);
    P = pt.data<T>();
  }
  std::vector<T> y(static_cast<size_t>(s.seq * s.dirs * B * H), T{});
  std::vector<T> yh = s.init_h, yc = s.init_c;
  std::vector<T> g(static_cast<size_t>(B * GH)), hc(static_cast<size_t>(H));
  for (int64_t d = 0; d < s.dirs; ++d) {
    std::vector<T> xw = InputProjection<T>(s, W + d * GH * s.input,
                                           Bias ? Bias + d * 2 * GH : nullptr,
                                           Bias ? Bias + d * 2 * GH + GH : nullptr, 4);
    const T* rd = R + d * GH * H;
    const T* pd = P ? P + d * 3 * H : nullptr;
    const ActFn& f = acts[d * 3];
    const ActFn& gf = acts[d * 3 + 1];
    const ActFn& hf = acts[d * 3 + 2];
    T* h = yh.data() + d * B * H;
    T* c = yc.data() + d * B * H;
    bool rev = Reverse(s.direction, d);
    for (int64_t step = 0; step < s.seq; ++step) {
      int64_t t = rev ? s.seq - 1 - step : step;
      std::memcpy(g.data(), xw.data() + t * B * GH, sizeof(T) * B * GH);
      GemmNT<T>(B, GH, H, h, H, rd, H, 1.f, g.data(), GH);
      for (int64_t b = 0; b < B; ++b) {
        if (t >= s.lens[b]) continue;
        T* gi = g.data() + b * GH;
        T* go = gi + H;
        T* gfg = gi + 2 * H;
        T* gc = gi + 3 * H;
        T* cb = c + b * H;
        T* hb = h + b * H;
        if (pd) {
          for (int64_t j = 0; j < H; ++j) {
            gi[j] += pd[j] * cb[j];
            gfg[j] += pd[2 * H + j] * cb[j];
          }
        }
        Apply(f, gi, H, s.clip);
        if (input_forget) {
          for (int64_t j = 0; j < H; ++j) gfg[j] = T(1) - gi[j];
        } else {
          Apply(f, gfg, H, s.clip);
        }
        Apply(gf, gc, H, s.clip);
        for (int64_t j = 0; j < H; ++j) cb[j] = gfg[j] * cb[j] + gi[j] * gc[j];
        if (pd)
          for (int64_t j = 0; j < H; ++j) go[j] += pd[H + j] * cb[j];
        Apply(f, go, H, s.clip);
        std::memcpy(hc.data(), cb, sizeof(T) * H);
        Apply(hf, hc.data(), H, 0.f);
        T* yb = y.data() + ((t * s.dirs + d) * B + b) * H;
        for (int64_t j = 0; j < H; ++j) {
          hb[j] = go[j] * hc[j];
          yb[j] = hb[j];
        }
      }
    }
  }
  WriteOutputs<T>(ctx, s, y, yh, &yc);
}

template <void (*FloatFn)(KernelContext&), void (*DoubleFn)(KernelContext&)>
void DispatchRnn(KernelContext& ctx) {
  DataType dt = ctx.input(0).dtype();
  if (dt == DataType::kFloat) return FloatFn(ctx);
  if (dt == DataType::kDouble) return DoubleFn(ctx);
  GAF_UNSUPPORTED("{}: data type {} is not supported", ctx.node.Describe(), DataTypeName(dt));
}

}  // namespace

void RegisterRnnKernels(OpRegistry& r) {
  r.Register({"", "RNN", OpKind::kOpaque, DispatchRnn<RunRnn<float>, RunRnn<double>>, true});
  r.Register({"", "GRU", OpKind::kOpaque, DispatchRnn<RunGru<float>, RunGru<double>>, true});
  r.Register({"", "LSTM", OpKind::kOpaque, DispatchRnn<RunLstm<float>, RunLstm<double>>, true});
}

}  // namespace gaf
