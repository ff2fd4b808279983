#!/usr/bin/env python3
"""The original system's walkthrough ("optimize Llama inference with graph-autofusion"), run on a
local model: a Llama-style decoder written here as a torch.nn.Module with random weights (no
downloads), in place of LlamaForCausalLM.from_pretrained(...).

    GraphAutoFusion(model, preset="transformer", safe_mode=True, example_inputs=[...])
    EstimateFusionBenefit, AnalyzeFusionBenefit, AddFusionRule(FusionRule(...)), Fuse() (safe),
    GetSafeFusionReport, CompileFusedOperators, VerifyPrecision, VerifyPerformance,
    save_pretrained, generate(input_ids, max_length=50)

then checks that the fused model's greedy tokens equal PyTorch's own greedy decoding with the KV
cache, and prints a throughput table: PyTorch eager vs graph-autofusion unfused vs fused, on the
same prompt, medians of interleaved repeats.

Run (from the repository root, after the README's first command):

    /usr/bin/python3 examples/llama_walkthrough.py [--size tiny|small|bench|wide] [--out DIR] [--tokens N] [--repeats R]
                                                   [--half-weights]

(another interpreter: PYTHONPATH=build/python). Exit status 0 when the tokens agree and the
precision check passes, 1 otherwise.

The model, written from the published Llama architecture (as Hugging Face's modeling_llama writes
it, so the exported graph carries the same exporter patterns): RMSNorm (pow/mean/rsqrt), rotary
embeddings gathered by position_ids with rotate_half, grouped-query attention with a KV cache
(repeat_kv by expand/reshape), a causal mask from attention_mask and position_ids, SwiGLU MLP.
Inputs and outputs follow the common past/present layout, which FusedModel.generate drives:

    input_ids [1, seq], attention_mask [1, past + seq], position_ids [1, seq],
    past_key_values.{i}.key / .value [1, kv_heads, past, head_dim]
    -> logits [1, seq, vocab], present.{i}.key / .value [1, kv_heads, past + seq, head_dim]
"""

import argparse
import math
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

try:
    from graph_autofusion import FusedModel, FusionRule, GraphAutoFusion
except ImportError as e:  # not built, or another interpreter without PYTHONPATH
    sys.exit(f"error: cannot import graph_autofusion ({e}); build it with the README's first command, then run "
             f"with /usr/bin/python3 or PYTHONPATH=build/python")


# ---------------------------------------------------------------------------------------------
# The model (random weights)

class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(d))
        self.eps = eps

    def forward(self, x):
        var = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + self.eps))


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def causal_mask(attention_mask, position_ids, total):
    """[b, 1, seq, total]: 0 where a query may attend (not a later position, not masked out), the
    dtype's minimum elsewhere."""
    k_pos = torch.arange(total, device=attention_mask.device)[None, None, :]
    allowed = (k_pos <= position_ids[:, :, None]) & (attention_mask[:, None, :] > 0)
    zero = torch.zeros((), dtype=torch.float32)
    low = torch.full((), torch.finfo(torch.float32).min, dtype=torch.float32)
    return torch.where(allowed, zero, low)[:, None, :, :]


class LlamaLayer(nn.Module):
    def __init__(self, d, heads, kv_heads, ffn):
        super().__init__()
        self.h, self.kvh, self.hd = heads, kv_heads, d // heads
        self.input_layernorm = RMSNorm(d)
        self.q_proj = nn.Linear(d, heads * self.hd, bias=False)
        self.k_proj = nn.Linear(d, kv_heads * self.hd, bias=False)
        self.v_proj = nn.Linear(d, kv_heads * self.hd, bias=False)
        self.o_proj = nn.Linear(heads * self.hd, d, bias=False)
        self.post_attention_layernorm = RMSNorm(d)
        self.gate_proj = nn.Linear(d, ffn, bias=False)
        self.up_proj = nn.Linear(d, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, d, bias=False)

    def forward(self, x, cos, sin, mask, past_k, past_v):
        b, t, _ = x.shape
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(b, t, self.h, self.hd).transpose(1, 2)
        k = self.k_proj(h).view(b, t, self.kvh, self.hd).transpose(1, 2)
        v = self.v_proj(h).view(b, t, self.kvh, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = torch.cat([past_k, k], dim=2)
        v = torch.cat([past_v, v], dim=2)
        present = (k, v)
        rep = self.h // self.kvh
        if rep > 1:  # repeat_kv: expand then reshape
            bb, kvh, s, hd = k.shape
            k = k[:, :, None, :, :].expand(bb, kvh, rep, s, hd).reshape(bb, kvh * rep, s, hd)
            v = v[:, :, None, :, :].expand(bb, kvh, rep, s, hd).reshape(bb, kvh * rep, s, hd)
        att = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.hd)
        att = F.softmax(att + mask, dim=-1, dtype=torch.float32)
        o = torch.matmul(att, v).transpose(1, 2).reshape(b, t, self.h * self.hd)
        x = x + self.o_proj(o)
        h = self.post_attention_layernorm(x)
        x = x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))
        return x, present


class LlamaForCausalLM(nn.Module):
    """forward(input_ids, attention_mask, position_ids, *past_key_values) -> (logits, *presents),
    past_key_values flattened as layer 0 key, layer 0 value, layer 1 key, ..."""

    def __init__(self, vocab, d, layers, heads, kv_heads, ffn, max_pos):
        super().__init__()
        self.config = dict(vocab=vocab, hidden=d, layers=layers, heads=heads, kv_heads=kv_heads, ffn=ffn,
                           head_dim=d // heads, max_pos=max_pos)
        self.embed_tokens = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList([LlamaLayer(d, heads, kv_heads, ffn) for _ in range(layers)])
        self.norm = RMSNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        hd = d // heads
        inv = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
        freqs = torch.outer(torch.arange(max_pos).float(), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos_cached", emb.cos(), persistent=False)
        self.register_buffer("sin_cached", emb.sin(), persistent=False)

    def forward(self, input_ids, attention_mask, position_ids, *past):
        x = self.embed_tokens(input_ids)
        cos = self.cos_cached[position_ids].unsqueeze(1)  # [b, 1, seq, head_dim]
        sin = self.sin_cached[position_ids].unsqueeze(1)
        mask = causal_mask(attention_mask, position_ids, attention_mask.shape[1])
        presents = []
        for i, layer in enumerate(self.layers):
            x, p = layer(x, cos, sin, mask, past[2 * i], past[2 * i + 1])
            presents.extend(p)
        return (self.lm_head(self.norm(x)), *presents)


# (vocab, hidden, layers, heads, kv_heads, ffn, max positions): the built-in Llama presets' sizes
# (autofusion example llama --preset ...).
SIZES = {
    "tiny": (256, 64, 2, 4, 2, 172, 256),
    "small": (8000, 384, 6, 6, 2, 1024, 1024),
    "bench": (32000, 1024, 12, 16, 4, 2816, 2048),
    "wide": (32000, 2048, 6, 16, 4, 5632, 2048),
}


def io_names(layers):
    past = [f"past_key_values.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]
    present = [f"present.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]
    return ["input_ids", "attention_mask", "position_ids"] + past, ["logits"] + present


def step_inputs(model, ids, past_len, past=None, generator=None):
    """One call's inputs: ids [1, seq] after a past of past_len positions (random past when none)."""
    c = model.config
    t = ids.shape[1]
    if past is None:
        past = [torch.randn(1, c["kv_heads"], past_len, c["head_dim"], generator=generator)
                for _ in range(2 * c["layers"])]
    return (ids, torch.ones(1, past_len + t, dtype=torch.int64),
            torch.arange(past_len, past_len + t, dtype=torch.int64)[None, :], *past)


def torch_greedy(model, prompt, new_tokens, timing=None):
    """PyTorch's own greedy decoding with the KV cache (the reference for generate)."""
    c = model.config
    ids = torch.tensor([prompt], dtype=torch.int64)
    past = [torch.zeros(1, c["kv_heads"], 0, c["head_dim"]) for _ in range(2 * c["layers"])]
    past_len, out, steps = 0, [], []
    with torch.no_grad():
        t0 = time.perf_counter()
        for _ in range(new_tokens):
            res = model(*step_inputs(model, ids, past_len, past))
            tok = int(res[0][0, -1].argmax())
            out.append(tok)
            past = list(res[1:])
            past_len += ids.shape[1]
            ids = torch.tensor([[tok]], dtype=torch.int64)
            t1 = time.perf_counter()
            steps.append(t1 - t0)
            t0 = t1
    if timing is not None:
        timing["prefill_seconds"], timing["step_seconds"] = steps[0], steps[1:]
    return out


# ---------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="small",
                    help="model size: tiny (CI, seconds), small (default), bench, wide (heads of 128, 1.6 GB)")
    ap.add_argument("--out", help="folder for the compiled operators and the saved model (default: a temp folder)")
    ap.add_argument("--tokens", type=int, default=50, help="max_length of generate: prompt + new tokens (default 50)")
    ap.add_argument("--repeats", type=int, default=5, help="interleaved repeats of the throughput measures")
    ap.add_argument("--half-weights", action="store_true",
                    help="also fuse with gated float16 weight storage (FuseSafe(half_weights=True)) and time it")
    ap.add_argument("--threads", type=int, default=0,
                    help="threads of graph-autofusion and, in the table, of PyTorch (0: all cores)")
    a = ap.parse_args()

    torch.manual_seed(0)
    vocab, d, layers, heads, kvh, ffn, max_pos = SIZES[a.size]
    prompt = [1 + (i * 37) % (vocab - 1) for i in range(8)]  # "Once upon a time", without a tokenizer
    if a.tokens <= len(prompt) + 1 or a.tokens > max_pos:
        ap.error(f"--tokens {a.tokens}: give {len(prompt) + 2}..{max_pos} (the prompt has {len(prompt)} tokens)")
    if a.repeats < 1:
        ap.error("--repeats must be >= 1")
    out_dir = a.out or tempfile.mkdtemp(prefix="gaf_llama_")
    os.makedirs(out_dir, exist_ok=True)
    t_start = time.perf_counter()

    # 1. The model (in place of LlamaForCausalLM.from_pretrained(...)).
    model = LlamaForCausalLM(vocab, d, layers, heads, kvh, ffn, max_pos).eval()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"== Llama-style decoder '{a.size}': {layers} layers, hidden {d}, {heads} heads ({kvh} KV heads), "
          f"vocab {vocab}, {n_params / 1e6:.1f}M parameters, random weights")

    # 2. The fuser. Two example inputs, a prefill (8 tokens, no past) and a decode step (1 token
    #    after a past of 8), so the sequence and past lengths are exported as dynamic dims.
    g = torch.Generator().manual_seed(1)
    prefill = step_inputs(model, torch.tensor([prompt]), 0, generator=g)
    decode = step_inputs(model, torch.tensor([[prompt[-1]]]), len(prompt), generator=g)
    input_names, output_names = io_names(layers)
    fuser = GraphAutoFusion(model, preset="transformer", safe_mode=True, example_inputs=[prefill, decode],
                            input_names=input_names, output_names=output_names, threads=a.threads)
    print(f"exported with torch.onnx.export; decoder: {fuser.is_decoder}; workload: {fuser.workload}")

    # 3. Estimate (the cost model; nothing is changed).
    benefit = fuser.EstimateFusionBenefit()
    print(f"\n== EstimateFusionBenefit\nestimated performance improvement: {benefit['performance_improvement'] * 100:.1f}%")
    print(f"estimated HBM access reduction: {benefit['hbm_access_reduction'] * 100:.1f}%")

    # 4. Per-candidate analysis.
    report = fuser.AnalyzeFusionBenefit()
    print(f"\n== AnalyzeFusionBenefit ({len(report)} candidates)")
    blocks = str(report).split("\n\n")  # one block per candidate, then the whole-model summary
    if len(blocks) > 9:
        with open(os.path.join(out_dir, "analysis.txt"), "w", encoding="utf-8") as f:
            f.write(str(report) + "\n")
        blocks = blocks[:8] + [f"[INFO]   ... {len(blocks) - 9} more candidates in "
                               f"{os.path.join(out_dir, 'analysis.txt')}", blocks[-1]]
    print("\n\n".join(blocks))

    # 5. A user rule, as the original shows it (a LayerNorm feeding an Add). This model normalizes
    #    with RMSNorm, so the rule finds nothing to fuse here; it shows the call, and the rules in use.
    fuser.AddFusionRule(FusionRule(op1="LayerNorm", op2="Add", fuse_pattern="LayerNormAdd", benefit_threshold=0.2,
                                   priority=2))
    print(f"\n== AddFusionRule: {len(fuser.rules())} rules in use, the last: {fuser.rules()[-1]['name']}")

    # 6. Fuse (safe_mode: FuseSafe, per-group precision and speed gates with rollback).
    t0 = time.perf_counter()
    fused_model = fuser.Fuse()
    print(f"\n== Fuse (safe, {time.perf_counter() - t0:.1f} s): {fused_model}")
    print(fuser.GetSafeFusionReport())

    # 7. Compile the fused operators (one batch build).
    ops_dir = os.path.join(out_dir, "fused_ops")
    print(f"\n== CompileFusedOperators({ops_dir})")
    print(fuser.CompileFusedOperators(ops_dir).rstrip())

    # 8. Verify: precision against PyTorch's own outputs, throughput against the unfused model.
    precision_report = fuser.VerifyPrecision(fused_model, model)
    print(f"\n== VerifyPrecision\ncosine similarity: {precision_report['cosine_similarity']:.5f}")
    print(f"max abs error: {precision_report['max_abs_error']:.2e}")
    print(f"against {precision_report['reference']}: {'PASS' if precision_report['passed'] else 'FAIL'}")
    performance_report = fuser.VerifyPerformance(fused_model, repeats=a.repeats, max_length=a.tokens)
    print("\n== VerifyPerformance")
    print(f"baseline throughput: {performance_report['baseline_throughput']:.1f} tokens/s (graph-autofusion, unfused)")
    print(f"fused throughput: {performance_report['fused_throughput']:.1f} tokens/s")
    print(f"improvement: {performance_report['improvement'] * 100:.1f}%")
    if performance_report.get("note"):
        print(f"note: {performance_report['note']}")

    # 9. Save, and load back.
    save_dir = os.path.join(out_dir, f"llama-{a.size}-fused")
    fused_model.save_pretrained(save_dir)
    print(f"\n== save_pretrained({save_dir}): {', '.join(sorted(os.listdir(save_dir)))}")
    fused_model = FusedModel.load(save_dir, threads=a.threads)

    # 10. Generate, and compare with PyTorch's greedy decoding with the cache.
    input_ids = torch.tensor([prompt])
    output = fused_model.generate(input_ids, max_length=a.tokens)
    new = a.tokens - len(prompt)
    reference = torch_greedy(model, prompt, new)
    same = output[0, len(prompt):].tolist() == reference
    print(f"\n== generate(input_ids, max_length={a.tokens}): {output.shape[1]} tokens; first new: "
          f"{output[0, len(prompt):len(prompt) + 8].tolist()}")
    print(f"same tokens as PyTorch's greedy decoding with the KV cache: {'yes' if same else 'NO'}")
    if not same:
        print(f"  PyTorch: {reference}\n  fused:   {output[0, len(prompt):].tolist()}")

    # 10b. Optionally, float16 weight storage: kept only when its gates (precision per output, then
    #     the greedy tokens of a generation) pass.
    half_model, half_same = None, True
    if a.half_weights:
        t0 = time.perf_counter()
        candidate = fuser.FuseSafe(half_weights=True)
        half_report = fuser.GetSafeFusionReport()
        kept = half_report.half_weights_kept
        print(f"\n== FuseSafe(half_weights=True) ({time.perf_counter() - t0:.1f} s): float16 storage "
              f"{'kept' if kept else 'rejected by its gates: ' + half_report['half_weights'].get('reason', '')}")
        if kept:
            half_model = candidate
            half_tokens = half_model.generate(input_ids, max_length=a.tokens)[0, len(prompt):].tolist()
            half_same = half_tokens == reference
            print(f"same tokens as PyTorch's greedy decoding: {'yes' if half_same else 'NO'}")

    # 11. The throughput table: the same prompt, greedy with the cache, interleaved repeats.
    unfused = FusedModel(fuser.model, description="unfused", use_kernels=False, threads=a.threads)
    unfused_same = unfused.generate(input_ids, max_length=a.tokens)[0, len(prompt):].tolist() == reference
    stages = {"PyTorch eager (torch.no_grad, KV cache)": [], "graph-autofusion, unfused": [],
              "graph-autofusion, fused (safe)": []}
    if half_model is not None:
        stages["graph-autofusion, fused (safe, float16 weights)"] = []
    wall = {k: [] for k in stages}
    prefill_s = {k: [] for k in stages}
    # The same number of threads on both sides. (graph-autofusion's runtime sets OpenMP's thread
    # count, which PyTorch shares in this process: without this, PyTorch would run with whatever
    # the last graph-autofusion call set.)
    threads = a.threads or len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    for _ in range(a.repeats):
        for name in stages:
            t0 = time.perf_counter()
            if name.startswith("PyTorch"):
                tm = {}
                torch.set_num_threads(threads)
                torch_greedy(model, prompt, new, tm)
            else:
                m = unfused if "unfused" in name else half_model if "float16" in name else fused_model
                _, tm = m.generate(input_ids, max_length=a.tokens, return_timing=True)
            wall[name].append(time.perf_counter() - t0)
            stages[name].append(statistics.median(tm["step_seconds"]))
            prefill_s[name].append(tm["prefill_seconds"])
    base = 1 / statistics.median(stages["PyTorch eager (torch.no_grad, KV cache)"])
    print(f"\n== Throughput: prompt {len(prompt)} tokens, {new} new tokens, batch 1, greedy; medians of "
          f"{a.repeats} interleaved repeats")
    print(f"{'stage':<50} {'decode tokens/s':>16} {'vs PyTorch':>11} {'prefill ms':>11} {'generate() tokens/s':>20}")
    for name in stages:
        tps = 1 / statistics.median(stages[name])
        e2e = new / statistics.median(wall[name])
        print(f"{name:<50} {tps:>16.1f} {tps / base:>10.2f}x {statistics.median(prefill_s[name]) * 1e3:>11.2f} "
              f"{e2e:>20.1f}")
    print(f"(figures of this machine: {len(os.sched_getaffinity(0))} CPUs, {threads} threads on both sides, "
          f"PyTorch {torch.__version__}; decode tokens/s from the median decode step, "
          f"generate() tokens/s = new tokens / wall time including the prefill)")

    ok = same and unfused_same and half_same and bool(precision_report["passed"])
    if not half_same:
        print("the float16-weight model's tokens differ from PyTorch's")
    if not unfused_same:
        print("the unfused model's tokens differ from PyTorch's")
    print(f"\n{'OK' if ok else 'FAILED'} ({time.perf_counter() - t_start:.1f} s; files in {out_dir})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
