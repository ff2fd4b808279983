#!/usr/bin/env bash
# Builds the libFuzzer harnesses (tests/fuzz) with clang, AddressSanitizer and UBSan in build-asan/
# (scripts/asan-build.sh: the build scripts/sanitize.sh tests, so CI compiles the project once for
# both), and runs each for SECONDS (default 60) on seed corpora made from the repository's
# test models, rule files and tensors (plus ONNX's node tests when installed). Prints each
# harness's executions per second and coverage; exits 1 on the first crash, leak or timeout,
# leaving the input in build-asan/artifacts/ (add it to tests/fuzz/regressions/HARNESS/ with the fix);
# exits 98 when clang and libFuzzer cannot be installed.
#
#   scripts/fuzz.sh [SECONDS] [HARNESS...]      harnesses: model rules tensor fuse (default all)
#   FUZZ_SEED=N: libFuzzer's random seed (CI sets 1, so that a run is repeatable; default: random)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
shift || true
harnesses=("$@")
[ ${#harnesses[@]} -gt 0 ] || harnesses=(model rules tensor fuse)
B=build-asan
set +e
scripts/asan-build.sh $(printf 'fuzz_%s ' "${harnesses[@]}")
rc=$?
set -e
[ "$rc" -eq 98 ] && { echo "fuzz.sh: clang and libFuzzer are not installed and cannot be; no fuzzing" >&2; exit 98; }
[ "$rc" -eq 0 ] || exit "$rc"

seed() {  # seed HARNESS DIR: copies the seed inputs of HARNESS into DIR
  local h=$1 d=$2 node=/usr/share/libonnx-testdata/data/node
  mkdir -p "$d"
  case $h in
    model|fuse)
      cp tests/fixtures/onnx/*.onnx "$d"/
      for m in tests/fixtures/torch/*/model.onnx; do cp "$m" "$d/$(basename "$(dirname "$m")").onnx"; done
      if [ -d $node ]; then for t in add conv_with_strides_padding loop11 if scan9_sum layer_normalization_2d_axis0 \
          gather_0 reshape_extended_dims slice softmax_axis_0 matmul_2d einsum_batch_matmul; do
        [ -f $node/test_$t/model.onnx ] && cp $node/test_$t/model.onnx "$d/node_$t.onnx"; done; fi ;;
    rules) cp rules/examples/* "$d"/ 2>/dev/null || true ;;
    tensor)
      for f in tests/fixtures/torch/*/*.npy; do { printf '\001'; cat "$f"; } > "$d/$(basename "$(dirname "$f")")_$(basename "$f")"; done
      if [ -d $node ]; then for t in add cast_FLOAT_to_FLOAT16 gather_0 slice; do
        f=$node/test_$t/test_data_set_0/input_0.pb
        [ -f $f ] && { printf '\000'; cat "$f"; } > "$d/$t.pb"; done; fi ;;
  esac
  # earlier crashes stay in the corpus
  if [ -d tests/fuzz/regressions/$h ]; then cp tests/fuzz/regressions/$h/* "$d"/ 2>/dev/null || true; fi
}

mkdir -p $B/artifacts
export ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export LSAN_OPTIONS=suppressions=$(pwd)/tests/sanitizer/lsan.supp:print_suppressions=0
for h in "${harnesses[@]}"; do
  corpus=$B/corpus/$h
  seed "$h" "$corpus"
  log=$B/fuzz_$h.log
  echo "== fuzz_$h: ${secs}s, $(ls "$corpus" | wc -l) corpus inputs"
  if ! $B/tests/fuzz/fuzz_$h "$corpus" -max_total_time="$secs" -timeout=20 -rss_limit_mb=3072 -max_len=262144 \
      -artifact_prefix=$B/artifacts/${h}- -print_final_stats=1 ${FUZZ_SEED:+-seed=$FUZZ_SEED} >"$log" 2>&1; then
    tail -40 "$log"
    echo "== fuzz_$h: FAILED (input in $B/artifacts/)"
    exit 1
  fi
  runs=$(grep -oE '^stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' || echo '?')
  rate=$(grep -oE '^stat::average_exec_per_sec: *[0-9]+' "$log" | grep -oE '[0-9]+$' || echo '?')
  cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+' "$log" | tail -1)
  echo "   clean: $runs executions, $rate exec/s, $cov, corpus $(ls "$corpus" | wc -l)"
done
