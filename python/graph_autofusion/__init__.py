"""graph-autofusion: automatic, safe operator fusion for ONNX and PyTorch models.

    from graph_autofusion import GraphAutoFusion, FusionRule
    fuser = GraphAutoFusion(model, preset="transformer", safe_mode=True)   # ONNX, or torch + example_inputs
    print(fuser.EstimateFusionBenefit()); print(fuser.AnalyzeFusionBenefit())
    fused = fuser.Fuse()                       # safe_mode: FuseSafe(), gated with rollback
    print(fuser.GetSafeFusionReport())
    fuser.VerifyPrecision(fused, model); fuser.VerifyPerformance(fused)
    fused.save_pretrained("./model-fused"); fused.generate(input_ids, max_length=50)

See docs/python.md."""

from . import _core
from ._api import FusionRule, GraphAutoFusion
from ._fused import DecodeLoop, FusedModel, load
from ._reports import AnalysisReport, Estimate, PerformanceReport, PrecisionReport, SafeFusionReport

Error = _core.Error                        # every error of the library: a ValueError with its sentence
UnsupportedError = _core.UnsupportedError  # an operator or type the runtime does not have (an Error)

__version__ = "0.13.0"

__all__ = ["GraphAutoFusion", "FusionRule", "FusedModel", "DecodeLoop", "load", "Error", "UnsupportedError", "AnalysisReport",
           "Estimate", "SafeFusionReport", "PrecisionReport", "PerformanceReport", "example_llama"]


def example_llama(preset="tiny"):
    """The built-in Llama-style decoder (random weights) as a FusedModel-ready ONNX model
    (_core.Model): presets tiny, small, bench, wide."""
    return _core.llama_model(preset)


def _register_torch_operator():
    """TorchScript saved from FusedModel.to_torch() calls graph_autofusion::run: the operator is
    registered on import whenever PyTorch is installed (costs PyTorch's import time)."""
    import importlib.util  # noqa: PLC0415

    if importlib.util.find_spec("torch") is None:
        return  # no python3-torch: everything but to_torch() works
    from . import _torch_op  # noqa: F401, PLC0415


_register_torch_operator()
