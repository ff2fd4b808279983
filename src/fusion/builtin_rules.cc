// The built-in fusion rules and presets, as data in the rule-file format (docs/rule_format.md).
//
// One explicit list (no static self-registration): BuiltinRules() parses kBuiltinRules once.
// Each rule's source is "builtin:LINE", the line of its header below. Priorities are distinct
// across all built-in rules (a larger, more specific pattern has a higher priority), so built-in
// rules never conflict with each other; an overlap is resolved by priority and the loser recorded.
//
// Exporter variants are covered by node alternatives ("Div(d, std) | Mul(d, inv)"), commutative
// matching, and canonicalization (Identity, no-op Cast, inference Dropout, constant folding):
//   - scaling by 1/c is written Div(x, #c) | Mul(x, #1/c)
//   - 1/sqrt(v) is Sqrt then Div, or Sqrt then Reciprocal / Div(1, .) then Mul
//   - squares are Pow(x, #2) | Mul(x, x)
#include <mutex>

#include "fusion/rules.h"

namespace gaf {
namespace {

constexpr const char* kBuiltinRules = R"RULES(
// ======================= transformer =======================

// softmax(Q K^T * scale + mask) V, the attention core (BERT, GPT-2, Llama exports).
rule AttentionFusion fuse=FusedAttention priority=60 preset=transformer formula="softmax(q@k * scale + mask) @ v"
  qk = MatMul($q, $k)
  s  = Div(qk, #scale) | Mul(qk, #scale)
  m  = Add(s, $mask)
  p  = Softmax(m) axis=-1
  y  = MatMul(p, $v)
end

rule AttentionFusion(no-mask) fuse=FusedAttention priority=58 preset=transformer formula="softmax(q@k * scale) @ v"
  qk = MatMul($q, $k)
  s  = Div(qk, #scale) | Mul(qk, #scale)
  p  = Softmax(s) axis=-1
  y  = MatMul(p, $v)
end

// GPT-2 style exports mask with Where(causal_mask, scores, min) instead of adding a mask.
rule AttentionFusion(where-mask) fuse=FusedAttention priority=59 preset=transformer formula="softmax(where(mask, q@k * scale, fill)) @ v"
  qk = MatMul($q, $k)
  s  = Div(qk, $scale) | Mul(qk, $scale)
  m  = Where($mask, s, $fill) | Where($mask, $fill, s)
  p  = Softmax(m) axis=-1
  y  = MatMul(p, $v)
end

rule AttentionFusion(prescaled-where-mask) fuse=FusedAttention priority=57 preset=transformer formula="softmax(where(mask, (q * scale) @ k, fill)) @ v"
  qs = Div($q, $scale) | Mul($q, $scale)
  qk = MatMul(qs, $k)
  m  = Where($mask, qk, $fill) | Where($mask, $fill, qk)
  p  = Softmax(m) axis=-1
  y  = MatMul(p, $v)
end

rule MaskedSoftmaxFusion(where) fuse=FusedMaskedSoftmax priority=49 preset=transformer formula="softmax(where(mask, x, fill))"
  m = Where($mask, $x, $fill) | Where($mask, $fill, $x)
  y = Softmax(m) axis=-1
end

rule ScaledMaskedSoftmaxFusion fuse=FusedScaledMaskedSoftmax priority=50 preset=transformer formula="softmax(x * scale + mask)"
  s = Div($x, #scale) | Mul($x, #scale)
  m = Add(s, $mask)
  y = Softmax(m) axis=-1
end

pair Add+Softmax name=BiasSoftmaxFusion fuse=FusedBiasSoftmax priority=48 preset=transformer formula="softmax(x + bias)"

// The ONNX function bodies of LogSoftmax / Softmax (the *_expanded backend tests).
rule LogSoftmaxFusion(expanded) fuse=FusedLogSoftmax priority=47 preset=transformer formula="x - max - log(sum(exp(x - max)))"
  mx = ReduceMax($x) axes=@axes keepdims=1
  d  = Sub($x, mx)
  e  = Exp(d)
  s  = ReduceSum(e) axes=@axes keepdims=1
  l  = Log(s)
  y  = Sub(d, l)
end

rule SoftmaxFusion(expanded) fuse=FusedSoftmax priority=46 preset=transformer formula="exp(x - max) / sum(exp(x - max))"
  mx = ReduceMax($x) axes=@axes keepdims=1
  d  = Sub($x, mx)
  e  = Exp(d)
  s  = ReduceSum(e) axes=@axes keepdims=1
  y  = Div(e, s)
end

// Residual Add feeding an RMSNorm; the sum is also an output (the next residual reads it).
rule AddRMSNormFusion fuse=FusedAddRMSNorm priority=40 preset=transformer formula="s = a + b; s / sqrt(mean(s^2) + eps) * w"
  sum = Add($a, $b) export
  sq  = Pow(sum, #2) | Mul(sum, sum)
  var = ReduceMean(sq) axes=[-1]
  ve  = Add(var, #eps)
  std = Sqrt(ve)
  inv = Div(#1, std) | Reciprocal(std)
  n   = Mul(sum, inv) | Div(sum, std)
  y   = Mul(n, $weight)
end

rule RMSNormFusion fuse=FusedRMSNorm priority=39 preset=transformer formula="x / sqrt(mean(x^2) + eps) * w"
  sq  = Pow($x, #2) | Mul($x, $x)
  var = ReduceMean(sq) axes=[-1]
  ve  = Add(var, #eps)
  std = Sqrt(ve)
  inv = Div(#1, std) | Reciprocal(std)
  n   = Mul($x, inv) | Div($x, std)
  y   = Mul(n, $weight)
end

rule RMSNormFusion(no-weight) fuse=FusedRMSNorm priority=38 preset=transformer formula="x / sqrt(mean(x^2) + eps)"
  sq  = Pow($x, #2) | Mul($x, $x)
  var = ReduceMean(sq) axes=[-1]
  ve  = Add(var, #eps)
  std = Sqrt(ve)
  inv = Div(#1, std) | Reciprocal(std)
  n   = Mul($x, inv) | Div($x, std)
end

// Residual Add feeding a decomposed LayerNorm (SkipLayerNormalization); the sum is an output too.
rule AddLayerNormFusion fuse=FusedAddLayerNorm priority=45 preset=transformer formula="s = a + b; (s - mean) / sqrt(var + eps) * g + b"
  sum  = Add($a, $b) export
  mean = ReduceMean(sum) axes=@axes
  d    = Sub(sum, mean)
  sq   = Pow(d, #2) | Mul(d, d)
  var  = ReduceMean(sq) axes=@axes
  ve   = Add(var, #eps)
  std  = Sqrt(ve)
  inv  = Reciprocal(std) | Div(#1, std)
  n    = Div(d, std) | Mul(d, inv)
  s    = Mul(n, $gamma)
  y    = Add(s, $beta)
end

// Decomposed LayerNorm whose output feeds a residual Add.
rule LayerNormAddFusion fuse=FusedLayerNormAdd priority=44 preset=transformer formula="layernorm(x) * g + b + r"
  mean = ReduceMean($x) axes=@axes
  d    = Sub($x, mean)
  sq   = Pow(d, #2) | Mul(d, d)
  var  = ReduceMean(sq) axes=@axes
  ve   = Add(var, #eps)
  std  = Sqrt(ve)
  inv  = Reciprocal(std) | Div(#1, std)
  n    = Div(d, std) | Mul(d, inv)
  s    = Mul(n, $gamma)
  ln   = Add(s, $beta)
  y    = Add(ln, $residual)
end

rule LayerNormFusion fuse=FusedLayerNorm priority=43 preset=transformer formula="(x - mean) / sqrt(mean((x - mean)^2) + eps) * g + b"
  mean = ReduceMean($x) axes=@axes
  d    = Sub($x, mean)
  sq   = Pow(d, #2) | Mul(d, d)
  var  = ReduceMean(sq) axes=@axes
  ve   = Add(var, #eps)
  std  = Sqrt(ve)
  inv  = Reciprocal(std) | Div(#1, std)
  n    = Div(d, std) | Mul(d, inv)
  s    = Mul(n, $gamma)
  y    = Add(s, $beta)
end

// The LayerNormalization function body (var = E[x^2] - E[x]^2); mean and std are outputs too,
// like LayerNormalization's optional Mean / InvStdDev outputs.
rule LayerNormFusion(var) fuse=FusedLayerNorm priority=42 preset=transformer formula="(x - E[x]) / sqrt(E[x^2] - E[x]^2 + eps) * g + b"
  mean = ReduceMean($x) axes=@axes export
  sq   = Mul($x, $x) | Pow($x, #2)
  msq  = ReduceMean(sq) axes=@axes
  m2   = Mul(mean, mean) | Pow(mean, #2)
  var  = Sub(msq, m2)
  ve   = Add(var, #eps)
  std  = Sqrt(ve) export
  dev  = Sub($x, mean)
  n    = Div(dev, std)
  s    = Mul(n, $gamma)
  y    = Add(s, $beta)
end

rule LayerNormFusion(no-affine) fuse=FusedLayerNorm priority=41 preset=transformer formula="(x - mean) / sqrt(var + eps)"
  mean = ReduceMean($x) axes=@axes
  d    = Sub($x, mean)
  sq   = Pow(d, #2) | Mul(d, d)
  var  = ReduceMean(sq) axes=@axes
  ve   = Add(var, #eps)
  std  = Sqrt(ve)
  inv  = Reciprocal(std) | Div(#1, std)
  n    = Div(d, std) | Mul(d, inv)
end

pair LayerNormalization+Add name=LayerNorm+Add fuse=FusedLayerNormAdd priority=31 preset=transformer formula="layernorm(x) + r"
pair Add+LayerNormalization name=Add+LayerNorm fuse=FusedAddLayerNorm priority=30 preset=transformer formula="layernorm(a + b)"

// Bias Add then GELU (erf form).
rule BiasGeluFusion(erf) fuse=FusedBiasGelu priority=29 preset=transformer formula="b = x + bias; 0.5 * b * (1 + erf(b / sqrt(2)))"
  b  = Add($in, $bias)
  d  = Div(b, #1.4142135623730951) | Mul(b, #0.7071067811865476)
  e  = Erf(d)
  a  = Add(e, #1)
  h  = Mul(b, #0.5)
  m  = Mul(b, a)
  ha = Mul(a, #0.5)
  y  = Mul(h, a) | Mul(m, #0.5) | Mul(b, ha)
end

rule GeluFusion(erf) fuse=FusedGelu priority=28 preset=transformer formula="0.5 * x * (1 + erf(x / sqrt(2)))"
  d  = Div($x, #1.4142135623730951) | Mul($x, #0.7071067811865476)
  e  = Erf(d)
  a  = Add(e, #1)
  h  = Mul($x, #0.5)
  m  = Mul($x, a)
  ha = Mul(a, #0.5)
  y  = Mul(h, a) | Mul(m, #0.5) | Mul($x, ha)
end

// tanh form with x^3: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
rule GeluFusion(tanh) fuse=FusedFastGelu priority=26 preset=transformer formula="0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))"
  xx = Mul($x, $x)
  c  = Pow($x, #3) | Mul(xx, $x)
  k  = Mul(c, #0.044715)
  s  = Add($x, k)
  u  = Mul(s, #0.7978845608028654)
  t  = Tanh(u)
  a  = Add(t, #1)
  h  = Mul($x, #0.5)
  m  = Mul($x, a)
  ha = Mul(a, #0.5)
  y  = Mul(h, a) | Mul(m, #0.5) | Mul($x, ha)
end

// tanh form factored as sqrt(2/pi) x (1 + 0.044715 x^2).
rule GeluFusion(tanh-factored) fuse=FusedFastGelu priority=25 preset=transformer formula="0.5 * x * (1 + tanh(sqrt(2/pi) * x * (1 + 0.044715 * x^2)))"
  k  = Mul($x, #0.044715)
  q  = Mul($x, k)
  p  = Add(q, #1)
  r  = Mul($x, #0.7978845608028654)
  u  = Mul(r, p)
  t  = Tanh(u)
  a  = Add(t, #1)
  h  = Mul($x, #0.5)
  m  = Mul($x, a)
  ha = Mul(a, #0.5)
  y  = Mul(h, a) | Mul(m, #0.5) | Mul($x, ha)
end

pair Add+Gelu name=BiasGeluFusion fuse=FusedBiasGelu priority=24 preset=transformer formula="gelu(x + bias)"

// Llama MLP: (silu(x @ Wg) * (x @ Wu)).
rule SwiGLUFusion fuse=FusedSwiGLU priority=22 preset=transformer formula="silu(x @ wg) * (x @ wu)"
  g = MatMul($x, $wg)
  s = Sigmoid(g)
  a = Mul(g, s)
  u = MatMul($x, $wu)
  y = Mul(a, u)
end

rule SwiGLUFusion(gate) fuse=FusedSwiGLU priority=21 preset=transformer formula="silu(g) * u"
  s = Sigmoid($g)
  a = Mul($g, s)
  y = Mul(a, $up)
end

// x * cos + rotate_half(x) * sin, rotate_half(x) = concat(-x[..., d/2:], x[..., :d/2]).
rule RotaryEmbeddingFusion fuse=FusedRotaryEmbedding priority=20 preset=transformer formula="x * cos + rotate_half(x) * sin"
  xc  = Mul($x, $cos)
  x1  = Slice($x, ...)
  x2  = Slice($x, ...)
  n   = Neg(x2) | Mul(x2, #-1)
  rot = Concat(n, x1) axis=-1
  xs  = Mul(rot, $sin)
  y   = Add(xc, xs)
end

rule MatMulBiasActivationFusion fuse=FusedMatMulBiasActivation priority=18 preset=transformer formula="act(x @ w + b)"
  m = MatMul($x, $w)
  b = Add(m, $bias)
  y = Relu|Gelu|Sigmoid|Tanh|LeakyRelu|Elu|HardSigmoid|HardSwish|Softplus(b)
end

rule MatMulBiasFusion fuse=FusedMatMulBias priority=16 preset=transformer formula="x @ w + b"
  m = MatMul($x, $w)
  y = Add(m, $bias)
end

rule SiLUFusion fuse=FusedSiLU priority=14 preset=transformer formula="x * sigmoid(x)"
  s = Sigmoid($x)
  y = Mul($x, s)
end

// ======================= cnn =======================

rule ConvBnAddReluFusion fuse=FusedConvBnAddRelu priority=79 preset=cnn formula="relu(bn(conv(x)) + r), BN folded into the weights"
  c  = Conv($x, $w, ...)
  bn = BatchNormalization(c, $scale, $shift, $mean, $var)
  s  = Add(bn, $residual)
  y  = Relu(s)
end

rule ConvBnReluFusion fuse=FusedConvBnRelu priority=78 preset=cnn formula="relu(bn(conv(x))), BN folded into the weights"
  c  = Conv($x, $w, ...)
  bn = BatchNormalization(c, $scale, $shift, $mean, $var)
  y  = Relu(bn) | Clip(bn, ...) | LeakyRelu(bn)
end

rule ConvBnFusion fuse=FusedConvBn priority=77 preset=cnn formula="bn(conv(x)) = conv with w*s/sqrt(v+eps), (b-m)*s/sqrt(v+eps)+shift"
  c  = Conv($x, $w, ...)
  y  = BatchNormalization(c, $scale, $shift, $mean, $var)
end

// An already-folded BN (per-channel scale and shift) after a Conv.
rule ConvMulAddFusion fuse=FusedConvAffine priority=76 preset=cnn formula="conv(x) * s + b"
  c = Conv($x, $w, ...)
  m = Mul(c, $scale)
  y = Add(m, $shift)
end

rule ConvAddReluFusion fuse=FusedConvAddRelu priority=75 preset=cnn formula="relu(conv(x) + r)"
  c = Conv($x, $w, ...)
  s = Add(c, $residual)
  y = Relu(s)
end

rule ConvAddFusion fuse=FusedConvAdd priority=74 preset=cnn formula="conv(x) + r"
  c = Conv($x, $w, ...)
  y = Add(c, $residual)
end

rule ConvHardSwishFusion fuse=FusedConvHardSwish priority=73 preset=cnn formula="c * hardsigmoid(c), c = conv(x)"
  c = Conv($x, $w, ...)
  h = HardSigmoid(c) alpha=0.16666667 beta=0.5
  y = Mul(c, h)
end

rule ConvSiLUFusion fuse=FusedConvSiLU priority=72 preset=cnn formula="c * sigmoid(c), c = conv(x)"
  c = Conv($x, $w, ...)
  s = Sigmoid(c)
  y = Mul(c, s)
end

rule ConvActivationFusion fuse=FusedConvActivation priority=71 preset=cnn formula="act(conv(x))"
  c = Conv($x, $w, ...)
  y = Relu|LeakyRelu|Sigmoid|Tanh|HardSigmoid|HardSwish|Softsign|Softplus|Elu|Selu|Mish|Clip(c, ...)
end

rule BatchNormReluFusion fuse=FusedBatchNormRelu priority=70 preset=cnn formula="relu(bn(x))"
  bn = BatchNormalization($x, $scale, $shift, $mean, $var)
  y  = Relu(bn)
end

rule GemmActivationFusion fuse=FusedGemmActivation priority=69 preset=cnn formula="act(alpha * A @ B + beta * C)"
  g = Gemm($a, $b, ...)
  y = Relu|LeakyRelu|Sigmoid|Tanh|HardSigmoid|HardSwish|Gelu|Elu|Softplus|Clip(g, ...)
end

rule HardSwishFusion(hardsigmoid) fuse=FusedHardSwish priority=68 preset=cnn formula="x * hardsigmoid(x; 1/6, 0.5)"
  h = HardSigmoid($x) alpha=0.16666667 beta=0.5
  y = Mul($x, h)
end

rule HardSwishFusion(relu6) fuse=FusedHardSwish priority=67 preset=cnn formula="x * relu6(x + 3) / 6"
  a = Add($x, #3)
  r = Clip(a, #0, #6) | Clip(a) min=0 max=6
  m = Mul($x, r)
  d = Div(r, #6) | Mul(r, #0.16666666666666666)
  y = Div(m, #6) | Mul(m, #0.16666666666666666) | Mul($x, d)
end

// ======================= rnn =======================

// One unrolled LSTM cell after its gate pre-activations: c' = f*c + i*g, h' = o*tanh(c').
rule LSTMCellFusion fuse=FusedLSTMCell priority=90 preset=rnn formula="c' = sig(f)*c + sig(i)*tanh(g); h' = sig(o)*tanh(c')"
  i  = Sigmoid($i)
  f  = Sigmoid($f)
  g  = Tanh($g)
  o  = Sigmoid($o)
  fc = Mul(f, $c)
  ig = Mul(i, g)
  c2 = Add(fc, ig) export
  tc = Tanh(c2)
  y  = Mul(o, tc)
end

// One unrolled GRU cell: h' = (1 - z) * n + z * h, n = tanh(xn + r * hn).
rule GRUCellFusion fuse=FusedGRUCell priority=89 preset=rnn formula="h' = (1 - z) * tanh(xn + r * hn) + z * h"
  r   = Sigmoid($r)
  z   = Sigmoid($z)
  rh  = Mul(r, $hn)
  na  = Add($xn, rh)
  n   = Tanh(na)
  omz = Sub(#1, z)
  a   = Mul(omz, n)
  b   = Mul(z, $h)
  d   = Sub($h, n)
  zd  = Mul(z, d)
  y   = Add(a, b) | Add(n, zd)
end

// A vanilla RNN step: h' = act(x W + h R + b).
rule RNNCellFusion fuse=FusedRNNCell priority=88 preset=rnn formula="act(x @ w + h @ r + b)"
  m1 = MatMul($x, $w)
  m2 = MatMul($h, $r)
  s  = Add(m1, m2)
  b  = Add(s, $bias)
  y  = Tanh|Relu|Sigmoid(b)
end

// Gate pre-activations of an unrolled LSTM/GRU step: x W + h R + b.
rule RNNGatesFusion fuse=FusedRNNGates priority=87 preset=rnn formula="x @ w + h @ r + b"
  m1 = MatMul($x, $w)
  m2 = MatMul($h, $r)
  s  = Add(m1, m2)
  y  = Add(s, $bias)
end
)RULES";

}  // namespace

std::vector<FusionRule> BuiltinRules() {
  static const std::vector<FusionRule> rules = [] {
    std::vector<FusionRule> r = ParseRules(kBuiltinRules, "builtin");
    return r;
  }();
  return rules;
}

}  // namespace gaf
