#!/usr/bin/env bash
# `autofusion bench` on a small CNN: the stage table with its memory plan note and the model as given
# under the full runtime, and ONNX Runtime's
# row where node and onnxruntime-node are installed in bench/ (else the line saying why it is not
# compared, with the install step); --no-ort and a bench folder without ONNX Runtime say so.
set -u
BIN="$1"
SRC="$2"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
MODEL="$SRC/tests/fixtures/torch/resnet_like/model.onnx"
fail=0
check() {  # description, pattern, file
  if grep -q -- "$2" "$3"; then echo "ok   $1"; else echo "FAIL $1: no '$2' in:"; cat "$3"; fail=1; fi
}
"$BIN" bench "$MODEL" --preset cnn --threads 1 --repeat 1 --no-ort >"$TMP/no_ort" 2>&1 || { echo "FAIL bench --no-ort exited $?"; cat "$TMP/no_ort"; exit 1; }
check "stage table" "+ memory reuse" "$TMP/no_ort"
check "the model as given with the full runtime" "^  as given, full runtime  *[0-9.]* *[0-9.]* *[0-9.]*x.*what run and generate do" "$TMP/no_ort"
check "memory plan note" "buffers from a .* KiB arena" "$TMP/no_ort"
check "--no-ort" "ONNX Runtime: not compared (--no-ort)" "$TMP/no_ort"
mkdir -p "$TMP/empty_bench"
GAF_BENCH_DIR="$TMP/empty_bench" "$BIN" bench "$MODEL" --preset cnn --threads 1 --repeat 1 >"$TMP/missing" 2>&1 || { echo "FAIL bench without ONNX Runtime exited $?"; cat "$TMP/missing"; exit 1; }
if command -v node >/dev/null; then
  check "no onnxruntime-node" "ONNX Runtime: not compared: no onnxruntime-node in $TMP/empty_bench/node_modules" "$TMP/missing"
else
  check "no node" "ONNX Runtime: not compared: node is not installed" "$TMP/missing"
fi
if command -v node >/dev/null && [ -f "$SRC/bench/node_modules/onnxruntime-node/package.json" ]; then
  GAF_BENCH_DIR="$SRC/bench" "$BIN" bench "$MODEL" --preset cnn --threads 1 --repeat 2 >"$TMP/ort" 2>&1 || { echo "FAIL bench with ONNX Runtime exited $?"; cat "$TMP/ort"; exit 1; }
  check "ONNX Runtime row" "ONNX Runtime (all) .*onnxruntime-node" "$TMP/ort"
  check "ratios against ONNX Runtime" "against ONNX Runtime (median of the rounds' ratios" "$TMP/ort"
else
  echo "skipped: the ONNX Runtime row (needs node and, in bench/, ONNXRUNTIME_NODE_INSTALL=skip npm ci)"
fi
exit "$fail"
