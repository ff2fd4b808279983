#!/usr/bin/env bash
# Safe fusion on a corpus of models nobody tuned it for: `fuse --safe` with no flags, then the
# result timed against the model as given in one process (`verify --original --repeat`: the
# session `run` uses, interleaved passes over the workload: random inputs, or a short generation
# for decoders), and `fuse --safe` RUNS times more to check that the kept groups are the same.
#
#   bench/safe_corpus.sh [MODEL.onnx...]
#
# Default corpus: the torch.onnx.export fixtures (tests/fixtures/torch, torch_decoders), the CNNs
# of bench/make_cnn_models.py when exported to $CNN_MODELS, and ONNX Runtime's fusion test graphs
# ($SHARED/testdata/ort-fusion; ORT_LIMIT of them, default all, fused once: STABILITY_ORT=1 for
# the stability runs there too). Environment: BUILD (default build), REPEAT (21), RUNS (3).
# Models whose inputs exceed MAX_INPUT_ELEMENTS (default 2^24) are skipped and listed.
# Prints one line per model and a summary: models slower after fuse --safe (the fused side lost
# enough pairs for a one-sided sign test at 1%), and models whose kept groups changed.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
BIN=$BUILD/autofusion
REPEAT=${REPEAT:-21}
RUNS=${RUNS:-3}
SHARED=${SHARED:-../shared}
CNN_MODELS=${CNN_MODELS:-/tmp/gaf-cnn-models}
ORT_LIMIT=${ORT_LIMIT:-100000}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

models=("$@")
if [ ${#models[@]} -eq 0 ]; then
  for d in tests/fixtures/torch/* tests/fixtures/torch_decoders/*; do models+=("$d/model.onnx"); done
  for m in resnet18 mobilenetv2; do [ -f "$CNN_MODELS/$m/model.onnx" ] && models+=("$CNN_MODELS/$m/model.onnx"); done
  n=0
  for f in "$SHARED"/testdata/ort-fusion/*.onnx; do
    [ -f "$f" ] || continue
    n=$((n + 1)); [ "$n" -le "$ORT_LIMIT" ] || break
    models+=("$f")
  done
fi

MAX_INPUT_ELEMENTS=${MAX_INPUT_ELEMENTS:-16777216}
input_elements() {  # model -> elements of its declared inputs (symbolic dims count 1)
  "$BIN" info "$1" --json 2>/dev/null | /usr/bin/python3 -c '
import json, sys
n = 0
for v in json.load(sys.stdin).get("inputs", []):
    p = 1
    for d in v.get("shape", []):
        p *= d if isinstance(d, int) and d > 0 else 1
    n += p
print(n)' 2>/dev/null || echo 0
}

kept_set() {  # report.json -> sorted kept node names, one line
  /usr/bin/python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(",".join(sorted(k["node"] for k in r["kernels"] if k["fused"])) or "-")' "$1"
}

slower=0; unstable=0; measured=0; failed=0; kept_original=0
printf "%-58s %8s %7s %10s %s\n" "model" "result" "speed" "pairs" "kept groups (stable?)"
for m in "${models[@]}"; do
  name=${m#"$SHARED/testdata/"}
  name=${name#tests/fixtures/}
  out="$TMP/f.onnx"; rep="$TMP/r.json"
  elems=$(input_elements "$m")
  if [ "$elems" -gt "$MAX_INPUT_ELEMENTS" ]; then  # e.g. ORT's *_large_tensor graphs: minutes per run here
    printf "%-58s %8s %s\n" "${name:0:58}" "skipped" "inputs of $elems elements (MAX_INPUT_ELEMENTS=$MAX_INPUT_ELEMENTS)"
    continue
  fi
  if ! "$BIN" fuse "$m" -o "$out" --safe --overwrite --report "$rep" >"$TMP/log" 2>&1; then
    failed=$((failed + 1))
    printf "%-58s %8s %s\n" "${name:0:58}" "error" "$(grep -m1 '^error' "$TMP/log" | cut -c1-100)"
    continue
  fi
  first=$(kept_set "$rep")
  orig=$(/usr/bin/python3 -c 'import json,sys; print(int(json.load(open(sys.argv[1]))["end_to_end"]["original_kept"]))' "$rep")
  stable=yes
  runs=$RUNS
  case "$m" in "$SHARED"/*) [ -n "${STABILITY_ORT:-}" ] || runs=1 ;; esac
  for ((k = 1; k < runs; k++)); do
    "$BIN" fuse "$m" -o "$TMP/g.onnx" --safe --overwrite --report "$TMP/s.json" >/dev/null 2>&1 || { stable=error; break; }
    [ "$(kept_set "$TMP/s.json")" = "$first" ] || stable=no
  done
  [ "$runs" -gt 1 ] || stable="-"
  [ "$stable" = no ] && unstable=$((unstable + 1))
  ngroups=$([ "$first" = "-" ] && echo 0 || echo "$first" | tr ',' '\n' | wc -l)
  if [ "$orig" = 1 ] || [ "$ngroups" -eq 0 ]; then
    kept_original=$((kept_original + 1))
    printf "%-58s %8s %7s %10s %s\n" "${name:0:58}" "original" "1.00x" "-" "0 ($stable)"
    continue
  fi
  if ! "$BIN" verify "$out" --original "$m" --repeat "$REPEAT" --json >"$TMP/v.json" 2>"$TMP/verr"; then
    failed=$((failed + 1))
    printf "%-58s %8s %s\n" "${name:0:58}" "verify!" "$(head -1 "$TMP/verr" | cut -c1-100)"
    continue
  fi
  read -r speed won needed <<<"$(/usr/bin/python3 -c 'import json,sys; p=json.load(open(sys.argv[1]))["performance"]; print("%.2f %d %d" % (p["speedup"], p["pairs_won"], p["pairs_needed"]))' "$TMP/v.json")"
  measured=$((measured + 1))
  verdict=fused
  if [ $((REPEAT - won)) -ge "$needed" ]; then verdict=SLOWER; slower=$((slower + 1)); fi
  printf "%-58s %8s %6sx %10s %s\n" "${name:0:58}" "$verdict" "$speed" "$won/$REPEAT" "$ngroups ($stable)"
done
echo "summary: ${#models[@]} models; $measured fused and timed, $kept_original kept as given, $failed errors;" \
     "$slower slower after fuse --safe (sign test at 1%, $REPEAT pairs); $unstable whose kept groups changed over $RUNS runs"
[ "$slower" -eq 0 ] && [ "$unstable" -eq 0 ]
