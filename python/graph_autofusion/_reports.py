"""Report objects: dicts (the fields of docs/report_format.md) that print as readable text in the
original system's shape. ``dict(report)``, ``report.to_dict()`` and ``report.to_json()`` give the
data; ``str(report)`` / ``print(report)`` the text."""

import json


def _pct(x):
    return f"{x * 100:+.1f}%"


class Report(dict):
    """A dict with a text form."""

    title = "Report"

    def to_dict(self):
        return json.loads(json.dumps(self))

    def to_json(self, indent=2):
        return json.dumps(self, indent=indent)

    def text(self):
        return json.dumps(self, indent=2)

    def __str__(self):
        return self.text()

    def __repr__(self):
        return f"<{type(self).__name__}: {self.text().splitlines()[0] if self.text() else ''}>"


class AnalysisReport(Report):
    """AnalyzeFusionBenefit(): one entry per candidate group in ``report['candidates']`` (rule,
    operators, nodes, verdict, reason, estimate) and the whole-model ``report['summary']``.
    Iterating over the report gives the candidates."""

    def __iter__(self):
        return iter(self.get("candidates", []))

    def __len__(self):
        return len(self.get("candidates", []))

    def __getitem__(self, key):
        if isinstance(key, int):
            return self["candidates"][key]
        return dict.__getitem__(self, key)

    def keys(self):
        return dict.keys(self)

    def text(self):
        prof = self.get("profile", {})
        local_kb = prof.get("local_memory_bytes", 0) / 1024
        lines = [f"[INFO] Fusion benefit analysis: (predicted by the cost model for profile {prof.get('name', '?')}, "
                 f"local memory {local_kb:.0f} KB; FuseSafe measures)"]
        if not self.get("shapes_known", True):
            lines.append(f"[INFO]   note: no shapes, so no estimates (verdicts Maybe): {self.get('shapes_error', '')}")
        for c in self.get("candidates", []):
            ops = " + ".join(c["operators"]) if len(c["operators"]) <= 6 else \
                " + ".join(c["operators"][:5]) + f" + ... ({len(c['operators'])} operators)"
            lines.append(f"[INFO]   Operator {'pair' if len(c['operators']) == 2 else 'group'}: {ops}"
                         f"  (rule {c['rule']}, first node {c['nodes'][0] if c['nodes'] else '-'})")
            e = c.get("estimate")
            if e:
                rb, ra = e["round_trips_before"], e["round_trips_after"]
                lines.append(f"[INFO]     HBM access: {rb} → {ra} (save {rb - ra} time{'s' if rb - ra != 1 else ''}); "
                             f"{e['bytes_before'] / 1e6:.4g} → {e['bytes_after'] / 1e6:.4g} MB")
                gb, ga = e["gflops_before"], e["gflops_after"]
                gain = f" ({_pct(ga / gb - 1)})" if gb > 0 else ""
                lines.append(f"[INFO]     GFLOPS: {gb:.3g} → {ga:.3g}{gain}; time {e['time_before_us']:.3g} → "
                             f"{e['time_after_us']:.3g} us")
                fp = e["footprint_bytes"] / 1024
                fit = f"fit in {local_kb:.0f} KB" if e["fits_local_memory"] else f"overflow! {fp:.0f} > {local_kb:.0f}"
                lines.append(f"[INFO]     Local Memory: {fp:.1f} KB ({fit})")
            lines.append(f"[INFO]     Verdict:  {c['verdict']} ({c['reason']})")
            lines.append("")
        s = self.get("summary")
        if s:
            lines.append("[INFO] " + Estimate(s).text().replace("\n", "\n[INFO] "))
        return "\n".join(lines).rstrip()


class Estimate(Report):
    """EstimateFusionBenefit(): ``performance_improvement`` (predicted time saved, 0.372 = 37.2%),
    ``hbm_access_reduction`` (predicted memory traffic saved), ``predicted_speedup``, times, bytes,
    candidates by verdict."""

    def __init__(self, data):
        super().__init__(data)
        if "memory_traffic_reduction" in self and "hbm_access_reduction" not in self:
            self["hbm_access_reduction"] = self["memory_traffic_reduction"]

    def text(self):
        lines = [f"Estimated fusion benefit (profile {self.get('profile', '?')}, cost model, nothing changed):"]
        if self.get("time_before_us", 0) > 0:
            lines.append(f"  performance improvement: {self['performance_improvement'] * 100:.1f}% "
                         f"({self['time_before_us']:.1f} → {self['time_after_us']:.1f} us, "
                         f"speedup {self['predicted_speedup']:.3f}x)")
            lines.append(f"  HBM access reduction:    {self['hbm_access_reduction'] * 100:.1f}% "
                         f"({self['bytes_before'] / 1e6:.3f} → {self['bytes_after'] / 1e6:.3f} MB)")
        lines.append(f"  candidates: {self.get('candidates', 0)}, to fuse: {self.get('fused', 0)}")
        for k, v in sorted(self.get("skipped_by_reason", {}).items()):
            lines.append(f"    {k}: {v}")
        if self.get("note"):
            lines.append(f"  note: {self['note']}")
        return "\n".join(lines)


class SafeFusionReport(Report):
    """GetSafeFusionReport(): ``candidates``, ``fused``, ``skipped_by_reason``, one entry per fused
    group tried in ``kernels`` (kept or rolled back, with the reason and the measured figures),
    the end-to-end gate in ``end_to_end`` (``measured_speedup``, ``verdict``, ``original_kept``);
    ``overall_improvement`` is the measured end-to-end gain."""

    def __init__(self, data, detail=""):
        super().__init__(data)
        self._detail = detail

    @property
    def end_to_end(self):
        return self.get("end_to_end", {})

    @property
    def half_weights_kept(self):
        """Whether FuseSafe(half_weights=True) kept float16 weight storage (its gates passed)."""
        return bool(self.get("half_weights", {}).get("kept", False))

    @property
    def overall_improvement(self):
        """Measured end to end: fused vs the model as given (0.372 = 37.2% faster)."""
        s = self.end_to_end.get("measured_speedup", 0)
        return s - 1 if s > 0 and not self.end_to_end.get("original_kept") else 0.0

    def text(self):
        total = self.get("candidates", 0)

        def share(n):
            return f"{n} ({100.0 * n / total:.1f}%)" if total else str(n)

        lines = ["[INFO] Safe fusion report:",
                 f"[INFO]   Total operator pairs: {total}",
                 f"[INFO]   Fused successfully: {share(self.get('fused', 0))}"]
        for k, v in sorted(self.get("skipped_by_reason", {}).items()):
            lines.append(f"[INFO]   Skipped ({k.replace('Skip: ', '')}): {share(v)}")
        e = self.end_to_end
        if e.get("original_kept"):
            lines.append(f"[INFO]   Overall: the model as given was kept ({e.get('verdict', '')})")
        elif e.get("measured_speedup", 0) > 0:
            lines.append(f"[INFO]   Overall performance improvement: {_pct(self.overall_improvement)} "
                         f"(measured end to end: {e.get('verdict', '')})")
        if self._detail:
            lines.append("")
            lines.append(self._detail.rstrip())
        return "\n".join(lines)


class PrecisionReport(Report):
    """VerifyPrecision(): ``cosine_similarity`` (lowest over outputs and samples), ``max_abs_error``,
    per-output figures in ``outputs``, kernel calls and fallbacks per fused operator, and
    ``passed`` against the gate (``min_cosine``, ``max_abs_error_limit``)."""

    def text(self):
        lines = [f"Precision of the fused model against {self.get('reference', 'the original')} "
                 f"({self.get('samples', 0)} run(s) of {self.get('workload', '?')}):",
                 f"  cosine similarity: {self['cosine_similarity']:.5f}",
                 f"  max abs error:     {self['max_abs_error']:.2e}"]
        for o in self.get("outputs", []):
            lines.append(f"    {o['name']:<32} cosine {o['cosine']:.7f}  max abs error {o['max_abs_error']:.3g}"
                         + ("" if o.get("same_shape", True) else "  (shapes differ)"))
        for n in self.get("never_ran", []):
            lines.append(f"  kernel never ran: {n}")
        for n in self.get("run_by_plan", []):
            lines.append(f"  run by the runtime's plan: {n}")
        if "passed" in self:
            lines.append(f"  {'PASS' if self['passed'] else 'FAIL'} (cosine >= {self['min_cosine']}, "
                         f"max abs error <= {self['max_abs_error_limit']})")
        return "\n".join(lines)


class PerformanceReport(Report):
    """VerifyPerformance(): ``baseline_throughput``, ``fused_throughput`` (in ``unit``: decode
    tokens/s for decoders, inferences/s otherwise), ``improvement`` (0.25 = 25% more throughput),
    medians of interleaved repeats and how many pairs the fused side won."""

    def text(self):
        u = self.get("unit", "")
        return "\n".join([
            f"Performance ({self.get('repeats', 0)} interleaved repeats, baseline: {self.get('baseline', '?')}):",
            f"  baseline throughput: {self['baseline_throughput']:.1f} {u}",
            f"  fused throughput:    {self['fused_throughput']:.1f} {u}",
            f"  improvement:         {_pct(self['improvement'])} (fused faster in {self.get('pairs_won', 0)} of "
            f"{self.get('repeats', 0)} pairs, {self.get('pairs_needed', 0)} needed for a sign test at 1%)"]
            + ([f"  note: {self['note']}"] if self.get("note") else []))
