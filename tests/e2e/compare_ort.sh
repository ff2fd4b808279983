#!/usr/bin/env bash
# Differential test against ONNX Runtime on ONNX models the team did not write: random inputs
# (.npy), `autofusion run` and ONNX Runtime (bench/ort_run.js) on the same files, outputs compared
# with rtol 1e-4, atol 1e-5 (1e-3 for graphs that compute in float16). One line per model and a
# final `N passed, N failed, N skipped`; exit status 1 when any model failed.
#
#   tests/e2e/compare_ort.sh [MODEL...]      default: the list below
#
# Models: /work/shared/testdata/ort-fusion/*.onnx except those with com.microsoft operators
# (ONNX Runtime's own), and from libonnx-testdata: the pytorch-converted and pytorch-operator
# models, simple/test_expand_shape_model*, and the node tests *_expanded (decomposed operators).
# Environment: BUILD (default build), ORT_FUSION_DIR, ONNX_TESTDATA (/usr/share/libonnx-testdata/data),
# COMPARE_ARGS (extra options for bench/compare_ort.js, e.g. "--keep /tmp/cmp --verbose").
# Needs `ONNXRUNTIME_NODE_INSTALL=skip npm ci` in bench/ (done here when node_modules is missing).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
ORT_FUSION_DIR=${ORT_FUSION_DIR:-/work/shared/testdata/ort-fusion}
ONNX_TESTDATA=${ONNX_TESTDATA:-/usr/share/libonnx-testdata/data}
AF="$BUILD/autofusion"
[ -x "$AF" ] || { echo "compare_ort.sh: $AF not found; build it first (ninja -C $BUILD autofusion)" >&2; exit 1; }
if [ ! -d bench/node_modules/onnxruntime-node ]; then
  (cd bench && ONNXRUNTIME_NODE_INSTALL=skip npm ci --no-audit --no-fund >/dev/null)
fi

models=("$@")
if [ ${#models[@]} -eq 0 ]; then
  excluded=0
  if [ -d "$ORT_FUSION_DIR" ]; then
    for f in "$ORT_FUSION_DIR"/*.onnx; do
      # A node in the com.microsoft domain prints as `= com.microsoft.Op(` in the dump.
      if "$AF" dump "$f" 2>/dev/null | grep -q '= com\.microsoft\.'; then excluded=$((excluded + 1)); continue; fi
      models+=("$f")
    done
  fi
  if [ -d "$ONNX_TESTDATA" ]; then
    for d in "$ONNX_TESTDATA"/pytorch-converted/*/ "$ONNX_TESTDATA"/pytorch-operator/*/ \
             "$ONNX_TESTDATA"/simple/test_expand_shape_model*/ "$ONNX_TESTDATA"/node/*_expanded/; do
      [ -f "$d/model.onnx" ] && models+=("${d%/}/model.onnx")
    done
  fi
  echo "${#models[@]} models ($excluded ort-fusion graphs with com.microsoft operators left out)"
fi
# The list goes through a file: a long argv eats into the main thread's stack, and ONNX Runtime
# recurses deeply enough on some of these graphs to overflow what is left (a segfault).
list=$(mktemp)
trap 'rm -f "$list"' EXIT
printf '%s\n' "${models[@]}" >"$list"
# shellcheck disable=SC2086
node bench/compare_ort.js --autofusion "$AF" ${COMPARE_ARGS:-} --list "$list"
