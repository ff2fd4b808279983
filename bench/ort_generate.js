#!/usr/bin/env node
// Greedy decoding with the KV cache under ONNX Runtime (CPU), the same loop as
// `autofusion generate` (src/models/generate.cc): one prefill run over the prompt with an empty
// past, then one run per new token feeding the previous run's present.* as past_key_values.*.
// Each step is timed from building its feeds to the argmax of its logits, as ours is.
//
//   node bench/ort_generate.js MODEL --prompt-ids 1,2,3 [--max-new-tokens 50] [--threads 1]
//        [--opt disabled|basic|extended|all] [--repeat 3] [--logits-npy FILE]
//
// Prints one JSON object: tokens, prefill_ms, decode_ms_per_token (median step of each
// generation, then the median over repeats), decode_tokens_per_second, and with --logits-npy the
// prefill's last-position logits written as float32 [vocab].
'use strict';
const ort = require('onnxruntime-node');
const { writeNpy } = require('./npy');

function parseArgs(argv) {
  const a = { model: null, promptIds: null, promptLen: 16, maxNew: 50, threads: 1, opt: 'disabled', repeat: 1, logitsNpy: null, seed: 0 };
  for (let i = 0; i < argv.length; i++) {
    const k = argv[i], v = () => argv[++i];
    if (k === '--prompt-ids') a.promptIds = v().split(',').filter((s) => s.length).map(Number);
    else if (k === '--prompt-len') a.promptLen = Number(v());
    else if (k === '--max-new-tokens' || k === '-n') a.maxNew = Number(v());
    else if (k === '--threads') a.threads = Number(v());
    else if (k === '--opt') a.opt = v();
    else if (k === '--repeat') a.repeat = Number(v());
    else if (k === '--logits-npy') a.logitsNpy = v();
    else if (k === '--seed') a.seed = Number(v());
    else if (k.startsWith('-')) throw new Error(`unknown option ${k}`);
    else a.model = k;
  }
  if (!a.model) throw new Error('usage: ort_generate.js MODEL --prompt-ids ... [options]');
  return a;
}

const median = (v) => { const s = [...v].sort((x, y) => x - y); return s.length ? s[Math.floor(s.length / 2)] : 0; };
const nowMs = () => Number(process.hrtime.bigint()) / 1e6;

// Cache input -> present output: same layer index and key/value kind (Optimum naming).
function cacheKey(name) {
  const m = /(\d+)(?:\.(key|value))?$/.exec(name.replace(/_/g, '.'));
  return m ? `${m[1]}:${m[2] || ''}` : null;
}

function intTensor(type, values, dims) {
  if (type === 'int32') return new ort.Tensor('int32', Int32Array.from(values), dims);
  return new ort.Tensor('int64', BigInt64Array.from(values.map((x) => BigInt(x))), dims);
}

function emptyPast(meta) {
  // Sequence dim = the only symbolic non-batch dim, or the one mentioning past/seq.
  const dims = meta.shape.map((d) => (typeof d === 'number' ? d : 1));
  const sym = [], seqLike = [];
  meta.shape.forEach((d, i) => {
    if (typeof d === 'number' || /batch/i.test(String(d))) return;
    sym.push(i);
    if (/past|seq/i.test(String(d))) seqLike.push(i);
  });
  dims[sym.length === 1 ? sym[0] : seqLike[0]] = 0;
  const type = meta.type === 'float16' ? 'float16' : 'float32';
  const Arr = type === 'float16' ? Uint16Array : Float32Array;
  return new ort.Tensor(type, new Arr(0), dims);
}

function argmaxLast(logits) {
  const d = logits.dims, vocab = d[d.length - 1];
  const data = logits.data, base = data.length - vocab;
  let best = 0, bv = -Infinity;
  for (let i = 0; i < vocab; i++) if (data[base + i] > bv) { bv = data[base + i]; best = i; }
  return best;
}

async function main() {
  const a = parseArgs(process.argv.slice(2));
  const opts = {
    executionProviders: ['cpu'],
    graphOptimizationLevel: a.opt,
    intraOpNumThreads: a.threads,
    interOpNumThreads: 1,
    executionMode: 'sequential',
  };
  const tLoad = nowMs();
  const session = await ort.InferenceSession.create(a.model, opts);
  const loadMs = nowMs() - tLoad;
  const inMeta = Object.fromEntries(session.inputMetadata.map((m) => [m.name, m]));
  const find = (names, want) => names.find((n) => n === want) || names.find((n) => n.toLowerCase().includes(want));
  const sig = {
    ids: find(session.inputNames, 'input_ids'),
    mask: find(session.inputNames, 'attention_mask'),
    pos: find(session.inputNames, 'position_ids'),
    logits: find(session.outputNames, 'logits'),
    cache: [],
  };
  const presents = {};
  for (const o of session.outputNames) if (/present/i.test(o)) presents[cacheKey(o)] = o;
  for (const i of session.inputNames) if (/^past/i.test(i)) sig.cache.push([i, presents[cacheKey(i)]]);
  const outNames = [sig.logits, ...sig.cache.map((c) => c[1])];
  const logitsMeta = session.outputMetadata.find((m) => m.name === sig.logits);
  const vocab = logitsMeta && typeof logitsMeta.shape[logitsMeta.shape.length - 1] === 'number' ? logitsMeta.shape[logitsMeta.shape.length - 1] : 256;

  let prompt = a.promptIds;
  if (!prompt) {  // deterministic LCG prompt (not the same as autofusion's --seed prompt; pass --prompt-ids to compare)
    let s = (a.seed * 2654435761 + 12345) >>> 0;
    prompt = [];
    for (let i = 0; i < a.promptLen; i++) { s = (Math.imul(s, 1664525) + 1013904223) >>> 0; prompt.push(s % vocab); }
  }

  const typeOf = (n) => (inMeta[n] ? inMeta[n].type : 'int64');
  function feedsFor(ids, pastLen) {
    const n = ids.length, f = {};
    f[sig.ids] = intTensor(typeOf(sig.ids), ids, [1, n]);
    if (sig.mask) f[sig.mask] = intTensor(typeOf(sig.mask), new Array(pastLen + n).fill(1), [1, pastLen + n]);
    if (sig.pos) f[sig.pos] = intTensor(typeOf(sig.pos), ids.map((_, i) => pastLen + i), [1, n]);
    return f;
  }

  let lastLogits = null;
  async function generate() {
    const t0 = nowMs();
    let feeds = feedsFor(prompt, 0);
    for (const [past] of sig.cache) feeds[past] = emptyPast(inMeta[past]);
    let outs = await session.run(feeds, outNames);
    let token = argmaxLast(outs[sig.logits]);
    const prefill = nowMs() - t0;
    const lg = outs[sig.logits], V = lg.dims[lg.dims.length - 1];
    lastLogits = Float32Array.from(lg.data.subarray(lg.data.length - V));
    const tokens = [token], steps = [];
    let pastLen = prompt.length;
    while (tokens.length < a.maxNew) {
      const ts = nowMs();
      feeds = feedsFor([token], pastLen);
      for (const [past, present] of sig.cache) feeds[past] = outs[present];
      outs = await session.run(feeds, outNames);
      token = argmaxLast(outs[sig.logits]);
      steps.push(nowMs() - ts);
      tokens.push(token);
      pastLen++;
    }
    return { tokens, prefill, step: median(steps), steps: steps.length };
  }

  const repeats = Math.max(1, a.repeat);
  if (repeats > 1) await generate();  // warm-up, excluded
  const runs = [];
  for (let r = 0; r < repeats; r++) runs.push(await generate());
  const deterministic = runs.every((r) => JSON.stringify(r.tokens) === JSON.stringify(runs[0].tokens));
  const step = median(runs.map((r) => r.step));
  if (a.logitsNpy) writeNpy(a.logitsNpy, 'float32', [lastLogits.length], lastLogits);
  let maxAbs = 0;
  for (const v of lastLogits) maxAbs = Math.max(maxAbs, Math.abs(v));
  const out = {
    engine: 'onnxruntime',
    ort_version: ort.env.versions ? ort.env.versions.node : undefined,
    model: a.model,
    graph_optimization_level: a.opt,
    threads: a.threads,
    session_create_ms: loadMs,
    prompt_ids: prompt,
    tokens: runs[0].tokens,
    new_tokens: runs[0].tokens.length,
    repeats,
    prefill_ms: median(runs.map((r) => r.prefill)),
    decode_ms_per_token: step,
    decode_tokens_per_second: step > 0 ? 1000 / step : 0,
    deterministic,
    prefill_last_logits_max_abs: maxAbs,
    runs: runs.map((r) => ({ prefill_ms: r.prefill, decode_ms_per_token: r.step, decode_steps: r.steps })),
  };
  process.stdout.write(JSON.stringify(out, null, 2) + '\n');
}

main().catch((e) => { process.stderr.write(`ort_generate.js: ${e.message}\n`); process.exit(1); });
