#!/usr/bin/python3
"""The training loop against PyTorch (test/test_torch_reference.sh part 2): trains ./train_gpt
for a few steps from random weights written here (norm gains random too, loaded with init_from)
on in-order shards (shuffle 0), a checkpoint after every step, then replays the same steps in
float64 PyTorch: a model written from docs/model.md (not from the C code), torch.optim.AdamW
with two parameter groups (decay on the 2-D weights but the embedding), clip_grad_norm_, the
WSD schedule, the loader's rows (B·T + 1 tokens from i·B·T, wrapping at the epoch), grad_accum
as a mean over micro-batches, a skipped step (TRAIN_GPT_FAULT nan_grad) that leaves the weights
and AdamW's step count alone, and the final validation over the first val_tokens / T rows.

usage: torch_train_replay.py WORK_DIR NAME [--key value]...
  --key value: a train_gpt config key of the base below, or --skip S (the step whose gradient the
  fault hook makes NaN), --ntok N (tokens per shard), --nshards K, --doc_range LO:HI (document
  lengths of test_tool shard). Needs TRAIN_GPT and TOOL (lib.sh's) in the environment.

Tolerances (fp32 backend against float64): loss 1e-4 relative (the fp32 sums over B·T rows and V
logits: ~2e-6 measured); grad_norm 3e-4 relative (a norm over every gradient, each through the
fp32 backward: up to 6e-5 measured); weights after each step, max |ours − torch| / max |torch|
per tensor, 1e-4 (AdamW's steps are lr-sized whatever the gradient's size, so the fp32 rounding
of small gradients shows at up to 1e-5 after 8 steps); lr 1e-6 relative (the same double
arithmetic, printed in metrics.jsonl's 7 significant digits); the final val_loss 1e-4. A skipped
step logs no grad_norm (null): its loss is compared, and its weights. Exit status 0 when all
hold, else 1."""
import json
import math
import os
import shutil
import struct
import subprocess
import sys

import numpy as np
import torch

torch.set_default_dtype(torch.float64)
TOL_LOSS, TOL_NORM, TOL_WEIGHTS, TOL_LR, TOL_VAL = 1e-4, 3e-4, 1e-4, 1e-6, 1e-4

work, name, extra = sys.argv[1], sys.argv[2], sys.argv[3:]
c = dict(vocab_size=64, n_layer=3, d_model=32, n_head=4, n_kv_head=2, head_dim=8, d_ff=48, seq_len=16,
         rope_theta=10000.0, nope_every=2, qk_norm=1, tie_embeddings=1, norm_eps=1e-6, doc_masking=1, doc_token=0,
         batch_size=2, grad_accum=1, max_steps=6, lr=1e-2, min_lr_frac=0.1, warmup_steps=2, decay_frac=0.5,
         decay_shape="linear", beta1=0.9, beta2=0.95, adam_eps=1e-5, weight_decay=0.1, grad_clip=0.5,
         z_loss=1e-2, spike_z=0, shuffle=0, threads=2, log_every=1, val_every=0, val_tokens=64)
doc_lo, doc_hi, ntok, nshards, skip = 2, 6, 0, 1, -1
for key, value in zip(extra[0::2], extra[1::2]):
    key = key[2:]
    if key == "skip": skip = int(value)
    elif key == "ntok": ntok = int(value)
    elif key == "nshards": nshards = int(value)
    elif key == "doc_range": doc_lo, doc_hi = map(int, value.split(":"))
    elif key in c: c[key] = type(c[key])(value)
    else: sys.exit("torch_train_replay: unknown option --" + key)
V, L, C, Hq, Hkv, D, F, T = (c[k] for k in ("vocab_size", "n_layer", "d_model", "n_head", "n_kv_head", "head_dim",
                                            "d_ff", "seq_len"))
B, A, S = c["batch_size"], c["grad_accum"], c["max_steps"]
run = os.path.join(work, name)
shutil.rmtree(run, ignore_errors=True)
os.makedirs(run)
tool, trainer = os.environ["TOOL"], os.environ["TRAIN_GPT"]

# ---- data: in-order shards with documents of doc_lo..doc_hi tokens
ntok = ntok or max(4096, (S * A * B * T + 1) * 2)
tokens = []
for k in range(nshards):
    path = "%s/train_%d.bin" % (run, k)
    subprocess.run([tool, "shard", path, str(V), str(c["doc_token"]), str(ntok), str(7 + k), "17", str(doc_lo),
                    str(doc_hi)], check=True, stdout=subprocess.DEVNULL)
    tokens += map(int, subprocess.run([tool, "tokens", path], check=True, capture_output=True,
                                      text=True).stdout.split())
shutil.copy("%s/train_0.bin" % run, "%s/val.bin" % run)
tokens = torch.tensor(tokens)


# ---- random initial weights, written as safetensors (fp32) and kept in float64
def safetensors_write(path, tensors):
    header, blobs, at = {}, [], 0
    for key, v in tensors.items():
        b = v.float().numpy().astype("<f4").tobytes()
        header[key] = {"dtype": "F32", "shape": list(v.shape), "data_offsets": [at, at + len(b)]}
        at += len(b)
        blobs.append(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def safetensors_read(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    return {k: torch.from_numpy(np.frombuffer(raw[8 + n + i["data_offsets"][0]:8 + n + i["data_offsets"][1]], "<f4")
                                .reshape(i["shape"]).astype(np.float64)) for k, i in header.items()}


g = torch.Generator().manual_seed(5)


def rand(*shape, std=0.2):
    return torch.randn(*shape, generator=g) * std


W = {"model.embed_tokens.weight": rand(V, C, std=0.5)}
for l in range(L):
    p = "model.layers.%d." % l
    W[p + "input_layernorm.weight"] = 1 + rand(C, std=0.3)
    W[p + "self_attn.q_proj.weight"] = rand(Hq * D, C)
    W[p + "self_attn.k_proj.weight"] = rand(Hkv * D, C)
    W[p + "self_attn.v_proj.weight"] = rand(Hkv * D, C)
    if c["qk_norm"]:
        W[p + "self_attn.q_norm.weight"] = 1 + rand(D, std=0.3)
        W[p + "self_attn.k_norm.weight"] = 1 + rand(D, std=0.3)
    W[p + "self_attn.o_proj.weight"] = rand(C, Hq * D)
    W[p + "post_attention_layernorm.weight"] = 1 + rand(C, std=0.3)
    W[p + "mlp.gate_proj.weight"] = rand(F, C)
    W[p + "mlp.up_proj.weight"] = rand(F, C)
    W[p + "mlp.down_proj.weight"] = rand(C, F)
W["model.norm.weight"] = 1 + rand(C, std=0.3)
if not c["tie_embeddings"]:
    W["lm_head.weight"] = rand(V, C, std=0.5)
W = {k: v.float().double() for k, v in W.items()}   # what the fp32 file holds
safetensors_write("%s/init.safetensors" % run, W)

# ---- train_gpt
conf = "".join("%s = %s\n" % kv for kv in c.items())
conf += ("train_data = %s/train_*.bin\nval_data = %s/val.bin\nout_dir = %s/out\ninit_from = %s/init.safetensors\n"
         "ckpt_every = 1\nckpt_keep = 100\ndevice = cpu\n" % (run, run, run, run))
open("%s/run.conf" % run, "w").write(conf)
env = dict(os.environ)
env.pop("TRAIN_GPT_FAULT", None)
if skip >= 0:
    env["TRAIN_GPT_FAULT"] = "nan_grad:%d" % skip
r = subprocess.run([trainer, "%s/run.conf" % run], capture_output=True, text=True, env=env)
open("%s/train.log" % run, "w").write(r.stdout + r.stderr)
if r.returncode != 0:
    sys.exit("%s: train_gpt failed (status %d): %s" % (name, r.returncode, r.stderr.strip().splitlines()[-1:]))
lines = [json.loads(x) for x in open("%s/out/metrics.jsonl" % run)]
steps = [m for m in lines if "loss" in m and "grad_norm" in m]
if len(steps) != S:
    sys.exit("%s: %d step lines in metrics.jsonl, expected %d" % (name, len(steps), S))


# ---- the model, from docs/model.md
def rms(x, w):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + c["norm_eps"]) * w


def forward(w, x):
    rows = x.shape[0]
    at = torch.arange(T).expand(rows, T)
    if c["doc_masking"]:
        starts = x == c["doc_token"]
        starts[:, 0] = False   # a row's first token starts no document of its own: it continues one
        doc = starts.long().cumsum(1)
        first = torch.where(starts | (torch.arange(T) == 0), at, torch.zeros_like(at)).cummax(1).values
        pos = at - first   # RoPE positions restart at each document
    else:
        doc, pos = torch.zeros(rows, T, dtype=torch.long), at
    allowed = (torch.arange(T)[None, :, None] >= torch.arange(T)[None, None, :]) & (doc[:, :, None] == doc[:, None, :])
    inv = c["rope_theta"] ** (-2.0 * torch.arange(D // 2) / D)
    angle = pos[..., None].double() * inv
    cos, sin = angle.cos()[:, :, None], angle.sin()[:, :, None]

    def rope(u):
        u1, u2 = u[..., :D // 2], u[..., D // 2:]
        return torch.cat([u1 * cos - u2 * sin, u2 * cos + u1 * sin], -1)

    h = w["model.embed_tokens.weight"][x]
    for l in range(L):
        p = "model.layers.%d." % l
        a = rms(h, w[p + "input_layernorm.weight"])
        q = (a @ w[p + "self_attn.q_proj.weight"].T).view(rows, T, Hq, D)
        k = (a @ w[p + "self_attn.k_proj.weight"].T).view(rows, T, Hkv, D)
        v = (a @ w[p + "self_attn.v_proj.weight"].T).view(rows, T, Hkv, D)
        if c["qk_norm"]:
            q, k = rms(q, w[p + "self_attn.q_norm.weight"]), rms(k, w[p + "self_attn.k_norm.weight"])
        if not (c["nope_every"] > 0 and (l + 1) % c["nope_every"] == 0):
            q, k = rope(q), rope(k)
        heads = []
        for j in range(Hq):
            kv = j // (Hq // Hkv)
            score = torch.einsum("btd,bsd->bts", q[:, :, j], k[:, :, kv]) / math.sqrt(D)
            heads.append(torch.einsum("bts,bsd->btd", score.masked_fill(~allowed, float("-inf")).softmax(-1),
                                      v[:, :, kv]))
        h = h + torch.cat(heads, -1) @ w[p + "self_attn.o_proj.weight"].T
        m = rms(h, w[p + "post_attention_layernorm.weight"])
        gate = torch.nn.functional.silu(m @ w[p + "mlp.gate_proj.weight"].T)
        h = h + (gate * (m @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    head = w["model.embed_tokens.weight"] if c["tie_embeddings"] else w["lm_head.weight"]
    return rms(h, w["model.norm.weight"]) @ head.T


def lr_at(s):   # WSD: linear warm-up to lr, flat, then the decay over the last decay_frac of the run
    peak, low = c["lr"], c["min_lr_frac"] * c["lr"]
    if s < c["warmup_steps"]:
        return peak * (s + 1) / c["warmup_steps"]
    decay_start = S - int(math.floor(c["decay_frac"] * S + 0.5))
    if s >= decay_start:
        f = (s - decay_start) / (S - decay_start)
        return peak + (low - peak) * f if c["decay_shape"] == "linear" else low + (peak - low) * (1 - math.sqrt(f))
    return peak


def rel(ours, ref):
    return abs(ours - ref) / max(abs(ref), 1e-12)


w = {k: v.clone().requires_grad_(True) for k, v in W.items()}
decayed = [n for n in w if w[n].dim() == 2 and n != "model.embed_tokens.weight"]
opt = torch.optim.AdamW([{"params": [w[n] for n in decayed], "weight_decay": c["weight_decay"]},
                         {"params": [w[n] for n in w if n not in decayed], "weight_decay": 0.0}],
                        lr=c["lr"], betas=(c["beta1"], c["beta2"]), eps=c["adam_eps"])
rows_per_epoch = (len(tokens) - 1) // (B * T)
worst = dict(loss=0.0, norm=0.0, lr=0.0, weights=0.0)
bad = []
for s in range(S):
    opt.zero_grad()
    ce_sum = 0.0
    for a in range(A):
        i = (s * A + a) % rows_per_epoch
        window = tokens[i * B * T:(i + 1) * B * T + 1]
        x, y = window[:-1].view(B, T), window[1:].view(B, T)
        logits = forward(w, x).reshape(-1, V)
        lse = logits.logsumexp(-1)
        ce = (lse - logits.gather(1, y.reshape(-1, 1)).squeeze(1)).mean()
        ((ce + c["z_loss"] * (lse ** 2).mean()) / A).backward()
        ce_sum += ce.item() / A
    limit = c["grad_clip"] if c["grad_clip"] > 0 else float("inf")
    norm = torch.nn.utils.clip_grad_norm_(list(w.values()), limit).item()
    lr = lr_at(s)
    for group in opt.param_groups:
        group["lr"] = lr
    if s != skip:   # a NaN gradient: the step is skipped whole (AdamW's count too)
        opt.step()
    m = steps[s]
    skipped = s == skip
    if skipped != bool(m.get("skipped")) or (m["grad_norm"] is None) != skipped:
        bad.append("step %d: skipped %s and grad_norm %s in metrics.jsonl, the fault hook asked for step %d"
                   % (s + 1, m.get("skipped"), m["grad_norm"], skip + 1))
        continue
    e_loss, e_norm = rel(m["loss"], ce_sum), 0.0 if skipped else rel(m["grad_norm"], norm)
    e_lr = rel(m["lr"], lr) if lr > 0 else abs(m["lr"])
    ours = safetensors_read("%s/out/step_%08d/model.safetensors" % (run, s + 1))
    e_w, worst_name = 0.0, ""
    for n in w:
        ref = w[n].detach()
        e = (ours[n] - ref).abs().max().item() / ref.abs().max().item()
        if e > e_w:
            e_w, worst_name = e, n
    for key, e in (("loss", e_loss), ("norm", e_norm), ("lr", e_lr), ("weights", e_w)):
        worst[key] = max(worst[key], e)
    if e_loss > TOL_LOSS or e_norm > TOL_NORM or e_lr > TOL_LR or e_w > TOL_WEIGHTS:
        bad.append("step %d: loss %.7g (torch %.7g), grad_norm %.7g (torch %.7g), lr %.9g (torch %.9g), weights "
                   "%.1e off (%s)" % (s + 1, m["loss"], ce_sum, m["grad_norm"], norm, m["lr"], lr, e_w, worst_name))

# ---- validation of the final weights: the first val_tokens / T rows
val = [m for m in lines if "val_loss" in m]
n_rows = min(max(1, c["val_tokens"] // T), (ntok - 1) // T)
val_tokens = tokens[:ntok]
with torch.no_grad():
    per = []
    for r0 in range(0, n_rows, 8):
        rows = range(r0, min(n_rows, r0 + 8))
        x = torch.stack([val_tokens[r * T:(r + 1) * T] for r in rows])
        y = torch.stack([val_tokens[r * T + 1:(r + 1) * T + 1] for r in rows])
        logits = forward(w, x).reshape(-1, V)
        per.append(logits.logsumexp(-1) - logits.gather(1, y.reshape(-1, 1)).squeeze(1))
    val_ref = torch.cat(per).mean().item()
e_val = rel(val[-1]["val_loss"], val_ref) if val else float("inf")
if e_val > TOL_VAL:
    bad.append("val_loss %s (torch %.7g)" % (val[-1]["val_loss"] if val else "missing", val_ref))
print("  %-8s worst relative error: loss %.1e, grad_norm %.1e, lr %.1e, weights %.1e, val_loss %.1e over %d step(s)"
      % (name, worst["loss"], worst["norm"], worst["lr"], worst["weights"], e_val, S))
for b in bad:
    print("    " + b)
sys.exit(1 if bad else 0)
