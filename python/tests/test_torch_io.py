"""torch_io: PyTorch models (nn.Module, ScriptModule, TorchScript files) exported to ONNX.

Imports torch_io by path (not the graph_autofusion package, whose C++ core may not be built).
Run: /usr/bin/python3 -m pytest -q python/tests/test_torch_io.py
"""

import collections
import os
import subprocess
import sys
import tempfile
import zipfile

import numpy as np
import onnx
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.join(os.path.dirname(HERE), "graph_autofusion")
SCRIPT = os.path.join(PKG, "torch_io.py")
sys.path.insert(0, PKG)
import torch_io  # noqa: E402

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def private_tempdir(tmp_path, monkeypatch):
    """export(path=None) writes into a fresh tempfile.mkdtemp folder: keep those under tmp_path."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))


class AddLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x, y):
        return self.lin(x) + y


class WithMask(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x, mask):
        return self.lin(x) * mask.unsqueeze(-1)


class DictOut(torch.nn.Module):
    def forward(self, a, b):
        return {"total": a + b, "product": a * b}


Pair = collections.namedtuple("Pair", "plus_one twice")


class NamedOut(torch.nn.Module):
    def forward(self, a):
        return Pair(a + 1, a * 2)


class NotExportable(torch.nn.Module):
    def forward(self, x):
        return torch.fft.fft(x).real


def dims(value_info):
    return [d.dim_param if d.dim_param else d.dim_value for d in value_info.type.tensor_type.shape.dim]


def graph_dims(path):
    m = onnx.load(path)
    return {v.name: dims(v) for v in list(m.graph.input) + list(m.graph.output)}


def xy(batch=2):
    torch.manual_seed(0)
    return torch.randn(batch, 4), torch.randn(batch, 3)


# ---- recognizing models and files


def test_is_torch_model():
    assert torch_io.is_torch_model(AddLinear())
    assert torch_io.is_torch_model(torch.jit.script(AddLinear()))
    assert not torch_io.is_torch_model(object())
    assert not torch_io.is_torch_model(np.zeros(3))
    assert not torch_io.is_torch_model("model.pt")


def test_is_torch_model_does_not_import_torch():
    code = (f"import sys; sys.path.insert(0, {PKG!r}); import torch_io; "
            "assert not torch_io.is_torch_model(object()); assert 'torch' not in sys.modules; print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_is_torchscript_file(tmp_path):
    pt = tmp_path / "m.pt"
    torch.jit.script(AddLinear()).save(str(pt))
    assert torch_io.is_torchscript_file(pt) and torch_io.is_torchscript_file(str(pt))
    other = tmp_path / "other.zip"
    with zipfile.ZipFile(other, "w") as z:
        z.writestr("readme.txt", "hello")
    assert not torch_io.is_torchscript_file(other)
    hand = tmp_path / "hand.zip"
    with zipfile.ZipFile(hand, "w") as z:
        z.writestr("archive/constants.pkl", b"")
    assert torch_io.is_torchscript_file(hand)
    text = tmp_path / "t.pt"
    text.write_text("not a zip")
    assert not torch_io.is_torchscript_file(text)
    assert not torch_io.is_torchscript_file(tmp_path / "missing.pt")
    assert not torch_io.is_torchscript_file(tmp_path)
    assert not torch_io.is_torchscript_file(42)


# ---- export


def test_positional_inputs(tmp_path):
    x, y = xy()
    out = tmp_path / "m.onnx"
    r = torch_io.export(AddLinear(), (x, y), path=out)
    assert r.path == str(out) and out.is_file()
    assert r.input_names == ["x", "y"] and r.output_names == ["output_0"]
    assert r.dynamic_axes == {} and r.opset == 17
    np.testing.assert_array_equal(r.feeds["x"], x.numpy())
    np.testing.assert_array_equal(r.feeds["y"], y.numpy())
    assert len(r.samples) == 1
    m = onnx.load(r.path)
    onnx.checker.check_model(m)
    assert max(o.version for o in m.opset_import if o.domain in ("", "ai.onnx")) == 17
    assert graph_dims(r.path) == {"x": [2, 4], "y": [2, 3], "output_0": [2, 3]}
    # The weights are in the model (constant folding keeps them as initializers).
    assert sum(int(np.prod(t.dims)) for t in m.graph.initializer) == 4 * 3 + 3


def test_single_tensor_numpy_and_temp_dir():
    class Double(torch.nn.Module):
        def forward(self, inp):
            return inp * 2

    r = torch_io.export(Double(), np.ones((2, 5), np.float32), opset=13)
    assert os.path.isfile(r.path) and os.path.basename(r.path) == "model.onnx"
    assert r.input_names == ["inp"] and r.opset == 13
    assert r.feeds["inp"].dtype == np.float32 and r.feeds["inp"].shape == (2, 5)


def test_dict_inputs_in_forward_order():
    x, y = xy()
    r = torch_io.export(AddLinear(), {"y": y.numpy(), "x": x})
    assert r.input_names == ["x", "y"]
    assert list(r.feeds) == ["x", "y"]


def test_output_names_from_dict_and_namedtuple():
    a = torch.ones(3)
    assert torch_io.export(DictOut(), (a, a)).output_names == ["total", "product"]
    assert torch_io.export(NamedOut(), (a,)).output_names == ["plus_one", "twice"]
    r = torch_io.export(DictOut(), (a, a), input_names=["p", "q"], output_names=["s", "t"])
    assert r.input_names == ["p", "q"] and r.output_names == ["s", "t"]


def test_two_samples_make_the_differing_dims_dynamic():
    torch.manual_seed(0)
    s1 = (torch.randn(2, 6, 4), torch.ones(2, 6))
    s2 = (torch.randn(2, 9, 4), torch.ones(2, 9))
    r = torch_io.export(WithMask(), [s1, s2])
    # Only the sequence dim differs; x's and mask's vary alike, so they share one name, and so does the output's.
    assert r.dynamic_axes == {"x": {1: "x_dim1"}, "mask": {1: "x_dim1"}, "output_0": {1: "x_dim1"}}
    assert graph_dims(r.path) == {"x": [2, "x_dim1", 4], "mask": [2, "x_dim1"], "output_0": [2, "x_dim1", 3]}
    assert len(r.samples) == 2 and r.samples[1]["x"].shape == (2, 9, 4)
    np.testing.assert_array_equal(r.feeds["x"], s1[0].numpy())


def test_samples_as_dicts_and_independent_dims():
    r = torch_io.export(AddLinear(), [{"x": torch.ones(2, 4), "y": torch.ones(2, 3)},
                                      {"x": torch.ones(5, 4), "y": torch.ones(1, 3)}])
    # Broadcasting y: the two batch dims vary differently, so they get their own names.
    assert r.dynamic_axes["x"] == {0: "x_dim0"} and r.dynamic_axes["y"] == {0: "y_dim0"}
    d = graph_dims(r.path)
    assert d["x"] == ["x_dim0", 4] and d["y"] == ["y_dim0", 3]


def test_explicit_dynamic_axes_win():
    s1, s2 = xy(2), xy(3)
    r = torch_io.export(AddLinear(), [s1, s2], dynamic_axes={"x": {0: "batch"}, "y": [0]})
    assert r.dynamic_axes == {"x": {0: "batch"}, "y": {0: "y_dim0"}}
    d = graph_dims(r.path)
    assert d["x"] == ["batch", 4] and d["y"] == ["y_dim0", 3]


def test_script_module():
    s = torch.jit.script(AddLinear())
    r = torch_io.export(s, xy())
    assert r.input_names == ["x", "y"] and r.output_names == ["output_0"]
    onnx.checker.check_model(onnx.load(r.path))


def test_traced_module_with_samples():
    t = torch.jit.trace(AddLinear(), xy())
    r = torch_io.export(t, [xy(2), xy(7)])
    assert r.input_names == ["x", "y"]
    assert graph_dims(r.path)["x"] == ["x_dim0", 4]


def test_torchscript_file_round_trip(tmp_path):
    pt = tmp_path / "model.pt"
    torch.jit.script(WithMask()).save(str(pt))
    r = torch_io.export(pt, {"x": np.ones((1, 3, 4), np.float32), "mask": np.ones((1, 3), np.float32)},
                        path=tmp_path / "model.onnx")
    assert r.input_names == ["x", "mask"]
    assert graph_dims(r.path) == {"x": [1, 3, 4], "mask": [1, 3], "output_0": [1, 3, 3]}


def test_eval_mode_restored():
    m = AddLinear()
    m.train()
    torch_io.export(m, xy())
    assert m.training


# ---- errors: one sentence, no torch traceback


def no_traceback(e):
    return e.__cause__ is None and (e.__context__ is None or e.__suppress_context__) and "\n" not in str(e)


def test_wrong_number_of_inputs():
    with pytest.raises(ValueError) as e:
        torch_io.export(AddLinear(), (torch.ones(2, 4),))
    assert str(e.value) == "example inputs: AddLinear.forward takes 2 input(s) (x, y) but 1 was given"
    assert no_traceback(e.value)
    with pytest.raises(ValueError, match="takes 2 input"):
        torch_io.export(torch.jit.script(AddLinear()), (torch.ones(2, 4),) * 3)


def test_bad_inputs():
    with pytest.raises(ValueError, match=r"has no parameter 'z' \(its parameters: x, y\)"):
        torch_io.export(AddLinear(), {"x": torch.ones(2, 4), "z": torch.ones(2, 3)})
    with pytest.raises(ValueError, match="'x' of AddLinear.forward is not given"):
        torch_io.export(AddLinear(), {"y": torch.ones(2, 3)})
    with pytest.raises(TypeError, match=r"example input 1 \('y'\) is a list"):
        torch_io.export(AddLinear(), (torch.ones(2, 4), [1.0, 2.0]))
    with pytest.raises(ValueError, match=r"\(sample 2 of 2\): AddLinear.forward takes 2 input\(s\)"):
        torch_io.export(AddLinear(), [{"x": torch.ones(2, 4), "y": torch.ones(2, 3)}, (torch.ones(2, 4),)])

    class Optional2(torch.nn.Module):
        def forward(self, x, y=None):
            return x if y is None else x + y

    with pytest.raises(ValueError, match="every sample must give the same inputs"):
        torch_io.export(Optional2(), [(torch.ones(2),), (torch.ones(2), torch.ones(2))])
    with pytest.raises(ValueError, match="rank 3 in sample 2"):
        torch_io.export(AddLinear(), [xy(), (torch.ones(1, 2, 4), torch.ones(2, 3))])
    with pytest.raises(ValueError, match="input_names gives 1 name"):
        torch_io.export(AddLinear(), xy(), input_names=["a"])
    with pytest.raises(ValueError, match="output_names gives 2 name"):
        torch_io.export(AddLinear(), xy(), output_names=["a", "b"])
    with pytest.raises(ValueError, match="'nope' is neither an input nor an output"):
        torch_io.export(AddLinear(), xy(), dynamic_axes={"nope": [0]})
    with pytest.raises(ValueError, match="opset must be an integer from 13 to 17"):
        torch_io.export(AddLinear(), xy(), opset=11)
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        torch_io.export(object(), xy())
    with pytest.raises(ValueError) as e:
        torch_io.export(AddLinear(), (torch.ones(2, 5), torch.ones(2, 3)))
    assert str(e.value).startswith("running AddLinear.forward on the example inputs failed: ") and no_traceback(e.value)


def test_bad_files(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        torch_io.export(tmp_path / "missing.pt", xy())
    (tmp_path / "t.pt").write_text("text")
    with pytest.raises(ValueError, match="is not a TorchScript file"):
        torch_io.export(tmp_path / "t.pt", xy())


def test_exporter_failure_is_one_sentence():
    with pytest.raises(ValueError) as e:
        torch_io.export(NotExportable(), (torch.ones(8),))
    assert str(e.value).startswith("torch.onnx.export failed on NotExportable: "), str(e.value)
    assert no_traceback(e.value)


def test_without_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    with pytest.raises(ImportError) as e:
        torch_io.export(object(), ())
    assert str(e.value) == ("converting a PyTorch model needs PyTorch: apt-get install python3-torch "
                            "(Debian's package)")
    assert not torch_io.is_torch_model(object())


# ---- the command line the C++ CLI runs


def run_script(args, env=None, cwd=None):
    return subprocess.run([sys.executable, SCRIPT] + args, capture_output=True, text=True, timeout=120,
                          env=env, cwd=cwd)


def test_cli_convert(tmp_path):
    pt = tmp_path / "m.pt"
    torch.jit.script(AddLinear()).save(str(pt))
    np.save(tmp_path / "x.npy", np.ones((2, 4), np.float32))
    np.save(tmp_path / "y.npy", np.ones((2, 3), np.float32))
    out = tmp_path / "m.onnx"
    # NAME=FILE for y, by position for x.
    r = run_script(["convert", str(pt), "-o", str(out), "-i", f"y={tmp_path / 'y.npy'}", "-i",
                    str(tmp_path / "x.npy")])
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.strip().splitlines()) == 1 and r.stdout.startswith(f"wrote {out}")
    assert graph_dims(str(out)) == {"x": [2, 4], "y": [2, 3], "output_0": [2, 3]}
    assert sorted(os.listdir(tmp_path)) == ["m.onnx", "m.pt", "x.npy", "y.npy"]  # no extra files

    # Errors: one line, exit 1 (one run for a wrong number of inputs; the others fail before torch).
    r = run_script(["convert", str(pt), "-o", str(out), "-i", f"x={tmp_path / 'x.npy'}"])
    assert r.returncode == 1 and r.stderr.strip().splitlines() == [
        "error: example inputs: AddLinear.forward needs 'y', which is not given (its parameters: x, y)"]
    r = run_script(["convert", str(pt), "-o", str(out)])
    assert r.returncode == 1 and r.stderr.strip() == (
        f"error: {pt} is a TorchScript file: give sample inputs (-i NAME=FILE.npy) so it can be exported to ONNX")
    r = run_script(["convert", str(pt), "-i", str(tmp_path / "x.npy")])
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1 and "-o/--output" in r.stderr
    r = run_script(["convert", str(pt), "-o", str(out), "-i", f"x={tmp_path / 'nope.npy'}"])
    assert r.returncode == 1 and r.stderr.strip() == f"error: -i x: {tmp_path / 'nope.npy'}: no such file"
    r = run_script(["convert", str(pt), "-o", str(out), "-i", str(tmp_path)])
    assert r.returncode == 1 and "test_data_set folder is not supported" in r.stderr


def test_cli_without_torch(tmp_path):
    fake = tmp_path / "fake" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named torch')\n")
    pt = tmp_path / "m.pt"
    with zipfile.ZipFile(pt, "w") as z:
        z.writestr("m/data.pkl", b"")
    np.save(tmp_path / "x.npy", np.ones((2, 4), np.float32))
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "fake"))
    r = run_script(["convert", str(pt), "-o", str(tmp_path / "m.onnx"), "-i", str(tmp_path / "x.npy")], env=env)
    assert r.returncode == 3
    assert r.stderr.strip() == ("error: converting a PyTorch model needs PyTorch: apt-get install python3-torch "
                                "(Debian's package)")
