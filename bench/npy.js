// Minimal NumPy .npy reader/writer (format 1.0-3.0, little-endian, C order) for the ORT scripts.
'use strict';
const fs = require('fs');

// numpy descr <-> onnxruntime tensor type and typed array.
const TYPES = [
  { descr: '<f4', ort: 'float32', Array: Float32Array },
  { descr: '<f8', ort: 'float64', Array: Float64Array },
  { descr: '<f2', ort: 'float16', Array: Uint16Array },
  { descr: '|i1', ort: 'int8', Array: Int8Array },
  { descr: '|u1', ort: 'uint8', Array: Uint8Array },
  { descr: '<i2', ort: 'int16', Array: Int16Array },
  { descr: '<u2', ort: 'uint16', Array: Uint16Array },
  { descr: '<i4', ort: 'int32', Array: Int32Array },
  { descr: '<u4', ort: 'uint32', Array: Uint32Array },
  { descr: '<i8', ort: 'int64', Array: BigInt64Array },
  { descr: '<u8', ort: 'uint64', Array: BigUint64Array },
  { descr: '|b1', ort: 'bool', Array: Uint8Array },
];

function typeByDescr(d) {
  const alias = { '<i1': '|i1', '<u1': '|u1', '<b1': '|b1', '|i1': '|i1', '|u1': '|u1', '|b1': '|b1' };
  const key = alias[d] || d;
  const t = TYPES.find((x) => x.descr === key);
  if (!t) throw new Error(`npy: unsupported dtype ${d}`);
  return t;
}
function typeByOrt(o) {
  const t = TYPES.find((x) => x.ort === o);
  if (!t) throw new Error(`npy: unsupported onnxruntime type ${o}`);
  return t;
}

// Returns {dtype (ort name), shape, data (typed array)}.
function readNpy(path) {
  const buf = fs.readFileSync(path);
  if (buf.toString('latin1', 0, 6) !== '\x93NUMPY') throw new Error(`${path}: not a .npy file`);
  const major = buf[6];
  let hlen, off;
  if (major === 1) { hlen = buf.readUInt16LE(8); off = 10; } else { hlen = buf.readUInt32LE(8); off = 12; }
  const header = buf.toString('latin1', off, off + hlen);
  const descr = /'descr':\s*'([^']+)'/.exec(header)[1];
  if (/'fortran_order':\s*True/.test(header)) throw new Error(`${path}: Fortran order is not supported`);
  const shapeStr = /'shape':\s*\(([^)]*)\)/.exec(header)[1];
  const shape = shapeStr.split(',').map((s) => s.trim()).filter((s) => s.length).map(Number);
  const t = typeByDescr(descr);
  const n = shape.reduce((a, b) => a * b, 1);
  const start = off + hlen;
  const bytes = buf.subarray(start, start + n * t.Array.BYTES_PER_ELEMENT);
  const copy = new Uint8Array(bytes.length);
  copy.set(bytes);
  return { dtype: t.ort, shape, data: new t.Array(copy.buffer, 0, n) };
}

function writeNpy(path, dtype, shape, data) {
  const t = typeByOrt(dtype);
  const shp = shape.length === 1 ? `(${shape[0]},)` : `(${shape.join(', ')})`;
  let header = `{'descr': '${t.descr}', 'fortran_order': False, 'shape': ${shp}, }`;
  const total = 10 + header.length + 1;
  header += ' '.repeat((64 - (total % 64)) % 64) + '\n';
  const pre = Buffer.alloc(10);
  pre.write('\x93NUMPY', 0, 'latin1');
  pre[6] = 1; pre[7] = 0;
  pre.writeUInt16LE(header.length, 8);
  let body;
  if (data instanceof Uint8Array || ArrayBuffer.isView(data)) {
    body = Buffer.from(data.buffer, data.byteOffset, data.byteLength);
  } else {
    const arr = t.Array.from(data);
    body = Buffer.from(arr.buffer);
  }
  fs.writeFileSync(path, Buffer.concat([pre, Buffer.from(header, 'latin1'), body]));
}

// Element values as JS numbers (float16 decoded), for comparisons.
function toNumbers(dtype, data) {
  if (dtype === 'float16') {
    const out = new Float64Array(data.length);
    for (let i = 0; i < data.length; i++) out[i] = halfToFloat(data[i]);
    return out;
  }
  if (dtype === 'int64' || dtype === 'uint64') return Float64Array.from(data, (v) => Number(v));
  return data;
}

function halfToFloat(h) {
  const s = h & 0x8000 ? -1 : 1, e = (h >> 10) & 0x1f, f = h & 0x3ff;
  if (e === 0) return s * Math.pow(2, -14) * (f / 1024);
  if (e === 31) return f ? NaN : s * Infinity;
  return s * Math.pow(2, e - 15) * (1 + f / 1024);
}

module.exports = { readNpy, writeNpy, toNumbers, typeByOrt, TYPES };
