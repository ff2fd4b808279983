"""GraphAutoFusion and FusionRule: the original system's API (its names and keyword arguments),
with snake_case spellings beside them."""

import json
import os
import time
import warnings

import numpy as np

from . import _core
from ._fused import FusedModel
from ._inputs import load_model, normalize_samples, to_numpy
from ._reports import AnalysisReport, Estimate, PerformanceReport, PrecisionReport, SafeFusionReport

Error = _core.Error


class FusionRule:
    """A user fusion rule: a chain of operators (``op1``, ``op2`` and more for a longer chain; each
    may list alternatives "Relu|Clip"; op2 reads op1's output) fused into one operator named
    ``fuse_pattern``, kept when the predicted saving reaches ``benefit_threshold`` (0.2 = 20%).
    Overlapping rules of the same ``priority`` are a conflict (an Error naming both rules and the
    operators); a higher priority wins. ``pattern`` takes the chain as one string
    ("MatMul+Add+Relu") or a whole rule in the rule-file format (docs/rule_format.md)."""

    def __init__(self, op1=None, op2=None, *more_ops, fuse_pattern=None, benefit_threshold=0.0, priority=0, name=None,
                 pattern=None):
        if pattern is not None and (op1 is not None or op2 is not None or more_ops):
            raise TypeError("FusionRule: give either op1, op2, ... or pattern, not both")
        if isinstance(benefit_threshold, bool) or not isinstance(benefit_threshold, (int, float)) \
                or not 0 <= benefit_threshold < 1:
            raise ValueError(f"FusionRule: benefit_threshold {benefit_threshold!r} must be a number in [0, 1) "
                             f"(0.2 = the fused group must be predicted 20% faster)")
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise TypeError(f"FusionRule: priority must be an integer, got {priority!r}")
        if not -2**31 <= priority < 2**31:
            raise ValueError(f"FusionRule: priority {priority} is out of range (a 32-bit integer)")
        for what, v in (("fuse_pattern", fuse_pattern), ("name", name)):
            if v is not None and not isinstance(v, str):
                raise TypeError(f"FusionRule: {what} must be a string, got {type(v).__name__}")
        if pattern is not None and not isinstance(pattern, str):
            raise TypeError(f"FusionRule: pattern must be a string, got {type(pattern).__name__}")
        if pattern is not None and "\n" in str(pattern).strip():
            rules = _core.parse_rules(str(pattern), name or "FusionRule(pattern=...)")
            if len(rules) != 1:
                raise ValueError(f"FusionRule: the pattern text holds {len(rules)} rules; give one")
            self._rule = rules[0]
        else:
            ops = [op1, op2, *more_ops] if pattern is None else str(pattern).split("+")
            ops = [o for o in ops if o is not None]
            if len(ops) < 2:
                raise ValueError("FusionRule: a rule needs at least two operators (op1 and op2)")
            for o in ops:
                if not isinstance(o, str) or not o.strip():
                    raise TypeError(f"FusionRule: operator names must be non-empty strings, got {o!r}")
                if any(ord(c) < 32 for c in o):  # the library's sentence would end at a NUL
                    raise ValueError(f"FusionRule: operator name {o!r} holds a control character")
            chain = "+".join(o.strip() for o in ops)
            self._rule = _core.chain_rule(chain, name or chain, fuse_pattern or "", float(benefit_threshold),
                                          int(priority))
        self.op_types = [o for o in (op1, op2, *more_ops) if o is not None]
        unknown = _core.unknown_ops(self._rule)
        if unknown:
            # Allowed (a model may hold operators of other domains), but usually a typo.
            warnings.warn(f"FusionRule {self.name!r}: {', '.join(repr(o) for o in unknown)} is not an ONNX operator "
                          f"graph-autofusion knows; the rule matches only nodes of exactly that op type",
                          stacklevel=2)

    name = property(lambda self: self._rule.name)
    fuse_pattern = property(lambda self: self._rule.fuse_pattern)
    benefit_threshold = property(lambda self: self._rule.benefit_threshold)
    priority = property(lambda self: self._rule.priority)

    def __repr__(self):
        return (f"FusionRule({self.name!r}, fuse_pattern={self.fuse_pattern!r}, "
                f"benefit_threshold={self.benefit_threshold}, priority={self.priority})")


_PRESETS = ("transformer", "cnn", "rnn", "all", "none")


class GraphAutoFusion:
    """Automatic, safe fusion of a model's operators.

    ``model``: an ONNX file path, an ``onnx.ModelProto``, bytes, a ``torch.nn.Module`` or a
    TorchScript module / ``.pt`` file (with ``example_inputs``; exported with torch.onnx.export,
    the dims that differ between several samples dynamic), or a FusedModel.
    ``preset``: "transformer", "cnn", "rnn", "all" or "none"; ``fuse_rules``: only these rules
    (names like "LayerNorm+Add", "RMSNormFusion"); ``safe_mode``: Fuse() runs FuseSafe();
    ``benefit_threshold``: overrides every rule's; ``profile``: "host-cpu", "ascend910", "h200"
    or a JSON file. ``inputs``: the workload fusion is decided and checked on (a dict of input
    name -> array, a list of them, or a tuple in input order); default: the torch example
    inputs, a short generation for decoders, else random inputs with consistently bound dims.
    ``input_names`` / ``output_names``: the names a torch model's inputs and outputs get in the
    export (default: forward's parameter names; output_0, ...)."""

    def __init__(self, model, preset="transformer", fuse_rules=None, safe_mode=False, benefit_threshold=None,
                 profile="host-cpu", *, example_inputs=None, inputs=None, dims=None, rules_file=None, auto_fuse=True,
                 dynamic_axes=None, opset=17, threads=0, kernel_cache="", input_names=None, output_names=None):
        if preset is None:
            preset = "none"
        if preset not in _PRESETS:
            raise ValueError(f"preset {preset!r}: expected one of {', '.join(_PRESETS)}")
        if fuse_rules is not None and (isinstance(fuse_rules, str) or not all(isinstance(r, str) for r in fuse_rules)):
            raise TypeError("fuse_rules: expected a list of rule names, e.g. ['LayerNorm+Add', 'MatMul+Relu']")
        if benefit_threshold is not None and (not isinstance(benefit_threshold, (int, float))
                                              or not 0 <= benefit_threshold < 1):
            raise ValueError(f"benefit_threshold {benefit_threshold!r}: expected a number in [0, 1)")
        self._source = load_model(model, example_inputs=example_inputs, dynamic_axes=dynamic_axes, opset=opset,
                                  input_names=input_names, output_names=output_names)
        self._given = model  # VerifyPrecision(fused, model) with the same object or path reuses the export
        self.model = self._source.model
        info = json.loads(self.model.info())
        self._input_names = [i["name"] for i in info["inputs"]]
        self.is_decoder = info["decoder"]
        samples = normalize_samples(inputs, self._input_names)
        if samples:
            self._samples, source = samples, "inputs given to GraphAutoFusion"
        elif self.is_decoder:
            # What generate runs: a prefill and decode steps with a growing past.
            self._samples = _core.decoder_workload(self.model)
            source = "a short generation (prefill of 8 tokens, 3 decode steps)"
        elif self._source.samples:
            self._samples, source = self._source.samples, "the example inputs"
        else:
            self._samples, source = [], ""
        self.workload = source or "random inputs (symbolic dims bound consistently with the graph)"
        self.safe_mode = bool(safe_mode)
        self.threads = threads
        self.kernel_cache = kernel_cache
        self._fuser = _core.Fuser(self.model, preset, list(fuse_rules or []), rules_file or "",
                                  -1.0 if benefit_threshold is None else float(benefit_threshold), profile,
                                  self.safe_mode, bool(auto_fuse), dict(dims or {}), self._samples, source)
        self._safe_report = None
        self._fused = None

    # ---- the original's names ----
    def AddFusionRule(self, rule):
        """Adds a FusionRule (an overlap with a rule of the same priority is reported as a conflict
        when the rules are matched: AnalyzeFusionBenefit, Fuse, ...)."""
        if not isinstance(rule, FusionRule):
            raise TypeError(f"AddFusionRule: expected a FusionRule, got {type(rule).__name__}")
        self._fuser.add_rule(rule._rule)
        self._fused = None

    def AnalyzeFusionBenefit(self):
        """Per-candidate report: operators, memory traffic and round trips before -> after,
        GFLOPS before -> after, local-memory footprint against the profile's budget, verdict and
        reason. Nothing is changed."""
        return AnalysisReport(json.loads(self._fuser.analyze()))

    def EstimateFusionBenefit(self):
        """Whole-model prediction without fusing: ``performance_improvement``,
        ``hbm_access_reduction``, ``predicted_speedup``, ..."""
        return Estimate(json.loads(self._fuser.estimate()))

    def Fuse(self):
        """The fused model: FuseSafe() when safe_mode is set, else every group the planner accepts
        (no gates)."""
        if self.safe_mode:
            return self.FuseSafe()
        m = self._fuser.fuse()
        self._fused = self._wrap(m, {"fuse": json.loads(self._fuser.fuse_summary())})
        return self._fused

    def FuseSafe(self, min_cosine=0.999, max_abs_error=1e-3, check_speed=True, repeats=15, min_gain=0.05,
                 remeasure=False, half_weights=False):
        """Fuses, then checks every fused group's generated kernel on the workload (precision:
        cosine >= min_cosine and max abs error <= max_abs_error; speed: faster in an interleaved
        sign test and by min_gain), rolls back the groups that fail with the reason, and times the
        whole fused model against the model as given (rolling back more, or keeping the
        original, when it is not faster). GetSafeFusionReport() says what happened."""
        if not 0 < min_cosine <= 1:
            raise ValueError(f"min_cosine {min_cosine!r}: expected a number in (0, 1]")
        if max_abs_error < 0:
            raise ValueError(f"max_abs_error {max_abs_error!r}: expected a number >= 0")
        if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
            raise ValueError(f"repeats {repeats!r}: expected an integer >= 1")
        if check_speed and repeats < 7:
            raise ValueError(f"repeats {repeats}: the speed gate's sign test at 1% needs at least 7 pairs "
                             f"(or check_speed=False)")
        m = self._fuser.fuse_safe(float(min_cosine), float(max_abs_error), bool(check_speed), int(repeats),
                                  float(min_gain), not remeasure, int(self.threads), self.kernel_cache,
                                  bool(half_weights))
        self._safe_report = SafeFusionReport(json.loads(self._fuser.safe_report_json()),
                                             self._fuser.safe_report_text())
        self._fused = self._wrap(m, {"safe_fusion": self._safe_report},  # with its text
                                 half=self._safe_report.half_weights_kept)
        return self._fused

    def GetSafeFusionReport(self):
        """What FuseSafe() did: candidates, fused, skipped by reason, per-group verdicts with the
        measured figures, the end-to-end verdict and measured improvement."""
        if self._safe_report is None:
            raise Error("GetSafeFusionReport: FuseSafe() has not run (or safe_mode is off and Fuse() ran without gates)")
        return self._safe_report

    def CompileFusedOperators(self, directory):
        """Generates the fused operators' kernels into ``directory`` (one source per kernel stage,
        build.ninja, the shared library), all in one batch build; returns the summary text."""
        return self._fuser.compile(str(directory))

    def VerifyPrecision(self, fused_model=None, model=None, inputs=None, min_cosine=0.999, max_abs_error=1e-3):
        """Runs ``fused_model`` (default: the last fused) with its kernels and the reference
        ``model`` (default: the model given to GraphAutoFusion) on the workload (or ``inputs``)
        and compares every output: ``cosine_similarity`` (lowest), ``max_abs_error`` (largest),
        per output. A torch module as ``model`` is run by PyTorch itself."""
        fused = self._fused_arg(fused_model)
        samples = normalize_samples(inputs, fused.input_names) if inputs is not None else self._samples
        if model is None or model is self._source.torch_module or model is self.model or model is self._given \
                or _same_path(model, self._given):
            ref = self._source
        else:
            # Another torch model is exported on every sample (positionally, under the fused model's
            # input and output names), so the dims that differ between samples are dynamic.
            names = [n for n in fused.input_names if samples and n in samples[0]]
            examples = [tuple(s[n] for n in names) for s in samples] or None
            ref = load_model(model, example_inputs=examples, input_names=names or None,
                             output_names=fused.output_names)
        torch_ref = ref.torch_module
        rep = json.loads(_core.verify_precision(fused.model, ref.model, samples, {}, int(self.threads), 0,
                                                fused.half_weights, self.kernel_cache))
        rep["reference"] = ref.description
        rep["workload"] = self.workload if inputs is None else "inputs given to VerifyPrecision"
        if torch_ref is not None:
            _compare_with_torch(rep, fused, torch_ref, samples or _core_samples(fused))
        rep["min_cosine"], rep["max_abs_error_limit"] = min_cosine, max_abs_error
        rep["passed"] = rep["cosine_similarity"] >= min_cosine and 0 <= rep["max_abs_error"] <= max_abs_error
        return PrecisionReport(rep)

    def VerifyPerformance(self, fused_model=None, repeats=10, max_length=None, prompt_len=8):
        """Throughput of the model as given (graph-autofusion's runtime, unfused operators) and of
        ``fused_model`` with its generated kernels, in interleaved repeats: decoders by greedy
        generation (decode tokens/s, ``max_length`` total tokens, default prompt + 30), other
        models by passes over the workload (inferences/s). ``improvement`` = fused / baseline - 1."""
        fused = self._fused_arg(fused_model)
        if not isinstance(repeats, int) or repeats < 1:
            raise ValueError(f"repeats {repeats!r}: expected an integer >= 1")
        if fused.is_decoder:
            rep = _generation_performance(FusedModel(self.model, use_kernels=False, threads=self.threads), fused,
                                          repeats, prompt_len, max_length)
            return _note_same_model(rep, fused)
        rep = json.loads(_core.verify_performance(fused.model, self.model, self._samples, {}, int(self.threads),
                                                  int(repeats), 0, fused.half_weights, self.kernel_cache))
        runs = max(1, len(self._samples))
        rep["unit"] = "inferences/s"
        rep["baseline"] = "the model as given, graph-autofusion's runtime"
        rep["baseline_throughput"] = runs / (rep["baseline_ms"] / 1e3) if rep["baseline_ms"] > 0 else 0.0
        rep["fused_throughput"] = runs / (rep["fused_ms"] / 1e3) if rep["fused_ms"] > 0 else 0.0
        rep["improvement"] = rep["speedup"] - 1 if rep["speedup"] > 0 else 0.0
        return _note_same_model(PerformanceReport(rep), fused)

    def Save(self, path):
        """Writes the fused model (fusing first if needed) as one ONNX file."""
        fused = self._fused or self.Fuse()
        fused.model.save(str(path), False)

    # ---- snake_case ----
    add_fusion_rule = AddFusionRule
    analyze_fusion_benefit = AnalyzeFusionBenefit
    estimate_fusion_benefit = EstimateFusionBenefit
    fuse = Fuse
    fuse_safe = FuseSafe
    get_safe_fusion_report = GetSafeFusionReport
    compile_fused_operators = CompileFusedOperators
    verify_precision = VerifyPrecision
    verify_performance = VerifyPerformance
    save = Save

    # ---- more ----
    def rules(self):
        """The rules in use: [{name, fuse_pattern, priority, benefit_threshold, preset, source}]."""
        return [{"name": r.name, "fuse_pattern": r.fuse_pattern, "priority": r.priority,
                 "benefit_threshold": r.benefit_threshold, "preset": r.preset, "source": r.source}
                for r in self._fuser.rules()]

    def decision_log(self):
        """Every decision (rule, nodes, verdict, reason) as a list of dicts (autofusion explain)."""
        return json.loads(self._fuser.decision_log())

    @property
    def samples(self):
        """The workload: a list of {input name: numpy array}."""
        return list(self._samples)

    def _wrap(self, m, reports, half=False):
        return FusedModel(m, description=f"fused {self._source.description}", reports=reports, samples=self._samples,
                          torch_module=self._source.torch_module, threads=self.threads,
                          kernel_cache=self.kernel_cache, half_weights=half)

    def _fused_arg(self, fused_model):
        if fused_model is None:
            if self._fused is None:
                raise Error("no fused model: call Fuse() or FuseSafe() first, or pass the fused model")
            return self._fused
        if isinstance(fused_model, FusedModel):
            return fused_model
        return FusedModel(load_model(fused_model).model, threads=self.threads, kernel_cache=self.kernel_cache)


def _same_path(a, b):
    if not isinstance(a, (str, os.PathLike)) or not isinstance(b, (str, os.PathLike)):
        return False
    return os.path.realpath(os.fspath(a)) == os.path.realpath(os.fspath(b))


def _core_samples(fused):
    return [_core.complete_feeds(fused.model, {})]


def _cosine(a, b):
    a = a.astype(np.float64).ravel()
    b = b.astype(np.float64).ravel()
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 and nb == 0:
        return 1.0
    if na == 0 or nb == 0 or not np.isfinite(b).all():
        return -1.0 if not np.isfinite(b).all() else 0.0
    return float(np.dot(a, b) / (na * nb))


def _compare_with_torch(rep, fused, module, samples):
    """The fused model's outputs against PyTorch's own on the same inputs (what torch.onnx.export
    was given: the module's forward with these tensors)."""
    import torch  # noqa: PLC0415 - a torch module is the reference

    outs = {}  # output name -> the worst figures over the samples
    worst_cos, worst_err = 1.0, 0.0
    for s in samples:
        args = [torch.from_numpy(np.ascontiguousarray(s[n])) for n in fused.input_names if n in s]
        with torch.no_grad():
            ref = module(*args)
        if isinstance(ref, dict):
            ref = list(ref.values())
        elif isinstance(ref, torch.Tensor):
            ref = [ref]
        ref = [r for r in _flatten(ref)]
        got = list(fused.run(s).values())
        if len(ref) != len(got):
            raise Error(f"VerifyPrecision: PyTorch's module returned {len(ref)} tensors, the fused model has "
                        f"{len(got)} outputs")
        for name, r, g in zip(fused.output_names, ref, got):
            r = r.detach().numpy()
            same = tuple(r.shape) == tuple(g.shape)
            cos = _cosine(r, g) if same else -1.0
            err = float(np.max(np.abs(r.astype(np.float64) - g.astype(np.float64)))) if same and r.size else 0.0
            o = outs.setdefault(name, {"name": name, "cosine": 1.0, "max_abs_error": 0.0, "same_shape": True,
                                       "max_abs_reference": 0.0})
            o["cosine"], o["max_abs_error"] = min(o["cosine"], cos), max(o["max_abs_error"], err)
            o["same_shape"] = o["same_shape"] and same
            o["max_abs_reference"] = max(o["max_abs_reference"], float(np.max(np.abs(r))) if r.size else 0.0)
            worst_cos, worst_err = min(worst_cos, cos), max(worst_err, err)
    rep["onnx_reference"] = {"description": rep.get("reference"), "cosine_similarity": rep["cosine_similarity"],
                             "max_abs_error": rep["max_abs_error"], "outputs": rep["outputs"]}
    rep["reference"] = f"PyTorch ({type(module).__name__}.forward)"
    rep["outputs"] = list(outs.values())
    rep["cosine_similarity"] = min(worst_cos, rep["cosine_similarity"])
    rep["max_abs_error"] = max(worst_err, rep["max_abs_error"])
    rep["samples"] = len(samples)


def _flatten(xs):
    for x in xs:
        if isinstance(x, (list, tuple)):
            yield from _flatten(x)
        else:
            yield x


def _note_same_model(rep, fused):
    """Says so when both sides ran the same graph (no fused operator, float32 weights: what
    FuseSafe returns when it kept the model as given): the difference is the measurement's noise."""
    if fused.fused_nodes == 0 and not fused.half_weights:
        rep["note"] = ("the fused model has no fused operators (safe fusion kept the model as given): both sides ran "
                       "the same graph, so the difference is the measurement's noise")
    return rep


def _generation_performance(baseline, fused, repeats, prompt_len, max_length):
    prompt = np.array([[1 + (i * 7) % 50 for i in range(prompt_len)]], dtype=np.int64)
    new = (max_length - prompt_len) if max_length else 30
    if new < 2:
        raise ValueError(f"VerifyPerformance: max_length {max_length} leaves fewer than 2 new tokens")
    for m in (baseline, fused):  # warm-up (and kernels compiled)
        m.generate(prompt, max_new_tokens=new)
    base, fast, won = [], [], 0
    same = True
    t0 = time.perf_counter()
    for _ in range(repeats):
        ob, rb = baseline.generate(prompt, max_new_tokens=new, return_timing=True)
        of, rf = fused.generate(prompt, max_new_tokens=new, return_timing=True)
        same = same and bool((ob == of).all())
        b, f = float(np.median(rb["step_seconds"])), float(np.median(rf["step_seconds"]))
        base.append(b)
        fast.append(f)
        won += f < b
    from math import comb  # noqa: PLC0415

    needed = next((k for k in range(repeats + 1)
                   if sum(comb(repeats, j) for j in range(k, repeats + 1)) / 2 ** repeats <= 0.01), repeats + 1)
    bt, ft = 1 / float(np.median(base)), 1 / float(np.median(fast))
    return PerformanceReport({
        "unit": "tokens/s", "baseline": "the model as given, graph-autofusion's runtime (unfused operators)",
        "baseline_throughput": bt, "fused_throughput": ft, "improvement": ft / bt - 1, "repeats": repeats,
        "pairs_won": won, "pairs_needed": needed, "new_tokens": new, "prompt_tokens": prompt_len,
        "same_tokens": same, "seconds": time.perf_counter() - t0})
