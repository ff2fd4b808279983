"""Regressions found by a review that ran the original's walkthrough on independently written
models (MobileNetV2-, GPT-2- and BERT-style) and fed the package hostile files.

- VerifyPrecision(fused, model) with the TorchScript file given to GraphAutoFusion (a path, not
  the loaded module) re-exported it on the first sample alone: a static model, so a workload of
  several shapes failed with "input 'x' expects shape [1,3,16,16] but was given [2,3,20,12]".
  Another torch module as the reference had the same problem.
- FusedModel.load on a crafted folder: wrong types in graph_autofusion.json ("reports": 5,
  "half_weights": "no" silently True), a garbage report file, a samples.npz with object arrays, a
  key that is not "<sample>/<input>" or not a zip at all gave bare TypeError / JSONDecodeError /
  BadZipFile without the file's name; now a one-line graph_autofusion.Error naming the file.
- FusionRule: a non-string fuse_pattern or name and a priority past 32 bits were pybind11's
  multi-line "incompatible function arguments"; a NUL in an operator name cut the library's
  sentence short ("chain 'Add")."""

import json
import os
import shutil

import numpy as np
import pytest


def _net(torch):
    torch.manual_seed(3)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
            self.bn = torch.nn.BatchNorm2d(8)
            self.fc = torch.nn.Linear(8, 4)

        def forward(self, x):
            y = torch.nn.functional.relu6(self.bn(self.conv(x)))
            return self.fc(y.mean((2, 3)))

    return Net().eval()


def _samples(torch):
    g = torch.Generator().manual_seed(5)
    return [(torch.randn(1, 3, 16, 16, generator=g),), (torch.randn(2, 3, 20, 12, generator=g),)]


def test_verify_precision_with_the_torchscript_path_given(gaf, torch, tmp_path):
    net = _net(torch)
    ex = _samples(torch)
    pt = str(tmp_path / "net.pt")
    torch.jit.save(torch.jit.trace(net, ex[0]), pt)
    fuser = gaf.GraphAutoFusion(pt, preset="cnn", example_inputs=ex)
    fused = fuser.Fuse()
    p = fuser.VerifyPrecision(fused, pt)  # the same file: the export already made, both samples
    assert p["passed"] and p["samples"] == 2, str(p)
    # Another module (a copy, not the object given) is exported on every sample: dynamic too.
    other = _net(torch)
    p2 = fuser.VerifyPrecision(fused, other)
    assert p2["passed"] and p2["samples"] == 2, str(p2)
    assert p2["reference"].startswith("PyTorch")


@pytest.fixture(scope="module")
def saved(gaf, torch, tmp_path_factory):
    net = _net(torch)
    fuser = gaf.GraphAutoFusion(net, preset="cnn", safe_mode=True, example_inputs=_samples(torch))
    fused = fuser.FuseSafe(check_speed=False)
    d = str(tmp_path_factory.mktemp("review") / "saved")
    fused.save_pretrained(d)
    return d


def _copy(saved, tmp_path):
    d = str(tmp_path / "copy")
    shutil.copytree(saved, d)
    return d


def _edit_meta(d, **kw):
    p = os.path.join(d, "graph_autofusion.json")
    with open(p, encoding="utf-8") as f:
        meta = json.load(f)
    meta.update(kw)
    with open(p, "w", encoding="utf-8") as f:
        json.dump(meta, f)


@pytest.mark.parametrize("field,value,says", [
    ("reports", 5, "'reports' must be a list"),
    ("reports", [{"x": 1}], "'reports' must be a list of report names"),
    ("half_weights", "no", "'half_weights' must be true or false"),
    ("description", ["a"], "'description' must be a string"),
])
def test_load_rejects_wrong_types_in_the_metadata(gaf, saved, tmp_path, field, value, says):
    d = _copy(saved, tmp_path)
    _edit_meta(d, **{field: value})
    with pytest.raises(gaf.Error, match=says) as e:
        gaf.load(d)
    assert "graph_autofusion.json" in str(e.value) and "\n" not in str(e.value)


def test_load_report_names_stay_inside_the_folder(gaf, saved, tmp_path):
    d = _copy(saved, tmp_path)
    outside = tmp_path / "evil_report.json"
    outside.write_text("{garbage")  # would fail to parse if it were read
    _edit_meta(d, reports=["../evil", "safe_fusion"])
    m = gaf.load(d)
    assert "../evil" not in m.reports and "safe_fusion" in m.reports


@pytest.mark.parametrize("text,says", [("{garbage", "Expecting"), ("[1]", "a list, not an object"),
                                       ('{"candidates": "x", "end_to_end": 3}', "")])
def test_load_rejects_a_garbage_report(gaf, saved, tmp_path, text, says):
    d = _copy(saved, tmp_path)
    with open(os.path.join(d, "safe_fusion_report.json"), "w", encoding="utf-8") as f:
        f.write(text)
    with pytest.raises(gaf.Error, match="safe_fusion_report.json: not a report written by save_pretrained") as e:
        gaf.load(d)
    assert says in str(e.value)


def _object_npz(path):
    np.savez(path, **{"0/x": np.array([1, "a", None], dtype=object)})


def _badkey_npz(path):
    np.savez(path, weird=np.zeros(3, np.float32))


def _garbage_npz(path):
    with open(path, "wb") as f:
        f.write(b"PK\x03\x04 not a zip")


@pytest.mark.parametrize("write,says", [(_object_npz, "Object arrays"), (_badkey_npz, "'<sample>/<input name>'"),
                                        (_garbage_npz, "not a zip")])
def test_load_rejects_hostile_samples(gaf, saved, tmp_path, write, says):
    d = _copy(saved, tmp_path)
    write(os.path.join(d, "samples.npz"))
    with pytest.raises(gaf.Error, match="samples.npz: not the sample inputs save_pretrained writes") as e:
        gaf.load(d)
    assert says in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("kwargs,exc,says", [
    ({"fuse_pattern": 5}, TypeError, "fuse_pattern must be a string"),
    ({"name": 7}, TypeError, "name must be a string"),
    ({"priority": 10**30}, ValueError, "out of range"),
])
def test_fusion_rule_argument_types(gaf, kwargs, exc, says):
    with pytest.raises(exc, match=says) as e:
        gaf.FusionRule("Add", "Relu", **kwargs)
    assert "\n" not in str(e.value)


def test_fusion_rule_pattern_with_a_nul_or_not_a_string(gaf):
    with pytest.raises(ValueError, match="control character"):
        gaf.FusionRule(pattern="Add\x00+Relu")
    with pytest.raises(TypeError, match="pattern must be a string"):
        gaf.FusionRule(pattern=["Add", "Relu"])
    with pytest.raises(gaf.Error, match="more than 256"):  # a huge rule: one line, no crash
        gaf.FusionRule(pattern="+".join(["Add"] * 100000))
