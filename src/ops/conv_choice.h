// Which oneDNN implementation runs a convolution, chosen by measurement on this machine.
//
// For one convolution (its source, weights, destination descriptors and post-ops fixed), oneDNN
// offers several implementations: for the direct algorithm jit kernels per ISA level (jit_1x1,
// jit, brgconv, brgconv_1x1, jit_dw, brdgmm_dw, gemm), and for 3x3 stride-1 convolutions on the
// channel-blocked layout Winograd kernels (F(4x4,3x3) jit_wino_4x3 and F(2x2,3x3) wino_2x3),
// which do 2.25-4x fewer multiplications at a transform cost. Which is fastest depends on the
// shape, the thread count and the CPU (Winograd F(4,3) ran a 64-channel 56x56 3x3 layer 2.8x
// faster than the direct kernel on one AMD Zen 4 core, and the 512-channel 7x7 one no faster;
// on an Intel Xeon its F(2,3) was 1.4x faster on the first and slower on most others), so it is
// measured, not guessed: every candidate is timed on scratch buffers of its own layouts,
// interleaved, and the fastest kept when it beats oneDNN's first choice by a margin.
//
// Winograd changes the rounding (its transforms are float32 sums of scaled inputs, so errors grow
// with the layer's magnitudes more than the direct kernels' reordered sums do; ResNet-50 with 13
// Winograd layers stayed within 5e-5 of PyTorch's outputs, as the direct kernels did, and the
// unit tests hold them to 1e-4 of the output's scale); callers that must keep the direct
// algorithm's numerics pass winograd=false.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

namespace gaf {

using ConvPd = dnnl::convolution_forward::primitive_desc;

struct ConvCandidate {
  ConvPd pd;
  // oneDNN's implementation name (impl_info_str), e.g. "jit_wino_4x3:avx512_core"; with
  // kSwishPass appended for a swish_after candidate.
  std::string name;
  bool winograd = false;
  // The convolution's post-ops lack its final Swish, which runs as a pass of its own over the
  // destination (SwishInPlace). oneDNN applies a Swish post-op to one vector at a time inside the
  // convolution's loop, where its exp and division are latency-bound: on a Zen 4 core it cost
  // ~0.76 ns per element there against ~0.37 ns in the pass, so a 64-channel 1x1 convolution with
  // SiLU ran faster as convolution, then pass.
  bool swish_after = false;
  // The convolution reads and writes NHWC in a chain on the channel-blocked layout: a reorder from
  // the chain's layout before it and one back after it, timed with it. oneDNN has its brgemm
  // convolution kernels for NHWC only; on the strided 3x3 convolutions of ResNet-50 they ran
  // 16-29% faster than the blocked layout's jit kernel (one AMD Zen 5 core and two, cold caches:
  // 512 channels 14x14 to 7x7 1.44 against 1.75 ms at one thread, 128 channels 56x56 to 28x28
  // 0.76 against 1.06 ms at two).
  bool nhwc = false;
};
inline constexpr const char* kSwishPass = "+swish-pass";
inline constexpr const char* kNhwcRoundTrip = "+nhwc";

// x[i] * sigmoid(x[i]) in place for i < n, on the calling thread's OpenMP team size (relative
// error ~2e-7).
void SwishInPlace(float* x, int64_t n);

// The optimized implementations for a convolution: `desc(algorithm)` describes it with that
// algorithm and `attr` gives its post-ops (oneDNN's implementation list keeps a pointer to the
// description while it is walked, so the description lives here, not in the caller); the direct
// algorithm's first `max_direct` optimized implementations in oneDNN's order (index 0: oneDNN's
// own choice), then, with `winograd`, every optimized Winograd one. Reference implementations are
// never candidates. Empty when oneDNN has no optimized implementation at all.
using ConvDesc = dnnl::convolution_forward::desc;
// With `attr_without_swish` (the post-ops less a final Swish), the direct algorithm's
// implementations under those post-ops follow as swish_after candidates.
std::vector<ConvCandidate> ConvCandidates(const std::function<ConvDesc(dnnl::algorithm)>& desc,
                                          const dnnl::primitive_attr& attr, bool winograd, int max_direct = 3,
                                          const dnnl::primitive_attr* attr_without_swish = nullptr);

// Appends oneDNN's first optimized direct implementation of the convolution `nhwc_desc` describes
// (NHWC source and destination) as an nhwc candidate, when there is one.
void AppendNhwcCandidate(const std::function<ConvDesc(dnnl::algorithm)>& nhwc_desc, const dnnl::primitive_attr& attr,
                         std::vector<ConvCandidate>* out);

struct ConvChoice {
  size_t index = 0;          // into the candidates
  std::vector<double> ms;    // median ms per candidate (0 for one dropped after its first run)
};

// Times every candidate on zeroed scratch memory of its own descriptors (an nhwc candidate with
// its reorders from and to candidate 0's source and destination layouts), `extra` giving the
// descriptors of further arguments (binary post-op sources) by argument id: a warm-up run each,
// one run each that drops candidates over 1.5x the fastest, then 3 to 7 interleaved rounds of the
// rest (fewer for slow convolutions: about 15 ms of runs per candidate). Index 0 is
// kept unless another's median is at least `margin` (0.03: 3%) faster. With a single candidate
// nothing runs; when index 0's warm-up takes over 250 ms nothing more runs and it is kept.
ConvChoice MeasureConvCandidates(const std::vector<ConvCandidate>& candidates,
                                 const std::unordered_map<int, dnnl::memory::desc>& extra, double margin = 0.03);

// What this process measured, by a description of the convolution (its shapes, layouts,
// geometry, post-ops and the thread count, as ChainPlanner::ChooseConvImpl writes it): the kernel's name,
// "" when none was measured. Networks repeat their layers, so each distinct convolution is timed
// once. Thread-safe.
std::string MeasuredConvKernel(const std::string& key);
void RememberConvKernel(const std::string& key, const std::string& name);

}  // namespace gaf
