"""PyTorch models in: torch.nn.Module, torch.jit.ScriptModule and TorchScript files to ONNX.

Everything goes through PyTorch's own exporter (torch.onnx.export, the TorchScript-based one of
PyTorch 1.13) with the example inputs the caller gives; when several samples are given, the dims
whose sizes differ between them become dynamic axes of the exported model.

This module imports only the standard library, numpy and onnx at load time, and torch lazily inside
the functions that need it. It imports nothing from the graph_autofusion package: the C++ CLI runs
it as a script by path to convert a TorchScript file it was given as a model:

    /usr/bin/python3 torch_io.py convert MODEL.pt -o OUT.onnx [-i NAME=FILE.npy|FILE.pb ...] [--opset N]

(exit 0 on success, 1 with one line `error: ...` on stderr, 3 when PyTorch is not installed).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import inspect
import io
import os
import sys
import tempfile
import warnings
import zipfile
from typing import Any, Dict, List, Optional, Sequence

try:
    import numpy as np
    import onnx
except ImportError as _e:  # run as a script by an interpreter without them: one line, exit 1
    if __name__ == "__main__":
        print(f"error: converting a PyTorch model needs numpy and onnx ({_e}): apt-get install python3-numpy "
              "python3-onnx", file=sys.stderr)
        sys.exit(1)
    raise

TORCH_MISSING = "converting a PyTorch model needs PyTorch: apt-get install python3-torch (Debian's package)"
MIN_OPSET, MAX_OPSET, DEFAULT_OPSET = 13, 17, 17

__all__ = ["ExportResult", "is_torch_model", "is_torchscript_file", "export", "main", "TORCH_MISSING"]


@dataclasses.dataclass
class ExportResult:
    """What `export` wrote: the ONNX file, its input and output names, the example inputs as numpy
    feeds (the first sample; `samples` holds all of them) and the dynamic axes used."""

    path: str
    input_names: List[str]
    output_names: List[str]
    feeds: Dict[str, np.ndarray]
    dynamic_axes: Dict[str, Dict[int, str]]
    samples: List[Dict[str, np.ndarray]] = dataclasses.field(default_factory=list)
    opset: int = DEFAULT_OPSET


# --------------------------------------------------------------------------------------------
# Recognizing torch models and TorchScript files (no torch import needed)


def is_torch_model(obj: Any) -> bool:
    """True for a torch.nn.Module (a torch.jit.ScriptModule is one). Imports nothing: an object
    can only be a torch module when torch is already loaded."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        return isinstance(obj, torch.nn.Module)
    except AttributeError:  # a partly initialized torch
        return False


def _zip_is_torchscript(names: Sequence[str]) -> bool:
    for n in names:
        parts = n.split("/")
        # torch.jit.save writes <archive>/code/..., <archive>/constants.pkl, <archive>/data.pkl.
        if len(parts) >= 2 and (parts[1] == "code" and len(parts) >= 3 or
                                parts[-1] in ("constants.pkl", "data.pkl")):
            return True
    return False


def is_torchscript_file(path: Any) -> bool:
    """True when `path` is a zip archive in the layout torch.jit.save writes (an entry under
    `*/code/`, or a `*/constants.pkl` or `*/data.pkl`). Checked with zipfile; no torch needed."""
    try:
        p = os.fspath(path)
    except TypeError:
        return False
    try:
        with open(p, "rb") as f:
            if f.read(4) != b"PK\x03\x04":
                return False
        with zipfile.ZipFile(p) as z:
            return _zip_is_torchscript(z.namelist())
    except (OSError, zipfile.BadZipFile, ValueError):
        return False


# --------------------------------------------------------------------------------------------
# Export


def _import_torch():
    try:
        import torch  # noqa: F401
        import torch.onnx  # noqa: F401
    except ImportError:
        raise ImportError(TORCH_MISSING) from None
    return torch


def _first_line(e: BaseException) -> str:
    for line in str(e).splitlines():
        if line.strip():
            return line.strip()
    return type(e).__name__


def _model_name(model) -> str:
    name = getattr(model, "original_name", None)  # ScriptModule: the scripted class
    if isinstance(name, str) and name:
        return name
    return type(model).__name__


def _load_model(torch, model):
    if isinstance(model, (str, os.PathLike)):
        p = os.fspath(model)
        if not os.path.exists(p):
            raise ValueError(f"{p}: no such file")
        if not os.path.isfile(p):
            raise ValueError(f"{p}: not a file")
        if not is_torchscript_file(p):
            raise ValueError(f"{p} is not a TorchScript file (torch.jit.save's zip archive)")
        try:
            return torch.jit.load(p, map_location="cpu")
        except Exception as e:  # noqa: BLE001 - torch raises RuntimeError and others
            raise ValueError(f"{p}: torch.jit.load failed: {_first_line(e)}") from None
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, a torch.jit.ScriptModule or the path of a TorchScript "
                        f"file, not {type(model).__name__}")
    return model


class _Param:
    def __init__(self, name: str, required: bool):
        self.name, self.required = name, required


def _forward_params(torch, model):
    """forward's parameters (without self) and whether it takes *args (then counts are not checked)."""
    if isinstance(model, torch.jit.ScriptModule):
        try:
            args = model.forward.schema.arguments[1:]
        except (AttributeError, RuntimeError):
            return [], True
        return [_Param(a.name, a.default_value is None and not a.has_default_value()) for a in args], False
    try:
        sig = inspect.signature(model.forward)
    except (TypeError, ValueError):
        return [], True
    params, varargs = [], False
    for p in sig.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            varargs = True
        elif p.kind != p.KEYWORD_ONLY:
            params.append(_Param(p.name, p.default is p.empty))
    return params, varargs


def _to_tensor(torch, x, what: str):
    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    if isinstance(x, np.ndarray):
        if x.dtype == object:
            raise TypeError(f"example input {what} is a numpy array of Python objects; give numbers")
        a = np.ascontiguousarray(x)
        if not a.flags.writeable:
            a = a.copy()
        try:
            return torch.from_numpy(a)
        except TypeError as e:
            raise TypeError(f"example input {what}: {_first_line(e)}") from None
    if isinstance(x, np.generic):
        return torch.from_numpy(np.array(x))
    raise TypeError(f"example input {what} is a {type(x).__name__}; give a torch tensor or a numpy array")


def _is_sample_list(example_inputs) -> bool:
    return (isinstance(example_inputs, list) and len(example_inputs) > 0 and
            all(isinstance(s, (tuple, list, dict)) for s in example_inputs))


def _arrange(torch, sample, params, varargs, model_name: str, where: str):
    """One sample as (names, tensors) in forward's order."""
    names = [p.name for p in params]
    if isinstance(sample, dict):
        for k in sample:
            if not isinstance(k, str):
                raise TypeError(f"example inputs{where}: keys must be input names (str), not {type(k).__name__}")
            if not varargs and k not in names:
                raise ValueError(f"example inputs{where}: {model_name}.forward has no parameter '{k}' "
                                 f"(its parameters: {', '.join(names) or 'none'})")
        if varargs and any(k not in names for k in sample):
            raise ValueError(f"example inputs{where}: {model_name}.forward takes *args/**kwargs; give the inputs "
                             "positionally (a tuple) instead of by name")
        given = [n for n in names if n in sample]
        last = max((names.index(n) for n in given), default=-1)
        for p in params[:last + 1]:
            if p.name not in sample:
                raise ValueError(f"example inputs{where}: '{p.name}' of {model_name}.forward is not given but a later "
                                 "input is; give every input up to the last one")
        for p in params[last + 1:]:
            if p.required:
                raise ValueError(f"example inputs{where}: {model_name}.forward needs '{p.name}', which is not given "
                                 f"(its parameters: {', '.join(names)})")
        out_names = names[:last + 1]
        return out_names, [_to_tensor(torch, sample[n], f"'{n}'") for n in out_names]
    if isinstance(sample, (tuple, list)):
        values = list(sample)
    else:
        values = [sample]
    if not values:
        raise ValueError(f"example inputs{where}: no inputs given")
    if not varargs:
        required = sum(p.required for p in params)
        if len(values) > len(params) or len(values) < required:
            count = (f"{len(params)}" if required == len(params) else f"{required} to {len(params)}")
            raise ValueError(f"example inputs{where}: {model_name}.forward takes {count} input(s) "
                             f"({', '.join(names) or 'none'}) but {len(values)} "
                             f"{'was' if len(values) == 1 else 'were'} given")
        out_names = names[:len(values)]
    else:
        out_names = names[:len(values)] + [f"input_{i}" for i in range(len(names), len(values))]
    return out_names, [_to_tensor(torch, v, f"{i} ('{n}')") for i, (v, n) in enumerate(zip(values, out_names))]


def _flatten_outputs(out, prefix: str = "") -> List[Any]:
    if isinstance(out, dict):
        leaves = []
        for v in out.values():
            leaves += _flatten_outputs(v)
        return leaves
    if isinstance(out, (tuple, list)):
        leaves = []
        for v in out:
            leaves += _flatten_outputs(v)
        return leaves
    return [out]


def _default_output_names(out, count: int) -> List[str]:
    if isinstance(out, dict) and all(isinstance(k, str) for k in out) and len(out) == count:
        return list(out.keys())
    fields = getattr(type(out), "_fields", None)  # a namedtuple
    if isinstance(out, tuple) and fields and len(fields) == count:
        return list(fields)
    return [f"output_{i}" for i in range(count)]


def _shape_of(x) -> Optional[tuple]:
    shape = getattr(x, "shape", None)
    return tuple(int(d) for d in shape) if shape is not None else None


def _dynamic_from_samples(input_names, input_shapes, output_names, output_shapes):
    """Axes whose sizes differ between the samples: {name: {axis: dim name}}, named
    `<input>_dim<axis>`. Axes whose sizes vary alike in every sample (a batch or sequence length
    shared by several inputs, an output's batch) share the name of the first such input axis."""
    axes: Dict[str, Dict[int, str]] = {}
    by_sizes: Dict[tuple, str] = {}
    for name, shapes in zip(input_names, input_shapes):
        for axis in range(len(shapes[0])):
            sizes = tuple(s[axis] for s in shapes)
            if len(set(sizes)) > 1:
                axes.setdefault(name, {})[axis] = by_sizes.setdefault(sizes, f"{name}_dim{axis}")
    for name, shapes in zip(output_names, output_shapes):
        if any(s is None for s in shapes) or len({len(s) for s in shapes}) != 1:
            continue
        for axis in range(len(shapes[0])):
            sizes = tuple(s[axis] for s in shapes)
            if len(set(sizes)) > 1:
                axes.setdefault(name, {})[axis] = by_sizes.get(sizes, f"{name}_dim{axis}")
    return axes


def _check_dynamic_axes(dynamic_axes, known: Sequence[str]):
    if not isinstance(dynamic_axes, dict):
        raise TypeError(f"dynamic_axes must be a dict name -> {{axis: dim name}} or [axes], not "
                        f"{type(dynamic_axes).__name__}")
    out: Dict[str, Any] = {}
    for name, ax in dynamic_axes.items():
        if name not in known:
            raise ValueError(f"dynamic_axes: '{name}' is neither an input nor an output (they are: {', '.join(known)})")
        if isinstance(ax, dict):
            out[name] = {int(k): str(v) for k, v in ax.items()}
        elif isinstance(ax, (list, tuple)):
            out[name] = {int(k): f"{name}_dim{int(k)}" for k in ax}
        else:
            raise TypeError(f"dynamic_axes['{name}'] must be a dict axis -> dim name or a list of axes")
    return out


def export(model, example_inputs, *, input_names=None, output_names=None, dynamic_axes=None,
           opset: int = DEFAULT_OPSET, path=None) -> ExportResult:
    """Exports a torch.nn.Module, a torch.jit.ScriptModule or a TorchScript file to ONNX with
    torch.onnx.export (eval mode, no grad, constant folding) and checks it with onnx.checker.

    example_inputs: a tensor, a tuple/list of tensors (positional), a dict name -> tensor (by
    forward's parameter names), numpy arrays in place of tensors; or a list of several such samples
    (a list of tuples or dicts), whose differing dims become dynamic axes unless dynamic_axes is
    given (see _dynamic_from_samples for their names). Input names default to forward's parameter
    names, output names to the keys of a returned dict or the fields of a namedtuple, else
    output_0, output_1, ... The result names the inputs and outputs as exported.
    """
    torch = _import_torch()
    if isinstance(opset, bool) or not isinstance(opset, int) or not MIN_OPSET <= opset <= MAX_OPSET:
        raise ValueError(f"opset must be an integer from {MIN_OPSET} to {MAX_OPSET}, not {opset!r}")
    model = _load_model(torch, model)
    name = _model_name(model)
    params, varargs = _forward_params(torch, model)

    raw_samples = list(example_inputs) if _is_sample_list(example_inputs) else [example_inputs]
    if example_inputs is None or (isinstance(example_inputs, (list, tuple, dict)) and len(example_inputs) == 0):
        raise ValueError(f"example inputs: none given; {name}.forward takes "
                         f"{', '.join(p.name for p in params) or 'no named parameters'}")
    samples = []  # (names, tensors)
    for i, s in enumerate(raw_samples):
        where = f" (sample {i + 1} of {len(raw_samples)})" if len(raw_samples) > 1 else ""
        samples.append(_arrange(torch, s, params, varargs, name, where))
    names0, tensors0 = samples[0]
    for i, (n, t) in enumerate(samples[1:], start=2):
        if n != names0:
            raise ValueError(f"example inputs: sample {i} gives the inputs ({', '.join(n)}) but sample 1 gives "
                             f"({', '.join(names0)}); every sample must give the same inputs")
        for nm, a, b in zip(n, tensors0, t):
            if a.dtype != b.dtype:
                raise ValueError(f"example inputs: input '{nm}' is {b.dtype} in sample {i} but {a.dtype} in sample 1")
            if a.dim() != b.dim():
                raise ValueError(f"example inputs: input '{nm}' has rank {b.dim()} in sample {i} but {a.dim()} in "
                                 "sample 1")

    if input_names is None:
        input_names = list(names0)
    else:
        input_names = [str(x) for x in input_names]
        if len(input_names) != len(names0):
            raise ValueError(f"input_names gives {len(input_names)} name(s) but there are {len(names0)} example "
                             f"input(s) ({', '.join(names0)})")
        if len(set(input_names)) != len(input_names):
            raise ValueError(f"input_names: a name is given twice ({', '.join(input_names)})")

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            outs = []
            for i, (_, t) in enumerate(samples):
                try:
                    outs.append(model(*t))
                except Exception as e:  # noqa: BLE001 - the model's own error
                    where = f" (sample {i + 1})" if len(samples) > 1 else ""
                    raise ValueError(f"running {name}.forward on the example inputs{where} failed: "
                                     f"{_first_line(e)}") from None
            leaves = [[x for x in _flatten_outputs(o) if isinstance(x, torch.Tensor)] for o in outs]
            n_out = len(leaves[0])
            if output_names is None:
                output_names = _default_output_names(outs[0], n_out)
            else:
                output_names = [str(x) for x in output_names]
                if len(output_names) != n_out:
                    raise ValueError(f"output_names gives {len(output_names)} name(s) but {name}.forward returns "
                                     f"{n_out} output(s)")
            clash = set(output_names) & set(input_names)
            if clash:
                raise ValueError(f"output name(s) {', '.join(sorted(clash))} are also input names; give output_names")

            if dynamic_axes is None:
                in_shapes = [[tuple(s[1][k].shape) for s in samples] for k in range(len(input_names))]
                out_shapes = []
                for k in range(n_out):
                    out_shapes.append([_shape_of(l[k]) if len(l) == n_out else None for l in leaves])
                axes = _dynamic_from_samples(input_names, in_shapes, output_names, out_shapes)
            else:
                axes = _check_dynamic_axes(dynamic_axes, input_names + output_names)

            if path is None:
                out_path = os.path.join(tempfile.mkdtemp(prefix="gaf_torch_"), "model.onnx")
            else:
                out_path = os.fspath(path)
                parent = os.path.dirname(os.path.abspath(out_path))
                if not os.path.isdir(parent):
                    raise ValueError(f"{out_path}: the folder {parent} does not exist")
            args = tuple(tensors0)
            diag = io.StringIO()  # torch 1.13 prints a diagnostic summary to stdout
            try:
                with contextlib.redirect_stdout(diag), warnings.catch_warnings():
                    # PyTorch's noise for every ScriptModule (it has no Python signature).
                    warnings.filterwarnings("ignore", message=".*skipping _decide_input_format")
                    torch.onnx.export(model, args, out_path, input_names=input_names, output_names=output_names,
                                      dynamic_axes=axes or None, opset_version=opset, do_constant_folding=True)
            except Exception as e:  # noqa: BLE001 - torch's error, shortened to one sentence
                raise ValueError(f"torch.onnx.export failed on {name}: {_first_line(e)}") from None
    finally:
        model.train(was_training)

    try:
        onnx.checker.check_model(out_path)
    except Exception as e:  # noqa: BLE001
        raise ValueError(f"{out_path}: the exported model fails the ONNX checker: {_first_line(e)}") from None

    # The names as exported (the exporter may drop an input that forward does not use).
    m = onnx.load(out_path, load_external_data=False)
    inits = {t.name for t in m.graph.initializer}
    graph_inputs = [v.name for v in m.graph.input if v.name not in inits]
    graph_outputs = [v.name for v in m.graph.output]
    keep = [k for k, n in enumerate(input_names) if n in graph_inputs]
    feeds_all = [{input_names[k]: s[1][k].numpy() for k in keep} for s in samples]
    used_axes = {k: v for k, v in axes.items() if k in graph_inputs or k in graph_outputs}
    return ExportResult(path=out_path, input_names=graph_inputs, output_names=graph_outputs, feeds=feeds_all[0],
                        dynamic_axes=used_axes, samples=feeds_all, opset=opset)


# --------------------------------------------------------------------------------------------
# Command line: convert a TorchScript file (what the C++ CLI runs)


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 1 (not argparse's usage and exit 2)
        raise _UsageError(message)


def _load_array(file: str, what: str) -> np.ndarray:
    if not os.path.isfile(file):
        raise ValueError(f"-i {what}: {file}: no such file")
    try:
        if file.endswith(".pb"):
            from onnx import numpy_helper
            return numpy_helper.to_array(onnx.load_tensor(file))
        return np.load(file, allow_pickle=False)
    except Exception as e:  # noqa: BLE001 - numpy's and onnx's errors
        raise ValueError(f"-i {what}: {file}: cannot read it as a .npy or TensorProto .pb file: "
                         f"{_first_line(e)}") from None


def _convert(argv: Sequence[str]) -> str:
    p = _Parser(prog="torch_io.py", add_help=True)
    sub = p.add_subparsers(dest="command")
    c = sub.add_parser("convert", help="export a TorchScript file to ONNX")
    c.error = p.error  # type: ignore[method-assign]
    c.add_argument("model")
    c.add_argument("-o", "--output", required=True)
    c.add_argument("-i", "--input", action="append", default=[], help="NAME=FILE.npy|FILE.pb, or FILE (positional)")
    c.add_argument("--opset", type=int, default=DEFAULT_OPSET)
    a = p.parse_args(list(argv))
    if a.command != "convert":
        raise _UsageError("expected: convert MODEL.pt -o OUT.onnx [-i NAME=FILE.npy ...] [--opset N]")
    if not a.input:
        raise ValueError(f"{a.model} is a TorchScript file: give sample inputs (-i NAME=FILE.npy) so it can be "
                         "exported to ONNX")
    if not os.path.isfile(a.model):
        raise ValueError(f"{a.model}: no such file")
    if not is_torchscript_file(a.model):
        raise ValueError(f"{a.model} is not a TorchScript file (torch.jit.save's zip archive)")
    named: Dict[str, np.ndarray] = {}
    positional: List[np.ndarray] = []
    for spec in a.input:
        if "=" in spec:
            n, f = spec.split("=", 1)
            if not n or not f:
                raise ValueError(f"-i '{spec}': expected NAME=FILE.npy")
            if n in named:
                raise ValueError(f"-i {spec}: input '{n}' is given twice")
            named[n] = _load_array(f, n)
        else:
            if os.path.isdir(spec):
                raise ValueError(f"-i {spec}: a test_data_set folder is not supported for a TorchScript model; give "
                                 "NAME=FILE.npy")
            positional.append(_load_array(spec, spec))
    torch = _import_torch()
    model = _load_model(torch, a.model)
    if named and positional:
        params, _ = _forward_params(torch, model)
        names = [q.name for q in params]
        sample: Dict[str, np.ndarray] = {}
        for k, arr in enumerate(positional):
            if k >= len(names):
                raise ValueError(f"-i: {len(positional)} positional inputs but forward takes {len(names)}")
            sample[names[k]] = arr
        for n, arr in named.items():
            if n in sample:
                raise ValueError(f"-i {n}=...: input '{n}' is also given positionally")
            sample[n] = arr
        inputs: Any = sample
    else:
        inputs = dict(named) if named else tuple(positional)
    r = export(model, inputs, opset=a.opset, path=a.output)
    dyn = "; dynamic axes: " + (", ".join(f"{n}[{k}]={d}" for n, ax in r.dynamic_axes.items() for k, d in ax.items())
                                or "none")
    return (f"wrote {r.path}: {a.model} exported to ONNX (opset {r.opset}; inputs {', '.join(r.input_names)}; "
            f"outputs {', '.join(r.output_names)}{dyn})")


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    warnings.simplefilter("ignore")
    try:
        print(_convert(argv))
        return 0
    except ImportError as e:
        if str(e) != TORCH_MISSING:
            print(f"error: {_first_line(e)}", file=sys.stderr)
            return 1
        print(f"error: {TORCH_MISSING}", file=sys.stderr)
        return 3
    except _UsageError as e:
        print(f"error: {_first_line(e)} (usage: torch_io.py convert MODEL.pt -o OUT.onnx [-i NAME=FILE.npy ...] "
              "[--opset N])", file=sys.stderr)
        return 1
    except SystemExit as e:  # --help
        return int(e.code or 0) if isinstance(e.code, int) else 1
    except Exception as e:  # noqa: BLE001 - every error is one line
        print(f"error: {_first_line(e)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
