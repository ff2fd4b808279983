"""Shared fixtures of the graph_autofusion tests: tiny models (ONNX graphs built with onnx.helper,
PyTorch modules exported once per session), their fused forms, and a private model cache.

Run: PYTHONPATH=build/python /usr/bin/python3 -m pytest -q -p no:cacheprovider python/tests
GAF_MODEL_CACHE (where to_torch() saves the models its operator loads) points into a folder of the
session's own so the tests never write ~/.cache/graph-autofusion/models; GAF_KERNEL_CACHE is left
alone so the generated kernels are reused from one run to the next."""

import os
import shutil
import tempfile

import numpy as np
import pytest

_SESSION_DIR = tempfile.mkdtemp(prefix="gaf_pytest_")
os.environ["GAF_MODEL_CACHE"] = os.path.join(_SESSION_DIR, "models")


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(_SESSION_DIR, ignore_errors=True)


@pytest.fixture(scope="session")
def gaf():
    """The package. Not importable is a failure, not a skip: CTest runs these tests on a build
    that has the module."""
    try:
        import graph_autofusion  # noqa: PLC0415
    except ImportError as e:
        pytest.fail(f"graph_autofusion is not importable ({e}); build it and set PYTHONPATH=build/python",
                    pytrace=False)
    return graph_autofusion


@pytest.fixture(scope="session")
def torch():
    return pytest.importorskip("torch")


# ---------------------------------------------------------------- ONNX graphs built by hand
def _onnx_model(nodes, inputs, outputs, inits, name):
    import onnx  # noqa: PLC0415
    from onnx import TensorProto, helper, numpy_helper  # noqa: PLC0415

    g = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], producer_name="gaf-tests")
    onnx.checker.check_model(m)
    return m


@pytest.fixture(scope="session")
def mlp_onnx():
    """x[4,16] -> MatMul+Add -> Relu -> MatMul+Add -> LayerNormalization -> Add(residual r) -> y:
    two MatMul+Add pairs and a LayerNormalization+Add, an onnx.ModelProto."""
    from onnx import helper  # noqa: PLC0415

    rng = np.random.default_rng(1)
    f = np.float32
    inits = {"w1": rng.standard_normal((16, 32)).astype(f) * 0.3, "b1": rng.standard_normal(32).astype(f),
             "w2": rng.standard_normal((32, 16)).astype(f) * 0.3, "b2": rng.standard_normal(16).astype(f),
             "gamma": (1 + 0.1 * rng.standard_normal(16)).astype(f), "beta": (0.1 * rng.standard_normal(16)).astype(f)}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m1"], name="mm1"),
             helper.make_node("Add", ["m1", "b1"], ["a1"], name="bias1"),
             helper.make_node("Relu", ["a1"], ["h"], name="relu"),
             helper.make_node("MatMul", ["h", "w2"], ["m2"], name="mm2"),
             helper.make_node("Add", ["m2", "b2"], ["a2"], name="bias2"),
             helper.make_node("LayerNormalization", ["a2", "gamma", "beta"], ["ln"], name="ln", axis=-1,
                              epsilon=1e-5),
             helper.make_node("Add", ["ln", "r"], ["y"], name="residual")]
    return _onnx_model(nodes, [("x", [4, 16]), ("r", [4, 16])], [("y", [4, 16])], inits, "mlp")


@pytest.fixture(scope="session")
def mlp_feeds():
    rng = np.random.default_rng(2)
    return {"x": rng.standard_normal((4, 16)).astype(np.float32),
            "r": rng.standard_normal((4, 16)).astype(np.float32)}


@pytest.fixture(scope="session")
def mlp_expected(mlp_onnx, mlp_feeds):
    """What mlp_onnx computes on mlp_feeds, in numpy (float64), written from the graph's definition."""
    from onnx import numpy_helper  # noqa: PLC0415

    w = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in mlp_onnx.graph.initializer}
    x, r = mlp_feeds["x"].astype(np.float64), mlp_feeds["r"].astype(np.float64)
    a2 = np.maximum(x @ w["w1"] + w["b1"], 0) @ w["w2"] + w["b2"]
    mu, var = a2.mean(-1, keepdims=True), a2.var(-1, keepdims=True)
    return (a2 - mu) / np.sqrt(var + 1e-5) * w["gamma"] + w["beta"] + r


# ---------------------------------------------------------------- PyTorch modules
def make_block(torch, d=32, heads=2, seed=0):
    """A pre-LayerNorm transformer block: multi-head self-attention (softmax) and a GELU MLP,
    both with residuals."""
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
            q, k, v = (z.reshape(b, t, heads, d // heads).transpose(1, 2) for z in (q, k, v))
            att = torch.softmax(q @ k.transpose(-1, -2) / (d // heads) ** 0.5, dim=-1)
            h = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
            return h + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(h))))

    torch.manual_seed(seed)
    return Block().eval()


def make_cnn(torch, seed=0):
    """Conv+BatchNorm+ReLU twice (BatchNorm with non-trivial running statistics), global average
    pooling and a Linear head."""
    nn = torch.nn

    class SmallCNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
            self.conv2, self.bn2 = nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8)
            self.fc = nn.Linear(8, 5)

        def forward(self, x):
            x = torch.relu(self.bn1(self.conv1(x)))
            x = torch.relu(self.bn2(self.conv2(x)))
            return self.fc(x.mean(dim=(2, 3)))

    torch.manual_seed(seed)
    m = SmallCNN()
    with torch.no_grad():
        for bn in (m.bn1, m.bn2):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 1.5)
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.2, 0.2)
    return m.eval()


@pytest.fixture(scope="session")
def block_factory(torch):
    return lambda **kw: make_block(torch, **kw)


@pytest.fixture(scope="session")
def block(torch):
    """(module, example input [2, 8, 32])."""
    m = make_block(torch)
    g = torch.Generator().manual_seed(5)
    return m, torch.randn(2, 8, 32, generator=g)


@pytest.fixture(scope="session")
def block_fusion(gaf, block):
    """(GraphAutoFusion over the torch block, its FuseSafe() result without the speed gate)."""
    m, x = block
    fuser = gaf.GraphAutoFusion(m, preset="transformer", safe_mode=True, example_inputs=(x,))
    return fuser, fuser.FuseSafe(check_speed=False)


@pytest.fixture(scope="session")
def cnn(torch):
    m = make_cnn(torch)
    g = torch.Generator().manual_seed(6)
    return m, torch.randn(1, 3, 12, 12, generator=g)


@pytest.fixture(scope="session")
def cnn_fusion(gaf, cnn):
    m, x = cnn
    fuser = gaf.GraphAutoFusion(m, preset="cnn", safe_mode=True, example_inputs=x)
    return fuser, fuser.FuseSafe(check_speed=False)


# ---------------------------------------------------------------- the built-in decoder
@pytest.fixture(scope="session")
def llama(gaf):
    """(the tiny Llama-style ONNX decoder, its fuser, FuseSafe() without the speed gate, the model
    unfused as a FusedModel without kernels)."""
    model = gaf.example_llama("tiny")
    fuser = gaf.GraphAutoFusion(model, preset="transformer", safe_mode=True)
    fused = fuser.FuseSafe(check_speed=False)
    return model, fuser, fused, gaf.FusedModel(model, use_kernels=False)
