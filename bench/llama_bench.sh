#!/usr/bin/env bash
# Side-by-side decode benchmark of our runtime and ONNX Runtime on the built-in Llama decoder.
#
#   bench/llama_bench.sh [PRESET|torch:SIZE|MODEL.onnx...]   presets: tiny small bench (default: tiny small bench)
#
# A MODEL.onnx argument runs a decoder of the same layout from elsewhere (a torch.onnx.export at
# another size: tests/fixtures/make_decoder_exports.py OUT --preset wide --only llama) as it is.
# When the PyTorch module it was exported from lies beside it (torch_model.pt: export with
# --save-torch), PyTorch eager runs it too, interleaved (bench/torch_generate.py), with a `vs eager`
# column; otherwise the table says why it did not. `torch:SIZE` exports such a model first when it
# is not there (make_decoder_exports.py --preset SIZE --only llama --opset $OPSET --save-torch into
# $MODELS/torch-SIZE): `torch:full` is a torch.onnx.export Llama at the `bench` preset's dims, with
# PyTorch eager beside it (about 1.6 GB on disk, a minute to export).
#
# Environment: BUILD (build dir, default build), MODELS (where models are written, default
# /tmp/gaf-bench-models), PROMPT_LEN (16), NEW_TOKENS (50), REPEAT (3, generations per process after
# one warm-up), ROUNDS (3, each runs every configuration once, interleaved), THREADS (1,2),
# ORT_OPT (disabled,all), JSON_DIR (write one JSON per preset there), SKIP_BUILD=1 (use the
# binaries in $BUILD as they are: autofusion, bench/membw, bench/gaf_bench_tool), OPSET (17, 23 or
# 28: the decoder as `example llama --opset` writes it; 23 and 28 use ONNX's Attention,
# RMSNormalization, RotaryEmbedding (and SwiGLU) operators; models go to $MODELS/PRESET-opsetN).
# Needs: the build (autofusion, bench/membw, bench/gaf_bench_tool) and `npm install` in bench/
# (ONNXRUNTIME_NODE_INSTALL=skip npm install --prefix bench).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
MODELS=${MODELS:-/tmp/gaf-bench-models}
PROMPT_LEN=${PROMPT_LEN:-16}
NEW_TOKENS=${NEW_TOKENS:-50}
REPEAT=${REPEAT:-3}
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-1,2}
OPSET=${OPSET:-17}
ORT_OPT=${ORT_OPT:-disabled,all}
presets=("$@")
[ ${#presets[@]} -gt 0 ] || presets=(tiny small bench)

if [ -z "${SKIP_BUILD:-}" ]; then
  log=$(mktemp)
  ninja -C "$BUILD" -j1 autofusion membw gaf_bench_tool >"$log" 2>&1 || { cat "$log"; rm -f "$log"; exit 1; }
  rm -f "$log"
fi
if [ ! -d bench/node_modules/onnxruntime-node ]; then
  (cd bench && ONNXRUNTIME_NODE_INSTALL=skip npm ci --no-audit --no-fund >/dev/null)
fi

echo "machine: $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) cores), $(date -u +%Y-%m-%dT%H:%MZ)"
echo "load:    $(cut -d' ' -f1-3 /proc/loadavg)"

for p in "${presets[@]}"; do
  if [[ "$p" == *.onnx ]]; then
    [ -f "$p" ] || { echo "llama_bench.sh: no model file $p" >&2; exit 1; }
    model=$p
    name=$(basename "$(dirname "$p")")
    echo
    echo "=== model $p ==="
  elif [[ "$p" == torch:* ]]; then
    size=${p#torch:}
    model="$MODELS/torch-$size/llama_kv_opset$OPSET/model.onnx"
    if [ ! -f "$model" ] || [ ! -f "$(dirname "$model")/torch_model.pt" ]; then
      /usr/bin/python3 tests/fixtures/make_decoder_exports.py "$MODELS/torch-$size" --preset "$size" --only llama \
        --opset "$OPSET" --save-torch >/dev/null 2>&1 || {
        echo "llama_bench.sh: exporting $p failed (tests/fixtures/make_decoder_exports.py --preset $size: tiny, bench, full, wide)" >&2
        exit 1
      }
    fi
    name=torch-$size
    echo
    echo "=== torch.onnx.export Llama, make_decoder_exports.py --preset $size (opset $OPSET): $model ==="
  else
    dir="$MODELS/$p"
    [ "$OPSET" = 17 ] || dir="$MODELS/$p-opset$OPSET"
    if [ ! -f "$dir/model.onnx" ]; then
      "$BUILD"/autofusion example llama --preset "$p" --opset "$OPSET" -o "$dir" >/dev/null
    fi
    model=$dir/model.onnx
    name=$p
    echo
    echo "=== preset $p (opset $OPSET) ==="
  fi
  json_args=()
  [ -n "${JSON_DIR:-}" ] && mkdir -p "$JSON_DIR" && json_args=(--json "$JSON_DIR/$name.json")
  node bench/llama_bench.js --model "$model" --build "$BUILD" --prompt-len "$PROMPT_LEN" \
    --max-new-tokens "$NEW_TOKENS" --repeat "$REPEAT" --threads "$THREADS" --ort-opt "$ORT_OPT" \
    --rounds "$ROUNDS" "${json_args[@]}"
done
