#!/usr/bin/env bash
# AddressSanitizer + UndefinedBehaviorSanitizer build of the project in build-asan/ (scripts/asan-build.sh:
# clang with libFuzzer's coverage instrumentation, shared with scripts/fuzz.sh; GCC where clang cannot
# be installed), then the unit and cli tests and the ONNX conformance suite under it; any sanitizer
# report fails the run.
#   scripts/sanitize.sh [ctest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
B=build-asan
scripts/asan-build.sh gaf_unit_tests gaf_conformance autofusion
# Leaks are checked (detect_leaks=1); an error exits with 1 at the first report.
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:halt_on_error=1:exitcode=1
export LSAN_OPTIONS=suppressions=$(pwd)/tests/sanitizer/lsan.supp:print_suppressions=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
ctest --test-dir $B --output-on-failure -j"$(nproc)" -L 'unit|cli|conformance' "$@"
