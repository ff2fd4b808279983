#!/usr/bin/env bash
# Bad input to the CLI: every case must exit with status 1 and print exactly one line on stderr
# starting with "error:" (never a crash, never a stack trace). Truncated and byte-flipped copies
# of real models are included; those that still parse must either run or fail the same way.
set -u
BIN="$1"
SRC="$2"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
pass=0
fail=0
expect_error() {  # description, command...
  local what="$1"; shift
  "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  local lines
  lines=$(wc -l <"$TMP/err")
  if [ "$rc" -eq 1 ] && [ "$lines" -eq 1 ] && grep -q '^error: ' "$TMP/err"; then
    pass=$((pass + 1))
  else
    fail=$((fail + 1))
    echo "FAIL $what: rc=$rc, stderr:"; head -n 5 "$TMP/err"
  fi
}
expect_ok_or_error() {
  local what="$1"; shift
  "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  if [ "$rc" -eq 0 ] || { [ "$rc" -eq 1 ] && grep -q '^error: ' "$TMP/err"; }; then
    pass=$((pass + 1))
  else
    fail=$((fail + 1))
    echo "FAIL $what: rc=$rc (crash?), stderr:"; head -n 5 "$TMP/err"
  fi
}
MODEL="$SRC/tests/fixtures/torch/resnet_like/model.onnx"
expect_error "missing file" "$BIN" info "$TMP/nope.onnx"
echo "hello" >"$TMP/text.onnx"
expect_error "not onnx" "$BIN" info "$TMP/text.onnx"
: >"$TMP/empty.onnx"
expect_error "empty file" "$BIN" run "$TMP/empty.onnx"
expect_error "directory" "$BIN" info "$TMP"
head -c 20000 "$MODEL" >"$TMP/trunc.onnx"
expect_error "truncated model" "$BIN" info "$TMP/trunc.onnx"
expect_error "unknown input name" "$BIN" run "$MODEL" -i nosuch=random
expect_error "--half-weights with --float32-weights" "$BIN" run "$MODEL" --half-weights --float32-weights
expect_error "negative --warmup" "$BIN" run "$MODEL" --warmup -1
# --warmup runs first, untimed: the timing line says so and the profile counts only the timed runs.
if "$BIN" run "$MODEL" --warmup 2 --repeat 3 --profile >"$TMP/out" 2>"$TMP/err" &&
   grep -q 'median of 3 runs after 2 warm-up runs' "$TMP/out" &&
   grep -qE '^  MaxPool +3 calls' "$TMP/out"; then  # one MaxPool per run
  pass=$((pass + 1))
else
  fail=$((fail + 1)); echo "FAIL --warmup: the timing line or the profile's call counts:"; head -n 3 "$TMP/out" "$TMP/err"
fi
# --profile-nodes N: the N slowest nodes by name, each with its op type and its call count (one per
# timed run); --json lists every timed run's seconds.
if "$BIN" run "$MODEL" --warmup 1 --repeat 2 --profile-nodes 3 >"$TMP/out" 2>"$TMP/err" &&
   grep -qE '^the 3 slowest of [0-9]+ nodes \(the timed runs' "$TMP/out" &&
   [ "$(grep -cE '^ +[0-9.]+ +[0-9.]+  .* \([A-Za-z]+, 2 calls\)$' "$TMP/out")" -eq 3 ] &&
   "$BIN" run "$MODEL" --repeat 3 --json >"$TMP/out.json" 2>"$TMP/err" &&
   /usr/bin/python3 -c 'import json, sys; j = json.load(open(sys.argv[1])); t = j["run_seconds"]; assert len(t) == 3 and all(x > 0 for x in t) and sorted(t)[1] == j["median_seconds"]' "$TMP/out.json"; then
  pass=$((pass + 1))
else
  fail=$((fail + 1)); echo "FAIL --profile-nodes / --json run_seconds:"; head -n 12 "$TMP/out" "$TMP/err"
fi
expect_error "negative --profile-nodes" "$BIN" run "$MODEL" --profile-nodes -1
# After the warm-up runs, runs until the memory plan is made stay untimed too (one records the
# buffers, the next makes and first touches the arena): reported in the timing line and the JSON;
# none without the plan.
if "$BIN" run "$MODEL" --warmup 1 --repeat 2 --json >"$TMP/plan.json" 2>"$TMP/err" &&
   "$BIN" run "$MODEL" --warmup 1 --repeat 2 --json --no-memory-plan >"$TMP/noplan.json" 2>>"$TMP/err" &&
   "$BIN" run "$MODEL" --warmup 1 --repeat 2 >"$TMP/out" 2>>"$TMP/err" &&
   grep -qE 'median of 2 runs after 1 warm-up run and [1-4] while the memory plan was made' "$TMP/out" &&
   /usr/bin/python3 -c 'import json, sys; a, b = (json.load(open(f)) for f in sys.argv[1:3]); assert 1 <= a["memory_plan_warmup_runs"] <= 4 and b["memory_plan_warmup_runs"] == 0 and len(a["run_seconds"]) == 2, (a, b)' "$TMP/plan.json" "$TMP/noplan.json"; then
  pass=$((pass + 1))
else
  fail=$((fail + 1)); echo "FAIL run's memory plan warm-up runs:"; head -n 3 "$TMP/out" "$TMP/err"
fi
# A CNN fused into a oneDNN chain: `run --profile` lists the chain's slowest steps by node and kernel,
# and the chains' time by kind of step (sorted by share: with two timed runs on a loaded machine one
# preempted reorder or pool can outweigh the convolutions, so the test does not ask for convolution first).
# Plain fuse says that it measured nothing.
if "$BIN" fuse "$MODEL" --preset cnn -o "$TMP/chain.onnx" >"$TMP/fuse_out" 2>"$TMP/err" &&
   grep -q '^Not measured: the groups were fused without the precision and speed gates' "$TMP/fuse_out" &&
   "$BIN" run "$TMP/chain.onnx" --warmup 1 --repeat 2 --profile >"$TMP/out" 2>"$TMP/err" &&
   grep -q '^slowest steps of the oneDNN chains' "$TMP/out" &&
   grep -qE "^ +[0-9.]+ ms +[0-9.]+%  node '.*' \(Conv\) \[convolution .* to 1x" "$TMP/out" &&
   grep -qE '^  by kind of step: (.*, )?convolution [0-9.]+% \([0-9]+ steps\)' "$TMP/out"; then
  pass=$((pass + 1))
else
  fail=$((fail + 1)); echo "FAIL run --profile of a fused CNN: no chain steps listed:"; tail -n 5 "$TMP/out" "$TMP/err"
fi
python3 - "$TMP/wrong.npy" <<'PY'
import sys, struct
hdr = "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }"
hdr += " " * (64 - 10 - len(hdr) - 1) + "\n"
open(sys.argv[1], "wb").write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr.encode() + b"\0" * 12)
PY
expect_error "wrong input shape" "$BIN" run "$MODEL" -i "image=$TMP/wrong.npy"
expect_error "wrong input shape, by position" "$BIN" run "$MODEL" -i "$TMP/wrong.npy"
grep -q "input 'image' expects shape" "$TMP/err" || { echo "FAIL -i FILE by position: $(cat "$TMP/err")"; fail=$((fail + 1)); }
# Kernel commands: wrong kinds of model and bad rule files name the problem.
expect_error "verify an unfused model" "$BIN" verify "$MODEL"
expect_error "verify a missing original" "$BIN" verify "$MODEL" --original "$TMP/nope.onnx"
printf 'rule Bad fuse=X math=sloppy\n  y = Relu($x)\nend\n' >"$TMP/bad.rules"
expect_error "rule with a bad math value" "$BIN" fuse "$MODEL" --preset none --rules "$TMP/bad.rules" --safe -o "$TMP/f.onnx"
[ -e "$TMP/f.onnx" ] && { echo "FAIL fuse left an output after an error"; fail=$((fail + 1)); }
"$BIN" fuse "$MODEL" --preset cnn -o "$TMP/fused.onnx" >/dev/null 2>&1 || { echo "FAIL fuse of the resnet-like export"; fail=$((fail + 1)); }
expect_error "bench of an already fused model" "$BIN" bench "$TMP/fused.onnx"
# Sample inputs (-i) of every command that runs a model: a missing file, an unknown input name, a
# file of the wrong dtype, and a folder that is no test_data_set each give one line naming it.
DEC="$SRC/tests/fixtures/torch_decoders/llama_kv_opset17"
python3 - "$TMP/ids_f32.npy" <<'PY'
import sys, struct
hdr = "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 3), }"
hdr += " " * (64 - 10 - len(hdr) - 1) + "\n"
open(sys.argv[1], "wb").write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr.encode() + b"\0" * 12)
PY
# Plain fuse of a torch-exported decoder says which calls the runtime runs as its own operators
# (attention over the KV cache, SwiGLU's sibling products), and `run --profile` names those sites
# as not called; without the plan's rewrites every kernel runs; `verify` passes, naming those sites.
if "$BIN" fuse "$DEC/model.onnx" -o "$TMP/dec_fused.onnx" >"$TMP/fuse_out" 2>"$TMP/err" &&
   grep -qE "^Run here, these calls run as the runtime's own operators instead of their functions \(FusedAttention x[0-9]+, FusedSwiGLU x[0-9]+\)" "$TMP/fuse_out" &&
   "$BIN" run "$TMP/dec_fused.onnx" --profile >"$TMP/out" 2>"$TMP/err" &&
   grep -qE "^      [0-9]+ site\(s\) not called: the runtime's plan runs its operators as FusedAttention" "$TMP/out" &&
   "$BIN" run "$TMP/dec_fused.onnx" --profile --no-plan-rewrites >"$TMP/out2" 2>"$TMP/err" &&
   grep -q "^fused kernels:" "$TMP/out2" && ! grep -q "not called" "$TMP/out2" &&
   "$BIN" verify "$TMP/dec_fused.onnx" >"$TMP/out3" 2>"$TMP/err" &&
   grep -q "^run by the runtime's plan: FusedAttention at " "$TMP/out3" && ! grep -q "^kernel never ran" "$TMP/out3" &&
   grep -q "^PASS" "$TMP/out3"; then
  pass=$((pass + 1))
else
  fail=$((fail + 1)); echo "FAIL plain fuse / run of a decoder: the calls the runtime runs itself are not named:"
  tail -3 "$TMP/fuse_out"; grep -A2 "fused kernels" "$TMP/out" "$TMP/out2" | head; tail -4 "$TMP/out3"; cat "$TMP/err"
fi
mkdir -p "$TMP/empty_set"
for cmd in analyze estimate "fuse -o $TMP/i.onnx" "fuse --safe -o $TMP/i.onnx" bench "compile -o $TMP/kdir" run verify; do
  m="$DEC/model.onnx"
  [ "$cmd" = verify ] && m="$TMP/dec_fused.onnx"
  expect_error "$cmd -i missing file" "$BIN" $cmd "$m" -i "input_ids=$TMP/nope.npy"
  grep -q "nope.npy" "$TMP/err" || { echo "FAIL $cmd: the error does not name the file: $(cat "$TMP/err")"; fail=$((fail + 1)); }
  expect_error "$cmd -i unknown input" "$BIN" $cmd "$m" -i "nosuch=$DEC/test_data_set_0/input_0.pb"
  grep -q "no input 'nosuch'" "$TMP/err" || { echo "FAIL $cmd: the error does not name the input: $(cat "$TMP/err")"; fail=$((fail + 1)); }
  expect_error "$cmd -i wrong dtype" "$BIN" $cmd "$m" -i "input_ids=$TMP/ids_f32.npy"
  grep -q "input 'input_ids' expects int64 but the file holds float" "$TMP/err" || { echo "FAIL $cmd: wrong-dtype error: $(cat "$TMP/err")"; fail=$((fail + 1)); }
  expect_error "$cmd -i not a test_data_set" "$BIN" $cmd "$m" -i "$TMP/empty_set"
done
[ -e "$TMP/i.onnx" ] && { echo "FAIL fuse left an output after a bad -i"; fail=$((fail + 1)); }
expect_error "generate -i of another input" "$BIN" generate "$DEC/model.onnx" -i "attention_mask=$DEC/test_data_set_0/input_1.pb"
# generate says what its decode steps did with the KV cache: appended in place, or (with
# --no-cache-in-place) copied, with the same tokens either way.
if "$BIN" generate "$DEC/model.onnx" -n 6 --json >"$TMP/in_place.json" 2>"$TMP/err" &&
  "$BIN" generate "$DEC/model.onnx" -n 6 --json --no-cache-in-place >"$TMP/copied.json" 2>>"$TMP/err" &&
  /usr/bin/python3 - "$TMP/in_place.json" "$TMP/copied.json" <<'PY'
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
assert a["tokens"] == b["tokens"], (a["tokens"], b["tokens"])
ca, cb = a["cache_appends"], b["cache_appends"]
assert ca["in_place"] > 0 and ca["copied"] == 0, ca
assert cb["in_place"] == 0 and cb["new_storage_with_room"] == 0 and cb["copied"] > 0, cb
PY
then pass=$((pass + 1)); else echo "FAIL generate's KV cache in place: $(cat "$TMP/err")"; fail=$((fail + 1)); fi
# generate --no-read-ahead: the same tokens, and the JSON says which (read_ahead).
if "$BIN" generate "$DEC/model.onnx" -n 6 --json --no-read-ahead >"$TMP/no_ra.json" 2>"$TMP/err" &&
  /usr/bin/python3 - "$TMP/in_place.json" "$TMP/no_ra.json" <<'PY'
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
assert a["tokens"] == b["tokens"], (a["tokens"], b["tokens"])
assert a["read_ahead"] is True and b["read_ahead"] is False, (a["read_ahead"], b["read_ahead"])
PY
then pass=$((pass + 1)); else echo "FAIL generate --no-read-ahead: $(cat "$TMP/err")"; fail=$((fail + 1)); fi
# generate's layers share their shape steps within a decode step (a torch.onnx.export decoder's
# layers compute the same shapes): --profile counts them a step; --no-shape-memo runs every one, with
# the same tokens.
if "$BIN" generate "$DEC/model.onnx" -n 6 --profile --json >"$TMP/memo.json" 2>"$TMP/err" &&
  "$BIN" generate "$DEC/model.onnx" -n 6 --profile --json --no-shape-memo >"$TMP/no_memo.json" 2>>"$TMP/err" &&
  /usr/bin/python3 - "$TMP/memo.json" "$TMP/no_memo.json" <<'PY'
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
assert a["tokens"] == b["tokens"], (a["tokens"], b["tokens"])
assert a["shape_memo"] is True and b["shape_memo"] is False, (a["shape_memo"], b["shape_memo"])
assert a["profile"]["shape_steps_shared_per_step"] > 10, a["profile"]["shape_steps_shared_per_step"]
assert b["profile"]["shape_steps_shared_per_step"] == 0, b["profile"]["shape_steps_shared_per_step"]
calls = lambda j, op: sum(t["calls"] for t in j["profile"]["op_types"] if t["op_type"] == op)
assert calls(a, "Unsqueeze") < calls(b, "Unsqueeze"), (calls(a, "Unsqueeze"), calls(b, "Unsqueeze"))
PY
then pass=$((pass + 1)); else echo "FAIL generate's shared shape steps: $(cat "$TMP/err")"; fail=$((fail + 1)); fi
# generate reports its first decode step and its slowest beside the median, in the JSON (also per
# run) and in the text.
if "$BIN" generate "$DEC/model.onnx" -n 6 >"$TMP/steps.txt" 2>"$TMP/err" &&
  grep -qE "^decode .* ms/token \(median of 5 steps\).*; the first step [0-9.]+ ms, the slowest [0-9.]+ ms$" "$TMP/steps.txt" &&
  /usr/bin/python3 - "$TMP/in_place.json" <<'PY'
import json, sys
a = json.load(open(sys.argv[1]))
for r in [a] + a["runs"]:
    med, first, slow = r["decode_ms_per_token"], r["first_decode_step_ms"], r["slowest_decode_step_ms"]
    assert 0 < med <= slow and 0 < first <= slow, (med, first, slow)
PY
then pass=$((pass + 1)); else echo "FAIL generate's first and slowest steps: $(cat "$TMP/err") $(cat "$TMP/steps.txt")"; fail=$((fail + 1)); fi
# generate --profile-nodes N: the last generation's decode steps (5 after the prefill of -n 6):
# the slowest nodes' calls one per step, slowest first, the same tokens as without the profile.
if "$BIN" generate "$DEC/model.onnx" -n 6 --repeat 2 --profile-nodes 4 --json >"$TMP/prof.json" 2>"$TMP/err" &&
  "$BIN" generate "$DEC/model.onnx" -n 6 --repeat 2 --profile-nodes 4 >"$TMP/prof.txt" 2>>"$TMP/err" &&
  grep -qE "^the 4 slowest of [0-9]+ nodes \(the last generation's 5 decode steps" "$TMP/prof.txt" &&
  /usr/bin/python3 - "$TMP/in_place.json" "$TMP/prof.json" <<'PY'
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
assert a["tokens"] == b["tokens"], (a["tokens"], b["tokens"])
p = b["profile"]
assert p["decode_steps"] == 5, p["decode_steps"]
assert len(p["nodes"]) == 4 and all(n["calls"] == 5 and n["ms"] > 0 for n in p["nodes"]), p["nodes"]
assert [n["ms"] for n in p["nodes"]] == sorted((n["ms"] for n in p["nodes"]), reverse=True)
types = {t["op_type"]: t["calls"] for t in p["op_types"]}
assert types.get("FusedAttention", 0) % 5 == 0 and types.get("FusedAttention", 0) > 0, types
PY
then pass=$((pass + 1)); else echo "FAIL generate --profile-nodes: $(cat "$TMP/err")"; head -n 5 "$TMP/prof.txt"; fail=$((fail + 1)); fi
# Without a warm-up generation the profile leaves out the first decode step too (it moves the
# caches into storage with room): -n 6 profiles 4 steps, one call of each node a step.
if "$BIN" generate "$DEC/model.onnx" -n 6 --profile-nodes 3 --json >"$TMP/cold.json" 2>"$TMP/err" &&
  "$BIN" generate "$DEC/model.onnx" -n 6 --profile >"$TMP/cold.txt" 2>>"$TMP/err" &&
  grep -q "^time per op type (the last generation's 4 decode steps after its first (one-time set-up" "$TMP/cold.txt" &&
  /usr/bin/python3 -c 'import json, sys; p = json.load(open(sys.argv[1]))["profile"]; assert p["decode_steps"] == 4 and all(n["calls"] == 4 for n in p["nodes"]), p' "$TMP/cold.json"
then pass=$((pass + 1)); else echo "FAIL generate --profile of a cold generation: $(cat "$TMP/err")"; head -n 12 "$TMP/cold.txt"; fail=$((fail + 1)); fi
expect_error "generate negative --profile-nodes" "$BIN" generate "$DEC/model.onnx" -n 2 --profile-nodes -2
# A test_data_set folder is one sample: it runs.
"$BIN" run "$DEC/model.onnx" -i "$DEC/test_data_set_0" >/dev/null 2>"$TMP/err" || { echo "FAIL run -i test_data_set_0: $(cat "$TMP/err")"; fail=$((fail + 1)); }
# TorchScript files are models too (exported to ONNX by python/graph_autofusion/torch_io.py with
# the -i sample inputs). Without -i, and without PyTorch, one line says what to do; this part
# needs no PyTorch (a zip in torch.jit.save's layout, and a stand-in torch that fails to import).
/usr/bin/python3 - "$TMP/layout.pt" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1], "w") as z:
    z.writestr("layout/data.pkl", b"")
    z.writestr("layout/code/__torch__.py", "")
PY
expect_error "TorchScript file without -i" "$BIN" info "$TMP/layout.pt"
grep -q "layout.pt is a TorchScript file: give sample inputs (-i NAME=FILE.npy) so it can be exported to ONNX" "$TMP/err" ||
  { echo "FAIL TorchScript without -i: $(cat "$TMP/err")"; fail=$((fail + 1)); }
expect_error "TorchScript file with a test_data_set folder" "$BIN" run "$TMP/layout.pt" -i "$DEC/test_data_set_0"
mkdir -p "$TMP/notorch/torch"
echo "raise ImportError('No module named torch')" >"$TMP/notorch/torch/__init__.py"
expect_error "TorchScript file without PyTorch" env PYTHONPATH="$TMP/notorch" "$BIN" run "$TMP/layout.pt" -i "$TMP/wrong.npy"
grep -q "layout.pt is a TorchScript file: converting it needs PyTorch (apt-get install python3-torch)" "$TMP/err" ||
  { echo "FAIL TorchScript without PyTorch: $(cat "$TMP/err")"; fail=$((fail + 1)); }
# With PyTorch (3 torch runs: make the file, info, run): a traced module loads and runs.
if /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  /usr/bin/python3 - "$TMP" <<'PY'
import sys, numpy as np, torch
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)
    def forward(self, x, y):
        return torch.relu(self.lin(x)) + y
torch.manual_seed(0)
torch.jit.trace(Net(), (torch.ones(2, 4), torch.ones(2, 3))).save(sys.argv[1] + "/net.pt")
np.save(sys.argv[1] + "/x.npy", np.ones((2, 4), np.float32))
np.save(sys.argv[1] + "/y.npy", np.ones((2, 3), np.float32))
PY
  if "$BIN" info "$TMP/net.pt" -i "x=$TMP/x.npy" -i "y=$TMP/y.npy" >"$TMP/out" 2>"$TMP/err" && grep -q "Gemm" "$TMP/out" &&
    grep -qE "^  x +float \[2,4\]" "$TMP/out"; then pass=$((pass + 1)); else
    echo "FAIL info of a TorchScript file: $(cat "$TMP/err" "$TMP/out")"; fail=$((fail + 1)); fi
  # x by position, y by name.
  if "$BIN" run "$TMP/net.pt" -i "$TMP/x.npy" -i "y=$TMP/y.npy" >"$TMP/out" 2>"$TMP/err" &&
    grep -q "output_0 .*float\[2,3\]" "$TMP/out"; then pass=$((pass + 1)); else
    echo "FAIL run of a TorchScript file: $(cat "$TMP/err" "$TMP/out")"; fail=$((fail + 1)); fi
else
  echo "skipped: the TorchScript cases that need PyTorch (/usr/bin/python3 has no torch; apt-get install python3-torch)"
fi
# Byte-flipped copies: must never crash.
size=$(stat -c %s "$MODEL")
for seed in $(seq 1 25); do
  cp "$MODEL" "$TMP/flip.onnx"
  for k in 1 2 3; do
    off=$(( (seed * 7919 * k + k * 104729) % size ))
    printf "\\x$(printf %02x $(( (seed * 37 + k) % 255 + 1 )))" | dd of="$TMP/flip.onnx" bs=1 seek="$off" conv=notrunc status=none
  done
  expect_ok_or_error "byte-flipped #$seed" "$BIN" run "$TMP/flip.onnx"
done
for n in 100 1000 50000 200000; do
  head -c "$n" "$MODEL" >"$TMP/t.onnx"
  expect_ok_or_error "truncated to $n bytes" "$BIN" run "$TMP/t.onnx"
done
ls "$TMP" | grep -q '\.tmp\.' && { echo "FAIL temporary files left behind"; fail=$((fail + 1)); }
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
