// PreparedMatMul: oneDNN's matmul on a weight packed once (see ops/gemm.h).
#include <oneapi/dnnl/dnnl.hpp>

#include <map>
#include <mutex>
#include <tuple>
#include <memory>

#include "ops/copy_kernels.h"
#include "ops/dnnl_util.h"
#include "ops/gemm.h"
#include "ops/gemv.h"
#include "ops/kernel_util.h"
#include "ir/simd.h"  // GAF_AVX512

namespace gaf {
namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

// Primitives kept per weight: one per row count, up to this many (a prompt length each).
constexpr size_t kMaxPlans = 16;

}  // namespace

struct PreparedMatMul::Impl {
  struct Plan {
    dnnl::matmul prim;
    dnnl::memory weights;  // packed copy in the primitive's layout
  };
  std::mutex mu;
  std::unique_ptr<PanelWeight> panels;                             // made on first use
  std::map<int64_t, Plan> plans;                                   // by M
  struct Packed {
    dnnl::memory::desc md;
    Tensor storage;
    dnnl::memory mem;
  };
  std::vector<Packed> packed;  // per layout asked for
};

PreparedMatMul::PreparedMatMul(Tensor weight) : weight_(std::move(weight)), impl_(std::make_unique<Impl>()) {}
PreparedMatMul::~PreparedMatMul() = default;

std::shared_ptr<PreparedMatMul> SharedPreparedMatMul(const Tensor& weight) {
  using Key = std::tuple<const void*, int64_t, int64_t>;
  static std::mutex mu;
  static std::map<Key, std::weak_ptr<PreparedMatMul>> made;
  const Key key{weight.raw(), weight.dim(0), weight.dim(1)};
  std::lock_guard<std::mutex> lock(mu);
  if (std::shared_ptr<PreparedMatMul> mm = made[key].lock()) return mm;
  // Entries of weights no kernel holds any more, dropped now and then (bounded by the live ones).
  if (made.size() > 64)
    for (auto it = made.begin(); it != made.end();) it = it->second.expired() ? made.erase(it) : std::next(it);
  auto mm = std::make_shared<PreparedMatMul>(weight);
  made[key] = mm;
  return mm;
}

size_t PreparedMatMul::packed_copies() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->packed.size() + (impl_->panels ? 1 : 0);
}

const PanelWeight& PreparedMatMul::panels() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (!impl_->panels) impl_->panels = std::make_unique<PanelWeight>(weight_.data<float>(), K(), N());
  return *impl_->panels;
}

namespace {

// Whether a product of M rows runs on the panels (else oneDNN's matmul: a prompt without AVX-512).
bool OnPanels(int64_t M) { return GAF_AVX512 || M <= kPanelMaxRows; }

}  // namespace

void PreparedMatMul::Run(const float* A, int64_t M, float* C) const {
  const int64_t K = this->K(), N = this->N();
  if (K == 0) {
    SgemmF32(false, false, M, N, K, 1.f, A, K, weight_.data<float>(), N, 0.f, C, N);
    return;
  }
  // One row too: the panels stream each thread's share of the weight as one run of memory, which
  // read a decode step's weights 1.08-1.14x faster than the row-major GEMV's (decode_gemv_bench,
  // 2 threads, "panel" against "sibl" at one row).
  if (!OnPanels(M)) return RunLibrary(A, M, C);
  const PanelProduct p{&panels(), C};
  PanelGemmMany(A, M, K, &p, 1);
}

void PreparedMatMul::RunLibrary(const float* A, int64_t M, float* C) const {
  const int64_t K = this->K(), N = this->N();
  if (M == 0) return;
  if (K == 0) return Run(A, M, C);
  dnnl::engine& eng = DnnlEngine();
  Impl::Plan plan;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    auto it = impl_->plans.find(M);
    if (it == impl_->plans.end()) {
      dnnl::memory::desc src({M, K}, dt::f32, tag::ab), w_any({K, N}, dt::f32, tag::any), dst({M, N}, dt::f32, tag::ab);
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src, w_any, dst), eng);
      dnnl::memory packed;
      for (const Impl::Packed& p : impl_->packed)
        if (p.md == pd.weights_desc()) packed = p.mem;
      if (!packed) {
        NoteOwnParallelRegion();  // oneDNN runs its own OpenMP regions
        dnnl::stream s(eng);
        dnnl::memory user({{K, N}, dt::f32, tag::ab}, eng, const_cast<float*>(weight_.data<float>()));
        Impl::Packed p{pd.weights_desc(), Tensor(), dnnl::memory()};
        p.mem = MemoryOnTensor(p.md, &p.storage);
        dnnl::reorder(user, p.mem).execute(s, user, p.mem);
        s.wait();
        packed = p.mem;
        impl_->packed.push_back(std::move(p));
      }
      if (impl_->plans.size() >= kMaxPlans) impl_->plans.clear();
      it = impl_->plans.emplace(M, Impl::Plan{dnnl::matmul(pd), packed}).first;
    }
    plan = it->second;
  }
  NoteOwnParallelRegion();  // oneDNN runs its own OpenMP regions
  dnnl::stream s(eng);
  dnnl::memory src({{M, K}, dt::f32, tag::ab}, eng, const_cast<float*>(A));
  dnnl::memory dst({{M, N}, dt::f32, tag::ab}, eng, C);
  plan.prim.execute(s, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, plan.weights}, {DNNL_ARG_DST, dst}});
  s.wait();
}

namespace {

// The rows of A as [M, K] when A is float32 with last dim K (else 0 rows and false).
bool RowsOf(const Tensor& A, int64_t K, int64_t* M) {
  if (A.dtype() != DataType::kFloat || A.rank() < 1 || A.shape().back() != K || K == 0) return false;
  *M = A.numel() / K;
  return true;
}

}  // namespace

KernelInfo PreparedMatMulKernel(std::shared_ptr<PreparedMatMul> mm) {
  const KernelInfo* reference = OpRegistry::Global().Find("", "MatMul");
  KernelInfo k = *reference;
  k.fn = [mm, fallback = reference->fn](KernelContext& ctx) {
    const Tensor& A = ctx.input(0);
    int64_t M = 0;
    // A rank-1 A is a vector (no row dim in the output): the reference handles it.
    if (A.rank() < 2 || !RowsOf(A, mm->K(), &M)) return fallback(ctx);
    Shape s = A.shape();
    s.back() = mm->N();
    ctx.outputs[0] = Tensor::Uninitialized(DataType::kFloat, s);
    if (M > 0) mm->Run(A.data<float>(), M, ctx.outputs[0].data<float>());
  };
  return k;
}

std::shared_ptr<PreparedMatMul> PrepareGemm(const Node& node, const Tensor& b) {
  if (node.GetInt("transA", 0) != 0 || node.GetFloat("alpha", 1.f) != 1.f || b.dtype() != DataType::kFloat ||
      b.rank() != 2 || b.numel() < kPackedMatMulMinWeight)
    return nullptr;
  if (node.GetInt("transB", 0) == 0) return std::make_shared<PreparedMatMul>(b);
  const int64_t N = b.dim(0), K = b.dim(1);
  Tensor w = Tensor::Uninitialized(DataType::kFloat, {K, N});
  Transpose2D(b.data<float>(), K, w.data<float>(), N, K, N);  // w[k][n] = b[n][k]
  return std::make_shared<PreparedMatMul>(std::move(w));
}

KernelInfo PreparedGemmKernel(std::shared_ptr<PreparedMatMul> mm) {
  const KernelInfo* reference = OpRegistry::Global().Find("", "Gemm");
  KernelInfo k = *reference;
  k.fn = [mm, fallback = reference->fn](KernelContext& ctx) {
    const Node& n = ctx.node;
    const Tensor& A = ctx.input(0);
    if (A.dtype() != DataType::kFloat || A.rank() != 2 || A.dim(1) != mm->K() || n.GetInt("transA", 0) != 0 ||
        n.GetFloat("alpha", 1.f) != 1.f)
      return fallback(ctx);
    const int64_t M = A.dim(0), N = mm->N();
    const float beta = n.GetFloat("beta", 1.f);
    const Tensor* C = ctx.has_input(2) ? ctx.inputs[2] : nullptr;
    const float* c = nullptr;
    if (C != nullptr && beta != 0.f && C->numel() > 0) {
      const bool row = (C->rank() == 1 && C->dim(0) == N) || (C->rank() == 2 && C->dim(0) == 1 && C->dim(1) == N);
      if (C->dtype() != DataType::kFloat || !row) return fallback(ctx);
      c = C->data<float>();
    }
    ctx.outputs[0] = Tensor::Uninitialized(DataType::kFloat, {M, N});
    float* y = ctx.outputs[0].data<float>();
    if (M > 0 && N > 0) mm->Run(A.data<float>(), M, y);
    if (c != nullptr)
      for (int64_t m = 0; m < M; ++m)
        for (int64_t j = 0; j < N; ++j) y[m * N + j] += beta * c[j];
  };
  return k;
}

KernelInfo ResidualMatMulKernelOf(ResidualProduct product) {
  const KernelInfo* reference = OpRegistry::Global().Find("ai.graph_autofusion.plan", "ResidualMatMul");
  KernelInfo k = *reference;
  if (!product.broadcast)
    product.broadcast = [fallback = reference->fn](KernelContext& ctx, int64_t) { fallback(ctx); };
  k.fn = [product, fallback = reference->fn](KernelContext& ctx) {
    // A, W, R; with `norm`, also eps [, gamma] and a second output: the RMSNorm of the result.
    const bool norm = ctx.node.GetInt("norm", 0) != 0;
    if (ctx.num_inputs() < 3 || ctx.num_outputs() != (norm ? 2u : 1u) || (!norm && ctx.num_inputs() != 3) ||
        (norm && ctx.num_inputs() > 5))
      return fallback(ctx);
    for (size_t i = 0; i < ctx.num_inputs(); ++i)
      if (!ctx.has_input(i)) return fallback(ctx);
    const Tensor& A = ctx.input(0);
    const Tensor& W = ctx.input(1);
    const Tensor& R = ctx.input(2);
    const int64_t K = product.K, N = product.N;
    int64_t M = 0;
    if (A.dtype() != DataType::kFloat || A.rank() < 2 || !RowsOf(A, K, &M) || W.dtype() != DataType::kFloat ||
        W.shape() != Shape{K, N} || R.dtype() != DataType::kFloat || !product.takes(M))
      return fallback(ctx);
    Shape s = A.shape();
    s.back() = N;
    if (R.shape() != s) return product.broadcast(ctx, M);  // a broadcast addend: the MatMul and the Add
    ctx.outputs[0] = Tensor::Uninitialized(DataType::kFloat, s);
    const Tensor* gamma = norm && ctx.num_inputs() > 4 ? &ctx.input(4) : nullptr;
    int64_t n = 0;
    if (norm && !RMSNormTakes(ctx.node, ctx.outputs[0], &ctx.input(3), gamma, &n)) return fallback(ctx);
    float* y = ctx.outputs[0].data<float>();
    const float* r = R.data<float>();
    float* z = nullptr;
    if (norm) {
      ctx.outputs[1] = Tensor::Uninitialized(DataType::kFloat, s);
      z = ctx.outputs[1].data<float>();
    }
    if (M == 0 || N == 0) return;
    const float eps = norm ? ctx.input(3).data<float>()[0] : 0.f;
    const float* g = gamma != nullptr ? gamma->data<float>() : nullptr;
    const bool divide = ctx.node.GetInt("divide", 0) != 0;
    // Rows [m0, m1): y += r where `add` (else y holds the sum already), then the norm of each row
    // while it is in L1: the RMSNorm kernel's arithmetic (ops/rms_norm.cc).
    auto rows = [&](int64_t m0, int64_t m1, bool add) {
      std::vector<float> sq(norm ? static_cast<size_t>(N) : 0);
      for (int64_t m = m0; m < m1; ++m) {
        float* yr = y + m * N;
        if (add) {
          const float* rr = r + m * N;
#pragma omp simd
          for (int64_t j = 0; j < N; ++j) yr[j] += rr[j];
        }
        if (norm) RMSNormRowF32(yr, N, eps, g, divide, sq.data(), z + m * N);
      }
    };
    const bool added = product.run(A.data<float>(), M, y, r);
    if (added && !norm) return;
    const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 14) / N);
    ParallelFor(M, grain, [&](int64_t m0, int64_t m1) { rows(m0, m1, !added); });
  };
  return k;
}

ResidualProduct PreparedResidualProduct(std::shared_ptr<PreparedMatMul> mm) {
  ResidualProduct p;
  p.K = mm->K();
  p.N = mm->N();
  p.takes = [](int64_t) { return true; };
  p.run = [mm](const float* a, int64_t M, float* y, const float* add) {
    if (M <= kPanelMaxRows) {
      const PanelProduct p{&mm->panels(), y, 0, add};
      PanelGemmMany(a, M, mm->K(), &p, 1);
      return true;
    }
    // A prompt: the product, then the addend (and the norm) in one pass over the rows. Added where
    // its whole-K tiles store their sums, the addend's rows came from memory between the tiles'
    // FMAs, and the sums were long out of cache when the next node (an RMSNorm) read them: run
    // --profile of the bench Llama's 256-token prompt, interleaved with the MatMul and Add, showed
    // the products 3.3 ms a prompt slower and the RMSNorms 2.1 ms slower, for the Add's 2.2 ms.
    mm->Run(a, M, y);
    return false;
  };
  return p;
}

KernelInfo PreparedResidualMatMulKernel(std::shared_ptr<PreparedMatMul> mm) {
  return ResidualMatMulKernelOf(PreparedResidualProduct(std::move(mm)));
}

KernelInfo PreparedSiblingMatMulKernel(std::vector<std::shared_ptr<PreparedMatMul>> mms) {
  const KernelInfo* reference = OpRegistry::Global().Find("ai.graph_autofusion.plan", "SiblingMatMul");
  KernelInfo k = *reference;
  k.fn = [mms, fallback = reference->fn](KernelContext& ctx) {
    const Tensor& A = ctx.input(0);
    int64_t M = 0;
    const int64_t K = A.rank() >= 1 ? A.shape().back() : 0;
    if (A.rank() < 2 || !RowsOf(A, K, &M) || M < 1 || ctx.num_inputs() != mms.size() + 1) return fallback(ctx);
    bool all_prepared = true;
    for (size_t i = 0; i < mms.size(); ++i) {
      const Tensor& w = ctx.input(1 + i);
      if (w.dtype() != DataType::kFloat || w.rank() != 2 || w.dim(0) != K ||
          (mms[i] && (mms[i]->K() != K || mms[i]->N() != w.dim(1))))
        return fallback(ctx);
      all_prepared = all_prepared && mms[i] != nullptr;
    }
    if (OnPanels(M) && (all_prepared || M <= kPanelMaxRows)) {
      // Every weight's panels in one set of tasks; a few rows take the registry's multi-row GEMV
      // when some weight is not prepared.
      if (!all_prepared) return fallback(ctx);
      std::vector<PanelProduct> ps;
      for (size_t i = 0; i < mms.size(); ++i) {
        Shape s = A.shape();
        s.back() = mms[i]->N();
        ctx.outputs[i] = Tensor::Uninitialized(DataType::kFloat, s);
        ps.push_back({&mms[i]->panels(), ctx.outputs[i].data<float>()});
      }
      PanelGemmMany(A.data<float>(), M, K, ps.data(), static_cast<int>(ps.size()));
      return;
    }
    for (size_t i = 0; i < mms.size(); ++i) {
      const Tensor& w = ctx.input(1 + i);
      Shape s = A.shape();
      s.back() = w.dim(1);
      ctx.outputs[i] = Tensor::Uninitialized(DataType::kFloat, s);
      if (mms[i])
        mms[i]->Run(A.data<float>(), M, ctx.outputs[i].data<float>());
      else
        SgemmF32(false, false, M, w.dim(1), K, 1.f, A.data<float>(), K, w.data<float>(), w.dim(1), 0.f,
                 ctx.outputs[i].data<float>(), w.dim(1));
    }
  };
  return k;
}

KernelInfo PreparedGatedMatMulKernel(std::shared_ptr<PreparedMatMul> gate, std::shared_ptr<PreparedMatMul> up) {
  const KernelInfo* reference = OpRegistry::Global().Find("ai.graph_autofusion.plan", "GatedMatMul");
  KernelInfo k = *reference;
  GAF_CHECK(gate && up && gate->K() == up->K() && gate->N() == up->N(), "GatedMatMul: gate and up weights differ");
  struct Pair {
    std::once_flag once;
    PanelWeight panels;
  };
  auto pair = std::make_shared<Pair>();
  k.fn = [gate, up, pair, fallback = reference->fn](KernelContext& ctx) {
    const Tensor& A = ctx.input(0);
    const int64_t K = gate->K(), F = gate->N();
    int64_t M = 0;
    if (A.rank() < 2 || !RowsOf(A, K, &M) || ctx.num_inputs() != 3 || ctx.num_outputs() != 1) return fallback(ctx);
    for (size_t i = 1; i < 3; ++i) {
      const Tensor& w = ctx.input(i);
      if (w.dtype() != DataType::kFloat || w.shape() != Shape{K, F}) return fallback(ctx);
    }
    Shape s = A.shape();
    s.back() = F;
    ctx.outputs[0] = Tensor::Uninitialized(DataType::kFloat, s);
    float* y = ctx.outputs[0].data<float>();
    if (M == 0) return;
    if (OnPanels(M)) {
      std::call_once(pair->once, [&] {
        pair->panels = PanelWeight::GatePair(gate->weight().data<float>(), up->weight().data<float>(), K, F);
      });
      const PanelProduct p{&pair->panels, y, F};
      PanelGemmMany(A.data<float>(), M, K, &p, 1);
      return;
    }
    // A prompt without AVX-512: each product on its packed weight, then the gate row by row.
    Tensor G = Tensor::Uninitialized(DataType::kFloat, {M, F}), U = Tensor::Uninitialized(DataType::kFloat, {M, F});
    gate->Run(A.data<float>(), M, G.data<float>());
    up->Run(A.data<float>(), M, U.data<float>());
    const float* g = G.data<float>();
    const float* u = U.data<float>();
    ParallelFor(M, std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(F, 1)), [&](int64_t m0, int64_t m1) {
      StoreGated(g + m0 * F, F, u + m0 * F, F, m1 - m0, F, y + m0 * F, F);
    });
  };
  return k;
}

}  // namespace gaf
