"""FusedModel: a (fused) model you can run, generate with, save, load and use inside PyTorch."""

import hashlib
import json
import os
import sys
import tempfile
import zipfile

import numpy as np

from . import _core
from ._inputs import normalize_samples, to_numpy
from ._reports import SafeFusionReport

_META = "graph_autofusion.json"
_FORMAT = 1


def _is_torch_tensor(x):
    return "torch" in sys.modules and isinstance(x, sys.modules["torch"].Tensor)


def _token_ids(ids, where, name):
    """Token ids [n] or [1, n] (numpy, torch or a list), n >= 1, as a list of ints; errors say
    where (generate, decode step) and what (the argument's name)."""
    a = to_numpy(ids, name)
    if a.ndim == 2:
        if a.shape[0] != 1:
            raise ValueError(f"{where}: batch size {a.shape[0]}; only batch 1 is supported")
        a = a[0]
    if a.ndim != 1 or a.size == 0:
        raise ValueError(f"{where}: {name} must be [n] or [1, n] with n >= 1, got shape {list(a.shape)}")
    return [int(v) for v in a]


class DecodeLoop:
    """A generation you drive one step at a time (FusedModel.decode_loop()), batch 1.

    ``step(ids)`` runs the tokens (the prompt first, then one token a step; numpy, torch or a list)
    after those of the steps before and returns the logits of the last one, a float32 numpy array
    [vocab]. The KV cache stays inside the runtime: each step's present caches are the next step's
    past, and where the attention is one node the new rows are appended in place, as in generate().
    ``past_length``: the tokens run so far; ``reset()`` starts a new sequence (so does a step whose
    run fails; an argument error leaves the loop as it was)."""

    def __init__(self, core):
        self._core = core  # _core.DecodeLoop

    def step(self, ids):
        return self._core.step(_token_ids(ids, "decode step", "ids"))

    @property
    def past_length(self):
        return self._core.past_length

    def reset(self):
        self._core.reset()


class FusedModel:
    """A model with graph-autofusion's fused operators (model-local ONNX functions) and the runtime
    that runs them with generated kernels.

    ``model(x, ...)`` / ``model.run(...)`` run it on numpy arrays or torch tensors (the same kind
    comes out); ``generate(input_ids, max_length=50)`` decodes greedily with the KV cache for
    decoders in the common past/present layout; ``save_pretrained(dir)`` and
    ``FusedModel.load(dir)`` keep it; ``to_torch()`` gives an ``nn.Module`` running it."""

    def __init__(self, model, description="model", reports=None, samples=None, torch_module=None, threads=0,
                 kernel_cache="", half_weights=False, use_kernels=True):
        self.model = model  # _core.Model
        self.description = description
        self.reports = dict(reports or {})  # name -> report (dicts), e.g. "safe_fusion"
        self.samples = list(samples or [])  # the workload the kernels are compiled for
        self.torch_module = torch_module
        self.threads = threads
        self.kernel_cache = kernel_cache
        self.half_weights = half_weights
        self.use_kernels = use_kernels
        self._info = json.loads(model.info())
        self._runtime = None

    # ---- what it is ----
    @property
    def input_names(self):
        return [i["name"] for i in self._info["inputs"]]

    @property
    def output_names(self):
        return [o["name"] for o in self._info["outputs"]]

    @property
    def inputs(self):
        """[{name, dtype, shape}] (symbolic dims as names)."""
        return self._info["inputs"]

    @property
    def outputs(self):
        return self._info["outputs"]

    @property
    def is_decoder(self):
        return self._info["decoder"]

    @property
    def fused_nodes(self):
        return self._info["fused_nodes"]

    def __repr__(self):
        return (f"<FusedModel {self.description}: {self._info['nodes']} nodes, {self.fused_nodes} fused, "
                f"inputs {', '.join(self.input_names)}>")

    # ---- running ----
    def runtime(self):
        """The session (compiled kernels) the model runs in, made on first use."""
        if self._runtime is None:
            self._runtime = _core.Runtime(self.model, use_kernels=self.use_kernels, samples=self.samples,
                                          threads=self.threads, half_weights=self.half_weights,
                                          kernel_cache=self.kernel_cache)
        return self._runtime

    def _feeds(self, args, kwargs):
        if len(args) == 1 and isinstance(args[0], dict) and not kwargs:
            given = dict(args[0])
        else:
            names = self.input_names
            if len(args) > len(names):
                raise ValueError(f"{len(args)} inputs given; the model has {len(names)} ({', '.join(names)})")
            given = dict(zip(names, args))
            for k, v in kwargs.items():
                if k in given:
                    raise ValueError(f"input '{k}' given twice")
                given[k] = v
        torch_out = any(_is_torch_tensor(v) for v in given.values())
        return normalize_samples(given, self.input_names)[0] if given else {}, torch_out

    def run(self, *args, outputs=None, **kwargs):
        """Runs the model once: inputs positional (in input order), as keywords, or one dict.
        Returns {output name: array}; torch tensors in give torch tensors out (sharing the
        runtime's buffers, no copy)."""
        feeds, torch_out = self._feeds(args, kwargs)
        names = list(outputs) if outputs else self.output_names
        values = self.runtime().run(feeds, names)
        if torch_out:
            import torch  # noqa: PLC0415 - torch tensors came in, so torch is there
            values = [torch.from_numpy(v) if v.dtype != object else v for v in values]
        return dict(zip(names, values))

    def __call__(self, *args, **kwargs):
        """As run(), but like a module: one output alone, several as a tuple in output order."""
        out = list(self.run(*args, **kwargs).values())
        return out[0] if len(out) == 1 else tuple(out)

    def generate(self, input_ids, max_length=None, max_new_tokens=None, eos_token_id=None, return_timing=False):
        """Greedy generation with the KV cache (batch 1). ``input_ids``: [1, n] or [n] (numpy, torch
        or a list). ``max_length``: total length, prompt included (as in Hugging Face); or
        ``max_new_tokens``. Returns the prompt followed by the new tokens, [1, n + new], as the
        kind that came in (torch in, torch out); with ``return_timing`` also the timings
        (prefill_seconds, step_seconds, decode_tokens_per_second)."""
        if not self.is_decoder:
            raise ValueError(f"{self.description}: generate needs a decoder with input_ids, past_key_values.* inputs "
                             f"and logits, present.* outputs (the common past/present layout)")
        prompt = _token_ids(input_ids, "generate", "input_ids")
        if max_new_tokens is None:
            max_new_tokens = (max_length if max_length is not None else 50) - len(prompt)
        if max_new_tokens < 1:
            raise ValueError(f"generate: max_length {max_length} leaves no new token after a prompt of {len(prompt)}")
        r = self.runtime().generate(prompt, int(max_new_tokens), -1 if eos_token_id is None else int(eos_token_id))
        out = np.array([prompt + list(r["tokens"])], dtype=np.int64)
        if _is_torch_tensor(input_ids):
            import torch  # noqa: PLC0415
            out = torch.from_numpy(out)
        return (out, r) if return_timing else out

    def decode_loop(self):
        """A generation you drive one step at a time, for your own sampling or stopping rule
        (batch 1): see DecodeLoop. generate() is such a loop stepped with the argmax."""
        if not self.is_decoder:
            raise ValueError(f"{self.description}: decode_loop needs a decoder with input_ids, past_key_values.* "
                             f"inputs and logits, present.* outputs (the common past/present layout)")
        return DecodeLoop(self.runtime().decode_loop())

    def kernels(self):
        """How the fused operators ran so far: text, and per function the kernel calls and the
        calls that ran the body (fallbacks)."""
        return json.loads(self.runtime().kernels())

    # ---- keeping it ----
    def save_pretrained(self, directory):
        """Writes ``directory/model.onnx`` (weights in an external data file beside it), the
        reports (``*.json``, ``safe_fusion_report.txt``), the sample inputs the kernels were made
        for (``samples.npz``) and ``graph_autofusion.json`` (format, inputs/outputs, the kernel
        cache key: target and cache folder). Returns the directory."""
        os.makedirs(directory, exist_ok=True)
        data = self.model.save(os.path.join(directory, "model.onnx"), True)
        for name, rep in self.reports.items():
            _write_atomic(os.path.join(directory, f"{name}_report.json"), json.dumps(rep, indent=2))
            if name == "safe_fusion":  # the text form, not the dict's repr
                text = str(rep if isinstance(rep, SafeFusionReport) else SafeFusionReport(rep))
                _write_atomic(os.path.join(directory, "safe_fusion_report.txt"), text + "\n")
        if self.samples:
            arrays = {f"{i}/{k}": v for i, s in enumerate(self.samples) for k, v in s.items()}
            tmp = os.path.join(directory, ".samples.tmp.npz")
            np.savez(tmp, **arrays)
            os.replace(tmp, os.path.join(directory, "samples.npz"))
        meta = {"format": _FORMAT, "description": self.description, "model": "model.onnx",
                "external_data": os.path.basename(data) if data else "",
                "inputs": self.inputs, "outputs": self.outputs, "decoder": self.is_decoder,
                "fused_nodes": self.fused_nodes, "half_weights": self.half_weights,
                "kernel_cache": {"target": _core.kernel_target(), "folder": self.kernel_cache or "default"},
                "reports": sorted(self.reports)}
        _write_atomic(os.path.join(directory, _META), json.dumps(meta, indent=2))
        return directory

    @classmethod
    def load(cls, directory, threads=0, kernel_cache=""):
        """A FusedModel saved by save_pretrained."""
        meta_path = os.path.join(directory, _META)
        if not os.path.isfile(meta_path):
            raise FileNotFoundError(f"{directory}: no {_META} (not a directory written by save_pretrained)")
        with open(meta_path, encoding="utf-8") as f:
            try:
                meta = json.load(f)
            except ValueError as e:
                raise _core.Error(f"{meta_path}: not valid JSON ({e})") from None
        if not isinstance(meta, dict) or meta.get("format") != _FORMAT:
            raise _core.Error(f"{meta_path}: unknown format {meta.get('format') if isinstance(meta, dict) else '?'}")
        # A crafted file gets a one-line Error naming the field, not a TypeError from deep inside.
        for key, types, what in (("reports", list, "a list of report names"), ("half_weights", bool, "true or false"),
                                 ("description", str, "a string")):
            if key in meta and not isinstance(meta[key], types):
                raise _core.Error(f"{meta_path}: '{key}' must be {what}, not {type(meta[key]).__name__}")
        if not all(isinstance(n, str) for n in meta.get("reports", [])):
            raise _core.Error(f"{meta_path}: 'reports' must be a list of report names (strings)")
        model = _core.Model.load(os.path.join(directory, "model.onnx"))
        samples = []
        sp = os.path.join(directory, "samples.npz")
        if os.path.isfile(sp):
            try:
                with np.load(sp, allow_pickle=False) as z:
                    by = {}
                    for key in z.files:
                        i, _, name = key.partition("/")
                        if not i.isdigit() or not name:
                            raise ValueError(f"entry '{key}' is not '<sample>/<input name>'")
                        a = z[key]
                        if a.dtype.hasobject:
                            raise ValueError(f"entry '{key}' holds Python objects")
                        by.setdefault(int(i), {})[name] = a
                    samples = [by[i] for i in sorted(by)]
            except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
                raise _core.Error(f"{sp}: not the sample inputs save_pretrained writes ({e})") from None
        reports = {}
        for name in meta.get("reports", []):
            p = os.path.join(directory, f"{os.path.basename(name)}_report.json")
            if os.path.isfile(p):
                try:
                    with open(p, encoding="utf-8") as f:
                        rep = json.load(f)
                    if not isinstance(rep, dict):
                        raise ValueError(f"a {type(rep).__name__}, not an object")
                    if name == "safe_fusion":
                        rep = SafeFusionReport(rep)
                        str(rep)  # its fields have the types the text needs
                except (ValueError, TypeError, KeyError, AttributeError, UnicodeDecodeError) as e:
                    raise _core.Error(f"{p}: not a report written by save_pretrained ({e})") from None
                reports[name] = rep
        return cls(model, description=meta.get("description", str(directory)), reports=reports, samples=samples,
                   threads=threads, kernel_cache=kernel_cache, half_weights=meta.get("half_weights", False))

    def to_torch(self):
        """An ``nn.Module`` whose forward runs this model (through the ``graph_autofusion::run``
        PyTorch operator): usable inside a larger PyTorch program, scriptable with torch.jit.script
        and savable as TorchScript (loading it needs ``import graph_autofusion``). Inference only
        (no gradients). The model is saved under the module's key folder first when it was not."""
        from ._torch_op import fused_module  # noqa: PLC0415 - needs torch
        return fused_module(self)

    def _key_dir(self):
        """A folder holding this model as saved by save_pretrained, named by its content."""
        digest = hashlib.sha256(self.model.to_bytes()).hexdigest()[:20]
        root = os.environ.get("GAF_MODEL_CACHE") or os.path.join(
            os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
            "graph-autofusion", "models")
        d = os.path.join(root, digest)
        if not os.path.isfile(os.path.join(d, _META)):
            self.save_pretrained(d)
        return d


def _write_atomic(path, text):
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".tmp-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def load(directory, **kwargs):
    """FusedModel.load(directory)."""
    return FusedModel.load(directory, **kwargs)
