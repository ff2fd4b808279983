#!/usr/bin/env bash
# Generated-kernel coverage on models the team did not write: `autofusion compile` (preset all) on
# ONNX Runtime's fusion test graphs, the torch fixtures and, when exported, the real CNNs of
# bench/make_cnn_models.py; prints per model the fused functions with a kernel or running their
# body (with the reason), then the totals and the reasons counted.
#
#   bench/kernel_coverage.sh [MODEL.onnx ...]      (default: the sets above)
# Environment: BUILD (build dir, default build), SHARED (default ../shared next to the repo).
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
SHARED=${SHARED:-$(cd .. && pwd)/shared}
models=("$@")
if [ ${#models[@]} -eq 0 ]; then
  models=("$SHARED"/testdata/ort-fusion/*.onnx tests/fixtures/torch/*/model.onnx)
  for m in /tmp/gaf-cnn-models/*/model.onnx; do [ -f "$m" ] && models+=("$m"); done
fi
out=$(mktemp -d)
log="$out/log"
trap 'rm -rf "$out"' EXIT
for f in "${models[@]}"; do
  echo "=== $f" | tee -a "$log"
  timeout 120 "$BUILD/autofusion" compile "$f" --preset all -o "$out/k" 2>&1 | grep -E "kernel sites|body   sites|rror" | tee -a "$log"
done
echo
echo "models: ${#models[@]}; fused functions with a generated kernel: $(grep -c 'kernel sites' "$log"); running their body: $(grep -c 'body   sites' "$log")"
echo "why not generated (count, reason with names elided):"
grep "not generated" "$log" | sed 's/.*not generated: //' |
  sed -E "s/node '[^']*'/node X/; s/input [0-9]+ \('[^']*'\)/input N/; s/output '[^']*'/output X/; s/'[^']*'/Q/g" |
  cut -c1-120 | sort | uniq -c | sort -rn
