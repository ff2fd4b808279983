#!/usr/bin/env python3
"""Writes a MobileNetV2-like classifier laid out as tf2onnx exports a Keras model (no TensorFlow
needed; onnx.helper, random seeded weights), for measuring that path side by side with ONNX Runtime:

  NHWC input [N, S, S, 3] and a Transpose to NCHW; convolutions with biases (BatchNorm folded, as
  tf2onnx folds it); stride-1 3x3 ones with auto_pad SAME_UPPER; each stride-2 one unpadded (VALID)
  after a Pad of one row at the bottom and one column at the right (Keras' ZeroPadding2D with
  correct_pad); ReLU6 as Clip(x, 0, 6) with min and max as inputs (opset 13); depthwise
  convolutions; residual Adds; a Transpose back to NHWC; ReduceMean over height and width; MatMul +
  Add; Softmax.

Run: /usr/bin/python3 bench/make_tf2onnx_like.py OUT_DIR [SIZE]   (SIZE default 224)
Writes OUT_DIR/model.onnx (input `input`, output `probs`) and OUT_DIR/input.npy. Then, e.g.:
  build/autofusion fuse OUT_DIR/model.onnx -i input=OUT_DIR/input.npy --safe -o OUT_DIR/fused.onnx
  build/autofusion run OUT_DIR/fused.onnx -i input=OUT_DIR/input.npy --threads 1 --warmup 2 --repeat 21
  node bench/ort_run.js OUT_DIR/model.onnx -i input=OUT_DIR/input.npy -o OUT_DIR --opt all --threads 1 --repeat 21
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

out_dir = sys.argv[1] if len(sys.argv) > 1 else "/tmp/gaf-tf2onnx-like"
size = int(sys.argv[2]) if len(sys.argv) > 2 else 224
rng = np.random.default_rng(0)
nodes, inits = [], []
count = [0]


def name(prefix):
    count[0] += 1
    return f"{prefix}_{count[0]}"


def const(a, prefix="c"):
    n = name(prefix)
    inits.append(numpy_helper.from_array(a, n))
    return n


zero, six = const(np.array(0, np.float32), "zero"), const(np.array(6, np.float32), "six")


def conv(x, cin, cout, k, s=1, g=1):
    w = const(rng.normal(0, (2.0 / (cin // g * k * k)) ** 0.5, (cout, cin // g, k, k)).astype(np.float32))
    b = const(rng.normal(0, 0.1, (cout,)).astype(np.float32))
    y = name("conv")
    if s == 2:  # ZeroPadding2D(((0, 1), (0, 1))), then a VALID convolution
        pads = const(np.array([0, 0, 0, 0, 0, 0, 1, 1], np.int64), "pads")
        p = name("pad")
        nodes.append(helper.make_node("Pad", [x, pads], [p], name=p, mode="constant"))
        nodes.append(helper.make_node("Conv", [p, w, b], [y], name=y, kernel_shape=[k, k], strides=[s, s], group=g,
                                      auto_pad="VALID", dilations=[1, 1]))
    else:
        nodes.append(helper.make_node("Conv", [x, w, b], [y], name=y, kernel_shape=[k, k], strides=[s, s], group=g,
                                      auto_pad="SAME_UPPER" if k > 1 else "NOTSET", dilations=[1, 1]))
    return y


def relu6(x):
    y = name("clip")
    nodes.append(helper.make_node("Clip", [x, zero, six], [y], name=y))
    return y


def block(x, cin, cout, s, t):
    hidden = cin * t
    y = relu6(conv(x, cin, hidden, 1)) if t != 1 else x
    y = relu6(conv(y, hidden, hidden, 3, s, hidden))
    y = conv(y, hidden, cout, 1)
    if s == 1 and cin == cout:
        o = name("add")
        nodes.append(helper.make_node("Add", [x, y], [o], name=o))
        y = o
    return y


nodes.append(helper.make_node("Transpose", ["input"], ["x_nchw"], name="transpose_in", perm=[0, 3, 1, 2]))
x = relu6(conv("x_nchw", 3, 32, 3, 2))
cin = 32
for t, c, n, s in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                   (6, 320, 1, 1)]:
    for i in range(n):
        x = block(x, cin, c, s if i == 0 else 1, t)
        cin = c
x = relu6(conv(x, 320, 1280, 1))
nodes.append(helper.make_node("Transpose", [x], ["x_nhwc"], name="transpose_out", perm=[0, 2, 3, 1]))
nodes.append(helper.make_node("ReduceMean", ["x_nhwc"], ["pooled"], name="mean", axes=[1, 2], keepdims=0))
wfc = const(rng.normal(0, 0.03, (1280, 1000)).astype(np.float32))
bfc = const(rng.normal(0, 0.1, (1000,)).astype(np.float32))
nodes.append(helper.make_node("MatMul", ["pooled", wfc], ["fc"], name="fc"))
nodes.append(helper.make_node("Add", ["fc", bfc], ["logits"], name="fc_bias"))
nodes.append(helper.make_node("Softmax", ["logits"], ["probs"], name="softmax", axis=-1))
graph = helper.make_graph(nodes, "tf2onnx_like_mobilenetv2",
                          [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", size, size, 3])],
                          [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", 1000])], inits)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], producer_name="tf2onnx-like")
onnx.checker.check_model(model)
os.makedirs(out_dir, exist_ok=True)
onnx.save(model, os.path.join(out_dir, "model.onnx"))
np.save(os.path.join(out_dir, "input.npy"), rng.random((1, size, size, 3), dtype=np.float32))
print(f"{out_dir}/model.onnx: {len(nodes)} nodes, input 1x{size}x{size}x3")
