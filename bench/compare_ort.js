#!/usr/bin/env node
// Differential test against ONNX Runtime: for each model, random inputs (seeded, written as .npy),
// then `autofusion run MODEL -i NAME=FILE.npy ... -o DIR` and ONNX Runtime (bench/ort_run.js,
// graph optimizations disabled) on the same files; every output is compared elementwise with
// |ours - ort| <= atol + rtol * |ort| (NaN must match NaN, infinities must match exactly).
//
//   node bench/compare_ort.js [--autofusion build/autofusion] [--rtol 1e-4] [--atol 1e-5]
//        [--dim 2] [--seed 0] [--keep DIR] [--verbose] [--list FILE (one model per line)] MODEL...
//
// Prints one line per model (PASS / FAIL with the reason / SKIP with the reason) and closes
// with `N passed, N failed, N skipped`. Exit status 1 when any model failed.
// Symbolic input dimensions all get the value --dim (then 1, then 3 if ONNX Runtime rejects the
// inputs). Integer inputs are drawn from [0, 2) (then all 0), which suits indices and masks;
// floats from [-1, 1), bools from {0, 1}. float16 outputs are compared with rtol = atol = 1e-3.
'use strict';
const { spawnSync } = require('child_process');
const fs = require('fs');
const os = require('os');
const path = require('path');
const ort = require('onnxruntime-node');
const { readNpy, writeNpy, toNumbers } = require('./npy');
const { runModel } = require('./ort_run');

const opt = { autofusion: 'build/autofusion', rtol: 1e-4, atol: 1e-5, dim: 2, seed: 0, keep: null, verbose: false, models: [] };
const argv = process.argv.slice(2);
for (let i = 0; i < argv.length; i++) {
  const k = argv[i], v = () => argv[++i];
  if (k === '--autofusion') opt.autofusion = v();
  else if (k === '--rtol') opt.rtol = Number(v());
  else if (k === '--atol') opt.atol = Number(v());
  else if (k === '--dim') opt.dim = Number(v());
  else if (k === '--seed') opt.seed = Number(v());
  else if (k === '--keep') opt.keep = v();
  else if (k === '--verbose') opt.verbose = true;
  else if (k === '--list') opt.models.push(...fs.readFileSync(v(), 'utf8').split('\n').map((x) => x.trim()).filter((x) => x));
  else if (k.startsWith('-')) { console.error(`compare_ort.js: unknown option ${k}`); process.exit(2); }
  else opt.models.push(k);
}

// Seeded PRNG (mulberry32).
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function floatToHalf(f) {
  const b = new DataView(new ArrayBuffer(4));
  b.setFloat32(0, f);
  const x = b.getUint32(0);
  const sign = (x >>> 16) & 0x8000;
  let e = ((x >>> 23) & 0xff) - 127 + 15;
  let m = x & 0x7fffff;
  if (e <= 0) return sign;  // inputs are in [-1, 1): flush tiny values
  if (e >= 31) return sign | 0x7c00;
  m += 0x1000;  // round
  if (m & 0x800000) { m = 0; e += 1; }
  return sign | (e << 10) | (m >>> 13);
}

function randomInput(meta, next, dimValue, intHigh) {
  const shape = meta.shape.map((d) => (typeof d === 'number' && d >= 0 ? d : dimValue));
  const int = () => Math.floor(next() * intHigh);
  const n = shape.reduce((a, b) => a * b, 1);
  const t = meta.type;
  let data;
  switch (t) {
    case 'float32': data = Float32Array.from({ length: n }, () => next() * 2 - 1); break;
    case 'float64': data = Float64Array.from({ length: n }, () => next() * 2 - 1); break;
    case 'float16': data = Uint16Array.from({ length: n }, () => floatToHalf(next() * 2 - 1)); break;
    case 'int8': data = Int8Array.from({ length: n }, int); break;
    case 'uint8': data = Uint8Array.from({ length: n }, int); break;
    case 'int16': data = Int16Array.from({ length: n }, int); break;
    case 'uint16': data = Uint16Array.from({ length: n }, int); break;
    case 'int32': data = Int32Array.from({ length: n }, int); break;
    case 'uint32': data = Uint32Array.from({ length: n }, int); break;
    case 'int64': data = BigInt64Array.from({ length: n }, () => BigInt(int())); break;
    case 'uint64': data = BigUint64Array.from({ length: n }, () => BigInt(int())); break;
    case 'bool': data = Uint8Array.from({ length: n }, () => (next() < 0.5 ? 1 : 0)); break;
    default: return null;
  }
  return { type: t, shape, data };
}

function compare(oursFile, ortFile) {
  if (!fs.existsSync(oursFile)) return `ours wrote no ${path.basename(oursFile)}`;
  const a = readNpy(oursFile), b = readNpy(ortFile);
  if (JSON.stringify(a.shape) !== JSON.stringify(b.shape)) return `shape [${a.shape}] vs ORT [${b.shape}]`;
  if (a.dtype !== b.dtype) return `type ${a.dtype} vs ORT ${b.dtype}`;
  const x = toNumbers(a.dtype, a.data), y = toNumbers(b.dtype, b.data);
  const [rtol, atol] = tolerance(b.dtype);
  let bad = 0, worst = -1, worstErr = 0, maxAbs = 0;
  for (let i = 0; i < x.length; i++) {
    const p = Number(x[i]), q = Number(y[i]);
    if (Number.isNaN(p) || Number.isNaN(q)) { if (Number.isNaN(p) !== Number.isNaN(q)) { bad++; if (worst < 0) worst = i; } continue; }
    if (!Number.isFinite(p) || !Number.isFinite(q)) { if (p !== q) { bad++; if (worst < 0) worst = i; } continue; }
    const d = Math.abs(p - q);
    maxAbs = Math.max(maxAbs, d);
    const excess = d - (atol + rtol * Math.abs(q));
    if (excess > 0) { bad++; if (worst < 0 || excess > worstErr) { worst = i; worstErr = excess; } }
  }
  if (bad === 0) return null;
  return `${bad}/${x.length} elements off (max |diff| ${maxAbs.toExponential(2)}; e.g. [${worst}] ours ${Number(x[worst])} vs ORT ${Number(y[worst])})`;
}

const ORT_QUIET = { logSeverityLevel: 4 };
const MAX_INPUT_ELEMENTS = 1 << 24;  // per input; larger settings are not tried

// Tolerance of one output: the given rtol/atol; float16/bfloat16 outputs, and every output of a
// graph that computes in float16/bfloat16 anywhere, get at least rtol = atol = 1e-3 (a half ulp is
// 2^-11 relative; ONNX Runtime's CPU kernels compute some half ops in float32 and drop Cast pairs,
// where we round to half wherever the graph says).
let halfGraph = false;  // the model under test computes values in float16/bfloat16
function tolerance(dtype) {
  if (halfGraph || dtype === 'float16' || dtype === 'bfloat16') return [Math.max(opt.rtol, 1e-3), Math.max(opt.atol, 1e-3)];
  return [opt.rtol, opt.atol];
}

// Writes random inputs for one (dim value, integer range) setting; null when a type is unsupported.
function writeInputs(session, dir, dimValue, intHigh) {
  const next = rng(opt.seed);
  const inputs = {};
  for (const m of session.inputMetadata) {
    if (!m.isTensor) return { skip: `input '${m.name}' is not a tensor` };
    const elems = m.shape.reduce((a, d) => a * (typeof d === 'number' && d >= 0 ? d : dimValue), 1);
    if (elems > MAX_INPUT_ELEMENTS) return { tooLarge: `input '${m.name}' would have ${elems} elements` };
    const r = randomInput(m, next, dimValue, intHigh);
    if (!r) return { skip: `input '${m.name}' has type ${m.type}` };
    const f = path.join(dir, `in_${Object.keys(inputs).length}.npy`);
    writeNpy(f, r.type, r.shape, r.data);
    inputs[m.name] = f;
  }
  return { inputs };
}

async function checkModel(model, dir) {
  let session;
  try {
    session = await ort.InferenceSession.create(model, { graphOptimizationLevel: 'disabled', intraOpNumThreads: 1, ...ORT_QUIET });
  } catch (e) {
    return ['SKIP', `ONNX Runtime cannot load it: ${e.message.split('\n')[0].slice(0, 160)}`];
  }
  // Input settings tried in turn until ONNX Runtime accepts the inputs: symbolic dims --dim,
  // then 1, then 3; integers from [0, 2), then all 0.
  const settings = [[opt.dim, 2], [1, 2], [opt.dim, 1], [1, 1], [3, 2]];
  const ortDir = path.join(dir, 'ort'), oursDir = path.join(dir, 'ours');
  let inputs = null, outNames = null, lastErr = '';
  for (const [dimValue, intHigh] of settings) {
    const w = writeInputs(session, dir, dimValue, intHigh);
    if (w.skip) return ['SKIP', w.skip];
    if (w.tooLarge) { lastErr = `${w.tooLarge} (limit ${MAX_INPUT_ELEMENTS})`; continue; }
    try {
      outNames = await runModel(model, w.inputs, ortDir, 'disabled', 1, ORT_QUIET);
      inputs = w.inputs;
      break;
    } catch (e) {
      lastErr = e.message.split('\n')[0].slice(0, 160);
    }
  }
  if (typeof session.release === 'function') await session.release();
  if (!inputs) return ['SKIP', `no random input setting was usable: ${lastErr}`];
  const dump = spawnSync(opt.autofusion, ['dump', model], { encoding: 'utf8', maxBuffer: 256 << 20 });
  halfGraph = /float16|bfloat16|\bto=(10|16)\b/.test(dump.stdout || '');
  const args = ['run', model, '-o', oursDir, '--threads', '1'];
  for (const [n, f] of Object.entries(inputs)) args.push('-i', `${n}=${f}`);
  const r = spawnSync(opt.autofusion, args, { encoding: 'utf8' });
  // Random operators (Bernoulli, Random*, Multinomial, training-mode Dropout) draw different
  // numbers in each engine: nothing to compare.
  const randomOp = /= (Bernoulli|RandomNormal|RandomUniform|RandomNormalLike|RandomUniformLike|Multinomial)\(/.exec(dump.stdout || '');
  if (randomOp) return ['SKIP', `random operator ${randomOp[1]}: the engines draw different numbers`];
  if (r.status !== 0 && /Dropout/.test(r.stderr || '') && /random/.test(r.stderr || ''))
    return ['SKIP', `training-mode Dropout (random): ${(r.stderr || '').trim().split('\n').pop()}`];
  if (r.status !== 0 && /unsupported operator com\.microsoft::/.test(r.stderr || ''))
    return ['SKIP', `ONNX Runtime's own com.microsoft operators: ${(r.stderr || '').trim().split('\n').pop()}`];
  if (r.status !== 0) return ['FAIL', `ours: ${(r.stderr || String(r.error || '')).trim().split('\n').pop()}`];
  const problems = [];
  for (const n of outNames) {
    const file = `${n.replace(/[/\\:]/g, '_')}.npy`;
    const p = compare(path.join(oursDir, file), path.join(ortDir, file));
    if (p) problems.push(`${n}: ${p}`);
  }
  const tol = halfGraph ? ' (half-precision tolerance)' : '';
  return problems.length ? ['FAIL', problems.join('; ') + tol] : ['PASS', `${outNames.length} output(s)${tol}`];
}

async function main() {
  const root = opt.keep || fs.mkdtempSync(path.join(os.tmpdir(), 'gaf-compare-ort-'));
  const counts = { PASS: 0, FAIL: 0, SKIP: 0 };
  const t0 = Date.now();
  for (let i = 0; i < opt.models.length; i++) {
    const model = opt.models[i];
    const dir = path.join(root, String(i));
    fs.mkdirSync(dir, { recursive: true });
    let verdict, why;
    const tm = Date.now();
    if (process.env.COMPARE_TRACE) process.stderr.write(`start ${model}\n`);
    try {
      [verdict, why] = await checkModel(model, dir);
    } catch (e) {
      [verdict, why] = ['FAIL', `harness: ${e.message.split('\n')[0]}`];
    }
    counts[verdict]++;
    const secs = (Date.now() - tm) / 1000;
    const slow = secs >= 2 ? ` [${secs.toFixed(1)} s]` : '';
    if (verdict !== 'PASS' || opt.verbose) console.log(`${verdict} ${model}: ${why}${slow}`);
    else console.log(`PASS ${model}${slow}`);
    if (!opt.keep) fs.rmSync(dir, { recursive: true, force: true });
  }
  if (!opt.keep) fs.rmSync(root, { recursive: true, force: true });
  console.log(`${counts.PASS} passed, ${counts.FAIL} failed, ${counts.SKIP} skipped (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
  process.exit(counts.FAIL ? 1 : 0);
}

main();
