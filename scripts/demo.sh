#!/usr/bin/env bash
# The main job on the built-in default model: build, write the tiny Llama-style decoder, analyze it,
# fuse it safely (each fused kernel checked for precision and speed on its real inputs, failures
# rolled back with the reason), verify the fused model, generate with both, and print the stage
# table (unfused vs fused, measured side by side).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
OUT=${OUT:-out/tiny}
build/autofusion example llama --preset tiny -o "$OUT"
build/autofusion analyze "$OUT/model.onnx" --preset transformer | tail -1
build/autofusion fuse "$OUT/model.onnx" --preset transformer -o "$OUT/fused.onnx" --safe --report "$OUT/safe_fusion.json"
# When no fused model was faster here (the end-to-end speed gate kept the model as given: on a busy
# or slow machine a 0.2 ms model can go either way), there is no fused operator to verify.
if grep -q '"original_kept": true' "$OUT/safe_fusion.json"; then
  echo "== verify: nothing to verify: fuse --safe kept the model as given on this machine (reasons above and in" \
       "$OUT/safe_fusion.json); verifying the unsafe fusion instead =="
  build/autofusion fuse "$OUT/model.onnx" --preset transformer -o "$OUT/fused_unsafe.onnx" | tail -1
  build/autofusion verify "$OUT/fused_unsafe.onnx" --original "$OUT/model.onnx"
else
  echo "== verify: fused model with generated kernels vs the original =="
  build/autofusion verify "$OUT/fused.onnx" --original "$OUT/model.onnx"
fi
echo "== original =="
build/autofusion generate "$OUT/model.onnx" --max-new-tokens 20 --repeat 3
echo "== fused =="
build/autofusion generate "$OUT/fused.onnx" --max-new-tokens 20 --repeat 3
echo "== stage table =="
build/autofusion bench "$OUT/model.onnx" --preset transformer --repeat 5 -n 20
