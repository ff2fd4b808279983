"""bench/torch_generate.py, the PyTorch eager column of bench/llama_bench.sh: it rebuilds the module a
decoder was exported from (torch_model.pt, make_decoder_exports.py --save-torch) and must decode
the same greedy tokens PyTorch produced at export time; without torch_model.pt it says so."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
EXPORTS = os.path.join(ROOT, "tests", "fixtures", "make_decoder_exports.py")
EAGER = os.path.join(ROOT, "bench", "torch_generate.py")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("eager")
    subprocess.run([sys.executable, EXPORTS, str(out), "--preset", "tiny", "--only", "llama", "--save-torch"],
                   check=True, capture_output=True)
    return out / "llama_kv_opset17"


def test_eager_tokens_are_pytorchs_greedy_tokens(exported):
    ref = json.loads((exported / "greedy.json").read_text())
    r = subprocess.run([sys.executable, EAGER, str(exported / "model.onnx"), "--prompt-ids",
                        ",".join(map(str, ref["prompt"])), "--max-new-tokens", str(len(ref["tokens"])),
                        "--repeat", "2"], check=True, capture_output=True, text=True)
    got = json.loads(r.stdout)
    assert got["tokens"] == ref["tokens"]
    assert got["deterministic"] and got["decode_ms_per_token"] > 0 and got["prefill_ms"] > 0
    assert len(got["runs"]) == 2


def test_eager_without_saved_module_says_so(exported, tmp_path):
    lone = tmp_path / "model.onnx"
    lone.write_bytes((exported / "model.onnx").read_bytes())
    r = subprocess.run([sys.executable, EAGER, str(lone), "--prompt-ids", "1,2"], capture_output=True, text=True)
    assert r.returncode != 0
    assert "torch_model.pt" in r.stderr and "--save-torch" in r.stderr
