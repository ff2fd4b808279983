"""The examples in examples/ run (at their CI size) and say what they should: the Llama walkthrough
generates PyTorch's greedy tokens and prints its throughput table, the CNN example passes its
precision check against PyTorch.

Each runs as a subprocess of this interpreter with this environment (CTest sets PYTHONPATH to the
built package). Run: PYTHONPATH=build/python /usr/bin/python3 -m pytest -q python/tests/test_examples.py
"""

import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples")


def run_example(script, args, tmp_path):
    env = dict(os.environ)
    env["GAF_MODEL_CACHE"] = str(tmp_path / "models")  # to_torch()'s saved models, not under ~/.cache
    p = subprocess.run([sys.executable, os.path.join(EXAMPLES, script), *args], cwd=str(tmp_path), env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    assert p.returncode == 0, f"{script} {' '.join(args)} exited {p.returncode}:\n{p.stdout[-6000:]}"
    return p.stdout


def test_llama_walkthrough_tiny(tmp_path):
    out = run_example("llama_walkthrough.py",
                      ["--size", "tiny", "--tokens", "16", "--repeats", "2", "--out", str(tmp_path / "out"),
                       "--half-weights"], tmp_path)
    for line in ("estimated performance improvement:", "estimated HBM access reduction:",
                 "[INFO] Fusion benefit analysis:", "[INFO] Safe fusion report:", "cosine similarity:",
                 "max abs error:", "against PyTorch (LlamaForCausalLM.forward): PASS", "baseline throughput:",
                 "fused throughput:", "improvement:", "same tokens as PyTorch's greedy decoding with the KV cache: yes",
                 "decode tokens/s", "PyTorch eager", "graph-autofusion, unfused", "graph-autofusion, fused (safe)",
                 "float16 storage kept", "same tokens as PyTorch's greedy decoding: yes",
                 "graph-autofusion, fused (safe, float16 weights)", "figures of this machine"):
        assert line in out, f"'{line}' not in the output:\n{out[-6000:]}"
    assert out.rstrip().splitlines()[-1].startswith("OK")
    saved = tmp_path / "out" / "llama-tiny-fused"
    assert (saved / "graph_autofusion.json").is_file() and (saved / "model.onnx").is_file()
    assert (tmp_path / "out" / "fused_ops").is_dir()


def test_cnn_example_tiny(tmp_path):
    out = run_example("cnn_example.py", ["--size", "tiny", "--repeats", "2"], tmp_path)
    for line in ("estimated performance improvement:", "[INFO] Safe fusion report:", "cosine similarity:",
                 "against PyTorch (ResNet.forward): PASS", "inferences/s", "PyTorch eager",
                 "graph-autofusion, fused (safe)", "to_torch():", "figures of this machine"):
        assert line in out, f"'{line}' not in the output:\n{out[-6000:]}"
    assert out.rstrip().splitlines()[-1].startswith("OK")
