#!/usr/bin/env bash
# Builds and runs every test: unit tests and the ONNX conformance suite (ctest labels unit, conformance, ...).
# Tests that need data from outside the repository (../shared/testdata, or GAF_SHARED_DIR) skip without it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
shared=${GAF_SHARED_DIR:-../shared}
if [ ! -d "$shared/testdata/ort-fusion" ]; then
  echo "note: $shared/testdata/ort-fusion not found: the tests on ONNX Runtime's fusion graphs will skip" \
       "(put the project's shared/ folder beside the checkout, or set GAF_SHARED_DIR)"
fi
ctest --test-dir build --output-on-failure -j"$(nproc)" "$@"
