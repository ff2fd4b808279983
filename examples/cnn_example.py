#!/usr/bin/env python3
"""A torchvision-style CNN through graph-autofusion: a ResNet with BasicBlocks (written here the
way torchvision.models.resnet writes it: conv3x3-BN-ReLU-conv3x3-BN, a 1x1 conv + BN downsample,
the residual Add and ReLU; stem conv7x7/2 + BN + ReLU + max pool; global average pool and a fully
connected head), random weights and BatchNorm statistics, in eval mode.

    GraphAutoFusion(model, preset="cnn", safe_mode=True, example_inputs=x)
    EstimateFusionBenefit, AnalyzeFusionBenefit, Fuse() (safe), GetSafeFusionReport,
    VerifyPrecision (against PyTorch's own outputs), VerifyPerformance, to_torch()

and a throughput table: PyTorch eager vs graph-autofusion unfused vs fused (inferences/s, medians
of interleaved repeats).

Run (from the repository root, after the README's first command):

    /usr/bin/python3 examples/cnn_example.py [--size tiny|full] [--repeats R]

(another interpreter: PYTHONPATH=build/python). tiny: a 1x3x32x32 input and 8-64 channels, one
block per stage (seconds); full: ResNet-18 at 1x3x224x224. Exit status 0 when the precision check
passes and the fused model inside PyTorch gives the same outputs, 1 otherwise.
"""

import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn as nn

try:
    from graph_autofusion import FusedModel, GraphAutoFusion
except ImportError as e:  # not built, or another interpreter without PYTHONPATH
    sys.exit(f"error: cannot import graph_autofusion ({e}); build it with the README's first command, then run "
             f"with /usr/bin/python3 or PYTHONPATH=build/python")


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        return self.relu(out + identity)


class ResNet(nn.Module):
    def __init__(self, layers, widths, num_classes=1000):
        super().__init__()
        self.inplanes = widths[0]
        self.conv1 = nn.Conv2d(3, self.inplanes, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(self.inplanes)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        self.layer1 = self._make_layer(widths[0], layers[0])
        self.layer2 = self._make_layer(widths[1], layers[1], stride=2)
        self.layer3 = self._make_layer(widths[2], layers[2], stride=2)
        self.layer4 = self._make_layer(widths[3], layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(widths[3], num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):  # random statistics, so BatchNorm is not the identity
                nn.init.uniform_(m.weight, 0.5, 1.5)
                nn.init.uniform_(m.bias, -0.1, 0.1)
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)

    def _make_layer(self, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes, 1, stride=stride, bias=False),
                                       nn.BatchNorm2d(planes))
        layers = [BasicBlock(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes
        layers += [BasicBlock(planes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


# (blocks per stage, widths, classes, input size)
SIZES = {
    "tiny": ((1, 1, 1, 1), (8, 16, 32, 64), 10, 32),
    "full": ((2, 2, 2, 2), (64, 128, 256, 512), 1000, 224),  # ResNet-18
}


def per_second(fn, n):
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return n / (time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="full", help="tiny (CI, seconds) or full (ResNet-18)")
    ap.add_argument("--repeats", type=int, default=7, help="interleaved repeats of the throughput measures")
    ap.add_argument("--threads", type=int, default=0,
                    help="threads of graph-autofusion and, in the table, of PyTorch (0: all cores)")
    a = ap.parse_args()
    if a.repeats < 1:
        ap.error("--repeats must be >= 1")
    t_start = time.perf_counter()

    torch.manual_seed(0)
    blocks, widths, classes, hw = SIZES[a.size]
    model = ResNet(blocks, widths, classes).eval()
    x = torch.randn(1, 3, hw, hw)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"== ResNet ({a.size}): BasicBlocks {list(blocks)}, widths {list(widths)}, input {list(x.shape)}, "
          f"{n_params / 1e6:.2f}M parameters, random weights, eval mode")

    # The fuser: the CNN rules (Conv+BatchNorm+ReLU, Conv+Add+ReLU, ...), fusion checked on x.
    fuser = GraphAutoFusion(model, preset="cnn", safe_mode=True, example_inputs=x, threads=a.threads)
    print(f"exported with torch.onnx.export; inputs {fuser.samples and list(fuser.samples[0])}; "
          f"workload: {fuser.workload}")

    benefit = fuser.EstimateFusionBenefit()
    print(f"\n== EstimateFusionBenefit\nestimated performance improvement: {benefit['performance_improvement'] * 100:.1f}%")
    print(f"estimated HBM access reduction: {benefit['hbm_access_reduction'] * 100:.1f}%")

    report = fuser.AnalyzeFusionBenefit()
    verdicts = {}
    for c in report:
        verdicts[c["verdict"].split(" (")[0]] = verdicts.get(c["verdict"].split(" (")[0], 0) + 1
    print(f"\n== AnalyzeFusionBenefit: {len(report)} candidates ("
          + ", ".join(f"{k}: {v}" for k, v in sorted(verdicts.items())) + "); the first:")
    print(str(report).split("\n\n")[0])

    t0 = time.perf_counter()
    fused_model = fuser.Fuse()  # safe_mode: FuseSafe
    print(f"\n== Fuse (safe, {time.perf_counter() - t0:.1f} s): {fused_model}")
    print(fuser.GetSafeFusionReport())

    precision_report = fuser.VerifyPrecision(fused_model, model)
    print(f"\n== VerifyPrecision\ncosine similarity: {precision_report['cosine_similarity']:.5f}")
    print(f"max abs error: {precision_report['max_abs_error']:.2e}")
    print(f"against {precision_report['reference']}: {'PASS' if precision_report['passed'] else 'FAIL'}")

    performance_report = fuser.VerifyPerformance(fused_model, repeats=max(3, a.repeats))
    print("\n== VerifyPerformance")
    print(f"baseline throughput: {performance_report['baseline_throughput']:.1f} inferences/s "
          f"(graph-autofusion, unfused)")
    print(f"fused throughput: {performance_report['fused_throughput']:.1f} inferences/s")
    print(f"improvement: {performance_report['improvement'] * 100:.1f}%")

    # The fused model inside a PyTorch program: to_torch() gives an nn.Module (inference only).
    classifier = nn.Sequential(fused_model.to_torch(), nn.Softmax(dim=-1)).eval()
    with torch.no_grad():
        probs_fused = classifier(x)
        probs_torch = torch.softmax(model(x), dim=-1)
    in_torch_err = float((probs_fused - probs_torch).abs().max())
    in_torch_ok = in_torch_err <= 1e-4
    print(f"\n== to_torch(): nn.Sequential(fused, Softmax) vs PyTorch: max abs error {in_torch_err:.2e} "
          f"({'ok' if in_torch_ok else 'DIFFERENT'})")

    # The throughput table: the same input, interleaved blocks of inferences.
    unfused = FusedModel(fuser.model, description="unfused", use_kernels=False, threads=a.threads)
    xn = x.numpy()
    # The same number of threads on both sides. (graph-autofusion's runtime sets OpenMP's thread
    # count, which PyTorch shares in this process: without this, PyTorch would run with whatever
    # the last graph-autofusion call set.)
    threads = a.threads or len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    with torch.no_grad():
        stages = {"PyTorch eager (torch.no_grad)": lambda: model(x),
                  "graph-autofusion, unfused": lambda: unfused(xn),
                  "graph-autofusion, fused (safe)": lambda: fused_model(xn)}
        for fn in stages.values():  # warm-up, and the block size: ~0.2 s of the slowest stage
            fn()
        n = max(1, int(0.2 * min(per_second(fn, 3) for fn in stages.values())))
        rates = {k: [] for k in stages}
        for _ in range(a.repeats):
            for name, fn in stages.items():
                rates[name].append(per_second(fn, n))
    base = statistics.median(rates["PyTorch eager (torch.no_grad)"])
    print(f"\n== Throughput: input {list(x.shape)}, batch 1; medians of {a.repeats} interleaved repeats of {n} "
          f"inferences")
    print(f"{'stage':<36} {'inferences/s':>13} {'vs PyTorch':>11}")
    for name, r in rates.items():
        med = statistics.median(r)
        print(f"{name:<36} {med:>13.1f} {med / base:>10.2f}x")
    cpus = len(os.sched_getaffinity(0))
    print(f"(figures of this machine: {cpus} CPUs, {threads} threads on both sides, PyTorch {torch.__version__})")

    ok = bool(precision_report["passed"]) and in_torch_ok
    print(f"\n{'OK' if ok else 'FAILED'} ({time.perf_counter() - t_start:.1f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
