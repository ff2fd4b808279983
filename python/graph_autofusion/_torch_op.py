"""FusedModel.to_torch(): the fused model as a PyTorch operator, ``graph_autofusion::run(str
model_dir, Tensor[] inputs) -> Tensor[]``, and an nn.Module calling it. The operator is registered
with PyTorch's dispatcher (torch.library) when this module is imported, so TorchScript can call it:
a scripted module saved with torch.jit.save runs again after ``import graph_autofusion``.
``model_dir`` is a folder written by save_pretrained; its FusedModel is loaded once per process."""

import threading

import torch

from . import _fused

_lib = torch.library.Library("graph_autofusion", "DEF")
_lib.define("run(str model_dir, Tensor[] inputs) -> Tensor[]")
_loaded = {}
_lock = threading.Lock()


def _model_for(model_dir):
    with _lock:
        m = _loaded.get(model_dir)
        if m is None:
            m = _loaded[model_dir] = _fused.FusedModel.load(model_dir)
        return m


def _run(model_dir, inputs):
    m = _model_for(model_dir)
    names = m.input_names
    if len(inputs) != len(names):
        raise ValueError(f"graph_autofusion::run: {len(inputs)} inputs for a model with {len(names)} "
                         f"({', '.join(names)})")
    out = m.run({n: t.detach().contiguous() for n, t in zip(names, inputs)})
    return [v if isinstance(v, torch.Tensor) else torch.from_numpy(v) for v in out.values()]


_lib.impl("run", _run, "CPU")


def _module_class(n_in, n_out):
    """An nn.Module class with forward(input_0, ..., input_{n-1}) returning one tensor or a tuple:
    TorchScript needs the arity in the signature. The source is made from the counts only."""
    args = ", ".join(f"input_{i}: torch.Tensor" for i in range(n_in))
    call = ", ".join(f"input_{i}" for i in range(n_in))
    if n_out == 1:
        ret, body = "torch.Tensor", "return out[0]"
    else:
        ret = "Tuple[" + ", ".join(["torch.Tensor"] * n_out) + "]"
        body = "return (" + ", ".join(f"out[{i}]" for i in range(n_out)) + ",)"
    src = (f"def forward(self, {args}) -> {ret}:\n"
           f"    out = torch.ops.graph_autofusion.run(self.model_dir, [{call}])\n"
           f"    {body}\n")
    ns = {"torch": torch, "Tuple": __import__("typing").Tuple}
    # Compiled from a file-less source: TorchScript reads a function's source with inspect, so it is
    # kept in linecache under a unique name.
    import linecache  # noqa: PLC0415

    fname = f"<graph_autofusion forward {n_in}->{n_out}>"
    linecache.cache[fname] = (len(src), None, src.splitlines(True), fname)
    exec(compile(src, fname, "exec"), ns)  # noqa: S102 - built from two integers, no model text
    cls = type(f"FusedModule_{n_in}_{n_out}", (FusedModule,), {"forward": ns["forward"]})
    return cls


class FusedModule(torch.nn.Module):
    """A fused model inside PyTorch (inference only)."""

    model_dir: str

    def __init__(self, model_dir, input_names, output_names):
        super().__init__()
        self.model_dir = model_dir
        self.input_names = list(input_names)
        self.output_names = list(output_names)

    def extra_repr(self):
        return f"model_dir={self.model_dir!r}, inputs={self.input_names}, outputs={self.output_names}"


def fused_module(fused):
    d = fused._key_dir()
    with _lock:
        _loaded.setdefault(d, fused)
    cls = _module_class(len(fused.input_names), len(fused.output_names))
    return cls(d, fused.input_names, fused.output_names)
