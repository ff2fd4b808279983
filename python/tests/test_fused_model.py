"""FusedModel: run / __call__ with numpy arrays and torch tensors, generate on the built-in
decoder, save_pretrained + load, to_torch() (eager, scripted, saved as TorchScript and loaded in a
fresh process), and the GIL released during long C++ calls."""

import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest


# ---------------------------------------------------------------- run and __call__
def test_run_and_call_with_numpy(gaf, mlp_onnx, mlp_feeds, mlp_expected):
    fused = gaf.GraphAutoFusion(mlp_onnx, preset="transformer").Fuse()
    assert fused.input_names == ["x", "r"] and fused.output_names == ["y"] and fused.fused_nodes == 3
    x, r = mlp_feeds["x"], mlp_feeds["r"]
    out = fused.run(x, r)
    assert list(out) == ["y"] and isinstance(out["y"], np.ndarray) and out["y"].dtype == np.float32
    np.testing.assert_allclose(out["y"], mlp_expected, rtol=1e-4, atol=1e-4)
    for y in (fused(x, r), fused(x=x, r=r), fused({"x": x, "r": r}), fused(x, r=r), fused.run(r=r, x=x)["y"]):
        np.testing.assert_array_equal(y, out["y"])
    # A result is the caller's: the next run does not overwrite it.
    keep = out["y"].copy()
    fused(x + 1, r)
    np.testing.assert_array_equal(out["y"], keep)


def test_run_and_call_with_torch(gaf, torch, block, block_fusion):
    m, x = block
    _, fused = block_fusion
    y = fused(x)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.float32 and tuple(y.shape) == (2, 8, 32)
    with torch.no_grad():
        ref = m(x)
    assert torch.allclose(y, ref, atol=1e-4, rtol=1e-4)
    out = fused.run(x=x)
    assert list(out) == fused.output_names and isinstance(out["output_0"], torch.Tensor)
    # numpy in, numpy out, same values
    np.testing.assert_allclose(fused(x.numpy()), y.numpy(), rtol=0, atol=0)
    # a non-contiguous tensor and one that requires grad
    xt = x.transpose(0, 1).contiguous().transpose(0, 1)
    assert not xt.is_contiguous()
    assert torch.allclose(fused(xt), ref, atol=1e-4, rtol=1e-4)
    assert torch.allclose(fused(x.clone().requires_grad_(True)), ref, atol=1e-4, rtol=1e-4)


def test_bad_run_arguments(gaf, mlp_onnx, mlp_feeds):
    fused = gaf.GraphAutoFusion(mlp_onnx).Fuse()
    x, r = mlp_feeds["x"], mlp_feeds["r"]
    with pytest.raises(ValueError, match=r"'z' is not an input of the model \(inputs: x, r\)"):
        fused(x=x, z=r)
    with pytest.raises(ValueError, match=r"'xx' is not an input of the model"):
        fused.run({"xx": x, "r": r})
    with pytest.raises(ValueError, match=r"3 inputs given; the model has 2 \(x, r\)"):
        fused(x, r, r)
    with pytest.raises(ValueError, match="input 'x' given twice"):
        fused(x, x=x)
    with pytest.raises(gaf.Error, match="input 'x' expects float but was given double"):
        fused(x.astype(np.float64), r)
    with pytest.raises(gaf.Error, match="input 'r' expects float but was given int64"):
        fused(x, r.astype(np.int64))
    with pytest.raises(gaf.Error, match=r"input 'x' expects shape \[4,16\] but was given \[4,8\]"):
        fused(x[:, :8], r)
    with pytest.raises(gaf.Error, match="input 'r' was not given"):
        fused(x)
    with pytest.raises(ValueError, match="generate needs a decoder"):
        fused.generate([1, 2, 3])


def test_bad_torch_dtype(gaf, block_fusion, block):
    _, x = block
    _, fused = block_fusion
    with pytest.raises(gaf.Error, match="input 'x' expects float but was given double"):
        fused(x.double())


# ---------------------------------------------------------------- generate
def test_generate_fused_equals_unfused(gaf, torch, llama):
    _, _, fused, unfused = llama
    assert fused.is_decoder and fused.fused_nodes > 0 and unfused.fused_nodes == 0
    prompt = np.array([[1, 5, 9, 2]], dtype=np.int64)
    a = fused.generate(prompt, max_length=16)
    b = unfused.generate(prompt, max_length=16)
    assert a.shape == (1, 16) and a.dtype == np.int64
    np.testing.assert_array_equal(a[:, :4], prompt)
    np.testing.assert_array_equal(a, b)
    # torch in, torch out; a flat list; max_new_tokens
    t = fused.generate(torch.from_numpy(prompt), max_length=16)
    assert isinstance(t, torch.Tensor) and torch.equal(t, torch.from_numpy(a))
    np.testing.assert_array_equal(fused.generate([1, 5, 9, 2], max_new_tokens=12), a)
    np.testing.assert_array_equal(fused.generate(prompt[0], max_length=10), a[:, :10])  # greedy: a prefix
    out, timing = fused.generate(prompt, max_length=8, return_timing=True)
    assert out.shape == (1, 8) and timing["prefill_seconds"] > 0 and len(timing["step_seconds"]) >= 3


def test_decode_loop_steps_as_generate_does(gaf, llama):
    # A loop stepped with the argmax makes generate's tokens; its logits are the unfused model's; a
    # reset starts the same sequence again bit for bit; a failed step leaves the loop empty.
    _, _, fused, unfused = llama
    prompt = [1, 5, 9, 2]
    want = [int(t) for t in fused.generate(prompt, max_length=14)[0, 4:]]
    loop, ref = fused.decode_loop(), unfused.decode_loop()
    first = loop.step(np.array([prompt], dtype=np.int64))
    logits, ref_logits = first, ref.step(prompt)
    assert isinstance(loop, gaf.DecodeLoop) and logits.dtype == np.float32 and logits.ndim == 1
    assert loop.past_length == 4
    got = []
    for _ in range(10):
        np.testing.assert_allclose(logits, ref_logits, rtol=1e-4, atol=1e-4)
        token = int(np.argmax(logits))
        got.append(token)
        logits, ref_logits = loop.step([token]), ref.step(np.array([token]))
    assert got == want and loop.past_length == 14 and ref.past_length == 14
    loop.reset()
    assert loop.past_length == 0
    np.testing.assert_array_equal(loop.step(prompt), first)
    with pytest.raises(ValueError, match=r"decode step: ids must be \[n\] or \[1, n\] with n >= 1, got shape \[0\]"):
        loop.step([])
    with pytest.raises(ValueError, match="decode step: batch size 2; only batch 1 is supported"):
        loop.step([[1, 2], [3, 4]])
    assert loop.past_length == 4  # argument errors leave the loop as it was
    with pytest.raises(gaf.Error):
        loop.step([10**9])  # not a token of the vocabulary: the run fails
    assert loop.past_length == 0
    np.testing.assert_array_equal(loop.step(prompt), first)


def test_decode_loop_needs_a_decoder(block_fusion):
    _, fused = block_fusion
    with pytest.raises(ValueError, match="decode_loop needs a decoder"):
        fused.decode_loop()


def test_generate_max_length_errors(gaf, llama):
    _, _, fused, _ = llama
    with pytest.raises(ValueError, match="max_length 3 leaves no new token after a prompt of 3"):
        fused.generate([1, 2, 3], max_length=3)
    with pytest.raises(ValueError, match="batch size 2; only batch 1 is supported"):
        fused.generate([[1, 2], [3, 4]], max_length=8)
    with pytest.raises(ValueError, match=r"input_ids must be \[n\] or \[1, n\] with n >= 1, got shape \[0\]"):
        fused.generate([], max_length=8)


def test_example_llama_presets(gaf):
    with pytest.raises(gaf.Error, match="unknown llama preset 'huge' \\(expected tiny, small, bench or wide\\)"):
        gaf.example_llama("huge")
    info = json.loads(gaf.example_llama("tiny").info())
    assert info["decoder"] is True and info["inputs"][0]["name"] == "input_ids"


# ---------------------------------------------------------------- save_pretrained and load
def test_save_pretrained_and_load(gaf, block, block_fusion, tmp_path):
    _, x = block
    fuser, fused = block_fusion
    d = str(tmp_path / "block-fused")
    assert fused.save_pretrained(d) == d
    files = set(os.listdir(d))
    assert {"model.onnx", "graph_autofusion.json", "samples.npz", "safe_fusion_report.json",
            "safe_fusion_report.txt"} <= files
    meta = json.load(open(os.path.join(d, "graph_autofusion.json"), encoding="utf-8"))
    assert meta["format"] == 1 and meta["fused_nodes"] == fused.fused_nodes
    assert meta["external_data"] in files and os.path.getsize(os.path.join(d, meta["external_data"])) > 30000
    assert meta["kernel_cache"]["target"] == gaf._core.kernel_target()
    with open(os.path.join(d, "safe_fusion_report.txt"), encoding="utf-8") as f:
        text = f.read()
    assert text == str(fuser.GetSafeFusionReport()) + "\n"
    assert text.startswith("[INFO] Safe fusion report:\n[INFO]   Total operator pairs: ")
    assert f"Safe fusion: {fuser.GetSafeFusionReport()['candidates']} candidates" in text  # the per-group table

    loaded = gaf.load(d)
    assert isinstance(loaded, gaf.FusedModel) and loaded.fused_nodes == fused.fused_nodes
    assert loaded.reports["safe_fusion"]["fused"] == fuser.GetSafeFusionReport()["fused"]
    assert str(loaded.reports["safe_fusion"]).startswith("[INFO] Safe fusion report:")
    assert loaded.samples and np.array_equal(loaded.samples[0]["x"], x.numpy())
    np.testing.assert_array_equal(loaded(x.numpy()), fused(x.numpy()))
    # The saved folder is a model too.
    again = gaf.GraphAutoFusion(d)
    assert again.EstimateFusionBenefit()["candidates"] == 0  # already fused: nothing left to fuse


def test_save_pretrained_decoder_and_generate(gaf, llama, tmp_path):
    _, _, fused, _ = llama
    d = fused.save_pretrained(str(tmp_path / "llama-fused"))
    loaded = gaf.FusedModel.load(d)
    assert loaded.is_decoder
    np.testing.assert_array_equal(loaded.generate([3, 1, 4], max_length=12), fused.generate([3, 1, 4], max_length=12))


def test_load_errors(gaf, tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        gaf.load(str(tmp_path / "nothing"))
    assert str(tmp_path / "nothing") in str(e.value) and "not a directory written by save_pretrained" in str(e.value)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "graph_autofusion.json").write_text("{not json")
    with pytest.raises(gaf.Error, match="not valid JSON"):
        gaf.load(str(bad))
    (bad / "graph_autofusion.json").write_text('{"format": 99}')
    with pytest.raises(gaf.Error, match="unknown format 99"):
        gaf.load(str(bad))


# ---------------------------------------------------------------- to_torch
def test_to_torch_module(gaf, torch, block, block_fusion):
    m, x = block
    _, fused = block_fusion
    tm = fused.to_torch()
    assert isinstance(tm, torch.nn.Module)
    assert tm.model_dir.startswith(os.environ["GAF_MODEL_CACHE"])
    with torch.no_grad():
        ref = m(x)
        y = tm(x)
    assert isinstance(y, torch.Tensor) and torch.allclose(y, ref, atol=1e-4, rtol=1e-4)

    class Outer(torch.nn.Module):  # inside a larger PyTorch program
        def __init__(self, inner):
            super().__init__()
            self.inner, self.head = inner, torch.nn.Linear(32, 3)

        def forward(self, z):
            return self.head(self.inner(z)).relu()

    torch.manual_seed(3)
    outer = Outer(tm)
    with torch.no_grad():
        want = outer.head(ref).relu()
        assert torch.allclose(outer(x), want, atol=1e-4, rtol=1e-4)
        scripted = torch.jit.script(outer)
        assert torch.allclose(scripted(x), want, atol=1e-4, rtol=1e-4)


def test_to_torch_several_outputs_scripted(gaf, torch, llama):
    _, _, fused, unfused = llama
    tm = torch.jit.script(fused.to_torch())
    feeds = fused.samples[0]
    args = [torch.from_numpy(feeds[n]) for n in fused.input_names]
    got = tm(*args)
    assert isinstance(got, tuple) and len(got) == len(fused.output_names)
    want = unfused.run(feeds)
    for name, g in zip(fused.output_names, got):
        np.testing.assert_allclose(g.numpy(), want[name], rtol=1e-4, atol=1e-4)


_SUBPROCESS = r"""
import sys
import numpy as np
import torch
import graph_autofusion
m = torch.jit.load(sys.argv[1])
x = torch.from_numpy(np.load(sys.argv[2]))
np.save(sys.argv[3], m(x).numpy())
"""


def test_to_torch_saved_as_torchscript_runs_in_a_fresh_process(gaf, torch, block, block_fusion, tmp_path):
    m, x = block
    _, fused = block_fusion
    path = str(tmp_path / "fused_block.pt")
    torch.jit.save(torch.jit.script(fused.to_torch()), path)
    np.save(tmp_path / "x.npy", x.numpy())
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [os.path.dirname(os.path.dirname(gaf.__file__)),
                                                      env.get("PYTHONPATH", "")] if p)
    r = subprocess.run([sys.executable, "-c", _SUBPROCESS, path, str(tmp_path / "x.npy"), str(tmp_path / "y.npy")],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    with torch.no_grad():
        np.testing.assert_allclose(np.load(tmp_path / "y.npy"), m(x).numpy(), rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- the GIL
def _progress_during(call):
    """Runs ``call`` in a thread while this thread counts in pure Python, noting (time, count)
    every 1000 increments. Returns how far the count advanced in the middle half of the call's
    time (so that thread start-up and the Python parts of the call, where the threads share the
    GIL, do not count) and the call's duration. A call that held the GIL would leave no note in
    that window: the count would not advance at all."""
    window, done = {}, threading.Event()

    def work():
        window["t0"] = time.perf_counter()
        try:
            call()
        finally:
            window["t1"] = time.perf_counter()
            done.set()

    notes, n = [], 0
    th = threading.Thread(target=work)
    th.start()
    while not done.is_set():
        n += 1
        if n % 1000 == 0:
            notes.append((time.perf_counter(), n))
    th.join()
    t0, t1 = window["t0"], window["t1"]
    lo, hi = t0 + (t1 - t0) / 4, t1 - (t1 - t0) / 4
    mid = [c for t, c in notes if lo <= t <= hi]
    return (mid[-1] - mid[0] if len(mid) > 1 else 0), t1 - t0


def _long_enough(call):
    """The seconds one ``call`` takes (to size the measured call)."""
    t = time.perf_counter()
    call()
    return time.perf_counter() - t


def test_the_check_sees_a_call_that_holds_the_gil():
    """The measurement itself: a C call that keeps the GIL (builtin sum over a range) leaves the
    counting thread nothing."""
    advanced, seconds = _progress_during(lambda: sum(range(20_000_000)))
    assert seconds > 0.02
    assert advanced == 0, advanced


@pytest.fixture(scope="module")
def small_decoder(gaf):
    """The "small" built-in decoder, unfused, on one thread (so that it and the counting thread
    each have a core of a 2-core machine)."""
    return gaf.FusedModel(gaf.example_llama("small"), use_kernels=False, threads=1)


def test_generate_releases_the_gil(gaf, small_decoder):
    """Decoding is one long C++ call: the counting thread must keep going during it."""
    model = small_decoder
    # Sized on a warm model: the first generation also plans and packs (on a fresh machine it took
    # 6x a later one's time a token, and the measured call then lasted 0.048 s instead of 0.3).
    model.generate([1, 2, 3], max_new_tokens=20)
    per_token = _long_enough(lambda: model.generate([1, 2, 3], max_new_tokens=20)) / 20
    tokens = int(min(400, max(10, 0.3 / max(per_token, 1e-5))))
    advanced, seconds = _progress_during(lambda: model.generate([1, 2, 3], max_new_tokens=tokens))
    assert seconds > 0.05, (seconds, tokens)
    # Free, the loop counts millions per second; 20000 increments is a few ms of it.
    assert advanced > 20000, (advanced, seconds)


def test_run_releases_the_gil(gaf, small_decoder):
    model = small_decoder
    n = 256  # a prefill of n tokens with an empty past
    feeds = {"input_ids": (np.arange(n, dtype=np.int64)[None] % 200) + 1,
             "attention_mask": np.ones((1, n), np.int64), "position_ids": np.arange(n, dtype=np.int64)[None]}
    for i in model.inputs:
        if i["name"].startswith("past_key_values."):
            feeds[i["name"]] = np.zeros((1, i["shape"][1], 0, i["shape"][3]), np.float32)
    assert model.run(feeds)["logits"].shape[:2] == (1, n)
    advanced, seconds = _progress_during(lambda: model.run(feeds))
    assert advanced > 5000, (advanced, seconds)


def test_fuse_safe_releases_the_gil(gaf):
    """FuseSafe (gates, fresh timings with the speed gate) on the tiny decoder's workload."""
    fuser = gaf.GraphAutoFusion(gaf.example_llama("tiny"))
    advanced, seconds = _progress_during(lambda: fuser.FuseSafe(repeats=15, remeasure=True))
    # What the gates keep depends on the machine's load (CTest runs tests side by side); the
    # report is there either way.
    assert fuser.GetSafeFusionReport()["candidates"] > 0
    assert advanced > 5000, (advanced, seconds)


def test_writing_into_an_output_does_not_change_later_runs(gaf):
    """Outputs the session keeps (a folded constant, a cached shape value) come out as copies; an
    output that is a view of the caller's own input still shares its memory."""
    from onnx import TensorProto, helper  # noqa: PLC0415

    g = helper.make_graph(
        [helper.make_node("Constant", [], ["c"], value=helper.make_tensor("v", TensorProto.FLOAT, [2], [1.0, 2.0])),
         helper.make_node("Shape", ["x"], ["s"]),
         helper.make_node("Reshape", ["x", "flat"], ["r"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, [2]),
         helper.make_tensor_value_info("s", TensorProto.INT64, [2]),
         helper.make_tensor_value_info("r", TensorProto.FLOAT, [6])],
        [helper.make_tensor("flat", TensorProto.INT64, [1], [6])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    fused = gaf.FusedModel(gaf._core.Model.from_bytes(m.SerializeToString()))
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    c, s, r = fused(x)
    assert np.shares_memory(r, x)
    c[:] = -7
    s[:] = -7
    c2, s2, _ = fused(x)
    assert c2.tolist() == [1.0, 2.0] and s2.tolist() == [2, 3]
