#!/usr/bin/env bash
# Real CNN architectures (bench/make_cnn_models.py: exported by torch.onnx.export with random
# weights): our stage table (baseline unfused, + fusion, + safe fusion; medians of interleaved runs
# in one process, with ONNX Runtime's row: all optimizations, on the same input), then the model
# fused by `fuse --safe` and ONNX Runtime side by side, each in its own processes, alternating.
#
#   bench/cnn_bench.sh [MODEL...]
#     models: resnet18 mobilenetv2 resnet50 densenet121 (1x3xSIZExSIZE), mobilenetv2_nhwc (1xSIZExSIZEx3,
#     Keras-style: NHWC, ZeroPadding2D, as tf2onnx exports), yolox_nano (1x3x416x416),
#     ppocr_det (1x3x640x640, height and width dynamic); default: all seven
#
# Environment: BUILD (build dir, default build), MODELS (default /tmp/gaf-cnn-models), SIZE (224;
# the input side of the classifiers when they are exported), THREADS (1,2), REPEAT (11),
# SKIP_BUILD=1 (use $BUILD/autofusion as it is), ROUNDS (3: alternating rounds of the side-by-side
# comparison with ONNX Runtime). Each model's input is its folder's input.npy.
# Needs: /usr/bin/python3 with torch (Debian's python3-torch) to export the models missing from
# $MODELS (once), and `npm ci` in bench/ for ONNX Runtime (done here when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
MODELS=${MODELS:-/tmp/gaf-cnn-models}
SIZE=${SIZE:-224}
THREADS=${THREADS:-1,2}
REPEAT=${REPEAT:-11}
ROUNDS=${ROUNDS:-3}
models=("$@")
[ ${#models[@]} -gt 0 ] || models=(resnet18 mobilenetv2 resnet50 yolox_nano densenet121 ppocr_det mobilenetv2_nhwc)

if [ -z "${SKIP_BUILD:-}" ]; then
  log=$(mktemp)
  ninja -C "$BUILD" -j1 autofusion >"$log" 2>&1 || { cat "$log"; rm -f "$log"; exit 1; }
  rm -f "$log"
fi
if [ ! -d bench/node_modules/onnxruntime-node ]; then
  (cd bench && ONNXRUNTIME_NODE_INSTALL=skip npm ci --no-audit --no-fund >/dev/null)
fi
missing=()
for m in "${models[@]}"; do [ -f "$MODELS/$m/model.onnx" ] || missing+=("$m"); done
if [ ${#missing[@]} -gt 0 ]; then  # exports just those (a failure is reported below, per model)
  /usr/bin/python3 -W ignore::UserWarning bench/make_cnn_models.py "$MODELS" "$SIZE" "${missing[@]}" || true
fi

echo "machine: $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) cores), $(date -u +%Y-%m-%dT%H:%MZ)"
echo "load:    $(cut -d' ' -f1-3 /proc/loadavg)"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for m in "${models[@]}"; do
  model="$MODELS/$m/model.onnx"
  [ -f "$model" ] || { echo "cnn_bench.sh: $model is missing (export failed?)" >&2; exit 1; }
  echo
  echo "=== $m ($model)"
  for t in ${THREADS//,/ }; do
    # The stage table with ONNX Runtime's row (bench runs bench/ort_run.js itself); the fused
    # kernels' lists after it are left out (read to the end: quitting early would cut bench off).
    "$BUILD/autofusion" bench "$model" -i "image=$MODELS/$m/input.npy" --preset cnn --threads "$t" --repeat "$REPEAT" \
      --safe | sed '/^fused kernels of/,$d'
  done
  # Side by side with ONNX Runtime on equal terms: the model fused by `fuse --safe` and ORT, each
  # timed back to back in its own process after one untimed run (warm caches for both), processes alternating for
  # ROUNDS rounds; the median of the per-round medians and their ratio.
  "$BUILD/autofusion" fuse "$model" -i "image=$MODELS/$m/input.npy" --preset cnn --safe -o "$out/fused.onnx" >/dev/null
  for t in ${THREADS//,/ }; do
    ours=() theirs=()
    for r in $(seq "$ROUNDS"); do
      ours+=("$("$BUILD/autofusion" run "$out/fused.onnx" -i "image=$MODELS/$m/input.npy" --threads "$t" --warmup 1 \
        --repeat "$REPEAT" | sed -n 's/^ran .* in \([0-9.]*\) ms.*/\1/p')")
      theirs+=("$(node bench/ort_run.js "$model" -i "image=$MODELS/$m/input.npy" -o "$out" --opt all --threads "$t" \
        --repeat "$REPEAT" | sed -n 's/^ort median ms: \([0-9.]*\).*/\1/p')")
    done
    /usr/bin/python3 -c "
import statistics as st, sys
o = [float(v) for v in '${ours[*]}'.split()]; e = [float(v) for v in '${theirs[*]}'.split()]
print('  fused --safe vs ONNX Runtime, %s thread(s), %d alternating rounds: ours %.3f ms, ORT %.3f ms -> %.2fx '
      '(rounds: %s)' % ('$t', len(o), st.median(o), st.median(e), st.median(e) / st.median(o),
                        ', '.join('%.2fx' % (b / a) for a, b in zip(o, e))))
"
  done
  # Our outputs on the exported input against PyTorch's: unfused and fused.
  "$BUILD/autofusion" run "$model" -i "image=$MODELS/$m/input.npy" -o "$out/ours" >/dev/null
  "$BUILD/autofusion" run "$out/fused.onnx" -i "image=$MODELS/$m/input.npy" -o "$out/fused" >/dev/null
  /usr/bin/python3 -c "
import numpy as np, sys
b = np.load('$MODELS/$m/expected_output.npy')
for name in ('ours', 'fused'):
    a = np.load('$out/%s/logits.npy' % name)
    print('  %s output vs PyTorch: max abs error %.2e' % ('unfused' if name == 'ours' else 'fused --safe', float(np.abs(a - b).max())))
"
done
