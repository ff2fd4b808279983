#!/usr/bin/env bash
# The portable paths: the kernels that have an AVX-512 form (ir/simd.h GAF_AVX512: the panel tiles,
# the attention tiles, the float16 conversions, the GEMVs...) also have loops for machines without
# it, which an AVX-512 machine never runs. This builds the project for x86-64-v3 (AVX2 and FMA, as
# most laptops and older servers have) into build-portable/ and runs the unit, cli and conformance
# tests on it, so that those loops answer the same tests. -O1: the build takes about half of -O2's
# time and the tests run at much the same speed. Generated kernels still compile for the machine
# (codegen/compiler.cc), as they would on a user's.
#   scripts/test-portable.sh [ctest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
B=build-portable
[ -f $B/build.ninja ] || cmake -S . -B $B -G Ninja -DGAF_MARCH=x86-64-v3 -DCMAKE_BUILD_TYPE=None \
  -DCMAKE_CXX_FLAGS="-O1 -DNDEBUG" >/dev/null
ninja -C $B -j"$(nproc)" gaf_unit_tests gaf_conformance autofusion
ctest --test-dir $B --output-on-failure -j"$(nproc)" -L 'unit|cli|conformance' "$@"
