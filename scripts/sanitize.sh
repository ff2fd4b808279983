#!/usr/bin/env bash
# AddressSanitizer + UndefinedBehaviorSanitizer build (GCC) of the project in build-asan/, then the
# unit and cli tests and the ONNX conformance suite under it; any sanitizer report fails the run.
#   scripts/sanitize.sh [ctest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
B=build-asan
[ -f $B/build.ninja ] || cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DGAF_SANITIZE=ON >/dev/null
ninja -C $B -j"$(nproc)" gaf_unit_tests gaf_conformance autofusion
# Leaks are checked (detect_leaks=1); an error exits with 1 at the first report.
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:halt_on_error=1:exitcode=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
ctest --test-dir $B --output-on-failure -j"$(nproc)" -L 'unit|cli|conformance' "$@"
