"""What a model and its sample inputs can be, turned into what the C++ library takes: a
``_core.Model`` and a list of ``{input name: numpy array}`` samples."""

import os
import sys
import tempfile

import numpy as np

from . import _core
from . import torch_io


class ModelSource:
    """A model ready for the library, and where it came from."""

    def __init__(self, model, kind, description, path=None, torch_module=None, samples=None, export=None):
        self.model = model                # _core.Model
        self.kind = kind                  # "onnx", "onnx-proto", "bytes", "torch", "torchscript", "fused"
        self.description = description    # for reports: "model.onnx", "torch module Llama", ...
        self.path = path
        self.torch_module = torch_module  # the torch module (for comparisons with PyTorch's outputs)
        self.samples = samples or []      # sample feeds that came with the model (torch example inputs)
        self.export = export              # torch_io.ExportResult


def _is_onnx_proto(obj):
    mod = type(obj).__module__ or ""
    return type(obj).__name__ == "ModelProto" and mod.startswith("onnx")


def to_numpy(value, what):
    """A numpy array for a numpy array, a torch tensor (no copy for a contiguous CPU tensor) or a
    nested list / scalar."""
    if isinstance(value, np.ndarray):
        return value
    if "torch" in sys.modules and isinstance(value, sys.modules["torch"].Tensor):
        t = value.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        return t.numpy()
    try:
        return np.asarray(value)
    except Exception as e:  # noqa: BLE001 - the sentence names the input
        raise TypeError(f"{what}: expected an array (numpy array or torch tensor), got {type(value).__name__}") from e


def normalize_samples(inputs, input_names, what="inputs"):
    """``inputs`` as a list of {name: numpy array}: a dict is one sample, a list of dicts several, a
    tuple/list of arrays one sample in input order."""
    if inputs is None:
        return []
    if isinstance(inputs, dict):
        inputs = [inputs]
    elif isinstance(inputs, (list, tuple)) and inputs and not isinstance(inputs[0], dict):
        inputs = [tuple(inputs)]
    samples = []
    for i, s in enumerate(inputs):
        if isinstance(s, dict):
            unknown = [k for k in s if k not in input_names]
            if unknown:
                raise ValueError(f"{what}[{i}]: '{unknown[0]}' is not an input of the model "
                                 f"(inputs: {', '.join(input_names)})")
            samples.append({k: to_numpy(v, f"input '{k}'") for k, v in s.items()})
        elif isinstance(s, (list, tuple)):
            if len(s) > len(input_names):
                raise ValueError(f"{what}[{i}]: {len(s)} arrays for {len(input_names)} inputs "
                                 f"({', '.join(input_names)})")
            samples.append({n: to_numpy(v, f"input '{n}'") for n, v in zip(input_names, s)})
        else:
            raise TypeError(f"{what}[{i}]: expected a dict of input name -> array or a tuple of arrays, "
                            f"got {type(s).__name__}")
    return samples


def load_model(model, example_inputs=None, dynamic_axes=None, opset=17, input_names=None, output_names=None):
    """Any supported model as a ModelSource."""
    from ._fused import FusedModel  # noqa: PLC0415 - avoids an import cycle

    if isinstance(model, FusedModel):
        return ModelSource(model.model, "fused", model.description, torch_module=model.torch_module,
                           samples=list(model.samples))
    if isinstance(model, _core.Model):
        return ModelSource(model, "onnx", "model")
    if isinstance(model, (bytes, bytearray, memoryview)):
        return ModelSource(_core.Model.from_bytes(bytes(model), "", "model bytes"), "bytes", "model bytes")
    if _is_onnx_proto(model):
        return ModelSource(_core.Model.from_bytes(model.SerializeToString(), "", "onnx.ModelProto"), "onnx-proto",
                           f"onnx.ModelProto ({model.graph.name or 'unnamed graph'})")
    if torch_io.is_torch_model(model):
        return _from_torch(model, type(model).__name__, example_inputs, dynamic_axes, opset, input_names, output_names)
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path}: no such file")
        if os.path.isdir(path) and os.path.exists(os.path.join(path, "graph_autofusion.json")):
            return load_model(FusedModel.load(path))
        if torch_io.is_torchscript_file(path):
            return _from_torch(path, f"TorchScript file {path}", example_inputs, dynamic_axes, opset, input_names,
                               output_names)
        return ModelSource(_core.Model.load(path), "onnx", path, path=path)
    raise TypeError(f"model: expected an ONNX file path, an onnx.ModelProto, bytes, a torch.nn.Module, a TorchScript "
                    f"module or file, or a FusedModel; got {type(model).__name__}")


def _from_torch(model, description, example_inputs, dynamic_axes, opset, input_names, output_names):
    if example_inputs is None:
        raise TypeError(f"{description}: a PyTorch model needs example_inputs=... (a tensor, a tuple of tensors or a "
                        f"dict of name -> tensor; a list of several samples makes the dims that differ dynamic) to be "
                        f"exported to ONNX")
    # The exported file is only a way in: Model.load reads it (and any external data) into memory,
    # so the folder goes away at once instead of one /tmp/gaf_torch_* folder per model.
    with tempfile.TemporaryDirectory(prefix="gaf_torch_") as tmp:
        res = torch_io.export(model, example_inputs, input_names=input_names, output_names=output_names,
                              dynamic_axes=dynamic_axes, opset=opset, path=os.path.join(tmp, "model.onnx"))
        m = _core.Model.load(res.path)
    samples = list(getattr(res, "samples", None) or [res.feeds])
    module = model
    if isinstance(model, (str, os.PathLike)):
        import torch  # noqa: PLC0415 - only for TorchScript files
        module = torch.jit.load(os.fspath(model), map_location="cpu")
    kind = "torchscript" if isinstance(model, (str, os.PathLike)) or type(model).__name__.startswith(
        ("RecursiveScriptModule", "ScriptModule", "TopLevelTracedModule")) else "torch"
    return ModelSource(m, kind, f"{description} (exported with torch.onnx.export, opset {opset})",
                       torch_module=module, samples=samples, export=res)
