#!/usr/bin/env python3
"""Exports standard CNN architectures with torch.onnx.export (Debian's python3-torch), random
seeded weights (no downloads), for `bench/cnn_bench.sh`, one folder per model under OUT_DIR:

  resnet18/model.onnx     ResNet-18 (He et al. 2015; torchvision's layout: BasicBlock x [2,2,2,2],
                          BatchNorm after every conv, 1x1 stride-2 downsample), 1x3xSxS input
  mobilenetv2/model.onnx  MobileNetV2 (Sandler et al. 2018; inverted residuals, ReLU6, depthwise),
                          1x3xSxS input
  resnet50/model.onnx     ResNet-50 (torchvision's layout: Bottleneck 1x1-3x3-1x1 x [3,4,6,3],
                          expansion 4, stride on the 3x3, 1x1+BN downsample), 1x3xSxS input
  yolox_nano/model.onnx   YOLOX-nano-like detector (Ge et al. 2021; the YOLOX code's layout at
                          depth 0.33, width 0.25, depthwise: Focus stem, CSPDarknet of DWConvs
                          with SiLU, SPP bottleneck, PAFPN with nearest upsampling, decoupled head
                          of width 64), fixed 1x3x416x416 input, output [1, 3549, 85] per anchor:
                          reg (4, raw), sigmoid(obj), sigmoid(cls) x 80, undecoded (as YOLOX's
                          export_onnx writes it)
  densenet121/model.onnx  DenseNet-121 (Huang et al. 2017; torchvision's layout: growth 32, blocks
                          [6,12,24,16], bn_size 4, BN-ReLU-Conv1x1-BN-ReLU-Conv3x3 layers on the
                          concat of all previous features, BN-ReLU-Conv1x1-AvgPool transitions),
                          1x3xSxS input; its pre-activation BatchNorms stay BatchNormalization nodes
  mobilenetv2_nhwc/model.onnx  MobileNetV2 laid out as Keras builds it and tf2onnx exports it: NHWC
                          images (a Transpose to NCHW after the input), a ZeroPadding2D (Pad) before
                          each stride-2 convolution, which is unpadded, a Transpose back to NHWC
                          after the features, ReduceMean over height and width, the classifier;
                          1xSxSx3 input
  ppocr_det/model.onnx    PP-OCR-like DB text detector (PaddleOCR's det_mobilenet_v3 at scale 0.5
                          with SE blocks, HardSwish; DBFPN neck of 96 channels; DB head: 3x3
                          conv+BN+ReLU, 2x2/2 ConvTranspose+BN+ReLU, 2x2/2 ConvTranspose, Sigmoid),
                          1x3x640x640 input, height and width dynamic (multiples of 32), output
                          the 1x1xHxW probability map

All are exported in eval mode, as users export them (opset 13, input `image`, output `logits`):
the exporter folds a BatchNorm that follows a convolution into it. BatchNorm scales and shifts are
random and the statistics far from identity, so that the folding matters: random for ResNet-18 and
MobileNetV2, measured on random images for the later models (calibrate_bn). Each folder also gets
input.npy and PyTorch's output (eval mode, no_grad) as expected_output.npy. ResNet-18 and
MobileNetV2 draw from one stream seeded 0 (as they always have); every later model has a seed of
its own, so each model's files are the same whichever models are asked for.

Run: /usr/bin/python3 bench/make_cnn_models.py OUT_DIR [SIZE] [MODEL...]
     SIZE (default 224) is the input side of resnet18, mobilenetv2, resnet50 and densenet121;
     yolox_nano (416) and ppocr_det (640) keep theirs. MODEL...: a subset of the seven above
     (default: all), e.g. `bench/make_cnn_models.py /tmp/gaf-cnn-models 224 resnet50 ppocr_det`.
"""
import os
import sys

import numpy as np
import torch
import torch.nn as nn

ALL_MODELS = ["resnet18", "mobilenetv2", "resnet50", "yolox_nano", "densenet121", "ppocr_det", "mobilenetv2_nhwc"]
torch.manual_seed(0)
OUT = sys.argv[1] if len(sys.argv) > 1 else "/tmp/gaf-cnn-models"
_args = sys.argv[2:]
SIZE = int(_args.pop(0)) if _args and _args[0].isdigit() else 224
SELECTED = _args or ALL_MODELS
for _m in SELECTED:
    if _m not in ALL_MODELS:
        sys.exit(f"make_cnn_models.py: unknown model '{_m}' (models: {' '.join(ALL_MODELS)})")


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


class NhwcMobileNetV2(nn.Module):
    """MobileNetV2 as Keras builds it and tf2onnx exports it: NHWC images (a Transpose in), each
    stride-2 3x3 convolution unpadded after a ZeroPadding2D of one row at the bottom and one column
    at the right (Keras' correct_pad for even sizes), a Transpose back to NHWC after the features,
    ReduceMean over height and width, the classifier."""

    def __init__(self):
        super().__init__()
        self.net = MobileNetV2()
        for seq in [m for m in self.net.modules() if isinstance(m, nn.Sequential)]:
            for i, m in enumerate(seq):
                if isinstance(m, nn.Conv2d) and m.stride == (2, 2) and m.kernel_size == (3, 3):
                    m.padding = (0, 0)
                    seq[i] = nn.Sequential(nn.ZeroPad2d((0, 1, 0, 1)), m)

    def forward(self, x):
        f = self.net.features(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
        return self.net.classifier(f.mean((1, 2)))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin, width, stride):
        super().__init__()
        cout = width * self.expansion
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return torch.relu(y + (x if self.down is None else self.down(x)))


class ResNet50(nn.Module):
    def __init__(self, classes=1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        layers, cin = [], 64
        for width, blocks, stride in [(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)]:
            for i in range(blocks):
                layers.append(Bottleneck(cin, width, stride if i == 0 else 1))
                cin = width * Bottleneck.expansion
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


# --- YOLOX-nano (the layout of Megvii's YOLOX code: yolox/models/{network_blocks,darknet,
# yolo_pafpn,yolo_head}.py, with depth 0.33, width 0.25, depthwise=True) ---

class BaseConv(nn.Module):  # Conv + BN + SiLU
    def __init__(self, cin, cout, k, stride=1, groups=1):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False)
        self.bn = nn.BatchNorm2d(cout, eps=1e-3, momentum=0.03)
        self.act = nn.SiLU()

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


class DWConv(nn.Module):  # depthwise kxk BaseConv, then pointwise 1x1 BaseConv
    def __init__(self, cin, cout, k, stride=1):
        super().__init__()
        self.dconv = BaseConv(cin, cin, k, stride, groups=cin)
        self.pconv = BaseConv(cin, cout, 1)

    def forward(self, x):
        return self.pconv(self.dconv(x))


class YoloBottleneck(nn.Module):
    def __init__(self, cin, cout, shortcut=True, expansion=0.5):
        super().__init__()
        hidden = int(cout * expansion)
        self.conv1 = BaseConv(cin, hidden, 1)
        self.conv2 = DWConv(hidden, cout, 3)
        self.use_add = shortcut and cin == cout

    def forward(self, x):
        y = self.conv2(self.conv1(x))
        return y + x if self.use_add else y


class CSPLayer(nn.Module):
    def __init__(self, cin, cout, n=1, shortcut=True, expansion=0.5):
        super().__init__()
        hidden = int(cout * expansion)
        self.conv1 = BaseConv(cin, hidden, 1)
        self.conv2 = BaseConv(cin, hidden, 1)
        self.conv3 = BaseConv(2 * hidden, cout, 1)
        self.m = nn.Sequential(*[YoloBottleneck(hidden, hidden, shortcut, 1.0) for _ in range(n)])

    def forward(self, x):
        return self.conv3(torch.cat((self.m(self.conv1(x)), self.conv2(x)), dim=1))


class SPPBottleneck(nn.Module):
    def __init__(self, cin, cout, kernel_sizes=(5, 9, 13)):
        super().__init__()
        hidden = cin // 2
        self.conv1 = BaseConv(cin, hidden, 1)
        self.m = nn.ModuleList([nn.MaxPool2d(k, 1, k // 2) for k in kernel_sizes])
        self.conv2 = BaseConv(hidden * (len(kernel_sizes) + 1), cout, 1)

    def forward(self, x):
        x = self.conv1(x)
        return self.conv2(torch.cat([x] + [m(x) for m in self.m], dim=1))


class Focus(nn.Module):  # space-to-depth by strided slices, then a conv
    def __init__(self, cin, cout, k=1, stride=1):
        super().__init__()
        self.conv = BaseConv(cin * 4, cout, k, stride)

    def forward(self, x):
        tl, tr = x[..., ::2, ::2], x[..., ::2, 1::2]
        bl, br = x[..., 1::2, ::2], x[..., 1::2, 1::2]
        return self.conv(torch.cat((tl, bl, tr, br), dim=1))


class CSPDarknet(nn.Module):
    def __init__(self, dep_mul, wid_mul):
        super().__init__()
        c = int(wid_mul * 64)  # 16
        d = max(round(dep_mul * 3), 1)  # 1
        self.stem = Focus(3, c, k=3)
        self.dark2 = nn.Sequential(DWConv(c, c * 2, 3, 2), CSPLayer(c * 2, c * 2, n=d))
        self.dark3 = nn.Sequential(DWConv(c * 2, c * 4, 3, 2), CSPLayer(c * 4, c * 4, n=d * 3))
        self.dark4 = nn.Sequential(DWConv(c * 4, c * 8, 3, 2), CSPLayer(c * 8, c * 8, n=d * 3))
        self.dark5 = nn.Sequential(DWConv(c * 8, c * 16, 3, 2), SPPBottleneck(c * 16, c * 16),
                                   CSPLayer(c * 16, c * 16, n=d, shortcut=False))

    def forward(self, x):
        x3 = self.dark3(self.dark2(self.stem(x)))
        x4 = self.dark4(x3)
        return x3, x4, self.dark5(x4)


class YOLOPAFPN(nn.Module):
    def __init__(self, depth, width, in_channels=(256, 512, 1024)):
        super().__init__()
        c0, c1, c2 = (int(c * width) for c in in_channels)  # 64, 128, 256
        n = round(3 * depth)
        self.backbone = CSPDarknet(depth, width)
        self.upsample = nn.Upsample(scale_factor=2, mode="nearest")
        self.lateral_conv0 = BaseConv(c2, c1, 1)
        self.C3_p4 = CSPLayer(2 * c1, c1, n, False)
        self.reduce_conv1 = BaseConv(c1, c0, 1)
        self.C3_p3 = CSPLayer(2 * c0, c0, n, False)
        self.bu_conv2 = DWConv(c0, c0, 3, 2)
        self.C3_n3 = CSPLayer(2 * c0, c1, n, False)
        self.bu_conv1 = DWConv(c1, c1, 3, 2)
        self.C3_n4 = CSPLayer(2 * c1, c2, n, False)

    def forward(self, x):
        x2, x1, x0 = self.backbone(x)
        fpn_out0 = self.lateral_conv0(x0)
        f_out0 = self.C3_p4(torch.cat([self.upsample(fpn_out0), x1], 1))
        fpn_out1 = self.reduce_conv1(f_out0)
        pan_out2 = self.C3_p3(torch.cat([self.upsample(fpn_out1), x2], 1))
        pan_out1 = self.C3_n3(torch.cat([self.bu_conv2(pan_out2), fpn_out1], 1))
        pan_out0 = self.C3_n4(torch.cat([self.bu_conv1(pan_out1), fpn_out0], 1))
        return pan_out2, pan_out1, pan_out0


class YOLOXHead(nn.Module):
    def __init__(self, classes, width, in_channels=(256, 512, 1024)):
        super().__init__()
        h = int(256 * width)  # 64
        self.stems = nn.ModuleList([BaseConv(int(c * width), h, 1) for c in in_channels])
        self.cls_convs = nn.ModuleList([nn.Sequential(DWConv(h, h, 3), DWConv(h, h, 3)) for _ in in_channels])
        self.reg_convs = nn.ModuleList([nn.Sequential(DWConv(h, h, 3), DWConv(h, h, 3)) for _ in in_channels])
        self.cls_preds = nn.ModuleList([nn.Conv2d(h, classes, 1) for _ in in_channels])
        self.reg_preds = nn.ModuleList([nn.Conv2d(h, 4, 1) for _ in in_channels])
        self.obj_preds = nn.ModuleList([nn.Conv2d(h, 1, 1) for _ in in_channels])

    def forward(self, xs):
        outputs = []
        for k, x in enumerate(xs):
            x = self.stems[k](x)
            cls_out = self.cls_preds[k](self.cls_convs[k](x))
            reg_feat = self.reg_convs[k](x)
            outputs.append(torch.cat([self.reg_preds[k](reg_feat), self.obj_preds[k](reg_feat).sigmoid(),
                                      cls_out.sigmoid()], 1))
        # [1, 85, H*W] per level, concatenated over levels, anchors first: [1, N, 85]
        return torch.cat([o.flatten(start_dim=2) for o in outputs], dim=2).permute(0, 2, 1)


class YOLOXNano(nn.Module):
    def __init__(self, classes=80, depth=0.33, width=0.25):
        super().__init__()
        self.backbone = YOLOPAFPN(depth, width)
        self.head = YOLOXHead(classes, width)

    def forward(self, x):
        return self.head(self.backbone(x))


# --- DenseNet-121 (torchvision's layout) ---

class DenseLayer(nn.Module):
    def __init__(self, cin, growth, bn_size):
        super().__init__()
        self.norm1 = nn.BatchNorm2d(cin)
        self.conv1 = nn.Conv2d(cin, bn_size * growth, 1, bias=False)
        self.norm2 = nn.BatchNorm2d(bn_size * growth)
        self.conv2 = nn.Conv2d(bn_size * growth, growth, 3, 1, 1, bias=False)

    def forward(self, features):  # the list of all previous feature maps of the block
        x = self.conv1(torch.relu(self.norm1(torch.cat(features, 1))))
        return self.conv2(torch.relu(self.norm2(x)))


class DenseBlock(nn.Module):
    def __init__(self, layers, cin, growth, bn_size):
        super().__init__()
        self.layers = nn.ModuleList([DenseLayer(cin + i * growth, growth, bn_size) for i in range(layers)])

    def forward(self, x):
        features = [x]
        for layer in self.layers:
            features.append(layer(features))
        return torch.cat(features, 1)


class DenseNet121(nn.Module):
    def __init__(self, growth=32, blocks=(6, 12, 24, 16), init_features=64, bn_size=4, classes=1000):
        super().__init__()
        layers = [nn.Conv2d(3, init_features, 7, 2, 3, bias=False), nn.BatchNorm2d(init_features), nn.ReLU(),
                  nn.MaxPool2d(3, 2, 1)]
        c = init_features
        for i, n in enumerate(blocks):
            layers.append(DenseBlock(n, c, growth, bn_size))
            c += n * growth
            if i != len(blocks) - 1:  # transition: BN, ReLU, 1x1 conv halving the channels, 2x2 average pool
                layers += [nn.BatchNorm2d(c), nn.ReLU(), nn.Conv2d(c, c // 2, 1, bias=False), nn.AvgPool2d(2, 2)]
                c //= 2
        layers.append(nn.BatchNorm2d(c))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(c, classes)

    def forward(self, x):
        x = nn.functional.adaptive_avg_pool2d(torch.relu(self.features(x)), 1)
        return self.classifier(torch.flatten(x, 1))


# --- PP-OCR-like DB text detector (PaddleOCR's ppocr/modeling: backbones/det_mobilenet_v3.py at
# scale 0.5 with SE, necks/db_fpn.py DBFPN, heads/det_db_head.py; inference output: the shrink map) ---

def make_divisible(v, divisor=8):
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v


class ConvBNAct(nn.Module):
    def __init__(self, cin, cout, k, stride=1, groups=1, act=None):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False)
        self.bn = nn.BatchNorm2d(cout)
        self.act = {"relu": nn.ReLU(), "hardswish": nn.Hardswish(), None: nn.Identity()}[act]

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


class SEModule(nn.Module):  # global average pool, 1x1, ReLU, 1x1, Hardsigmoid, scale the input
    def __init__(self, c, reduction=4):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c // reduction, 1)
        self.conv2 = nn.Conv2d(c // reduction, c, 1)
        self.gate = nn.Hardsigmoid()

    def forward(self, x):
        s = nn.functional.adaptive_avg_pool2d(x, 1)
        return x * self.gate(self.conv2(torch.relu(self.conv1(s))))


class ResidualUnit(nn.Module):  # 1x1 expand, kxk depthwise, optional SE, 1x1 linear, residual
    def __init__(self, cin, mid, cout, k, stride, use_se, act):
        super().__init__()
        self.shortcut = stride == 1 and cin == cout
        self.expand = ConvBNAct(cin, mid, 1, act=act)
        self.dw = ConvBNAct(mid, mid, k, stride, groups=mid, act=act)
        self.se = SEModule(mid) if use_se else nn.Identity()
        self.linear = ConvBNAct(mid, cout, 1)

    def forward(self, x):
        y = self.linear(self.se(self.dw(self.expand(x))))
        return x + y if self.shortcut else y


class MobileNetV3Det(nn.Module):
    # k, expansion, channels, SE, activation, stride (MobileNetV3-Large)
    CFG = [(3, 16, 16, False, "relu", 1), (3, 64, 24, False, "relu", 2), (3, 72, 24, False, "relu", 1),
           (5, 72, 40, True, "relu", 2), (5, 120, 40, True, "relu", 1), (5, 120, 40, True, "relu", 1),
           (3, 240, 80, False, "hardswish", 2), (3, 200, 80, False, "hardswish", 1),
           (3, 184, 80, False, "hardswish", 1), (3, 184, 80, False, "hardswish", 1),
           (3, 480, 112, True, "hardswish", 1), (3, 672, 112, True, "hardswish", 1),
           (5, 672, 160, True, "hardswish", 2), (5, 960, 160, True, "hardswish", 1),
           (5, 960, 160, True, "hardswish", 1)]

    def __init__(self, scale=0.5):
        super().__init__()
        c = make_divisible(16 * scale)
        self.stem = ConvBNAct(3, c, 3, 2, act="hardswish")
        stages, blocks, self.out_channels = [], [], []
        for i, (k, exp, cout, se, act, s) in enumerate(self.CFG):
            if s == 2 and i > 2:  # a new stage starts at each later stride-2 block
                self.out_channels.append(c)
                stages.append(nn.Sequential(*blocks))
                blocks = []
            blocks.append(ResidualUnit(c, make_divisible(scale * exp), make_divisible(scale * cout), k, s, se, act))
            c = make_divisible(scale * cout)
        last = make_divisible(scale * 960)
        blocks.append(ConvBNAct(c, last, 1, act="hardswish"))
        stages.append(nn.Sequential(*blocks))
        self.out_channels.append(last)
        self.stages = nn.ModuleList(stages)  # strides 4, 8, 16, 32; channels 16, 24, 56, 480

    def forward(self, x):
        x, outs = self.stem(x), []
        for stage in self.stages:
            x = stage(x)
            outs.append(x)
        return outs


class DBFPN(nn.Module):
    def __init__(self, in_channels, out_channels=96):
        super().__init__()
        self.ins = nn.ModuleList([nn.Conv2d(c, out_channels, 1, bias=False) for c in in_channels])
        self.ps = nn.ModuleList([nn.Conv2d(out_channels, out_channels // 4, 3, 1, 1, bias=False)
                                 for _ in in_channels])

    def forward(self, feats):
        up = lambda x, s: nn.functional.interpolate(x, scale_factor=s, mode="nearest")
        in2, in3, in4, in5 = (conv(f) for conv, f in zip(self.ins, feats))
        out4 = in4 + up(in5, 2)
        out3 = in3 + up(out4, 2)
        out2 = in2 + up(out3, 2)
        p2, p3, p4, p5 = (conv(f) for conv, f in zip(self.ps, (out2, out3, out4, in5)))
        return torch.cat([up(p5, 8), up(p4, 4), up(p3, 2), p2], dim=1)


class DBHead(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c // 4, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c // 4)
        self.conv2 = nn.ConvTranspose2d(c // 4, c // 4, 2, 2)
        self.bn2 = nn.BatchNorm2d(c // 4)
        self.conv3 = nn.ConvTranspose2d(c // 4, 1, 2, 2)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.bn2(self.conv2(x)))
        return torch.sigmoid(self.conv3(x))


class PPOCRDet(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = MobileNetV3Det(0.5)
        self.neck = DBFPN(self.backbone.out_channels, 96)
        self.head = DBHead(96)

    def forward(self, x):
        return self.head(self.neck(self.backbone(x)))


def randomize_bn(model):
    # Fresh BatchNorm layers are identities; give them statistics so that folding matters.
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.1, 0.1)


def calibrate_bn(model, size):
    # For the later models: random BatchNorm scales and shifts, then running statistics measured on
    # random images in train mode, as a trained network's are on its data. Default-initialized convs
    # shrink activations (~0.6x per layer), and fixed random statistics do not undo that: by the
    # head, YOLOX's sigmoids were all ~0.5 and the DB map nearly constant. Measured statistics keep
    # every BatchNorm's output at its scale and shift, and are far from identity, so folding matters.
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    momenta = [m.momentum for m in bns]
    with torch.no_grad():
        for m in bns:
            m.weight.uniform_(0.5, 1.5)
            m.bias.uniform_(-0.1, 0.1)
            m.reset_running_stats()
            m.momentum = None  # cumulative average: the statistics of this batch
        model.train()
        model(torch.randn(8, 3, size, size))
        model.eval()
        for m, momentum in zip(bns, momenta):
            m.momentum = momentum


def export(name, model, size, dynamic=False, init_bn=randomize_bn, nhwc=False):
    model.eval()
    init_bn(model)
    x = torch.randn(1, size, size, 3) if nhwc else torch.randn(1, 3, size, size)
    if name not in SELECTED:  # drawn all the same, so that MobileNetV2 is the same without ResNet-18
        return
    folder = os.path.join(OUT, name)
    os.makedirs(folder, exist_ok=True)
    with torch.no_grad():
        y = model(x)
    path = os.path.join(folder, "model.onnx")
    axes = {"image": {2: "height", 3: "width"}, "logits": {2: "height", 3: "width"}} if dynamic else None
    torch.onnx.export(model, (x,), path, input_names=["image"], output_names=["logits"],
                      opset_version=13, do_constant_folding=True, dynamic_axes=axes)
    np.save(os.path.join(folder, "input.npy"), x.numpy())
    np.save(os.path.join(folder, "expected_output.npy"), y.numpy())
    print(f"{path}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, input {'x'.join(map(str, x.shape))}"
          f"{' (height, width dynamic)' if dynamic else ''}, output {'x'.join(map(str, y.shape))}")


export("resnet18", ResNet18(), SIZE)
export("mobilenetv2", MobileNetV2(), SIZE)
# Each later model draws from a seed of its own.
for seed, (name, make, size, dynamic) in enumerate([
        ("resnet50", ResNet50, SIZE, False),
        ("yolox_nano", YOLOXNano, 416, False),
        ("densenet121", DenseNet121, SIZE, False),
        ("ppocr_det", PPOCRDet, 640, True)], start=1):
    if name in SELECTED:
        torch.manual_seed(seed)
        export(name, make(), size, dynamic, lambda model: calibrate_bn(model, size))
if "mobilenetv2_nhwc" in SELECTED:
    torch.manual_seed(5)
    export("mobilenetv2_nhwc", NhwcMobileNetV2(), SIZE, nhwc=True)
