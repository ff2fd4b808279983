#!/usr/bin/env bash
# One decode step of a decoder in the past/present layout (Optimum / torch.onnx.export with a KV
# cache), ours against ONNX Runtime (all optimizations) on the same inputs, at a given batch and
# past length: each round runs `autofusion run` and bench/ort_run.js once each (fresh processes,
# interleaved), each timing REPEAT steps after a warm-up step; medians over rounds (SEQ>1: bench/fma_peak
# in the same rounds, and the step's weight-product GFLOPS as a fraction of it).
#
#   bench/decode_step_bench.sh MODEL [BATCH=1] [PAST=16]
#
# Environment: BUILD (build), THREADS (2), REPEAT (20), ROUNDS (3), SEQ (1: new tokens per step;
# SEQ=256 with PAST=0 times a prefill of 256 tokens, and prints its GFLOPS in the products).
# Needs: the build, /usr/bin/python3 with numpy and onnx, and `npm install` in bench/.
set -euo pipefail
cd "$(dirname "$0")/.."
model=$1
batch=${2:-1}
past=${3:-16}
BUILD=${BUILD:-build}
THREADS=${THREADS:-2}
REPEAT=${REPEAT:-20}
ROUNDS=${ROUNDS:-3}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

# Inputs from the model's declared inputs: batch_size=BATCH, sequence_length=1,
# past_sequence_length=PAST, total_sequence_length=PAST+1 (a sum of dims is evaluated); token ids 1..; positions after the past.
SEQ=${SEQ:-1}
/usr/bin/python3 - "$model" "$dir" "$batch" "$past" "$SEQ" <<'EOF'
import sys, numpy as np, onnx
model, out, batch, past, seq = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
dims = {"batch_size": batch, "sequence_length": seq, "past_sequence_length": past, "total_sequence_length": past + seq}
m = onnx.load(model, load_external_data=False)
inits = {t.name for t in m.graph.initializer}
rng = np.random.default_rng(0)
args = []
for i in m.graph.input:
    if i.name in inits:
        continue
    shape = []
    for d in i.type.tensor_type.shape.dim:
        if d.HasField("dim_value"):
            shape.append(d.dim_value)
        else:
            shape.append(sum(dims[p.strip()] for p in d.dim_param.split("+")))
    et = i.type.tensor_type.elem_type
    if i.name == "position_ids":
        a = np.broadcast_to(np.arange(past, past + seq, dtype=np.int64), shape).copy()
    elif i.name == "input_ids":
        a = (np.arange(np.prod(shape)) % 50 + 1).reshape(shape).astype(np.int64)
    elif et == onnx.TensorProto.INT64:
        a = np.ones(shape, dtype=np.int64)
    else:
        a = (rng.standard_normal(shape) * 0.5).astype(np.float32)
    np.save(f"{out}/{i.name}.npy", a)
    args.append(f"{i.name}={out}/{i.name}.npy")
open(f"{out}/args", "w").write("\n".join(args))
# The multiply-adds of the matrix products: those by constant weights (MatMul/Gemm whose B is an
# initializer), and all MatMuls (the attention's too) at these input shapes, by ONNX shape inference.
shapes = {t.name: list(t.dims) for t in m.graph.initializer}
weights = sum(2 * shapes[n.input[1]][0] * shapes[n.input[1]][1] for n in m.graph.node
              if n.op_type in ("MatMul", "Gemm") and len(n.input) > 1 and len(shapes.get(n.input[1], [])) == 2)
for i in m.graph.input:
    if i.name in inits:
        continue
    a = np.load(f"{out}/{i.name}.npy")
    for d, v in zip(i.type.tensor_type.shape.dim, a.shape):
        d.ClearField("dim_param")
        d.dim_value = v
inferred = onnx.shape_inference.infer_shapes(m)
known = dict(shapes)
for v in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
    vdims = v.type.tensor_type.shape.dim
    if all(d.HasField("dim_value") for d in vdims):
        known[v.name] = [d.dim_value for d in vdims]
total = 0
for n in m.graph.node:
    if n.op_type != "MatMul":
        continue
    a, b = known.get(n.input[0]), known.get(n.input[1])
    if not a or not b or len(a) < 2 or len(b) < 2:  # a shape unknown (or a vector operand): no total printed
        total = -1
        break
    batch_a = int(np.prod(a[:-2])) if len(a) > 2 else 1
    batch_b = int(np.prod(b[:-2])) if len(b) > 2 else 1
    total += 2 * max(batch_a, batch_b) * a[-2] * a[-1] * b[-1]
open(f"{out}/flops", "w").write(f"{weights * batch * seq} {total}\n")
EOF
mapfile -t feeds < "$dir/args"
in_args=()
for f in "${feeds[@]}"; do in_args+=(-i "$f"); done

ours=() ort=() peak=()
# A run that prints no time failed: show what it said.
timed() {
  local out t
  out=$("$@" 2>&1) || true
  t=$(sed -n -e 's/^ran .* in \([0-9.]*\) ms.*/\1/p' -e 's/^ort median ms: \([0-9.]*\).*/\1/p' <<<"$out")
  if [ -z "$t" ]; then
    echo "decode_step_bench: $1 failed:" >&2
    tail -3 <<<"$out" >&2
    exit 1
  fi
  echo "$t"
}
for ((r = 0; r < ROUNDS; r++)); do
  ours+=("$(timed "$BUILD"/autofusion run "$model" "${in_args[@]}" --warmup 1 --repeat "$REPEAT" --threads "$THREADS")")
  ort+=("$(timed node bench/ort_run.js "$model" "${in_args[@]}" -o "$dir/ort" --opt all --threads "$THREADS" --repeat "$REPEAT")")
  # A prompt's step is compute-bound: the machine's multiply-add peak, measured in the same rounds.
  if [ "$SEQ" -gt 1 ] && [ -x "$BUILD/bench/fma_peak" ]; then
    p=$("$BUILD"/bench/fma_peak --threads "$THREADS" --repeat 5 | sed -n 's/.*"gflops": \([0-9.]*\).*/\1/p')
    if [ -n "$p" ]; then peak+=("$p"); fi
  fi
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
mo=$(median "${ours[@]}")
mr=$(median "${ort[@]}")
echo "step of $SEQ token(s), batch $batch, past $past, $THREADS thread(s), medians of $ROUNDS rounds x $REPEAT steps"
echo "  ours ms:         $mo   (rounds: ${ours[*]})"
echo "  ort (all) ms:    $mr   (rounds: ${ort[*]})"
awk -v o="$mo" -v r="$mr" 'BEGIN {printf "  ours vs ort:     %.2fx\n", r / o}'
read -r wflops allflops < "$dir/flops"
awk -v o="$mo" -v r="$mr" -v f="$wflops" -v a="$allflops" 'BEGIN {
  printf "  products by constant weights: %.2f GFLOP per step; ours %.1f GFLOPS, ort %.1f GFLOPS\n", f / 1e9, f / o / 1e6, f / r / 1e6
  if (a > 0) printf "  all matrix products (attention too): %.2f GFLOP per step; ours %.1f GFLOPS, ort %.1f GFLOPS\n", a / 1e9, a / o / 1e6, a / r / 1e6 }'
if [ "$SEQ" -gt 1 ] && [ ${#peak[@]} -eq 0 ]; then
  echo "  FMA peak: not measured ($BUILD/bench/fma_peak missing or printed no figure), so no fraction of it"
fi
if [ ${#peak[@]} -gt 0 ]; then
  mp=$(median "${peak[@]}")
  awk -v o="$mo" -v r="$mr" -v f="$wflops" -v p="$mp" -v rounds="${peak[*]}" 'BEGIN {
    printf "  FMA peak (bench/fma_peak, same rounds): %.1f GFLOPS (rounds: %s); products by weights per step time: ours %.3f, ort %.3f of it\n", p, rounds, f / o / 1e6 / p, f / r / 1e6 / p }'
fi
