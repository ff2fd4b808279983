#!/usr/bin/env python3
"""Greedy decoding with the KV cache in PyTorch eager, timed as bench/ort_generate.js and
`autofusion generate --json` time theirs, for bench/llama_bench.js's side-by-side table.

The model is the PyTorch module a decoder ONNX file was exported from: `torch_model.pt` beside it
(written by tests/fixtures/make_decoder_exports.py --save-torch: the class name, its constructor
arguments and the weights), rebuilt from that script's classes. So PyTorch runs the same weights
on the same prompt as the ONNX engines, and its tokens can be compared with theirs.

    /usr/bin/python3 bench/torch_generate.py MODEL.onnx --prompt-ids 1,2,3 [--max-new-tokens 50]
                                             [--threads 1] [--repeat 3]

Prints one JSON object: tokens, prefill_ms, decode_ms_per_token (the median step of each
generation, then the median over repeats; one warm-up generation first when --repeat > 1),
deterministic, torch_version, omp_wait_policy. Exits 1 with a one-line reason when there is no
torch_model.pt.

OpenMP's wait policy is PASSIVE unless the environment sets one: Debian's PyTorch runs its own
OpenMP threads beside OpenBLAS's (libopenblas0-pthread), and with both spinning on a 2-core
machine a decode step of the bench-size Llama took 116-124 ms instead of 48-49 ms (2 threads,
50 new tokens; from a past of 32 on, where PyTorch's copies go parallel). The bench compares
against PyTorch at its best here, not at that.
"""
import argparse
import importlib.util
import json
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # read by libgomp when torch loads it
import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
EXPORTS = os.path.join(HERE, "..", "tests", "fixtures", "make_decoder_exports.py")


def load_module(model_path):
    saved = os.path.join(os.path.dirname(os.path.abspath(model_path)), "torch_model.pt")
    if not os.path.isfile(saved):
        sys.exit(f"torch_generate.py: no {saved} (export with tests/fixtures/make_decoder_exports.py --save-torch)")
    spec = importlib.util.spec_from_file_location("make_decoder_exports", EXPORTS)
    exports = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(exports)
    ckpt = torch.load(saved, map_location="cpu", weights_only=True)
    cls = {"LlamaDecoder": exports.LlamaDecoder, "Gpt2Decoder": exports.Gpt2Decoder}.get(ckpt["class"])
    if cls is None:
        sys.exit(f"torch_generate.py: {saved}: unknown class {ckpt['class']!r}")
    model = cls(*ckpt["args"])
    model.load_state_dict(ckpt["state_dict"])
    model.eval()
    return model, int(ckpt["layers"]), int(ckpt["kv_heads"]), int(ckpt["head_dim"])


def generate(model, layers, kvh, hd, prompt, new_tokens):
    ids = torch.tensor([prompt], dtype=torch.int64)
    n = len(prompt)
    past = [torch.zeros(1, kvh, 0, hd) for _ in range(2 * layers)]
    feeds = (ids, torch.ones(1, n, dtype=torch.int64), torch.arange(n, dtype=torch.int64)[None, :])
    tokens, steps = [], []
    with torch.no_grad():
        t0 = time.perf_counter()
        out = model(*feeds, *past)
        tok = int(out[0][0, -1].argmax())
        prefill = (time.perf_counter() - t0) * 1e3
        tokens.append(tok)
        total = n
        for _ in range(new_tokens - 1):
            t0 = time.perf_counter()
            feeds = (torch.tensor([[tok]], dtype=torch.int64), torch.ones(1, total + 1, dtype=torch.int64),
                     torch.tensor([[total]], dtype=torch.int64))
            out = model(*feeds, *out[1:])
            tok = int(out[0][0, -1].argmax())
            steps.append((time.perf_counter() - t0) * 1e3)
            tokens.append(tok)
            total += 1
    return tokens, prefill, statistics.median(steps) if steps else 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--prompt-ids", required=True)
    ap.add_argument("--max-new-tokens", type=int, default=50)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    prompt = [int(x) for x in a.prompt_ids.split(",")]
    if not prompt or a.max_new_tokens < 1:
        sys.exit("torch_generate.py: an empty prompt or no new tokens")
    torch.set_num_threads(a.threads)
    model, layers, kvh, hd = load_module(a.model)
    repeats = max(1, a.repeat)
    if repeats > 1:
        generate(model, layers, kvh, hd, prompt, a.max_new_tokens)  # warm-up, excluded
    runs = [generate(model, layers, kvh, hd, prompt, a.max_new_tokens) for _ in range(repeats)]
    step = statistics.median(r[2] for r in runs)
    print(json.dumps({
        "engine": "pytorch eager", "torch_version": torch.__version__, "threads": a.threads, "repeats": repeats,
        "tokens": runs[0][0], "prefill_ms": statistics.median(r[1] for r in runs), "decode_ms_per_token": step,
        "decode_tokens_per_second": 1e3 / step if step > 0 else 0.0,
        "deterministic": all(r[0] == runs[0][0] for r in runs), "omp_wait_policy": os.environ["OMP_WAIT_POLICY"],
        "runs": [{"prefill_ms": r[1], "decode_ms_per_token": r[2]} for r in runs],
    }))


if __name__ == "__main__":
    main()
