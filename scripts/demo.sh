#!/usr/bin/env bash
# The main job on the built-in default model: build, write the tiny Llama-style decoder, analyze and
# fuse it, then generate with the original and with the fused model (generated kernels).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
OUT=${OUT:-out/tiny}
build/autofusion example llama --preset tiny -o "$OUT"
build/autofusion analyze "$OUT/model.onnx" --preset transformer | tail -1
build/autofusion fuse "$OUT/model.onnx" --preset transformer -o "$OUT/fused.onnx"
echo "== original =="
build/autofusion generate "$OUT/model.onnx" --max-new-tokens 20 --repeat 3
echo "== fused =="
build/autofusion generate "$OUT/fused.onnx" --max-new-tokens 20 --repeat 3
