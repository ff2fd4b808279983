"""GraphAutoFusion and FusionRule: the original system's names and keyword arguments, their
snake_case twins, reports (values and text), rule conflicts and priorities, thresholds, and the
exceptions bad arguments give.

Most tests run on small ONNX graphs (conftest.mlp_onnx) and need no torch; the walkthrough and
VerifyPrecision against PyTorch use the session's exported transformer block."""

import inspect
import json
import os

import numpy as np
import onnx
import pytest


def op_types(fused):
    """The node op types of a fused model's main graph."""
    return [n.op_type for n in onnx.load_from_string(fused.model.to_bytes()).graph.node]


def groups(fused):
    """The fused groups recorded in the model's metadata: [{rule, op_type, original_nodes, ...}]."""
    meta = json.loads(fused.model.info())["metadata"]
    return json.loads(meta["graph_autofusion"])["groups"] if "graph_autofusion" in meta else []


# ---------------------------------------------------------------- names and keywords
ORIGINAL_TO_SNAKE = {
    "AddFusionRule": "add_fusion_rule", "AnalyzeFusionBenefit": "analyze_fusion_benefit",
    "EstimateFusionBenefit": "estimate_fusion_benefit", "Fuse": "fuse", "FuseSafe": "fuse_safe",
    "GetSafeFusionReport": "get_safe_fusion_report", "CompileFusedOperators": "compile_fused_operators",
    "VerifyPrecision": "verify_precision", "VerifyPerformance": "verify_performance",
}


def test_original_names_and_snake_case_twins(gaf):
    for original, snake in ORIGINAL_TO_SNAKE.items():
        assert callable(getattr(gaf.GraphAutoFusion, original)), original
        assert getattr(gaf.GraphAutoFusion, snake) is getattr(gaf.GraphAutoFusion, original), snake
    params = inspect.signature(gaf.GraphAutoFusion).parameters
    assert list(params)[:6] == ["model", "preset", "fuse_rules", "safe_mode", "benefit_threshold", "profile"]
    rule_params = inspect.signature(gaf.FusionRule).parameters
    for kw in ("op1", "op2", "fuse_pattern", "benefit_threshold", "priority"):
        assert kw in rule_params, kw
    for name in ("GraphAutoFusion", "FusionRule", "FusedModel", "Error", "load", "example_llama"):
        assert hasattr(gaf, name), name
    assert issubclass(gaf.Error, ValueError) and issubclass(gaf.UnsupportedError, gaf.Error)


def test_fusion_rule_keywords_and_values(gaf):
    r = gaf.FusionRule(op1="LayerNorm", op2="Add", fuse_pattern="LayerNormAdd", benefit_threshold=0.2, priority=2)
    assert (r.name, r.fuse_pattern, r.benefit_threshold, r.priority) == ("LayerNorm+Add", "LayerNormAdd", 0.2, 2)
    assert r.op_types == ["LayerNorm", "Add"]
    assert repr(r) == "FusionRule('LayerNorm+Add', fuse_pattern='LayerNormAdd', benefit_threshold=0.2, priority=2)"
    longer = gaf.FusionRule("MatMul", "Add", "Relu", fuse_pattern="MMAR", name="mine")
    assert (longer.name, longer.op_types, longer.priority) == ("mine", ["MatMul", "Add", "Relu"], 0)
    assert gaf.FusionRule(pattern="MatMul+Add+Relu").name == "MatMul+Add+Relu"


def test_original_walkthrough_with_keywords(gaf, mlp_onnx, mlp_feeds, mlp_expected, tmp_path):
    """The issue's example, keyword for keyword, on an ONNX model."""
    fuser = gaf.GraphAutoFusion(mlp_onnx, preset="transformer", fuse_rules=None, safe_mode=True,
                                benefit_threshold=None, profile="host-cpu")
    benefit = fuser.EstimateFusionBenefit()
    assert 0 < benefit["performance_improvement"] < 1 and 0 < benefit["hbm_access_reduction"] < 1
    fuser.AddFusionRule(gaf.FusionRule(op1="LayerNorm", op2="Add", fuse_pattern="LayerNormAdd",
                                       benefit_threshold=0.2, priority=2))
    report = fuser.AnalyzeFusionBenefit()
    assert "[INFO] Fusion benefit analysis:" in str(report)
    fused = fuser.Fuse()  # safe_mode: FuseSafe()
    safe = fuser.GetSafeFusionReport()
    assert safe is fuser.get_safe_fusion_report() and "safe_fusion" in fused.reports
    assert str(safe).startswith("[INFO] Safe fusion report:\n[INFO]   Total operator pairs: ")
    out = fused(mlp_feeds)
    np.testing.assert_allclose(out, mlp_expected, rtol=1e-4, atol=1e-4)
    summary = fuser.CompileFusedOperators(str(tmp_path / "fused_ops"))
    assert f"kernel library: {tmp_path / 'fused_ops'}" in summary
    libs = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path / "fused_ops") for f in fs if f.endswith(".so")]
    assert libs and all(os.path.getsize(p) > 0 for p in libs)
    assert any(f == "build.ninja" for _, _, fs in os.walk(tmp_path / "fused_ops") for f in fs)
    p = fuser.VerifyPrecision(fused, mlp_onnx)
    assert p["cosine_similarity"] > 0.99999 and p["max_abs_error"] < 1e-4 and p["passed"] is True
    q = fuser.VerifyPerformance(fused, repeats=3)
    assert q["baseline_throughput"] > 0 and q["fused_throughput"] > 0
    assert q["improvement"] == pytest.approx(q["fused_throughput"] / q["baseline_throughput"] - 1, rel=1e-6)


def test_snake_case_walkthrough(gaf, mlp_onnx, mlp_feeds, mlp_expected):
    fuser = gaf.GraphAutoFusion(mlp_onnx, preset="transformer")
    fuser.add_fusion_rule(gaf.FusionRule("LayerNormalization", "Add", fuse_pattern="LNA", priority=50))
    est = fuser.estimate_fusion_benefit()
    assert est["fused"] == sum(c["verdict"] == "Fuse" for c in fuser.analyze_fusion_benefit())
    fused = fuser.fuse_safe(check_speed=False)
    assert fuser.get_safe_fusion_report()["fused"] == fused.fused_nodes
    assert "LNA" in op_types(fused)
    np.testing.assert_allclose(fused(mlp_feeds), mlp_expected, rtol=1e-4, atol=1e-4)
    assert fuser.verify_precision(fused)["passed"]
    assert fuser.verify_performance(fused, repeats=2)["unit"] == "inferences/s"


# ---------------------------------------------------------------- reports
def test_estimate_values_and_text(gaf, mlp_onnx):
    e = gaf.GraphAutoFusion(mlp_onnx, preset="transformer").EstimateFusionBenefit()
    assert e["performance_improvement"] == pytest.approx(1 - e["time_after_us"] / e["time_before_us"])
    assert e["hbm_access_reduction"] == pytest.approx(1 - e["bytes_after"] / e["bytes_before"])
    assert e["predicted_speedup"] == pytest.approx(e["time_before_us"] / e["time_after_us"])
    text = str(e)
    assert text.startswith("Estimated fusion benefit (profile host-cpu, cost model, nothing changed):")
    assert f"performance improvement: {e['performance_improvement'] * 100:.1f}%" in text
    assert f"HBM access reduction:    {e['hbm_access_reduction'] * 100:.1f}%" in text
    assert json.loads(e.to_json()) == e.to_dict() == json.loads(json.dumps(dict(e)))


def test_analysis_report_candidates_and_text(gaf, mlp_onnx):
    rep = gaf.GraphAutoFusion(mlp_onnx, preset="transformer").AnalyzeFusionBenefit()
    cands = list(rep)
    assert len(rep) == len(cands) == len(rep["candidates"]) == 5
    by_rule = {(c["rule"], tuple(c["nodes"])): c["verdict"] for c in cands}
    assert by_rule[("MatMulBiasActivationFusion", ("mm1", "bias1", "relu"))] == "Fuse"
    assert by_rule[("MatMulBiasFusion", ("mm1", "bias1"))] == "Skip: overlap"  # inside the longer one
    assert by_rule[("MatMulBiasFusion", ("mm2", "bias2"))] == "Fuse"
    assert rep[0] == cands[0]
    text = str(rep)
    assert text.count("Verdict:") == 5
    assert "[INFO]   Operator group: MatMul + Add + Relu  (rule MatMulBiasActivationFusion, first node mm1)" in text
    assert "[INFO]   Operator pair: LayerNormalization + Add" in text
    assert "HBM access: " in text and "Local Memory: " in text and "fit in 512 KB" in text
    overlap = next(c for c in cands if c["verdict"] == "Skip: overlap" and c["rule"] == "MatMulBiasFusion")
    assert "MatMulBiasActivationFusion" in overlap["reason"] and "priority" in overlap["reason"]


# ---------------------------------------------------------------- rules: conflicts and priorities
def _two_rules(gaf, model, p1, p2):
    fuser = gaf.GraphAutoFusion(model, preset="none", auto_fuse=False)
    fuser.AddFusionRule(gaf.FusionRule(op1="MatMul", op2="Add", fuse_pattern="FusedA", priority=p1, name="ruleA"))
    fuser.AddFusionRule(gaf.FusionRule(op1="MatMul", op2="Add", fuse_pattern="FusedB", priority=p2, name="ruleB"))
    return fuser


def test_rule_conflict_same_priority_names_both_rules_and_operators(gaf, mlp_onnx):
    fuser = _two_rules(gaf, mlp_onnx, 2, 2)
    for call in (fuser.AnalyzeFusionBenefit, fuser.Fuse, fuser.EstimateFusionBenefit):
        with pytest.raises(gaf.Error) as e:
            call()
        msg = str(e.value)
        assert "'ruleA'" in msg and "'ruleB'" in msg, msg
        assert "same priority 2" in msg, msg
        assert "mm1 (MatMul)" in msg and "bias1 (Add)" in msg, msg
        assert "higher priority" in msg, msg


def test_higher_priority_rule_wins(gaf, mlp_onnx, mlp_feeds, mlp_expected):
    fuser = _two_rules(gaf, mlp_onnx, 2, 3)
    cands = list(fuser.AnalyzeFusionBenefit())
    assert sorted((c["rule"], c["verdict"]) for c in cands) == [
        ("ruleA", "Skip: overlap"), ("ruleA", "Skip: overlap"), ("ruleB", "Fuse"), ("ruleB", "Fuse")]
    lost = next(c for c in cands if c["rule"] == "ruleA")
    assert "'ruleB' has priority 3, higher than 2" in lost["reason"]
    fused = fuser.Fuse()
    assert op_types(fused).count("FusedB") == 2 and "FusedA" not in op_types(fused)
    assert sorted(g["original_nodes"] for g in groups(fused)) == [["mm1", "bias1"], ["mm2", "bias2"]]
    assert {g["rule"] for g in groups(fused)} == {"ruleB"}
    np.testing.assert_allclose(fused(mlp_feeds), mlp_expected, rtol=1e-4, atol=1e-4)
    # The other way round, ruleA wins.
    assert set(op_types(_two_rules(gaf, mlp_onnx, 5, 3).Fuse())) >= {"FusedA"}


def test_user_rule_is_listed_with_its_values(gaf, mlp_onnx):
    fuser = gaf.GraphAutoFusion(mlp_onnx, preset="none")
    fuser.add_fusion_rule(gaf.FusionRule("LayerNorm", "Add", fuse_pattern="LNA", benefit_threshold=0.25, priority=7))
    assert fuser.rules() == [{"name": "LayerNorm+Add", "fuse_pattern": "LNA", "priority": 7, "benefit_threshold": 0.25,
                              "preset": "user", "source": "AddFusionRule"}]


def test_fuse_rules_keeps_only_the_named_rules(gaf, mlp_onnx):
    fuser = gaf.GraphAutoFusion(mlp_onnx, preset="transformer", fuse_rules=["MatMulBiasFusion"], auto_fuse=False)
    assert [r["name"] for r in fuser.rules()] == ["MatMulBiasFusion"]
    fused = fuser.Fuse()
    assert sorted(g["original_nodes"] for g in groups(fused)) == [["mm1", "bias1"], ["mm2", "bias2"]]


# ---------------------------------------------------------------- thresholds
def test_global_benefit_threshold_099_fuses_nothing(gaf, mlp_onnx, mlp_feeds, mlp_expected):
    fuser = gaf.GraphAutoFusion(mlp_onnx, preset="transformer", benefit_threshold=0.99)
    cands = list(fuser.AnalyzeFusionBenefit())
    assert cands and {c["verdict"] for c in cands} == {"Skip: low benefit"}
    assert all("is below the benefit threshold of 99.0%" in c["reason"] for c in cands)
    assert fuser.EstimateFusionBenefit()["fused"] == 0
    fused = fuser.FuseSafe(check_speed=False)
    assert fused.fused_nodes == 0
    rep = fuser.GetSafeFusionReport()
    assert rep["fused"] == 0 and rep["skipped_by_reason"] == {"Skip: low benefit": len(cands)}
    assert f"[INFO]   Skipped (low benefit): {len(cands)} (100.0%)" in str(rep)
    np.testing.assert_allclose(fused(mlp_feeds), mlp_expected, rtol=1e-4, atol=1e-4)


def test_fusion_rule_threshold_decides(gaf, mlp_onnx):
    probe = gaf.GraphAutoFusion(mlp_onnx, preset="none", auto_fuse=False)
    probe.AddFusionRule(gaf.FusionRule("LayerNorm", "Add", fuse_pattern="LNA"))
    (cand,) = list(probe.AnalyzeFusionBenefit())
    saving = 1 - cand["estimate"]["time_after_us"] / cand["estimate"]["time_before_us"]
    assert 0.1 < saving < 0.9, saving
    verdicts = {}
    for t in (saving - 0.05, saving + 0.05):
        fuser = gaf.GraphAutoFusion(mlp_onnx, preset="none", auto_fuse=False)
        fuser.AddFusionRule(gaf.FusionRule("LayerNorm", "Add", fuse_pattern="LNA", benefit_threshold=round(t, 3)))
        (c,) = list(fuser.AnalyzeFusionBenefit())
        verdicts[t] = c["verdict"]
        if c["verdict"] == "Skip: low benefit":
            assert f"below the benefit threshold of {round(t, 3) * 100:.1f}%" in c["reason"], c["reason"]
            assert "LNA" not in op_types(fuser.Fuse())
        else:
            assert "LNA" in op_types(fuser.Fuse())
    assert verdicts == {saving - 0.05: "Fuse", saving + 0.05: "Skip: low benefit"}


def test_global_threshold_overrides_the_rules(gaf, mlp_onnx):
    fuser = gaf.GraphAutoFusion(mlp_onnx, preset="none", auto_fuse=False, benefit_threshold=0.95)
    fuser.AddFusionRule(gaf.FusionRule("LayerNorm", "Add", fuse_pattern="LNA", benefit_threshold=0.0))
    assert [c["verdict"] for c in fuser.AnalyzeFusionBenefit()] == ["Skip: low benefit"]


# ---------------------------------------------------------------- FuseSafe, verification
def test_fuse_safe_report(gaf, block_fusion):
    fuser, fused = block_fusion
    rep = fuser.GetSafeFusionReport()
    assert rep["candidates"] >= 4 and rep["fused"] == fused.fused_nodes >= 2
    assert rep["candidates"] == rep["fused"] + sum(rep["skipped_by_reason"].values())
    kept = [k for k in rep["kernels"] if k["fused"]]
    assert len(kept) == rep["fused"]
    assert all(k["cosine"] > 0.9999 and k["max_abs_error"] < 1e-4 and k["original_nodes"] for k in kept)
    text = str(rep)
    share = f"{rep['fused']} ({100.0 * rep['fused'] / rep['candidates']:.1f}%)"
    assert f"[INFO]   Total operator pairs: {rep['candidates']}\n[INFO]   Fused successfully: {share}" in text
    assert "verdict: not gated for speed (speed gate off)" in text
    assert rep.end_to_end["original_kept"] is False


def test_fuse_safe_with_speed_gate(gaf, mlp_onnx):
    """With the speed gate the report carries measured times and an end-to-end verdict."""
    fuser = gaf.GraphAutoFusion(mlp_onnx, preset="transformer", safe_mode=True)
    fuser.FuseSafe(repeats=7)
    e = fuser.GetSafeFusionReport().end_to_end
    assert e["pairs"] >= 7 or e["original_kept"], e
    assert e["verdict"], e


def test_fuse_safe_half_weights_kept_runs_on_float16(gaf, llama):
    """FuseSafe(half_weights=True): when the gate keeps float16 storage, the fused model runs on it
    and generates float32's greedy tokens on the tiny decoder."""
    model, _, fused32, _ = llama
    fuser = gaf.GraphAutoFusion(model, preset="transformer", safe_mode=True)
    fused = fuser.FuseSafe(check_speed=False, half_weights=True)
    rep = fuser.GetSafeFusionReport()
    assert rep["half_weights"]["kept"] is True and rep.half_weights_kept is True, rep["half_weights"]
    assert fused.half_weights is True
    assert "greedy tokens as float32 weights" in rep["half_weights"]["check"], rep["half_weights"]  # the decoder gate ran
    ids = np.array([[3, 1, 4, 1, 5, 9, 2, 6]], dtype=np.int64)
    assert fused.generate(ids, max_length=16).tolist() == fused32.generate(ids, max_length=16).tolist()


def test_verify_precision_against_pytorch(gaf, block, block_fusion):
    m, x = block
    fuser, fused = block_fusion
    p = fuser.VerifyPrecision(fused, m)
    assert p["reference"] == "PyTorch (Block.forward)"
    assert p["cosine_similarity"] > 0.99999 and 0 <= p["max_abs_error"] < 1e-4
    assert p["outputs"][0]["same_shape"] and p["passed"] is True
    assert p["onnx_reference"]["max_abs_error"] < 1e-4
    text = str(p)
    assert text.startswith("Precision of the fused model against PyTorch (Block.forward)")
    assert f"cosine similarity: {p['cosine_similarity']:.5f}" in text and "PASS (cosine >= 0.999" in text


def test_verify_precision_fails_against_a_different_model(gaf, block, block_fusion, block_factory):
    """Another block (other random weights) as the reference: the check must say FAIL."""
    _, x = block
    fuser, fused = block_fusion
    p = fuser.VerifyPrecision(fused, block_factory(seed=1))
    assert p["passed"] is False and p["cosine_similarity"] < 0.99 and p["max_abs_error"] > 1e-2
    assert "FAIL (cosine >= 0.999" in str(p)


def test_verify_performance_keys_and_text(gaf, cnn_fusion):
    fuser, fused = cnn_fusion
    q = fuser.VerifyPerformance(fused, repeats=3)
    assert q["unit"] == "inferences/s" and q["repeats"] == 3
    assert q["baseline_throughput"] == pytest.approx(1e3 / q["baseline_ms"])
    assert q["fused_throughput"] == pytest.approx(1e3 / q["fused_ms"])
    assert q["improvement"] == pytest.approx(q["fused_throughput"] / q["baseline_throughput"] - 1, rel=1e-6)
    assert f"baseline throughput: {q['baseline_throughput']:.1f} inferences/s" in str(q)
    assert "note" not in q  # a fused model: no note


def test_verify_performance_of_the_model_as_given_says_it_measured_one_model(gaf, mlp_onnx):
    fuser = gaf.GraphAutoFusion(mlp_onnx, preset="transformer")
    q = fuser.VerifyPerformance(mlp_onnx, repeats=2)  # what FuseSafe returns when it keeps the original
    assert "both sides ran the same graph" in q["note"]
    assert "note: the fused model has no fused operators" in str(q)


def test_verify_performance_of_a_decoder(gaf, llama):
    _, fuser, fused, _ = llama
    q = fuser.VerifyPerformance(fused, repeats=2, max_length=14)
    assert q["unit"] == "tokens/s" and q["new_tokens"] == 14 - 8 and q["prompt_tokens"] == 8
    assert q["same_tokens"] is True and q["baseline_throughput"] > 0 and q["fused_throughput"] > 0
    assert q["improvement"] == pytest.approx(q["fused_throughput"] / q["baseline_throughput"] - 1)


# ---------------------------------------------------------------- bad arguments
@pytest.mark.parametrize("kwargs, exc, words", [
    ({"preset": "bert"}, ValueError, "preset 'bert': expected one of transformer, cnn, rnn, all, none"),
    ({"fuse_rules": "LayerNorm+Add"}, TypeError, "fuse_rules: expected a list of rule names"),
    ({"fuse_rules": [3]}, TypeError, "fuse_rules: expected a list of rule names"),
    ({"benefit_threshold": 1.5}, ValueError, "benefit_threshold 1.5: expected a number in [0, 1)"),
    ({"benefit_threshold": -0.1}, ValueError, "benefit_threshold -0.1: expected a number in [0, 1)"),
    ({"benefit_threshold": "0.2"}, ValueError, "benefit_threshold '0.2': expected a number in [0, 1)"),
    ({"profile": "tpu9"}, "Error", "unknown hardware profile 'tpu9': use host-cpu, ascend910, h200"),
    ({"fuse_rules": ["NoSuchRule"]}, "Error", "fuse_rules names an unknown rule 'NoSuchRule'; known rules:"),
])
def test_bad_fuser_arguments(gaf, mlp_onnx, kwargs, exc, words):
    exc = gaf.Error if exc == "Error" else exc
    with pytest.raises(exc) as e:
        gaf.GraphAutoFusion(mlp_onnx, **kwargs).Fuse()
    assert words in str(e.value)


@pytest.mark.parametrize("args, kwargs, exc, words", [
    (("MatMul",), {}, ValueError, "a rule needs at least two operators (op1 and op2)"),
    ((), {"op1": "MatMul"}, ValueError, "a rule needs at least two operators"),
    (("MatMul", "Add"), {"benefit_threshold": 2}, ValueError, "benefit_threshold 2 must be a number in [0, 1)"),
    (("MatMul", "Add"), {"priority": 1.5}, TypeError, "priority must be an integer, got 1.5"),
    (("MatMul", 3), {}, TypeError, "operator names must be non-empty strings, got 3"),
    (("MatMul", "Add"), {"pattern": "MatMul+Add"}, TypeError, "give either op1, op2, ... or pattern, not both"),
])
def test_bad_fusion_rules(gaf, args, kwargs, exc, words):
    with pytest.raises(exc) as e:
        gaf.FusionRule(*args, **kwargs)
    assert words in str(e.value)


def test_add_fusion_rule_wants_a_fusion_rule(gaf, mlp_onnx):
    with pytest.raises(TypeError, match="AddFusionRule: expected a FusionRule, got str"):
        gaf.GraphAutoFusion(mlp_onnx).AddFusionRule("MatMul+Add")


def test_report_and_verification_before_fusing(gaf, mlp_onnx):
    fuser = gaf.GraphAutoFusion(mlp_onnx, preset="transformer")
    with pytest.raises(gaf.Error, match=r"GetSafeFusionReport: FuseSafe\(\) has not run"):
        fuser.GetSafeFusionReport()
    with pytest.raises(gaf.Error, match=r"no fused model: call Fuse\(\) or FuseSafe\(\) first"):
        fuser.VerifyPrecision()
    fuser.Fuse()  # without safe_mode: no gates, still no safe-fusion report
    with pytest.raises(gaf.Error, match="FuseSafe"):
        fuser.GetSafeFusionReport()


@pytest.mark.parametrize("kwargs, words", [
    ({"repeats": 0}, "repeats 0: expected an integer >= 1"),
    ({"repeats": 5}, "repeats 5: the speed gate's sign test at 1% needs at least 7 pairs"),
    ({"min_cosine": 0}, "min_cosine 0: expected a number in (0, 1]"),
    ({"max_abs_error": -1}, "max_abs_error -1: expected a number >= 0"),
])
def test_bad_fuse_safe_arguments(gaf, mlp_onnx, kwargs, words):
    with pytest.raises(ValueError) as e:
        gaf.GraphAutoFusion(mlp_onnx).FuseSafe(**kwargs)
    assert words in str(e.value)


def test_missing_file_names_the_path(gaf, tmp_path):
    path = str(tmp_path / "no_such_model.onnx")
    with pytest.raises((FileNotFoundError, gaf.Error)) as e:
        gaf.GraphAutoFusion(path)
    assert path in str(e.value)


def test_corrupt_onnx_is_an_error(gaf, mlp_onnx, tmp_path):
    data = mlp_onnx.SerializeToString()
    with pytest.raises(gaf.Error, match="not a valid ONNX protobuf"):
        gaf.GraphAutoFusion(data[: len(data) // 3])
    bad = tmp_path / "corrupt.onnx"
    bad.write_bytes(b"\x08\x07not an onnx model" * 8)
    with pytest.raises(gaf.Error) as e:
        gaf.GraphAutoFusion(str(bad))
    assert str(bad) in str(e.value) and "not a valid ONNX protobuf" in str(e.value)


def test_unknown_model_type(gaf):
    with pytest.raises(TypeError, match="model: expected an ONNX file path, an onnx.ModelProto, bytes.*got int"):
        gaf.GraphAutoFusion(12)


def test_compile_into_an_impossible_folder_names_it(gaf, mlp_onnx, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    with pytest.raises(gaf.Error) as e:
        gaf.GraphAutoFusion(mlp_onnx).CompileFusedOperators(str(blocker / "ops"))
    assert str(blocker) in str(e.value)


def test_rule_naming_an_unknown_operator_warns(gaf):
    with pytest.warns(UserWarning, match=r"'NoSuchOp' is not an ONNX operator graph-autofusion knows"):
        gaf.FusionRule(op1="MatMul", op2="NoSuchOp", fuse_pattern="X")
    import warnings  # noqa: PLC0415

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the original's LayerNorm+Add (an alias) and alternatives do not warn
        gaf.FusionRule(op1="LayerNorm", op2="Add", fuse_pattern="LayerNormAdd", benefit_threshold=0.2, priority=2)
        gaf.FusionRule(pattern="MatMul+Relu|Clip")
