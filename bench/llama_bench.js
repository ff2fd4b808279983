#!/usr/bin/env node
// Side-by-side decode benchmark: our runtime (`autofusion generate`) against ONNX Runtime
// (bench/ort_generate.js) on one Llama-style decoder, plus the memory-bandwidth floor, and PyTorch
// eager (bench/torch_generate.py) where the PyTorch module the model was exported from lies beside
// it (torch_model.pt, from tests/fixtures/make_decoder_exports.py --save-torch).
// Called by bench/llama_bench.sh; see docs/benchmarks.md for the columns and formulas.
//
//   node bench/llama_bench.js --model M.onnx [--build build] [--prompt-len 16] [--max-new-tokens 50]
//        [--repeat 3] [--rounds 3] [--threads 1,2] [--ort-opt disabled,all] [--json OUT]
//
// Each round runs the bandwidth probe and then every configuration once, as a fresh process
// (one warm-up generation + --repeat timed generations, median step); figures are medians over rounds.
'use strict';
const { execFileSync } = require('child_process');
const fs = require('fs');
const os = require('os');
const path = require('path');
const { readNpy } = require('./npy');

const args = { model: null, build: 'build', promptLen: 16, maxNew: 50, repeat: 3, threads: [1, 2], ortOpt: ['disabled', 'all'], rounds: 3, json: null, seed: 1 };
const argv = process.argv.slice(2);
for (let i = 0; i < argv.length; i++) {
  const k = argv[i], v = () => argv[++i];
  if (k === '--model') args.model = v();
  else if (k === '--build') args.build = v();
  else if (k === '--prompt-len') args.promptLen = Number(v());
  else if (k === '--max-new-tokens') args.maxNew = Number(v());
  else if (k === '--repeat') args.repeat = Number(v());
  else if (k === '--threads') args.threads = v().split(',').map(Number);
  else if (k === '--ort-opt') args.ortOpt = v().split(',');
  else if (k === '--rounds') args.rounds = Number(v());
  else if (k === '--json') args.json = v();
  else if (k === '--seed') args.seed = Number(v());
  else { console.error(`llama_bench.js: unknown option ${k}`); process.exit(2); }
}
if (!args.model) { console.error('llama_bench.js: --model is required'); process.exit(2); }

const here = __dirname;
const tool = path.join(args.build, 'bench', 'gaf_bench_tool');
const autofusion = path.join(args.build, 'autofusion');
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'gaf-bench-'));
const run = (cmd, a) => execFileSync(cmd, a, { encoding: 'utf8', maxBuffer: 64 << 20, stdio: ['ignore', 'pipe', 'inherit'] });
const runJson = (cmd, a) => JSON.parse(run(cmd, a));
const load = () => os.loadavg().map((x) => x.toFixed(2)).join(' ');

// Weights read per decode step, and the prompt (deterministic, inside the vocabulary).
const weights = runJson(tool, ['weights', args.model]);
const vocab = runJson(tool, ['logits', args.model, '--prompt-ids', '0', '-o', path.join(tmp, 'probe.npy')]).vocab;
let s = (args.seed * 2654435761 + 12345) >>> 0;
const prompt = [];
for (let i = 0; i < args.promptLen; i++) { s = (Math.imul(s, 1664525) + 1013904223) >>> 0; prompt.push(s % vocab); }
const promptStr = prompt.join(',');

// Memory bandwidth: measured in every round (between the engines), median over rounds.
const membwRuns = [];
const measureBw = () => membwRuns.push(runJson(path.join(args.build, 'bench', 'membw'), ['--threads', args.threads.join(','), '--repeat', '9']));
const median = (v) => { const s2 = [...v].sort((x, y) => x - y); return s2.length ? s2[Math.floor(s2.length / 2)] : NaN; };
const bwFor = (t) => median(membwRuns.map((m) => (m.results.find((x) => x.threads === t) || { gbps: NaN }).gbps));
const maxAbsDiff = (a, b) => { let m = 0; for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i] - b[i])); return m; };

// The configurations; every round runs each once (a fresh process: one warm-up generation, then
// --repeat generations, median step), so that load from other processes hits all of them alike.
// `ours fused`: the model fused by `autofusion fuse --safe` (precision and speed gates), run with
// its generated kernels.
const fusedModel = path.join(tmp, 'fused.onnx');
run(autofusion, ['fuse', args.model, '--preset', 'transformer', '-o', fusedModel, '--safe', '--threads', String(Math.max(...args.threads))]);
// `safe+fp16w`: fused by `fuse --safe --half-weights`, which also gates float16 weight storage end to
// end and, when it passes, records it in the model; `generate` then decodes with float16 weights.
const fusedHalfModel = path.join(tmp, 'fused_fp16w.onnx');
const halfOut = run(autofusion, ['fuse', args.model, '--preset', 'transformer', '-o', fusedHalfModel, '--safe', '--half-weights',
  '--threads', String(Math.max(...args.threads))]);
const halfLine = String(halfOut || '').split('\n').find((l) => l.startsWith('float16 weight storage')) || 'float16 weight storage: (no gate line)';
process.stderr.write(`${halfLine}\n`);
// When the gate rolled float16 storage back, the model records nothing: that configuration is then
// run with --half-weights forced and labelled as failing the gate, so its speed is still shown.
const halfKept = halfLine.includes(': kept');
const configs = [];
for (const t of args.threads) configs.push({ engine: 'ours', opt: '-', threads: t, runs: [] });
for (const t of args.threads) configs.push({ engine: 'ours fused', opt: 'safe', threads: t, runs: [] });
// float16 weight storage (opt-in, changes numerics, gated by fuse --safe --half-weights).
for (const t of args.threads) configs.push({ engine: 'ours fused', opt: halfKept ? 'safe+fp16w' : 'fp16w gate-fail', threads: t, runs: [] });
for (const opt of args.ortOpt) for (const t of args.threads) configs.push({ engine: 'ort', opt, threads: t, runs: [] });
// PyTorch eager on the module the model was exported from, when it was saved beside the model.
const torchModel = path.join(path.dirname(path.resolve(args.model)), 'torch_model.pt');
const python = process.env.PYTHON || '/usr/bin/python3';
let eagerNote = null;
if (!fs.existsSync(torchModel)) {
  eagerNote = `PyTorch eager: not run (no ${torchModel}: the model was not exported with tests/fixtures/make_decoder_exports.py --save-torch)`;
} else {
  try {
    run(python, ['-c', 'import torch']);
    for (const t of args.threads) configs.push({ engine: 'pytorch', opt: 'eager', threads: t, runs: [] });
  } catch (e) {
    eagerNote = `PyTorch eager: not run (${python} cannot import torch)`;
  }
}

function runConfig(c, withLogitsIn) {
  let withLogits = withLogitsIn;
  const lf = path.join(tmp, `${c.engine}_${c.opt}_${c.threads}.npy`);
  let g;
  if (c.engine === 'ours fused') {
    // Logits of fused kernels are checked by `autofusion verify` (and the safe-fusion gates); here
    // the greedy tokens are compared.
    const half = c.opt.includes('fp16w');
    const weightsFlag = !half ? ['--float32-weights'] : halfKept ? [] : ['--half-weights'];
    g = runJson(autofusion, ['generate', half && halfKept ? fusedHalfModel : fusedModel, '--prompt-ids', promptStr,
      '--max-new-tokens', String(args.maxNew), '--threads', String(c.threads), '--repeat', String(args.repeat), '--json',
      ...weightsFlag]);
    withLogits = false;
  } else if (c.engine === 'ours') {
    g = runJson(autofusion, ['generate', args.model, '--prompt-ids', promptStr, '--max-new-tokens', String(args.maxNew),
      '--threads', String(c.threads), '--repeat', String(args.repeat), '--json']);
    if (withLogits) run(tool, ['logits', args.model, '--prompt-ids', promptStr, '--threads', String(c.threads), '-o', lf]);
  } else if (c.engine === 'pytorch') {
    g = runJson(python, [path.join(here, 'torch_generate.py'), args.model, '--prompt-ids', promptStr,
      '--max-new-tokens', String(args.maxNew), '--threads', String(c.threads), '--repeat', String(args.repeat)]);
    c.version = g.torch_version;
    withLogits = false;
  } else {
    const a = [path.join(here, 'ort_generate.js'), args.model, '--prompt-ids', promptStr, '--max-new-tokens', String(args.maxNew),
      '--threads', String(c.threads), '--opt', c.opt, '--repeat', String(args.repeat)];
    if (withLogits) a.push('--logits-npy', lf);
    g = runJson('node', a);
    c.version = g.ort_version;
  }
  if (withLogits) c.logits = readNpy(lf).data;
  c.runs.push(g);
}

const loadBefore = load();
const loads = [];
for (let r = 0; r < args.rounds; r++) {
  measureBw();
  for (const c of configs) runConfig(c, r === 0);
  loads.push(os.loadavg()[0]);
}
const loadAfter = load();

const ref = configs[0];
const rows = configs.map((c) => {
  const ms = median(c.runs.map((g) => g.decode_ms_per_token));
  return {
    engine: c.engine.startsWith('ours') ? c.engine : `${c.engine} ${c.version}`, opt: c.opt, threads: c.threads, ms,
    ms_rounds: c.runs.map((g) => g.decode_ms_per_token),
    prefill: median(c.runs.map((g) => g.prefill_ms)), tokens: c.runs[0].tokens,
    same: c.runs.every((g) => JSON.stringify(g.tokens) === JSON.stringify(ref.runs[0].tokens)),
    diff: c.logits ? maxAbsDiff(c.logits, ref.logits) : NaN, deterministic: c.runs.every((g) => g.deterministic),
  };
});
const membw = { array_bytes: membwRuns[0].array_bytes, repeats: membwRuns[0].repeats, rounds: membwRuns.length,
  results: args.threads.map((t) => ({ threads: t, gbps: bwFor(t) })), per_round: membwRuns };

const bytes = weights.total_bytes;
// float16 weight storage streams 2 bytes per MatMul/Gemm weight element instead of 4.
const halfBytes = bytes - weights.matmul_bytes / 2;
for (const r of rows) {
  r.tps = 1000 / r.ms;
  r.half = r.opt.includes('fp16w');  // also when its gate failed: that row runs with --half-weights anyway
  r.floor_ms = (r.half ? halfBytes : bytes) / (bwFor(r.threads) * 1e9) * 1000;
  r.pct_floor = r.ms / r.floor_ms * 100;  // ms/token as a percentage of the floor (100% = at the floor)
  r.of_floor = r.floor_ms / r.ms;         // the fraction of the floor reached (1 = at the floor)
  const ort = rows.find((o) => o.engine.startsWith('ort') && o.opt === 'all' && o.threads === r.threads);
  r.vs_ort = ort ? ort.ms / r.ms : NaN;   // ONNX Runtime (all) ms / this ms, same thread count
  r.prefill_vs_ort = ort ? ort.prefill / r.prefill : NaN;
  const eager = rows.find((o) => o.engine.startsWith('pytorch') && o.threads === r.threads);
  r.vs_eager = eager ? eager.ms / r.ms : NaN;  // PyTorch eager ms / this ms, same thread count
}

const mb = (b) => (b / 1e6).toFixed(2);
console.log(`model   ${args.model}`);
console.log(`prompt  ${prompt.length} tokens, ${args.maxNew} new tokens; ${args.rounds} rounds x (1 warm-up + ${args.repeat} generations) per configuration, medians`);
console.log(`weights read per decode token: ${mb(bytes)} MB = MatMul/Gemm weights ${mb(weights.matmul_bytes)} MB (${weights.matmul_tensors} tensors)` +
  ` + Gather rows ${mb(weights.gather_row_bytes)} MB (${weights.gather_tensors}) + other initializers ${mb(weights.other_bytes)} MB (${weights.other_tensors})`);
console.log(`memory read bandwidth: ${membw.results.map((r) => `${r.threads} thread(s) ${r.gbps.toFixed(1)} GB/s`).join(', ')}` +
  ` (${(membw.array_bytes / 2 ** 20).toFixed(0)} MiB array sum, median of ${membw.repeats} x ${membw.rounds} rounds)`);
console.log(`floor ms/token = weight bytes / bandwidth: ${args.threads.map((t) => `${t}T ${(bytes / (bwFor(t) * 1e9) * 1000).toFixed(3)} ms`).join(', ')}` +
  `; with float16 weights (${mb(halfBytes)} MB): ${args.threads.map((t) => `${t}T ${(halfBytes / (bwFor(t) * 1e9) * 1000).toFixed(3)} ms`).join(', ')}`);
console.log(`load average (1/5/15 min): before ${loadBefore}, after ${loadAfter}; 1-min load after each round: ${loads.map((x) => x.toFixed(2)).join(' ')}`);
console.log('');
const head = ['engine', 'opt', 'threads', 'tokens/s', 'ms/token', 'rounds min-max', 'prefill ms', 'same tokens', 'max |dlogit|',
  'floor / ms', 'vs ort (all)', 'prefill vs ort', 'vs eager'];
const table = rows.map((r) => [r.engine, r.opt, String(r.threads), r.tps.toFixed(1), r.ms.toFixed(3),
  `${Math.min(...r.ms_rounds).toFixed(2)}-${Math.max(...r.ms_rounds).toFixed(2)}`, r.prefill.toFixed(2),
  r.same ? 'yes' : 'NO', Number.isNaN(r.diff) ? '-' : r.diff.toExponential(2),
  `${r.of_floor.toFixed(2)}${r.half ? ' (fp16 floor)' : ''}`, Number.isNaN(r.vs_ort) ? '-' : `${r.vs_ort.toFixed(2)}x`,
  Number.isNaN(r.prefill_vs_ort) ? '-' : `${r.prefill_vs_ort.toFixed(2)}x`,
  Number.isNaN(r.vs_eager) ? '-' : `${r.vs_eager.toFixed(2)}x`]);
const w = head.map((h, i) => Math.max(h.length, ...table.map((row) => row[i].length)));
const line = (cells) => '| ' + cells.map((c, i) => c.padEnd(w[i])).join(' | ') + ' |';
console.log(line(head));
console.log('|' + w.map((n) => '-'.repeat(n + 2)).join('|') + '|');
for (const row of table) console.log(line(row));
if (eagerNote) console.log(eagerNote);
for (const r of rows) if (!r.deterministic) console.log(`WARNING: ${r.engine} ${r.opt} ${r.threads}T generated different tokens across repeats`);

if (args.json) fs.writeFileSync(args.json, JSON.stringify({ model: args.model, prompt, weights, membw, loadBefore, loadAfter, loads, rows, eager_note: eagerNote }, null, 2));
fs.rmSync(tmp, { recursive: true, force: true });
