"""Models in every form the package takes (an ONNX path, onnx.ModelProto, bytes, torch.nn.Module,
torch.jit.script / torch.jit.trace modules, a saved .pt file), and fused outputs equal to
PyTorch's own: a transformer block (LayerNorm, attention, GELU MLP) and a Conv+BatchNorm+ReLU
CNN (fused into one blocked-layout chain). Torch models are exported a few times only; the session fixtures hold the fused ones."""

import glob
import os
import tempfile

import numpy as np
import onnx
import pytest

torch = pytest.importorskip("torch")


def reference(module, *args):
    with torch.no_grad():
        return module(*args).numpy()


def close(a, b):
    a = a.numpy() if isinstance(a, torch.Tensor) else a
    return np.allclose(a, b, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- outputs equal PyTorch's
def test_transformer_block_equals_pytorch(gaf, block, block_fusion):
    m, x = block
    fuser, fused = block_fusion
    assert fuser._source.kind == "torch" and fused.fused_nodes >= 3
    kinds = {g.split("/")[0] for g in (k["node"] for k in fuser.GetSafeFusionReport()["kernels"] if k["fused"])}
    assert any("Attention" in k or "Softmax" in k for k in kinds), kinds  # the attention was fused
    assert close(fused(x), reference(m, x))
    g = torch.Generator().manual_seed(11)
    other = torch.randn(2, 8, 32, generator=g) * 3  # not the example the kernels were checked on
    assert close(fused(other), reference(m, other))


def test_cnn_with_batchnorm_equals_pytorch(gaf, cnn, cnn_fusion):
    m, x = cnn
    fuser, fused = cnn_fusion
    groups = [k for k in fuser.GetSafeFusionReport()["kernels"] if k["fused"]]
    # Both Conv+BatchNorm+ReLU blocks in one blocked-layout chain (oneDNN's layout kept between them).
    assert len(groups) == 1 and groups[0]["function"].startswith("FusedBlockedChain"), groups
    assert close(fused(x), reference(m, x))
    g = torch.Generator().manual_seed(12)
    other = torch.randn(1, 3, 12, 12, generator=g)
    assert close(fused(other), reference(m, other))
    p = fuser.VerifyPrecision(fused, m)
    assert p["reference"] == "PyTorch (SmallCNN.forward)" and p["passed"]


def test_dynamic_axes_from_several_samples(gaf, block):
    """Two example inputs of different batch and length: both dims are dynamic, and other
    shapes run too."""
    m, _ = block
    g = torch.Generator().manual_seed(13)
    samples = [(torch.randn(2, 8, 32, generator=g),), (torch.randn(3, 5, 32, generator=g),)]
    fuser = gaf.GraphAutoFusion(m, example_inputs=samples)
    shape = fuser.model.info()
    assert '"shape":["x_dim0","x_dim1",32]' in shape, shape
    assert len(fuser.samples) == 2 and fuser.workload == "the example inputs"
    fused = fuser.Fuse()
    for s in [(1, 3, 32), (4, 7, 32)]:
        x = torch.randn(*s, generator=g)
        y = fused(x)
        assert tuple(y.shape) == s and close(y, reference(m, x))


# ---------------------------------------------------------------- models in
@pytest.fixture(scope="module")
def cnn_files(cnn, tmp_path_factory):
    """The CNN as an ONNX file (inputs named image -> logits) and as a TorchScript .pt file."""
    m, x = cnn
    d = tmp_path_factory.mktemp("cnn")
    onnx_path, pt_path = str(d / "cnn.onnx"), str(d / "cnn.pt")
    torch.onnx.export(m, (x,), onnx_path, input_names=["image"], output_names=["logits"], opset_version=17)
    torch.jit.save(torch.jit.script(m), pt_path)
    return onnx_path, pt_path


@pytest.mark.parametrize("form", ["path", "pathlib", "proto", "bytes"])
def test_onnx_forms(gaf, cnn, cnn_files, form):
    m, x = cnn
    path = cnn_files[0]
    import pathlib  # noqa: PLC0415

    model = {"path": path, "pathlib": pathlib.Path(path), "proto": onnx.load(path),
             "bytes": open(path, "rb").read()}[form]
    fuser = gaf.GraphAutoFusion(model, preset="cnn")
    assert fuser._source.kind == {"path": "onnx", "pathlib": "onnx", "proto": "onnx-proto", "bytes": "bytes"}[form]
    fused = fuser.Fuse()
    assert fused.input_names == ["image"] and fused.output_names == ["logits"] and fused.fused_nodes == 1
    y = fused(image=x.numpy())
    assert isinstance(y, np.ndarray) and close(y, reference(m, x))


@pytest.mark.parametrize("form", ["script", "trace", "pt_file"])
def test_torchscript_forms(gaf, cnn, cnn_files, form):
    m, x = cnn
    model = {"script": lambda: torch.jit.script(m), "trace": lambda: torch.jit.trace(m, (x,)),
             "pt_file": lambda: cnn_files[1]}[form]()
    fuser = gaf.GraphAutoFusion(model, preset="cnn", example_inputs=(x,))
    assert fuser._source.kind == "torchscript"
    assert "exported with torch.onnx.export" in fuser._source.description
    if form == "pt_file":
        assert cnn_files[1] in fuser._source.description
    fused = fuser.Fuse()
    assert fused.fused_nodes == 1  # the two conv blocks as one blocked-layout chain
    assert close(fused(x), reference(m, x)) and close(fused(x.numpy()), reference(m, x))
    p = fuser.VerifyPrecision(fused)  # the TorchScript module itself is the reference
    assert p["reference"].startswith("PyTorch (") and p["passed"], p


def test_example_inputs_as_a_dict(gaf, block):
    m, x = block
    fuser = gaf.GraphAutoFusion(m, example_inputs={"x": x}, preset="none")
    assert fuser.Fuse().input_names == ["x"]


def test_traced_transformer_block_equals_pytorch(gaf, block):
    m, x = block
    fuser = gaf.GraphAutoFusion(torch.jit.trace(m, (x,)), example_inputs=(x,))
    fused = fuser.FuseSafe(check_speed=False)
    assert fuser._source.kind == "torchscript" and fused.fused_nodes >= 3
    assert close(fused(x), reference(m, x))


def test_torch_module_without_example_inputs(gaf, block, cnn, cnn_files):
    m, _ = block
    with pytest.raises(TypeError, match=r"Block: a PyTorch model needs example_inputs=\.\.\."):
        gaf.GraphAutoFusion(m)
    with pytest.raises(TypeError, match="a PyTorch model needs example_inputs"):
        gaf.GraphAutoFusion(torch.jit.script(cnn[0]))
    with pytest.raises(TypeError, match=f"TorchScript file {cnn_files[1]}: a PyTorch model needs example_inputs"):
        gaf.GraphAutoFusion(cnn_files[1])


def test_missing_pt_file(gaf, cnn, tmp_path):
    _, x = cnn
    path = str(tmp_path / "missing.pt")
    with pytest.raises((FileNotFoundError, gaf.Error)) as e:
        gaf.GraphAutoFusion(path, example_inputs=(x,))
    assert path in str(e.value)


def test_export_leaves_no_temporary_folders(gaf, cnn):
    m, x = cnn
    pattern = os.path.join(tempfile.gettempdir(), "gaf_torch_*")
    before = set(glob.glob(pattern))
    gaf.GraphAutoFusion(m, preset="cnn", example_inputs=(x,)).Fuse()
    assert set(glob.glob(pattern)) - before == set()
