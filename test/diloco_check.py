"""Independent check of DiLoCo's outer step from the tensors train_gpt dumps.

usage: diloco_check.py DUMP_DIR OUTER_LR MOMENTUM QUANT [MAX_QUANT_REL_ERR [NESTEROV [MU_WARMUP
                       [FRAGMENTS [MERGE_ALPHA]]]]] [--hub DOWNLINK[:FEEDBACK[:BLOCK[:BOUND]]] | --hub off]
                       [--topk T] [--plain_from K]
       diloco_check.py --codec DIR...      (cases of `test_tool quant` / `quant_reduce`)

TRAIN_GPT_DILOCO_DUMP=DIR makes every replica write DIR/outer_<replica>_<k>_<p>.f32 at outer
step k, which syncs fragment p (the whole model when FRAGMENTS = 1): θ before, θᵢ (its local
weights), Δ, m before, m after, θ after, each the fragment's numel fp32 values. This script
recomputes, in float64 and without any train_gpt code:
  Δ      = θ_before − mean over replicas of θᵢ      (the sign convention)
  m      = μₖ·m_before + Δ
  θ      = θ_before − lr·(Δ + μₖ·m)                 (torch.optim.SGD, nesterov=True)
         = θ_before − lr·m                          (NESTEROV = 0: heavy-ball)
  m is stored as 0 where μₖ = 0 (no later step reads it: torch's SGD keeps no buffer then)
  μₖ     = μ·j/W for the fragment's outer step j < W = MU_WARMUP, else μ; j = ⌊(k − 1)/FRAGMENTS⌋ + 1
           for a regular round, and for the final syncs after the last step (fragments 0..P−1
           in rounds k0..k0+P−1) fragment p's regular rounds before k0, ⌈(k0 − p)/P⌉, + 1
and, from outer step K = --plain_from on (diloco_plain_in_decay: the steps landed in the inner
schedule's decay phase), lr = 1 and μₖ = 0 (θ = the mean); and checks each against the dump,
plus that all replicas hold the same bits and that a fragment's θ before is its previous
outer step's θ after. With streaming (overlap > 0) the replicas also write DIR/merge_<replica>_<k>_<p>.f32: local weights before, θ, local weights
after the merge, which must be α·before + (1 − α)·θ (MERGE_ALPHA = α) and whose θ must be
outer step k's θ after, bit for bit.

The hub's reduction. The replicas also write DIR/sent_<replica>_<k>_<p>.bin (the encoded
contribution it sent: θᵢ as fp32 with QUANT = none, else its encoded Δᵢ),
DIR/tokens_<replica>_<k>_<p>.bin (the tokens behind it, u64 little-endian: its weight) and
DIR/mean_<replica>_<k>_<p>.bin (the encoded mean it received; applied rounds only). When they
are there this script re-does the hub in numpy, with its own decoder and encoder (the byte
layout of docs/quant.md, segments of quant_segment_values(BLOCK) values relative to the
fragment, each encoded on its own):
  per segment: leave out a contribution holding NaN/Inf; decode each (code·scale, one fp32
  multiply; with unequal tokens tⱼ, times fp32(tⱼ·count/Σt), the bound's scale folded in by one
  fp32 multiply); s = v₀, s = s + v₁, ... in ascending replica id, each add rounded to fp32; s / count
  (one fp32 division, none for count 1); then encode y = s + r in the downlink codec with the
  hub's residual r ← y − decode(encoded) (per fragment position, from 0 at the fragment's first
  outer step), and requires the result BYTE-IDENTICAL to every replica's mean_ (which must all
  be the same bytes). The contributors of outer step k are the replicas that dumped its mean_;
  should that fail and more replicas dumped a sent_ for k (e.g. one dropped after it had
  uploaded), all senders are tried too. The dumped Δ must then be the decoded mean exactly
  (quantized kinds: Δ = (float)(double)mean, bit for bit) or, with QUANT = none,
  (float)((double)θ_before − (double)mean), bit for bit or within 1e-6 of max|Δ|.
--hub DOWNLINK[:FEEDBACK[:BLOCK[:BOUND]]] says how the run encoded: DOWNLINK = same (the uplink's
codec) | fp32 | bf16 (as diloco_downlink; none, int8, int4 name a codec directly), FEEDBACK =
diloco_downlink_feedback (0 | 1; no effect when the downlink is fp32), BLOCK =
diloco_quant_block, BOUND = diloco_bound (a contribution whose segment norm, squares summed
in float64 in order, is above BOUND times the lower median of the segment's norms is scaled
to that, in fp32; not for none, which carries weights). Left out, it is train_gpt's defaults,
same:1:128:3. --topk T is the run's diloco_topk: the uplink is then sparse (QUANT keeping
ceil(T·BLOCK) values of every block, docs/quant.md) and the downlink "same" is QUANT dense.
--hub off skips the hub
checks; so does a dump without sent_/mean_ files (a binary older than the hub's reduction),
and the script says so.
A round whose replicas skipped the outer step leaves no outer_/mean_ dump, but the hub may
still have reduced it and moved its residual: with downlink feedback, fragment p's rounds
from the first such gap on cannot be reproduced byte for byte. A gap is an outer step j
before k that is fragment p's (by the fragment in the name of its sent_ files, which stay)
but has no outer_ dump, or that left no file at all (so it may have been p's). The rounds
after a gap are reported as unverifiable (their mean_ files are still compared between
replicas and against Δ), not failed. Without feedback every round is checked. A hub that
restarts (a resumed MPI run, a tcp group founded anew) starts its residual at 0 again: dump
such runs into separate directories.

Tolerances: Δ, m, θ and a merge are fp32 roundings of float64 results, so each is within one
fp32 rounding (6e-8 relative to the tensor's largest value) of the float64 value; 1e-6
leaves margin for the double-rounding of m that feeds θ, and still catches a flipped
sign (an error of ~2·lr·|Δ+μm|, 1e-4..1e-2 of |θ| here). With QUANT = none the reference of
Δ is θ_before minus the hub's fp32 mean of the θᵢ (recomputed as above, from the sent_ files
or, without them, from the dumped θᵢ), not their float64 mean: the fp32 mean differs from the
float64 one by up to half an ulp of θ (plus the roundings of the running sum), and since
|Δ| = |θ − mean| is small against |θ| that is often more than 1e-6 of max|Δ| (1e-5..5e-5
on the test's runs). With quantization the Δ check compares against the mean of the true Δᵢ
(float64) with the stated relative L2 bound MAX_QUANT_REL_ERR instead; with downlink
feedback Δ also carries the hub's residual (and the downlink's own rounding), so the bound
must cover two quantizations.
"""
import glob
import math
import os
import re
import sys

import numpy as np

F32_NAN_BITS = np.uint32(0x7FC00000)
CODECS = ("none", "int8", "int4", "int2", "bf16")
QMAX = {"int8": 127.0, "int4": 7.0, "int2": 1.0}
BITS = {"int8": 8, "int4": 4, "int2": 2}


# ---------------------------------------------------------------- codecs (docs/quant.md)
# A codec is a kind ("none", "int8", ...) or a sparse one, "KIND@KEEP": KEEP values of every
# block kept (the largest |y|, ties to the lower index), docs/quant.md's sparse layout.
def split_codec(codec):
    kind, _, keep = codec.partition("@")
    return kind, int(keep) if keep else 0


def topk_keep(topk, block):
    """diloco_topk -> values kept per block (0: dense), as quant_topk_keep."""
    keep = max(1, math.ceil(topk * block - 1e-9))
    return 0 if keep >= block else keep


def segment_values(block):
    return block * max(2, 2 * ((1 << 17) // block))


def offset_width(block):
    return max(0, (block - 1).bit_length())


def sparse_shape(block, keep, bits):
    """(offsets?, w): offsets when ceil(keep·w/8) < ceil(block/8)."""
    w = offset_width(block)
    return -(-keep * w // 8) < -(-block // 8), w


def sparse_record_bytes(block, keep, bits, ln):
    offsets, w = sparse_shape(block, keep, bits)
    k = min(keep, ln)
    return (-(-k * w // 8) if offsets else -(-ln // 8)) + -(-k * bits // 8)


def encoded_bytes(codec, n, block):
    kind, keep = split_codec(codec)
    if kind == "none":
        return 4 * n
    if kind == "bf16":
        return 2 * n
    blocks = -(-n // block)
    if keep:
        if n == 0:
            return 0
        last = n - (blocks - 1) * block
        return 4 * blocks + (blocks - 1) * sparse_record_bytes(block, keep, BITS[kind], block) + \
            sparse_record_bytes(block, keep, BITS[kind], last)
    return 4 * blocks + {"int8": n, "int4": (n + 1) // 2, "int2": (n + 3) // 4}[kind]


def segmented_bytes(kind, n, block):
    seg = segment_values(block)
    return sum(encoded_bytes(kind, min(seg, n - s0), block) for s0 in range(0, n, seg))


def segments(kind, buf, n, block):
    """(start, len, bytes) of each segment of an encoded fragment of n values."""
    seg, at, out = segment_values(block), 0, []
    for s0 in range(0, n, seg):
        ln = min(seg, n - s0)
        nb = encoded_bytes(kind, ln, block)
        out.append((s0, ln, buf[at:at + nb]))
        at += nb
    return out


def _nan_f32(shape):
    return np.full(shape, F32_NAN_BITS, dtype=np.uint32).view(np.float32)


def _pack(values, width):
    """Rows of unsigned fields (rows, count) -> bytes (rows, ceil(count·width/8)), LSB first."""
    v = np.asarray(values, dtype=np.uint64)
    bits = ((v[..., None] >> np.arange(width, dtype=np.uint64)) & np.uint64(1)).astype(np.uint8)
    return np.packbits(bits.reshape(v.shape[0], -1), axis=1, bitorder="little")


def _unpack(b, count, width):
    """Rows of bytes -> rows of `count` unsigned fields of `width` bits, LSB first."""
    bits = np.unpackbits(b, axis=1, bitorder="little")[:, :count * width].reshape(b.shape[0], count, width)
    return (bits.astype(np.int64) << np.arange(width, dtype=np.int64)).sum(axis=2)


def _sparse_groups(n, block):
    """(first block, number of blocks, their length): the full blocks, then a short last one."""
    if n == 0:
        return []
    blocks = -(-n // block)
    last = n - (blocks - 1) * block
    if last == block:
        return [(0, blocks, block)]
    return ([(0, blocks - 1, block)] if blocks > 1 else []) + [(blocks - 1, 1, last)]


def decode_sparse(kind, keep, b, n, block):
    bits = BITS[kind]
    blocks = -(-n // block)
    scales = np.frombuffer(b, dtype="<f4", count=blocks).astype(np.float32)
    offsets, w = sparse_shape(block, keep, bits)
    out = np.empty(n, dtype=np.float32)
    at = 4 * blocks
    for first, count, ln in _sparse_groups(n, block):
        k = min(keep, ln)
        rec = sparse_record_bytes(block, keep, bits, ln)
        ib = -(-k * w // 8) if offsets else -(-ln // 8)
        rows = np.frombuffer(b, dtype=np.uint8, count=count * rec, offset=at).reshape(count, rec)
        at += count * rec
        if offsets:
            pos = _unpack(rows[:, :ib], k, w)
        else:
            mask = np.unpackbits(rows[:, :ib], axis=1, bitorder="little")[:, :ln].astype(bool)
            pos = np.argsort(~mask, axis=1, kind="stable")[:, :k]
        raw = _unpack(rows[:, ib:], k, bits)
        codes = (raw ^ (1 << (bits - 1))) - (1 << (bits - 1))
        s = scales[first:first + count]
        with np.errstate(invalid="ignore"):
            vals = np.zeros((count, ln), dtype=np.float32) * s[:, None]  # 0·scale: NaN in a NaN block
            np.put_along_axis(vals, pos, codes.astype(np.float32) * s[:, None], axis=1)
        out[first * block:first * block + count * ln] = vals.reshape(-1)
    return out


def decode(codec, b, n, block):
    """The n fp32 values of one encoded segment (value = code·scale, one fp32 multiply)."""
    kind, keep = split_codec(codec)
    if keep:
        return decode_sparse(kind, keep, b, n, block)
    if kind == "none":
        return np.frombuffer(b, dtype="<f4", count=n).astype(np.float32)
    if kind == "bf16":
        return (np.frombuffer(b, dtype="<u2", count=n).astype(np.uint32) << np.uint32(16)).view(np.float32)
    nb = -(-n // block)
    scales = np.frombuffer(b, dtype="<f4", count=nb).astype(np.float32)
    code_bytes = np.frombuffer(b, dtype=np.uint8, offset=4 * nb)
    if kind == "int8":
        codes = code_bytes[:n].view(np.int8).astype(np.float32)
    elif kind == "int2":
        pairs = np.unpackbits(code_bytes, bitorder="little").reshape(-1, 2).astype(np.int16)
        codes = (((pairs[:n, 0] | (pairs[:n, 1] << 1)) ^ 2) - 2).astype(np.float32)
    else:
        nib = np.empty(2 * code_bytes.size, dtype=np.int16)
        nib[0::2] = code_bytes & 0x0F
        nib[1::2] = code_bytes >> 4
        codes = ((nib[:n] ^ 8) - 8).astype(np.float32)
    with np.errstate(invalid="ignore"):
        return codes * np.repeat(scales, block)[:n]  # float32 · float32: one fp32 multiply


def is_finite(codec, b, n, block):
    kind, _ = split_codec(codec)
    if kind == "bf16":
        return not np.any((np.frombuffer(b, dtype="<u2", count=n) & 0x7F80) == 0x7F80)
    floats = n if kind == "none" else -(-n // block)
    return bool(np.all(np.isfinite(np.frombuffer(b, dtype="<f4", count=floats))))


def encode(codec, x, r, block):
    """Encodes x (+ r, updated in place to y − decode(out) when not None) -> bytes."""
    kind, keep = split_codec(codec)
    n = x.size
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        y = x + r if r is not None else x  # fp32 add
        if kind == "none":
            if r is not None:
                y = np.where(np.isnan(y), _nan_f32(n), y)
                r[:] = y - y
            return y.astype("<f4").tobytes()
        if kind == "bf16":
            bits = y.view(np.uint32).astype(np.uint64)
            rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF
            h = np.where((bits & 0x7FFFFFFF) > 0x7F800000, 0x7FC0, rounded).astype(np.uint16)
            if r is not None:
                r[:] = y - (h.astype(np.uint32) << np.uint32(16)).view(np.float32)
            return h.astype("<u2").tobytes()
        qmax = np.float32(QMAX[kind])
        nb = -(-n // block)
        pad = np.zeros(nb * block, dtype=np.float32)
        pad[:n] = y
        max_bits = (pad.view(np.uint32) & np.uint32(0x7FFFFFFF)).reshape(nb, block).max(axis=1)
        bad = max_bits > 0x7F7FFFFF  # Inf or NaN in the block
        scales = max_bits.view(np.float32) / qmax  # fp32 division
        scales[bad] = _nan_f32(int(bad.sum()))
        s = np.repeat(scales, block)[:n]
        ok = s > 0  # false for 0 and NaN: codes 0
        v = np.where(ok, y / np.where(ok, s, np.float32(1)), np.float32(0))  # fp32 division
        v = np.minimum(np.maximum(v, -qmax), qmax)
        a = np.abs(v)
        t = np.floor(a)
        q = t + (a - t >= np.float32(0.5)).astype(np.float32)
        codes = np.where(v < 0, -q, q).astype(np.int8)
        if keep:
            # The kept set: per block, |y| as bits descending, the lower index first among equals
            # (a stable sort of the negated bits; the padding, -1, is never taken).
            key = np.full(nb * block, -1, dtype=np.int64)
            key[:n] = (y.view(np.uint32) & np.uint32(0x7FFFFFFF)).astype(np.int64)
            order = np.argsort(-key.reshape(nb, block), axis=1, kind="stable")
            lens = np.minimum(block, n - np.arange(nb) * block)
            take = np.arange(block)[None, :] < np.minimum(keep, lens)[:, None]
            kept = np.zeros((nb, block), dtype=bool)
            np.put_along_axis(kept, order, take, axis=1)
            codes = np.where(kept.reshape(-1)[:n], codes, np.int8(0))
        if r is not None:
            r[:] = y - codes.astype(np.float32) * s
        if keep:
            return scales.astype("<f4").tobytes() + _encode_sparse_records(kind, keep, codes, kept, n, block)
        if kind == "int8":
            code_bytes = codes.tobytes()
        elif kind == "int2":
            c = (codes.astype(np.uint8) & 0x03)
            c = np.append(c, np.zeros(-n % 4, dtype=np.uint8))
            code_bytes = (c[0::4] | (c[1::4] << 2) | (c[2::4] << 4) | (c[3::4] << 6)).astype(np.uint8).tobytes()
        else:
            c = (codes.astype(np.uint8) & 0x0F)
            if n % 2:
                c = np.append(c, np.uint8(0))
            code_bytes = (c[0::2] | (c[1::2] << 4)).astype(np.uint8).tobytes()
        return scales.astype("<f4").tobytes() + code_bytes


def _encode_sparse_records(kind, keep, codes, kept, n, block):
    """The records (index + codes) of every block, from the codes (0 off the kept set) and the
    kept mask (nb, block)."""
    bits = BITS[kind]
    offsets, w = sparse_shape(block, keep, bits)
    pad = np.zeros(kept.size, dtype=np.int64)
    pad[:n] = codes
    codes2 = pad.reshape(kept.shape)
    out = []
    for first, count, ln in _sparse_groups(n, block):
        k = min(keep, ln)
        m = kept[first:first + count, :ln]
        pos = np.argsort(~m, axis=1, kind="stable")[:, :k]  # kept positions, ascending
        if offsets:
            index = _pack(pos, w) if k else np.zeros((count, 0), dtype=np.uint8)
        else:
            index = np.packbits(m, axis=1, bitorder="little")
        vals = np.take_along_axis(codes2[first:first + count], pos, axis=1) & ((1 << bits) - 1)
        out.append(np.concatenate([index, _pack(vals, bits)], axis=1).tobytes())
    return b"".join(out)


BOUND = [3.0]  # diloco_bound (the 4th field of --hub); 0 = none


def bound_factors(up, values):
    """diloco_bound: each contribution's factor (fp32), from its norm (squares summed in float64
    in order, as quant_norm) against BOUND times the lower median of the norms."""
    bound = float(np.float32(BOUND[0]))
    if bound <= 0 or split_codec(up)[0] == "none" or not values:
        return [np.float32(1)] * len(values)
    norms = []
    for v in values:
        w = v.astype(np.float64)
        norms.append(math.sqrt(float(np.cumsum(w * w)[-1])) if w.size else 0.0)
    limit = bound * sorted(norms)[(len(norms) - 1) // 2]
    return [np.float32(limit / x) if limit > 0 and x > limit else np.float32(1) for x in norms]


def weight_factors(weights, kept, up="int8"):
    """Token weights (quant_reduce_segment): contribution j is scaled by fp32(w_j·kept/Σw), the
    sum in float64 in ascending id; equal weights give exactly 1. With BOUND (not for none) a
    weight counts at most BOUND times the lower median weight."""
    if weights is None:
        return [np.float32(1)] * len(kept)
    w = [float(weights[i]) for i in kept]
    bound = float(np.float32(BOUND[0]))
    if bound > 0 and split_codec(up)[0] != "none":
        cap = bound * sorted(w)[(len(w) - 1) // 2]
        w = [min(x, cap) for x in w]
    total = 0.0
    for x in w:
        total += x
    return [np.float32(x * len(kept) / total) for x in w]


def hub_segment(up, ins, n, block, down, r, order=None, weights=None):
    """The hub's reduction of one segment: (encoded mean, ids used). A contribution of weight 0
    (no work: a replica that joined at the run's end) is left out, as if it were not there."""
    kept = [i for i, b in enumerate(ins)
            if (weights is None or weights[i] != 0) and is_finite(up, b, n, block)]
    if not kept:
        return encode(down, _nan_f32(n), None, block), kept
    values = [decode(up, ins[i], n, block) for i in kept]
    factors = bound_factors(up, values)
    factors = [f if g == 1 else np.float32(f * g) for f, g in zip(factors, weight_factors(weights, kept, up))]
    values = [v if f == 1 else (v * f).astype(np.float32) for v, f in zip(values, factors)]
    s = values[0].copy()
    for v in values[1:]:
        s = s + v  # fp32, in ascending replica id
    if len(kept) > 1:
        s = np.divide(s, np.float32(len(kept)), dtype=np.float32)
    return encode(down, s, r, block), kept


def hub_mean(up, sents, n, block, down, residual, weights=None):
    """The hub's encoded mean of a fragment from the senders' payloads (ascending id), weighted
    by the senders' tokens when given."""
    pieces = [segments(up, b, n, block) for b in sents]
    out = []
    for j, (s0, ln, _) in enumerate(pieces[0]):
        r = residual[s0:s0 + ln] if residual is not None else None
        out.append(hub_segment(up, [p[j][2] for p in pieces], ln, block, down, r, weights=weights)[0])
    return b"".join(out)


def decode_all(kind, buf, n, block):
    return np.concatenate([decode(kind, b, ln, block) for _, ln, b in segments(kind, buf, n, block)])


# ---------------------------------------------------------------- arguments
# The options that take a value: name -> (parse, what the value must be).
OPTIONS = {
    "--hub": (str, "DOWNLINK[:FEEDBACK[:BLOCK]] or off"),
    "--topk": (float, "a fraction in (0, 1]"),
    "--plain_from": (int, "an outer step"),
}


def parse_args(argv):
    pos, opts = [], {"--hub": None, "--topk": 1.0, "--plain_from": None}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in OPTIONS:
            if i + 1 >= len(argv):
                sys.exit(f"diloco_check: {a} needs {OPTIONS[a][1]}")
            opts[a] = OPTIONS[a][0](argv[i + 1])
            i += 2
            continue
        if a.startswith("--hub="):
            opts["--hub"] = a[len("--hub="):]
        else:
            pos.append(a)
        i += 1
    if len(pos) < 4 or not 0 < opts["--topk"] <= 1:
        sys.exit(__doc__)
    return pos, opts["--hub"], opts["--topk"], opts["--plain_from"]


def hub_config(spec, quant):
    """(downlink codec, feedback, block) or None for off."""
    if spec is not None and spec.strip().lower() == "off":
        return None
    parts = (spec or "").split(":") if spec else []
    down = parts[0] if len(parts) > 0 and parts[0] else "same"
    feedback = int(parts[1]) if len(parts) > 1 and parts[1] else 1
    block = int(parts[2]) if len(parts) > 2 and parts[2] else 128
    BOUND[0] = float(parts[3]) if len(parts) > 3 and parts[3] else 3.0
    if down == "same":
        down = quant
    elif down == "fp32":
        down = "none"
    if down not in CODECS or feedback not in (0, 1) or block < 1:
        sys.exit(f"diloco_check: bad --hub '{spec}': DOWNLINK same|fp32|bf16|none|int8|int4, FEEDBACK 0|1, BLOCK >= 1")
    if quant == "none":
        down = "none"  # train_gpt: diloco_quant = none always sends the mean back in fp32
    return down, bool(feedback) and down != "none", block


# ---------------------------------------------------------------- codec cases
def codec_cases(dirs):
    """--codec DIR...: each DIR holds a case `test_tool quant` or `quant_reduce` wrote; numpy's
    encoder (with feedback) and decoder, or its hub, must give the same bytes and bits."""
    failures = 0
    for d in dirs:
        words = open(os.path.join(d, "case.txt")).read().split()

        def f32(name):
            return np.fromfile(os.path.join(d, name), dtype="<f4").astype(np.float32)

        def raw(name):
            with open(os.path.join(d, name), "rb") as f:
                return f.read()
        if words[0] == "encode":
            codec, block, n = words[1], int(words[2]), int(words[3])
            r = f32("r.f32")
            want = encode(codec, f32("x.f32"), r, block)
            problems = []
            if want != raw("enc.bin"):
                got = raw("enc.bin")
                diff = [i for i in range(min(len(got), len(want))) if got[i] != want[i]]
                problems.append(f"bytes differ ({len(got)} vs numpy's {len(want)}, first at {diff[:1]})")
            if not np.array_equal(r.view(np.uint32), f32("r_after.f32").view(np.uint32)) and \
                    not np.array_equal(np.isnan(r), np.isnan(f32("r_after.f32"))):
                problems.append("residual differs")
            else:
                a, b = r, f32("r_after.f32")
                if not np.array_equal(np.where(np.isnan(a), 0, a).view(np.uint32),
                                      np.where(np.isnan(b), 0, b).view(np.uint32)):
                    problems.append("residual differs")
            back, dec = decode(codec, raw("enc.bin"), n, block), f32("dec.f32")
            if not np.array_equal(np.where(np.isnan(back), 0, back).view(np.uint32),
                                  np.where(np.isnan(dec), 0, dec).view(np.uint32)) or \
                    not np.array_equal(np.isnan(back), np.isnan(dec)):
                problems.append("decode differs")
            if encoded_bytes(codec, n, block) != len(raw("enc.bin")):
                problems.append("size differs")
        else:
            up, down, block, n, m = words[1], words[2], int(words[3]), int(words[4]), int(words[5])
            r = f32("r.f32")
            ins = [raw(f"in_{j}.bin") for j in range(m)]
            out, kept = hub_segment(up, ins, n, block, down, r)
            problems = []
            if out != raw("out.bin"):
                problems.append(f"the mean's bytes differ (contributions used: {kept})")
            a, b = r, f32("r_after.f32")
            if not np.array_equal(np.where(np.isnan(a), 0, a).view(np.uint32), np.where(np.isnan(b), 0, b).view(np.uint32)):
                problems.append("the hub's residual differs")
        if problems:
            failures += 1
            print(f"FAIL {d} ({' '.join(words)}): {'; '.join(problems)}")
    print(f"diloco_check --codec: {len(dirs) - failures} of {len(dirs)} cases equal to numpy")
    sys.exit(1 if failures else 0)


# ---------------------------------------------------------------- the check
def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--codec":
        codec_cases(sys.argv[2:])
    pos, hub_spec, topk, plain_from = parse_args(sys.argv[1:])
    dump_dir = pos[0]
    lr, mu, quant = float(pos[1]), float(pos[2]), pos[3]
    if quant == "fp32":
        quant = "none"
    max_quant_err = float(pos[4]) if len(pos) > 4 else 0.0
    nesterov = int(pos[5]) if len(pos) > 5 else 1
    mu_warmup = int(pos[6]) if len(pos) > 6 else 0
    fragments = int(pos[7]) if len(pos) > 7 else 1
    alpha = float(pos[8]) if len(pos) > 8 else None
    hub = hub_config(hub_spec, quant)
    steps, merges, fragment_of = {}, {}, {}
    sent, mean = {}, {}  # k -> {replica: bytes}
    tokens = {}  # k -> {replica: the tokens behind its contribution (its weight in the mean)}
    for path in sorted(glob.glob(os.path.join(dump_dir, "*.f32")) + glob.glob(os.path.join(dump_dir, "*.bin"))):
        if os.path.basename(path).startswith("carry_"):
            continue  # a rejoining replica's carried work: test/test_diloco_late.sh checks it
        m = re.match(r"(outer|merge)_(\d+)_(\d+)_(\d+)\.f32$|(sent|mean|tokens)_(\d+)_(\d+)_(\d+)\.bin$",
                     os.path.basename(path))
        assert m, f"{path}: not a dump name"
        if m.group(5):
            kind, replica, k, p = m.group(5), int(m.group(6)), int(m.group(7)), int(m.group(8))
            with open(path, "rb") as f:
                data = f.read()
            if kind == "tokens":
                assert len(data) == 8, f"{path}: not one u64"
                tokens.setdefault(k, {})[replica] = int.from_bytes(data, "little")
                continue
            (sent if kind == "sent" else mean).setdefault(k, {})[replica] = (p, data)
            continue
        kind, replica, k, p = m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4))
        data = np.fromfile(path, dtype=np.float32)
        rows = 6 if kind == "outer" else 3
        assert data.size % rows == 0, f"{path}: {data.size} values, not {rows} tensors"
        (steps if kind == "outer" else merges).setdefault(k, {})[replica] = data.reshape(rows, -1)
        assert fragment_of.setdefault((kind, k), p) == p, f"{path}: outer step {k} has two fragments"
    assert steps, "no dumps found"
    have_bins = bool(sent or mean)
    hub_on = hub is not None and have_bins
    if hub is None:
        print("diloco_check: hub checks skipped (--hub off)")
    elif not have_bins:
        print("diloco_check: hub checks skipped: no sent_/mean_ dumps in this directory (a train_gpt without "
              "the hub's reduction); the Δ reference of QUANT = none is the fp32 mean of the dumped θᵢ")
    down, feedback, block = hub if hub else ("none", False, 128)
    keep = topk_keep(topk, block) if quant != "none" else 0
    up = f"{quant}@{keep}" if keep else quant
    failures = 0
    told = {}  # message kind -> times printed

    def fail(msg, kind=None):
        nonlocal failures
        failures += 1
        if kind is not None:
            told[kind] = told.get(kind, 0) + 1
            if told[kind] > 5:
                if told[kind] == 6:
                    print(f"FAIL ... (further '{kind}' failures not printed)")
                return
        print("FAIL " + msg)

    def weights_of(k, ids):
        """The tokens of replicas ids at outer step k (dumped by train_gpt), or None: equal."""
        have = tokens.get(k, {})
        return [have[r] for r in ids] if all(r in have for r in ids) else None

    worst = {"delta": 0.0, "momentum": 0.0, "theta": 0.0}
    hub_stats = {"verified": 0, "unverifiable": 0, "mean_files": 0}
    unverifiable = {}  # fragment → [(outer step, why)]
    last_after = {}  # fragment → θ after of its latest outer step
    hub_res = {}     # fragment → (its latest outer step, the hub's residual after it or None, why None)
    # The fragment of every outer step any file names (sent_ files stay for skipped rounds).
    round_fragment = {k: p for (_, k), p in fragment_of.items()}
    for d in (sent, mean):
        for k, by_replica in d.items():
            for p, _ in by_replica.values():
                round_fragment.setdefault(k, p)
    for k in sorted(steps):
        reps = steps[k]
        ids = sorted(reps)
        first = reps[ids[0]]
        p = fragment_of[("outer", k)]
        numel = first.shape[1]
        for r in ids[1:]:
            for i, name in [(0, "θ before"), (2, "Δ"), (4, "m after"), (5, "θ after")]:
                if not np.array_equal(first[i].view(np.uint32), reps[r][i].view(np.uint32)):
                    fail(f"outer step {k}: replica {r}'s {name} differs from replica {ids[0]}'s")
        theta_b, delta, m_b, m_a, theta_a = (first[i].astype(np.float64) for i in (0, 2, 3, 4, 5))

        # ---- the hub: the mean every replica received, recomputed byte for byte
        hub_mean_f32 = None  # the mean as the replicas decoded it (verified or not)
        hub_calc = None      # the mean as numpy's hub computed it (when it could)
        if hub_on:
            means, senders = mean.get(k, {}), sent.get(k, {})
            want_up = segmented_bytes(up, numel, block)
            want_down = segmented_bytes(down, numel, block)
            bad_layout = False
            for r, (pp, b) in sorted(senders.items()):
                if pp != p or len(b) != want_up:
                    fail(f"outer step {k}: sent_{r}: fragment {pp}, {len(b)} bytes; expected fragment {p}, {want_up} "
                         f"bytes ({up}, block {block}: is --hub's BLOCK the run's diloco_quant_block?)", "layout")
                    bad_layout = True
            for r, (pp, b) in sorted(means.items()):
                if pp != p or len(b) != want_down:
                    fail(f"outer step {k}: mean_{r}: fragment {pp}, {len(b)} bytes; expected fragment {p}, "
                         f"{want_down} bytes ({down}, block {block}: does --hub match the run's diloco_downlink "
                         f"and diloco_quant_block?)", "layout")
                    bad_layout = True
            missing = [r for r in ids if r not in means]
            if missing:
                fail(f"outer step {k}: replica(s) {missing} dumped the outer step but no mean_")
            if not means:
                pass
            elif bad_layout:
                hub_res[p] = (k, None, f"outer step {k}'s files have the wrong size")
            else:
                mids = sorted(means)
                ref = means[mids[0]][1]
                hub_stats["mean_files"] += len(mids)
                for r in mids[1:]:
                    if means[r][1] != ref:
                        fail(f"outer step {k}: replica {r}'s mean_ differs from replica {mids[0]}'s")
                hub_mean_f32 = decode_all(down, ref, numel, block)
                # The hub's residual before this round (downlink feedback): known when no
                # earlier outer step could have been one of this fragment's without a dump.
                residual, known, why = None, True, ""
                if feedback:
                    prev = hub_res.get(p)
                    start, residual = (1, np.zeros(numel, dtype=np.float32)) if prev is None else \
                        (prev[0] + 1, None if prev[1] is None else prev[1].copy())
                    if residual is None:
                        known, why = False, prev[2]
                    for j in range(start, k):
                        if j not in round_fragment:
                            known, why = False, f"outer step {j} left no dump at all (it may have been fragment {p}'s)"
                        elif round_fragment[j] == p:
                            known, why = False, f"fragment {p}'s outer step {j} left no outer_/mean_ dump"
                        if not known:
                            break
                if not known:
                    hub_stats["unverifiable"] += 1
                    unverifiable.setdefault(p, []).append((k, why))
                    hub_res[p] = (k, None, why)
                else:
                    candidates = [[r for r in mids if r in senders]]
                    if sorted(senders) != candidates[0]:
                        candidates.append(sorted(senders))
                    no_sent = [r for r in mids if r not in senders]
                    if no_sent:
                        fail(f"outer step {k}: replica(s) {no_sent} dumped a mean_ but no sent_")
                    got = None
                    for cand in candidates:
                        if not cand:
                            continue
                        r_try = residual.copy() if residual is not None else None
                        b = hub_mean(up, [senders[r][1] for r in cand], numel, block, down, r_try,
                                     weights_of(k, cand))
                        if hub_calc is None or b == ref:  # the senders that match, when some do
                            hub_calc = decode_all(down, b, numel, block)
                        if b == ref:
                            got = (cand, r_try)
                            break
                        if got is None:
                            got = (None, r_try, b, cand)
                    if got is not None and got[0] is not None:
                        hub_stats["verified"] += 1
                        if got[0] != candidates[0]:
                            print(f"note: outer step {k}: the hub's mean is that of senders {got[0]}, "
                                  f"not only of the replicas that applied it {candidates[0]}")
                        hub_res[p] = (k, got[1], None)
                    else:
                        detail = ""
                        if got is not None:
                            b, cand = got[2], got[3]
                            diff = np.nonzero(np.frombuffer(b, np.uint8) != np.frombuffer(ref, np.uint8))[0] \
                                if len(b) == len(ref) else None
                            if diff is not None and diff.size:
                                detail = f"; {diff.size} of {len(ref)} bytes differ, the first at byte {diff[0]}"
                            if feedback and residual is not None and np.any(residual != 0):
                                plain = hub_mean(up, [senders[r][1] for r in cand], numel, block, down,
                                                 np.zeros(numel, dtype=np.float32), weights_of(k, cand))
                                if plain == ref:
                                    detail += ("; the dumped mean IS the encoding with a zero hub residual: "
                                               "the hub's downlink error feedback did not carry over")
                            # Keep following the spec's residual, so that later rounds say
                            # whether they are off too.
                            hub_res[p] = (k, got[1], None)
                        else:
                            hub_res[p] = (k, None, f"outer step {k} had no contributor to reduce")
                        fail(f"outer step {k} (fragment {p}): the mean the replicas received is not the hub's "
                             f"reduction of {candidates} ({up} up, {down} down, feedback {int(feedback)}, "
                             f"block {block}){detail}", "hub")
                # Δ from the received mean
                if up == "none":
                    exp = (theta_b - hub_mean_f32.astype(np.float64)).astype(np.float32)
                else:
                    exp = hub_mean_f32
                for r in ids:
                    if r not in means:
                        continue
                    dr = reps[r][2]
                    mine = exp if means[r][1] == ref else (
                        (theta_b - decode_all(down, means[r][1], numel, block).astype(np.float64)).astype(np.float32)
                        if up == "none" else decode_all(down, means[r][1], numel, block))
                    if np.array_equal(dr.view(np.uint32), mine.view(np.uint32)):
                        continue
                    err = np.max(np.abs(dr.astype(np.float64) - mine)) / max(np.max(np.abs(mine)), 1e-30)
                    if up == "none" and err <= 1e-6:
                        continue
                    fail(f"outer step {k}: replica {r}'s Δ is not "
                         f"{'θ − the decoded mean' if up == 'none' else 'the decoded mean'} "
                         f"(max difference {err:.3g} of max|Δ|)", "delta-mean")

        # ---- Δ against the true mean
        wts = weights_of(k, ids) or [1] * len(ids)
        locals_mean = sum(float(wi) * reps[r][1].astype(np.float64) for wi, r in zip(wts, ids)) / float(sum(wts))
        delta_true = theta_b - locals_mean
        if quant == "none":
            # The hub's fp32 mean as numpy's hub computed it from the sent_ files, else
            # from the dumped θᵢ of the replicas that applied the step.
            if hub_calc is not None:
                mean32 = hub_calc
            else:
                segs = [segments("none", reps[r][1].astype("<f4").tobytes(), numel, block) for r in ids]
                mean32 = np.concatenate([decode("none", hub_segment("none", [s[j][2] for s in segs], ln, block,
                                                                    "none", None, weights=weights_of(k, ids))[0],
                                                ln, block)
                                         for j, (_, ln, _) in enumerate(segs[0])])
            ref_delta = theta_b - mean32.astype(np.float64)
            scale = max(np.max(np.abs(ref_delta)), 1e-30)
            err = np.max(np.abs(delta - ref_delta)) / scale
            worst["delta"] = max(worst["delta"], err)
            if err > 1e-6:
                fail(f"outer step {k}: Δ differs from θ − (fp32 mean of the θᵢ) by {err:.3g} of max|Δ|")
        else:
            err = np.linalg.norm(delta - delta_true) / max(np.linalg.norm(delta_true), 1e-30)
            worst["delta"] = max(worst["delta"], err)
            if err > max_quant_err:
                fail(f"outer step {k}: quantized Δ is {err:.3g} (relative L2) from θ − mean θᵢ, "
                     f"bound {max_quant_err}")
        # The fragment's own outer-step count: round k − 1 is regular when it is fragment
        # (k − 1) mod P's; otherwise it is a final sync after the last step (fragments 0..P−1
        # in rounds k0..k0+P−1), and the count is fragment p's regular rounds before k0, + 1.
        # (So while the fragments sync in turn, as in the runs this checks; across a decay
        # phase's start that breaks the turn, test_diloco_pays.sh checks the count.)
        p_k, r_k = fragment_of[("outer", k)], k - 1
        if r_k % fragments == p_k:
            j = r_k // fragments + 1
        else:
            k0 = r_k - p_k
            j = (k0 - p_k + fragments - 1) // fragments + 1
        mu_k = mu * j / mu_warmup if j < mu_warmup else mu
        lr_k = lr
        if plain_from is not None and k >= plain_from:
            lr_k, mu_k = 1.0, 0.0  # diloco_plain_in_decay: θ becomes the mean
        m_exp = mu_k * m_b + delta
        m_kept = m_exp if mu_k > 0 else np.zeros_like(m_exp)   # μ = 0: stored as 0, bit for bit
        if mu_k == 0 and (np.any(m_a != 0) or np.any(np.signbit(m_a))):
            fail(f"outer step {k}: μ = 0 but the momentum kept is not all zero bits")
        err = np.max(np.abs(m_a - m_kept)) / max(np.max(np.abs(m_exp)), 1e-30)
        worst["momentum"] = max(worst["momentum"], err)
        if err > 1e-6:
            fail(f"outer step {k}: momentum off by {err:.3g} of max|m|")
        theta_exp = theta_b - lr_k * (delta + mu_k * m_exp if nesterov else m_exp)
        err = np.max(np.abs(theta_a - theta_exp)) / max(np.max(np.abs(theta_exp)), 1e-30)
        worst["theta"] = max(worst["theta"], err)
        if err > 1e-6:
            fail(f"outer step {k}: θ after off by {err:.3g} of max|θ| (sign or formula)")
        if p in last_after and not np.array_equal(last_after[p][1], first[0]):
            fail(f"outer step {k}: θ before is not fragment {p}'s θ after at outer step {last_after[p][0]}")
        last_after[p] = (k, first[5])
    if hub_on:
        for k in sorted(set(mean) - set(steps)):
            fail(f"outer step {k}: mean_ dumped but no outer_ (the replica applied no outer step?)")
    worst["merge"] = 0.0
    for k in sorted(merges):
        if alpha is None:
            fail(f"merge dumps at outer step {k}, but no MERGE_ALPHA given")
            break
        if k not in steps or fragment_of[("merge", k)] != fragment_of[("outer", k)]:
            fail(f"merge at outer step {k} has no outer step with the same fragment")
            continue
        for r, t in merges[k].items():
            before, theta, after = (t[i].astype(np.float64) for i in range(3))
            if not np.array_equal(t[1], steps[k][min(steps[k])][5]):
                fail(f"merge at outer step {k}, replica {r}: θ is not outer step {k}'s θ after")
            exp = alpha * before + (1 - alpha) * theta
            err = np.max(np.abs(after - exp)) / max(np.max(np.abs(exp)), 1e-30)
            worst["merge"] = max(worst["merge"], err)
            if err > 1e-6:
                fail(f"merge at outer step {k}, replica {r}: local weights off α·local + (1 − α)·θ by {err:.3g}")
    for p, rounds in sorted(unverifiable.items()):
        ks = [k for k, _ in rounds]
        print(f"note: fragment {p}: the hub's mean of outer step(s) {ks} not reproduced byte for byte (its "
              f"downlink residual is unknown: {rounds[0][1]}); those rounds were only checked against each other "
              f"and against Δ")
    if hub_on:
        hub_text = (f"hub ({up} up, {down} down, feedback {int(feedback)}, block {block}, segments of "
                    f"{segment_values(block)}): {hub_stats['verified']} of {len(steps)} outer steps' means "
                    f"byte-identical to numpy, {hub_stats['unverifiable']} unverifiable (a gap in the dumps), "
                    f"{hub_stats['mean_files']} mean_ files")
    else:
        hub_text = "hub not checked"
    print(f"diloco_check: {len(steps)} outer steps, {len(merges)} merges, fragments "
          f"{sorted({p for (kind, _), p in fragment_of.items() if kind == 'outer'})}, replicas "
          f"{sorted({r for s in steps.values() for r in s})}, worst relative errors: Δ {worst['delta']:.2e}, "
          f"m {worst['momentum']:.2e}, θ {worst['theta']:.2e}, merge {worst['merge']:.2e}; {hub_text}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
