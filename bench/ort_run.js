#!/usr/bin/env node
// Runs an ONNX model under ONNX Runtime (CPU) on inputs given as .npy files and writes every
// output as OUTDIR/NAME.npy (the same layout as `autofusion run -o OUTDIR`).
//
//   node bench/ort_run.js MODEL -i NAME=FILE.npy ... -o OUTDIR [--opt disabled|basic|extended|all]
//        [--threads N] [--repeat N]
//
// --repeat N: after the run that writes the outputs, N more timed runs of the same session;
// prints "ort median ms: X (N runs)" (session.run wall time, median).
//
// Graph optimizations are disabled by default so that ONNX Runtime computes the graph as written.
// Errors: one line on stderr, exit status 1.
'use strict';
const fs = require('fs');
const path = require('path');
const ort = require('onnxruntime-node');
const { readNpy, writeNpy } = require('./npy');

function toTensor(a) {
  let data = a.data;
  if (a.dtype === 'bool') data = new Uint8Array(data.buffer, data.byteOffset, data.length);
  return new ort.Tensor(a.dtype, data, a.shape);
}

// Runs MODEL on {name: path.npy}; writes outputs to outDir; returns output names.
async function runModel(model, inputs, outDir, opt = 'disabled', threads = 1, extra = {}) {
  const { repeat, ...sessionOptions } = extra;
  const session = await ort.InferenceSession.create(model, {
    executionProviders: ['cpu'], graphOptimizationLevel: opt, intraOpNumThreads: threads, interOpNumThreads: 1,
    executionMode: 'sequential', ...sessionOptions,
  });
  const feeds = {};
  for (const [name, file] of Object.entries(inputs)) feeds[name] = toTensor(readNpy(file));
  for (const n of session.inputNames) if (!(n in feeds)) throw new Error(`input '${n}' is not given (-i ${n}=FILE.npy)`);
  const outs = await session.run(feeds);
  if (extra.repeat > 0) {
    const times = [];
    for (let r = 0; r < extra.repeat; r++) {
      const t0 = process.hrtime.bigint();
      await session.run(feeds);
      times.push(Number(process.hrtime.bigint() - t0) / 1e6);
    }
    times.sort((a, b) => a - b);
    process.stdout.write(`ort median ms: ${times[Math.floor(times.length / 2)].toFixed(3)} (${times.length} runs)\n`);
  }
  fs.mkdirSync(outDir, { recursive: true });
  for (const [name, t] of Object.entries(outs)) {
    if (t.type === 'string') throw new Error(`output '${name}' is a string tensor; not supported`);
    const file = path.join(outDir, `${name.replace(/[/\\:]/g, '_')}.npy`);
    writeNpy(file, t.type, t.dims, t.data);
  }
  return Object.keys(outs);
}

async function main() {
  const argv = process.argv.slice(2);
  let model = null, outDir = null, opt = 'disabled', threads = 1, repeat = 0;
  const inputs = {};
  for (let i = 0; i < argv.length; i++) {
    const k = argv[i];
    if (k === '-i' || k === '--input') {
      const v = argv[++i], eq = v.indexOf('=');
      if (eq < 0) throw new Error(`-i expects NAME=FILE.npy, got '${v}'`);
      inputs[v.slice(0, eq)] = v.slice(eq + 1);
    } else if (k === '-o') outDir = argv[++i];
    else if (k === '--opt') opt = argv[++i];
    else if (k === '--threads') threads = Number(argv[++i]);
    else if (k === '--repeat') repeat = Number(argv[++i]);
    else if (k.startsWith('-')) throw new Error(`unknown option ${k}`);
    else model = k;
  }
  if (!model || !outDir) throw new Error('usage: ort_run.js MODEL -i NAME=FILE.npy ... -o OUTDIR [--opt LEVEL] [--threads N] [--repeat N]');
  const names = await runModel(model, inputs, outDir, opt, threads, { repeat });
  process.stdout.write(`${names.length} output(s) written to ${outDir}: ${names.join(', ')}\n`);
}

module.exports = { runModel };
if (require.main === module) main().catch((e) => { process.stderr.write(`ort_run.js: ${e.message.split('\n')[0]}\n`); process.exit(1); });
