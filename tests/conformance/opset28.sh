#!/usr/bin/env bash
# ONNX's node tests to opset 28 (the project's shared data: testdata/onnx-backend-opset28, 1,802
# tests with Attention, RMSNormalization, RotaryEmbedding, Swish, SwiGLU and their _expanded
# twins) on our runtime: every test of an operator we claim must pass, and at least MIN_PASS pass.
# Skipped (exit 77) where the shared data is not there (a user's clone has no ../shared).
#   opset28.sh GAF_CONFORMANCE SOURCE_DIR [MIN_PASS]
set -euo pipefail
bin=$1 src=$2 min=${3:-1450}
data=${GAF_SHARED_DIR:-$src/../shared}/testdata/onnx-backend-opset28
if [ ! -d "$data/node" ]; then
  echo "skipped: needs $data (ONNX's opset-28 node tests): put the project's shared/ folder beside the checkout or point GAF_SHARED_DIR at it"
  exit 77
fi
exec "$bin" --data "$data" --min-node-pass "$min"
