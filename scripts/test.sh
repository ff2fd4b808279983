#!/usr/bin/env bash
# Builds and runs every test: unit tests and the ONNX conformance suite (ctest labels unit, conformance, ...).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
ctest --test-dir build --output-on-failure -j"$(nproc)" "$@"
