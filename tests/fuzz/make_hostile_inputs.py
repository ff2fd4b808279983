#!/usr/bin/env python3
"""Writes the hostile inputs of issue 11 (crafted models, rule files and tensor files that once
crashed, hung or exhausted memory) into tests/fuzz/regressions/HARNESS/, where the unit test
FuzzRegressions.SavedInputsEndCleanly replays them and scripts/fuzz.sh starts its corpora from them.

Run: /usr/bin/python3 tests/fuzz/make_hostile_inputs.py tests/fuzz/regressions
"""
import os
import struct
import sys

import onnx
from onnx import TensorProto, helper

OUT = sys.argv[1] if len(sys.argv) > 1 else "tests/fuzz/regressions"
F = TensorProto.FLOAT


def write(harness, name, data, prefix=b""):
    os.makedirs(os.path.join(OUT, harness), exist_ok=True)
    with open(os.path.join(OUT, harness, name), "wb") as f:
        f.write(prefix + data)


def model(nodes, inputs, outputs, inits=(), functions=(), opset=17, name="g"):
    g = helper.make_graph(nodes, name, inputs, outputs, initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("local", 1)],
                          functions=list(functions))
    return m.SerializeToString()


def huge_initializer(name, dims, raw=b"\0" * 64):
    t = TensorProto()
    t.name, t.data_type = name, F
    t.dims.extend(dims)
    t.raw_data = raw
    return t


def models():
    big = 1 << 32
    # Element count wraps to 0 in int64: [2^32, 2^32].
    idx = helper.make_tensor("idx", TensorProto.INT64, [1, 2], [0, 0])
    upd = helper.make_tensor("upd", F, [1], [1.0])
    write("model", "huge_dims_scatternd.onnx", model(
        [helper.make_node("ScatterND", ["data", "idx", "upd"], ["y"])], [],
        [helper.make_tensor_value_info("y", F, None)], [huge_initializer("data", [big, big]), idx, upd]))
    st = helper.make_tensor("st", TensorProto.INT64, [1], [big - 4])
    en = helper.make_tensor("en", TensorProto.INT64, [1], [big])
    write("model", "huge_dims_slice.onnx", model(
        [helper.make_node("Slice", ["data", "st", "en"], ["y"])], [],
        [helper.make_tensor_value_info("y", F, None)], [huge_initializer("data", [big, big]), st, en]))
    # 4 bytes of raw data declaring 6 GiB.
    write("model", "raw_data_6gib.onnx", model(
        [helper.make_node("Relu", ["w"], ["y"])], [], [helper.make_tensor_value_info("y", F, None)],
        [huge_initializer("w", [1536, 1024, 1024], b"\0\0\0\0")]))
    # A Loop with trip count 2^62 and a condition that stays true.
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Add", ["v_in", "one"], ["v_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_in", F, [1])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), helper.make_tensor_value_info("v_out", F, [1])],
        initializer=[helper.make_tensor("one", F, [1], [1.0])])
    write("model", "loop_2p62.onnx", model(
        [helper.make_node("Loop", ["M", "c", "v0"], ["v"], body=body)], [],
        [helper.make_tensor_value_info("v", F, [1])],
        [helper.make_tensor("M", TensorProto.INT64, [], [1 << 62]), helper.make_tensor("c", TensorProto.BOOL, [], [True]),
         helper.make_tensor("v0", F, [1], [0.0])]))
    # Functions that each call the next twice: 2^40 nodes when inlined.
    funcs = [helper.make_function("local", "f40", ["x"], ["y"], [helper.make_node("Relu", ["x"], ["y"])],
                                  [helper.make_opsetid("", 17)])]
    for k in range(39, -1, -1):
        funcs.append(helper.make_function("local", f"f{k}", ["x"], ["y"], [
            helper.make_node(f"f{k + 1}", ["x"], ["a"], domain="local"),
            helper.make_node(f"f{k + 1}", ["a"], ["y"], domain="local")], [helper.make_opsetid("", 17),
                                                                            helper.make_opsetid("local", 1)]))
    write("model", "function_explosion.onnx", model(
        [helper.make_node("f0", ["x"], ["y"], domain="local")], [helper.make_tensor_value_info("x", F, [4])],
        [helper.make_tensor_value_info("y", F, [4])], functions=funcs))
    # A function calling itself.
    rec = helper.make_function("local", "rec", ["x"], ["y"], [helper.make_node("rec", ["x"], ["y"], domain="local")],
                               [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)])
    write("model", "function_recursion.onnx", model(
        [helper.make_node("rec", ["x"], ["y"], domain="local")], [helper.make_tensor_value_info("x", F, [4])],
        [helper.make_tensor_value_info("y", F, [4])], functions=[rec]))
    # 40 nested Ifs.
    def leaf(k):
        return helper.make_graph([helper.make_node("Identity", ["x"], [f"e{k}"])], f"e{k}", [],
                                 [helper.make_tensor_value_info(f"e{k}", F, [4])])
    inner = leaf(0)
    for k in range(1, 40):  # then-branches nest, else-branches stay one node (no 2^40 copies)
        inner = helper.make_graph([helper.make_node("If", ["c"], [f"r{k}"], then_branch=inner, else_branch=leaf(k))],
                                  f"b{k}", [], [helper.make_tensor_value_info(f"r{k}", F, [4])])
    write("model", "nested_if_40.onnx", model(
        [helper.make_node("If", ["c"], ["y"], then_branch=inner, else_branch=leaf(40))],
        [helper.make_tensor_value_info("c", TensorProto.BOOL, []), helper.make_tensor_value_info("x", F, [4])],
        [helper.make_tensor_value_info("y", F, [4])]))
    # A Conv whose kernel is larger than its input.
    write("model", "conv_kernel_larger_than_input.onnx", model(
        [helper.make_node("Conv", ["x", "w"], ["y"])], [helper.make_tensor_value_info("x", F, [1, 1, 2, 2])],
        [helper.make_tensor_value_info("y", F, None)], [helper.make_tensor("w", F, [2, 1, 3, 3], [0.1] * 18)]))
    # External data outside the folder, through a path and through an absolute name.
    for i, loc in enumerate(["../../../../etc/passwd", "/etc/passwd", "weights..bin"]):
        t = TensorProto()
        t.name, t.data_type = "w", F
        t.dims.extend([4])
        t.data_location = TensorProto.EXTERNAL
        for k, v in (("location", loc), ("offset", "abc" if i == 2 else "0"), ("length", "16")):
            e = t.external_data.add()
            e.key, e.value = k, v
        write("model", f"external_data_{i}.onnx", model(
            [helper.make_node("Relu", ["w"], ["y"])], [], [helper.make_tensor_value_info("y", F, None)], [t]))
    # A fused-function name that carries C++ code (it must never reach a compiler).
    evil = "FusedX\n__attribute__((constructor)) static void evil() { system(\"touch /tmp/gaf-pwned\"); }\n//*/"
    f = helper.make_function("ai.graph_autofusion", evil, ["x"], ["y"], [helper.make_node("Relu", ["x"], ["y"])],
                             [helper.make_opsetid("", 17)])
    g = helper.make_graph([helper.make_node(evil, ["x"], ["y"], domain="ai.graph_autofusion", name="n\n*/")], "g",
                          [helper.make_tensor_value_info("x", F, [4])], [helper.make_tensor_value_info("y", F, [4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.graph_autofusion", 1)],
                          functions=[f])
    write("model", "function_name_injection.onnx", m.SerializeToString())
    for n in os.listdir(os.path.join(OUT, "model")):
        if n.endswith(".onnx"):
            write("fuse", n, open(os.path.join(OUT, "model", n), "rb").read())


def npy(shape_text, payload=b""):
    header = ("{'descr': '<f4', 'fortran_order': False, 'shape': (%s), }" % shape_text).encode()
    header += b" " * ((64 - (10 + len(header) + 1) % 64) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + payload


def tensors():
    write("tensor", "npy_wrapping_shape", npy("4294967296, 4294967296"), b"\x01")
    write("tensor", "npy_6gib_in_100_bytes", npy("1536, 1024, 1024", b"\0" * 100), b"\x01")
    write("tensor", "npy_negative_dim", npy("-1, 4", b"\0" * 16), b"\x01")
    t = huge_initializer("t", [1 << 32, 1 << 32])
    write("tensor", "pb_wrapping_dims", t.SerializeToString(), b"\x00")
    t = huge_initializer("t", [1536, 1024, 1024], b"\0\0\0\0")
    write("tensor", "pb_6gib_in_4_bytes", t.SerializeToString(), b"\x00")


def rules():
    alts = " | ".join(f"Mul($x{i}, $y{i})" for i in range(4))
    lines = ["rule Backtrack fuse=FusedBacktrack"]
    for k in range(12):
        lines.append(f"  n{k} = Add({'n%d' % (k - 1) if k else '$a'}, $b{k}) | Add($b{k}, {'n%d' % (k - 1) if k else '$a'})"
                     f" | {alts.replace('$x0', 'n%d' % (k - 1) if k else '$a')} | Sub($p{k}, $q{k})")
    lines.append("end")
    write("rules", "alternatives_backtrack.rules", ("\n".join(lines) + "\n").encode())
    lines = ["rule Huge fuse=FusedHuge"] + [f"  n{k} = Relu({'n%d' % (k - 1) if k else '$x'})" for k in range(10000)] + ["end"]
    write("rules", "rule_10000_nodes.rules", ("\n".join(lines) + "\n").encode())
    write("rules", "threshold_nan.rules", b"rule R fuse=FusedR threshold=nan\n  y = Relu($x)\nend\n")
    write("rules", "cycle.rules", b"rule C fuse=FusedC\n  a = Relu(b)\n  b = Relu(a)\n  y = Add(a, b)\nend\n")


if __name__ == "__main__":
    models()
    tensors()
    rules()
    print("wrote", OUT)
