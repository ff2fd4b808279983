#!/usr/bin/env python3
"""Exports two standard CNN architectures with torch.onnx.export (Debian's python3-torch), random
seeded weights (no downloads), for `bench/cnn_bench.sh`:

  resnet18/model.onnx     ResNet-18 (He et al. 2015; torchvision's layout: BasicBlock x [2,2,2,2],
                          BatchNorm after every conv, 1x1 stride-2 downsample), 1x3xSxS input
  mobilenetv2/model.onnx  MobileNetV2 (Sandler et al. 2018; inverted residuals, ReLU6, depthwise)

Both are exported in eval mode, as users export them: the exporter folds BatchNorm into the convs.
Each folder also gets input.npy and PyTorch's output as expected_output.npy.

Run: /usr/bin/python3 bench/make_cnn_models.py OUT_DIR [SIZE]   (SIZE default 224)
"""
import os
import sys

import numpy as np
import torch
import torch.nn as nn

torch.manual_seed(0)
OUT = sys.argv[1] if len(sys.argv) > 1 else "/tmp/gaf-cnn-models"
SIZE = int(sys.argv[2]) if len(sys.argv) > 2 else 224


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (x if self.down is None else self.down(x)))


class ResNet18(nn.Module):
    def __init__(self, classes=1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        layers, cin = [], 64
        for cout, stride in [(64, 1), (128, 2), (256, 2), (512, 2)]:
            layers += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(512, classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


class InvertedResidual(nn.Module):
    def __init__(self, cin, cout, stride, expand):
        super().__init__()
        hidden = cin * expand
        self.use_res = stride == 1 and cin == cout
        layers = []
        if expand != 1:
            layers += [nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6()]
        layers += [nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False),
                   nn.BatchNorm2d(hidden), nn.ReLU6(),
                   nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.conv(x) if self.use_res else self.conv(x)


class MobileNetV2(nn.Module):
    def __init__(self, classes=1000):
        super().__init__()
        cfg = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
               (6, 160, 3, 2), (6, 320, 1, 1)]
        layers = [nn.Conv2d(3, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU6()]
        cin = 32
        for t, c, n, s in cfg:
            for i in range(n):
                layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        layers += [nn.Conv2d(cin, 1280, 1, bias=False), nn.BatchNorm2d(1280), nn.ReLU6()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(1280, classes)

    def forward(self, x):
        x = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))


def randomize_bn(model):
    # Fresh BatchNorm layers are identities; give them statistics so that folding matters.
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.1, 0.1)


def export(name, model):
    model.eval()
    randomize_bn(model)
    folder = os.path.join(OUT, name)
    os.makedirs(folder, exist_ok=True)
    x = torch.randn(1, 3, SIZE, SIZE)
    with torch.no_grad():
        y = model(x)
    path = os.path.join(folder, "model.onnx")
    torch.onnx.export(model, (x,), path, input_names=["image"], output_names=["logits"],
                      opset_version=13, do_constant_folding=True)
    np.save(os.path.join(folder, "input.npy"), x.numpy())
    np.save(os.path.join(folder, "expected_output.npy"), y.numpy())
    print(f"{path}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, input 1x3x{SIZE}x{SIZE}")


export("resnet18", ResNet18())
export("mobilenetv2", MobileNetV2())
