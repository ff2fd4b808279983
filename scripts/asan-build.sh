#!/usr/bin/env bash
# Configures and builds the sanitizer build in build-asan/ (TARGETS... as ninja targets), shared by
# scripts/sanitize.sh (the tests under AddressSanitizer + UBSan) and scripts/fuzz.sh (the libFuzzer
# harnesses), so that CI compiles the project once for both instead of twice.
#
# With clang and libFuzzer (installed here from Debian's packages when missing) the build is clang
# with AddressSanitizer, UBSan and libFuzzer's coverage instrumentation (GAF_FUZZ): the tests and the
# harnesses link the same objects. Without them it is GCC with the two sanitizers (GAF_SANITIZE),
# the harnesses cannot be built, and this exits 98 when asked for one.
#
#   scripts/asan-build.sh TARGET...       exit 98: a harness asked for without clang and libFuzzer
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
B=build-asan
need=()
for p in clang libclang-rt-14-dev libomp-14-dev; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
      "${need[@]}"; } >&2 || echo "asan-build.sh: cannot install ${need[*]} (clang and libFuzzer): a GCC build, no fuzzers" >&2
fi
clang=0
command -v clang++ >/dev/null && dpkg-query -W -f='${Status}' libclang-rt-14-dev 2>/dev/null | grep -q "install ok installed" \
  && clang=1
# A build folder configured the other way (an older checkout's GCC build, say) is made again.
if [ -f $B/CMakeCache.txt ]; then
  fuzz_on=0
  grep -q '^GAF_FUZZ:BOOL=ON' $B/CMakeCache.txt && fuzz_on=1
  [ "$fuzz_on" -eq "$clang" ] || rm -rf $B
fi
if [ ! -f $B/build.ninja ]; then
  if [ "$clang" -eq 1 ]; then
    CC=clang CXX=clang++ cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DGAF_FUZZ=ON >/dev/null
  else
    cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DGAF_SANITIZE=ON >/dev/null
  fi
fi
for t in "$@"; do
  if [[ $t == fuzz_* ]] && [ "$clang" -eq 0 ]; then
    echo "asan-build.sh: $t needs clang and libFuzzer" >&2
    exit 98
  fi
done
ninja -C $B -j"$(nproc)" "$@"
