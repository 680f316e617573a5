#!/usr/bin/env node
// bench/tokenizer/bench_gpt_tokenizer.js — gpt-tokenizer's encoder on one thread, the JS
// half of the comparison (see bench_tokenizer.c for the line format and the meaning of
// cold and warm).
//
// Usage: node bench_gpt_tokenizer.js NODE_MODULES ENCODING TEXT [REPEATS]
// cold is the first encode() of the process: V8 compiles the encoder while it runs and
// gpt-tokenizer's merge cache starts empty. warm is the best of the REPEATS further calls
// (its merge cache, up to 100,000 entries, is kept between calls: that is its design).
// cpu_s is process.cpuUsage() (user + system, every thread of the process: V8's compiler
// and GC threads included), the honest count of cores used.
'use strict';
const fs = require('fs');
const path = require('path');

const [modules, encoding, textPath, repeatsArg] = process.argv.slice(2);
const repeats = repeatsArg ? Number(repeatsArg) : 5;
const { encode } = require(path.join(path.resolve(modules), `gpt-tokenizer/cjs/encoding/${encoding}`));
const text = fs.readFileSync(textPath, 'utf8');
const bytes = Buffer.byteLength(text);

function checksum(ids) {
  let h = 0;
  for (const id of ids) h = (Math.imul(h, 31) + id) >>> 0;
  return h.toString(16).padStart(8, '0');
}

function once() {
  const c0 = process.cpuUsage();
  const t0 = process.hrtime.bigint();
  const ids = encode(text, { allowedSpecial: new Set(), disallowedSpecial: new Set() });
  const wall = Number(process.hrtime.bigint() - t0) / 1e9;
  const c = process.cpuUsage(c0);
  return { ids, wall, cpu: (c.user + c.system) / 1e6 };
}

function line(kind, r) {
  console.log(`gpt-tokenizer ${encoding} ${kind} bytes=${bytes} tokens=${r.ids.length} checksum=${checksum(r.ids)} ` +
              `wall_s=${r.wall.toFixed(4)} cpu_s=${r.cpu.toFixed(4)} tok_per_s=${Math.round(r.ids.length / r.wall)}`);
}

line('cold', once());
let best = null;
for (let i = 0; i < repeats; i++) {
  const r = once();
  if (!best || r.wall < best.wall) best = { ids: r.ids, wall: r.wall, cpu: Math.min(r.cpu, best ? best.cpu : Infinity) };
  else best.cpu = Math.min(best.cpu, r.cpu);
}
line('warm', best);
