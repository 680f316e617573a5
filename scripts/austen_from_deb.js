#!/usr/bin/env node
// austen_from_deb.js — the six Jane Austen novels as plain text, read straight out of
// Debian's r-cran-janeaustenr package, without R.
//
// Usage: node austen_from_deb.js PACKAGE_ROOT OUT_DIR
//   PACKAGE_ROOT  where the .deb was unpacked (dpkg-deb -x), or / if it is installed
//   OUT_DIR       gets sensesensibility.txt, prideprejudice.txt, ... (one novel per file,
//                 its lines joined by "\n", UTF-8)
//
// The package keeps its data as an R lazy-load database: data/Rdata.rdx is a gzipped R
// serialization of an index {variables: {name: c(offset, length)}, ...}, and data/Rdata.rdb
// holds, at each offset, a 4-byte big-endian length and a zlib stream of one serialized
// object (here a character vector, one element per line of the novel). This script reads
// exactly the subset of R's XDR serialization format (R Internals, "Serialization Formats")
// that those two files use, and refuses anything else, so a changed package is an error and
// not silently wrong text.
'use strict';
const fs = require('fs');
const path = require('path');
const zlib = require('zlib');

const NOVELS = ['sensesensibility', 'prideprejudice', 'mansfieldpark', 'emma', 'northangerabbey', 'persuasion'];

function die(msg) {
  process.stderr.write(`austen_from_deb: error: ${msg}\n`);
  process.exit(1);
}

// A reader for R's big-endian XDR serialization ("X\n" format, versions 2 and 3).
class RReader {
  constructor(buf) {
    this.buf = buf;
    this.pos = 0;
    this.refs = [];
  }
  int() {
    if (this.pos + 4 > this.buf.length) die('truncated R serialization');
    const v = this.buf.readInt32BE(this.pos);
    this.pos += 4;
    return v;
  }
  bytes(n) {
    if (this.pos + n > this.buf.length) die('truncated R serialization');
    const b = this.buf.subarray(this.pos, this.pos + n);
    this.pos += n;
    return b;
  }
  header() {
    if (this.bytes(2).toString('latin1') !== 'X\n') die('not an XDR R serialization');
    const version = this.int();
    this.int(); // writer's R version
    this.int(); // minimal R version
    if (version === 3) this.bytes(this.int()); // native encoding name
    else if (version !== 2) die(`R serialization version ${version} is not supported`);
  }
  // One item. Returns JS values: strings arrays for STRSXP, arrays for VECSXP/INTSXP,
  // {tag: value} objects for pairlists, and attaches attributes as .attributes.
  item() {
    const flags = this.int();
    const type = flags & 0xff;
    const hasAttr = (flags & (1 << 9)) !== 0;
    const hasTag = (flags & (1 << 10)) !== 0;
    switch (type) {
      case 254: return null;                       // NILVALUE_SXP
      case 242: return null;                       // EMPTYENV_SXP
      case 255: {                                  // REFSXP
        const index = flags >> 8 || this.int();
        return this.refs[index - 1];
      }
      case 1: {                                    // SYMSXP
        const name = this.item();
        this.refs.push(name);
        return name;
      }
      case 9: {                                    // CHARSXP
        const n = this.int();
        if (n === -1) return null;                 // NA_STRING
        const raw = this.bytes(n);
        const levels = flags >> 12;
        // LATIN1_MASK = 4; otherwise UTF-8 or ASCII.
        return (levels & 4) ? raw.toString('latin1') : raw.toString('utf8');
      }
      case 16: case 19: {                          // STRSXP, VECSXP
        const n = this.int();
        const out = [];
        for (let i = 0; i < n; i++) out.push(this.item());
        if (hasAttr) out.attributes = this.item();
        return out;
      }
      case 13: case 10: {                          // INTSXP, LGLSXP
        const n = this.int();
        const out = [];
        for (let i = 0; i < n; i++) out.push(this.int());
        if (hasAttr) out.attributes = this.item();
        return out;
      }
      case 2: {                                    // LISTSXP (pairlist)
        const out = {};
        let attr = null;
        if (hasAttr) attr = this.item();
        const tag = hasTag ? this.item() : `${Object.keys(out).length}`;
        out[tag] = this.item();
        const rest = this.item();
        if (rest) Object.assign(out, rest);
        if (attr) out.attributes = attr;
        return out;
      }
      default:
        die(`R serialization item of type ${type} is not supported`);
    }
  }
}

function unserialize(buf) {
  const r = new RReader(buf);
  r.header();
  return r.item();
}

function main() {
  const [root, outDir] = process.argv.slice(2);
  if (!root || !outDir) die('usage: node austen_from_deb.js PACKAGE_ROOT OUT_DIR');
  const dataDir = path.join(root, 'usr/lib/R/site-library/janeaustenr/data');
  let rdx, rdb;
  try {
    rdx = fs.readFileSync(path.join(dataDir, 'Rdata.rdx'));
    rdb = fs.readFileSync(path.join(dataDir, 'Rdata.rdb'));
  } catch (e) {
    die(`cannot read the janeaustenr data in ${dataDir}: ${e.message}`);
  }
  const index = unserialize(zlib.gunzipSync(rdx));
  const names = index.attributes && index.attributes.names;
  if (!Array.isArray(index) || !names) die('Rdata.rdx is not the expected index');
  const variables = index[names.indexOf('variables')];
  const varNames = variables.attributes.names;
  fs.mkdirSync(outDir, { recursive: true });
  for (const novel of NOVELS) {
    const k = varNames.indexOf(novel);
    if (k < 0) die(`the package has no ${novel}`);
    const [offset, length] = variables[k];
    const blob = rdb.subarray(offset, offset + length);
    if (blob.length !== length || length < 5) die(`Rdata.rdb is truncated at ${novel}`);
    const expected = blob.readUInt32BE(0);
    const raw = zlib.inflateSync(blob.subarray(4));
    if (raw.length !== expected) die(`${novel}: inflated ${raw.length} bytes, expected ${expected}`);
    const lines = unserialize(raw);
    if (!Array.isArray(lines) || lines.some((l) => typeof l !== 'string' && l !== null)) die(`${novel} is not text`);
    const text = lines.map((l) => l || '').join('\n') + '\n';
    fs.writeFileSync(path.join(outDir, `${novel}.txt`), text);
    process.stdout.write(`${novel}.txt: ${lines.length} lines, ${Buffer.byteLength(text)} bytes\n`);
  }
}

main();
