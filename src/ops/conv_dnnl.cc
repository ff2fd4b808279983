// PreparedConv: oneDNN's convolution for a constant weight (see ops/conv.h).
//
// Per input shape, a plan: the convolution primitive with "any" layouts (oneDNN picks its blocked
// layout and kernel, brgconv/jit on AVX-512 or AVX2), the weight reordered once into the layout
// the primitive wants, and reorder primitives between NCHW and the primitive's source/destination
// layouts. A call reorders the input, convolves (bias included) and reorders the output back.
#include <oneapi/dnnl/dnnl.hpp>

#include <cstdlib>
#include <cstring>
#include <mutex>

#include "ops/conv.h"
#include "ops/dnnl_util.h"
#include "ops/kernel_util.h"

namespace gaf {
namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

dnnl::memory::dims Dims(const Shape& s) { return dnnl::memory::dims(s.begin(), s.end()); }

// Per-thread scratch for the blocked-layout source and destination of a call: grown, never freed,
// so a model's convolutions do not allocate (and fault in) megabytes on every call.
struct Scratch {
  std::unique_ptr<float, decltype(&std::free)> p{nullptr, &std::free};
  size_t bytes = 0;
  void* Get(size_t need) {
    if (need > bytes) {
      const size_t size = (need + 63) / 64 * 64;
      p.reset(static_cast<float*>(std::aligned_alloc(64, size)));
      GAF_CHECK(p != nullptr, "prepared convolution: cannot allocate {} bytes of scratch", size);
      bytes = size;
    }
    return p.get();
  }
};

}  // namespace

struct PreparedConv::Impl {
  Node node;
  Tensor weight, bias;  // float32; bias undefined when absent
  std::vector<ConvPostOp> post;
  struct Plan {
    Shape x, y;
    dnnl::convolution_forward conv;
    Tensor weights_storage;
    dnnl::memory weights, bias;  // in the primitive's layouts (weights on weights_storage)
    dnnl::memory::desc src_md, dst_md, user_src_md, user_dst_md;
    bool reorder_src = false, reorder_dst = false;
    dnnl::reorder src_reorder, dst_reorder, residual_reorder;
  };
  std::mutex mu;
  std::shared_ptr<const Plan> last;

  std::shared_ptr<const Plan> PlanFor(const Shape& x) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (last && last->x == x) return last;
    }
    auto p = std::make_shared<Plan>();
    p->x = x;
    ConvGeometry g = ConvGeometryOf(node, x, weight.shape());
    p->y = {x[0], weight.dim(0), g.out[1], g.out[2]};
    dnnl::engine& eng = DnnlEngine();
    auto src_any = dnnl::memory::desc(Dims(x), dt::f32, tag::any);
    auto w_any = dnnl::memory::desc(Dims(weight.shape()), dt::f32, tag::any);
    auto dst_any = dnnl::memory::desc(Dims(p->y), dt::f32, tag::any);
    dnnl::memory::dims strides{g.s[1], g.s[2]}, dil{g.d[1] - 1, g.d[2] - 1}, pad_l{g.pb[1], g.pb[2]},
        pad_r{g.pe[1], g.pe[2]};
    const bool has_bias = bias.defined();
    auto desc = has_bias ? dnnl::convolution_forward::desc(
                               dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, src_any, w_any,
                               dnnl::memory::desc({weight.dim(0)}, dt::f32, tag::x), dst_any, strides, dil, pad_l, pad_r)
                         : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference,
                                                           dnnl::algorithm::convolution_direct, src_any, w_any,
                                                           dst_any, strides, dil, pad_l, pad_r);
    dnnl::primitive_attr attr;
    if (!post.empty()) {
      dnnl::post_ops po;
      for (const ConvPostOp& op : post) {
        if (op.kind == ConvPostOp::kSum) po.append_sum(1.f);
        else if (op.kind == ConvPostOp::kRelu) po.append_eltwise(1.f, dnnl::algorithm::eltwise_relu, op.alpha, 0.f);
        else po.append_eltwise(1.f, dnnl::algorithm::eltwise_clip, op.alpha, op.beta);
      }
      attr.set_post_ops(po);
    }
    dnnl::convolution_forward::primitive_desc pd(desc, attr, eng);
    p->conv = dnnl::convolution_forward(pd);
    p->user_src_md = dnnl::memory::desc(Dims(x), dt::f32, tag::nchw);
    p->user_dst_md = dnnl::memory::desc(Dims(p->y), dt::f32, tag::nchw);
    p->src_md = pd.src_desc();
    p->dst_md = pd.dst_desc();
    p->reorder_src = p->src_md != p->user_src_md;
    p->reorder_dst = p->dst_md != p->user_dst_md;
    if (p->reorder_src) p->src_reorder = dnnl::reorder(dnnl::reorder::primitive_desc(eng, p->user_src_md, eng, p->src_md));
    if (p->reorder_dst) {
      p->dst_reorder = dnnl::reorder(dnnl::reorder::primitive_desc(eng, p->dst_md, eng, p->user_dst_md));
      p->residual_reorder = dnnl::reorder(dnnl::reorder::primitive_desc(eng, p->user_dst_md, eng, p->dst_md));
    }
    // The weight (and bias) once, in the primitive's layout.
    NoteOwnParallelRegion();  // oneDNN runs its own OpenMP regions
    dnnl::stream s(eng);
    dnnl::memory user_w(dnnl::memory::desc(Dims(weight.shape()), dt::f32, tag::oihw), eng,
                        const_cast<float*>(weight.data<float>()));
    p->weights = MemoryOnTensor(pd.weights_desc(), &p->weights_storage);
    dnnl::reorder(user_w, p->weights).execute(s, user_w, p->weights);
    if (has_bias) {
      p->bias = dnnl::memory(pd.bias_desc(), eng);
      std::memcpy(p->bias.get_data_handle(), bias.data<float>(), sizeof(float) * static_cast<size_t>(bias.numel()));
    }
    s.wait();
    std::lock_guard<std::mutex> lock(mu);
    last = p;
    return p;
  }
};

std::shared_ptr<PreparedConv> PreparedConv::Create(const Node& node, const Tensor& weight, const Tensor* bias,
                                                   std::vector<ConvPostOp> post_ops) {
  if (weight.dtype() != DataType::kFloat || weight.rank() != 4) return nullptr;
  if (bias != nullptr && (bias->dtype() != DataType::kFloat || bias->numel() != weight.dim(0))) return nullptr;
  if (node.GetInt("group", 1) != 1) return nullptr;
  // Where oneDNN's blocked convolution (with the layout changes around it) beat our tiled
  // im2col + sgemm on this class of machine (bench notes in docs/benchmarks.md): 3x3 and larger
  // kernels with enough output channels and reduction depth. 1x1 convolutions (the reorders cost
  // more than they save), depthwise and grouped ones keep our path.
  const int64_t M = weight.dim(0), K = weight.dim(1) * weight.dim(2) * weight.dim(3);
  if (weight.dim(2) * weight.dim(3) == 1 || M < 32 || K < 64) return nullptr;
  auto c = std::shared_ptr<PreparedConv>(new PreparedConv());
  c->impl_ = std::make_unique<Impl>();
  c->impl_->node = node;
  c->impl_->weight = weight;
  if (bias != nullptr) c->impl_->bias = *bias;
  c->impl_->post = std::move(post_ops);
  return c;
}

const std::vector<ConvPostOp>& PreparedConv::post_ops() const { return impl_->post; }

PreparedConv::~PreparedConv() = default;

void PreparedConv::Run(const Tensor& x, Tensor* y, const Tensor* residual) {
  GAF_CHECK(x.dtype() == DataType::kFloat && x.rank() == 4, "{}: prepared convolution needs a float32 NCHW input",
            impl_->node.Describe());
  std::shared_ptr<const Impl::Plan> p = impl_->PlanFor(x.shape());
  *y = Tensor::Uninitialized(DataType::kFloat, p->y);
  if (y->numel() == 0 || x.numel() == 0) return;
  dnnl::engine& eng = DnnlEngine();
  NoteOwnParallelRegion();  // oneDNN runs its own OpenMP regions
  dnnl::stream s(eng);
  dnnl::memory user_src(p->user_src_md, eng, const_cast<float*>(x.data<float>()));
  dnnl::memory user_dst(p->user_dst_md, eng, y->data<float>());
  dnnl::memory src = user_src, dst = user_dst;
  if (p->reorder_src) {
    thread_local Scratch src_scratch;
    src = dnnl::memory(p->src_md, eng, src_scratch.Get(p->src_md.get_size()));
    p->src_reorder.execute(s, {{DNNL_ARG_FROM, user_src}, {DNNL_ARG_TO, src}});
  }
  thread_local Scratch dst_scratch;
  if (p->reorder_dst) dst = dnnl::memory(p->dst_md, eng, dst_scratch.Get(p->dst_md.get_size()));
  bool sum = false;
  for (const ConvPostOp& op : impl_->post) sum |= op.kind == ConvPostOp::kSum;
  if (sum) {
    // The sum post-op adds what the destination holds: the residual, in the destination's layout.
    GAF_CHECK(residual != nullptr && residual->dtype() == DataType::kFloat && residual->shape() == p->y,
              "{}: prepared convolution with a residual needs a float32 residual of shape {}", impl_->node.Describe(),
              ShapeToString(p->y));
    if (p->reorder_dst) {
      dnnl::memory user_res(p->user_dst_md, eng, const_cast<float*>(residual->data<float>()));
      p->residual_reorder.execute(s, {{DNNL_ARG_FROM, user_res}, {DNNL_ARG_TO, dst}});
    } else {
      std::memcpy(y->data<float>(), residual->data<float>(), sizeof(float) * static_cast<size_t>(y->numel()));
    }
  }
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, p->weights}, {DNNL_ARG_DST, dst}};
  if (impl_->bias.defined()) args[DNNL_ARG_BIAS] = p->bias;
  p->conv.execute(s, args);
  if (p->reorder_dst) p->dst_reorder.execute(s, {{DNNL_ARG_FROM, dst}, {DNNL_ARG_TO, user_dst}});
  s.wait();
}

KernelInfo PreparedConvKernel(std::shared_ptr<PreparedConv> conv, bool fused_stage) {
  const KernelInfo* reference = OpRegistry::Global().Find("", "Conv");
  KernelInfo info;
  info.domain = "";
  info.op_type = "Conv";
  info.kind = OpKind::kContraction;
  info.upcast_half = true;
  info.fn = [conv, reference, fused_stage](KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    if (fused_stage) {
      conv->Run(x, &ctx.outputs[0], ctx.has_input(1) ? ctx.inputs[1] : nullptr);
      return;
    }
    if (x.dtype() != DataType::kFloat || x.rank() != 4) {
      reference->fn(ctx);
      return;
    }
    conv->Run(x, &ctx.outputs[0]);
  };
  return info;
}

}  // namespace gaf
