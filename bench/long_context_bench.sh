#!/usr/bin/env bash
# Decode at a long past, side by side, in interleaved rounds: a generation of 40 tokens after a
# prompt of PROMPT (2000) tokens, ours with the KV cache appended in place, ours copying it into a
# new present every step (--no-cache-in-place), ONNX Runtime (all optimizations); then ours after a
# 16-token prompt and the machine's read bandwidth (bench/membw), for the issue-14 floor: the step at
# the long past costs at most (the short-past step + the cache's bytes at that bandwidth) x 1.15.
#
#   bench/long_context_bench.sh [MODEL]     (default: the bench Llama, made if missing)
# Needs the build (autofusion, bench/membw) and `npm install` in bench/ for the ONNX Runtime column.
set -euo pipefail
cd "$(dirname "$0")/.."
M=${1:-/tmp/gaf-bench-models/bench/model.onnx}
PROMPT=${PROMPT:-2000}
ROUNDS=${ROUNDS:-3}
[ -f "$M" ] || build/autofusion example llama --preset bench -o "$(dirname "$M")" >/dev/null
ids=$(python3 -c "import random; random.seed(3); print(','.join(str(random.randrange(1, 32000)) for _ in range($PROMPT)))")
# Bytes of the KV cache at the long past (batch 1, float32), from the past inputs' declared shapes.
kv=$(/usr/bin/python3 - "$M" "$PROMPT" <<'PY'
import sys, onnx
m = onnx.load(sys.argv[1], load_external_data=False)
total = 0
for i in m.graph.input:
    if i.name.startswith("past"):
        dims = [d.dim_value for d in i.type.tensor_type.shape.dim]
        total += dims[1] * int(sys.argv[2]) * dims[3] * 4
print(total)
PY
)
echo "KV cache at past $PROMPT: $(awk -v b="$kv" 'BEGIN { printf "%.1f MB", b / 1e6 }')"
# A generation's decode ms/token (and with `tokens`, its first tokens) from its JSON; a generation
# that fails stops the bench with its own error (a model whose position table is shorter than the
# past, say), not a JSON parser's.
decode() {
  local tokens=$1 out
  shift
  if ! out=$("$@" 2>&1); then
    echo "long_context_bench: $1 $2 (prompt of $PROMPT tokens) failed: $(tail -n 1 <<<"$out")" >&2
    exit 1
  fi
  python3 -c 'import json,sys; j=json.load(sys.stdin); print(round(j["decode_ms_per_token"],3), *([j["tokens"][:6]] if sys.argv[1] == "1" else []))' "$tokens" <<<"$out"
}
for r in $(seq "$ROUNDS"); do
  a=$(decode 1 build/autofusion generate $M --prompt-ids $ids -n 40 --threads 2 --repeat 2 --json)
  b=$(decode 1 build/autofusion generate $M --prompt-ids $ids -n 40 --threads 2 --repeat 2 --no-cache-in-place --json)
  o=$(decode 1 node bench/ort_generate.js $M --prompt-ids $ids --max-new-tokens 40 --threads 2 --opt all --repeat 2)
  s=$(decode 0 build/autofusion generate $M --prompt-len 16 -n 40 --threads 2 --repeat 2 --json)
  bw=$(build/bench/membw 2>/dev/null | python3 -c 'import json,sys; print([x["gbps"] for x in json.load(sys.stdin)["results"] if x["threads"]==2][0])')
  echo "round $r | decode ms/token and first tokens at past $PROMPT: in place $a | copied $b | ONNX Runtime (all) $o |"\
       "ours at past 16: $s | membw $bw GB/s"
  awk -v s="$s" -v kv="$kv" -v bw="$bw" -v a="${a%% *}" 'BEGIN { f = (s + kv / bw / 1e6) * 1.15;
    printf "  floor (past-16 step + cache at membw) x 1.15 = %.3f ms: in place %.3f ms, %s\n", f, a, a <= f ? "met" : "NOT met" }'
done
