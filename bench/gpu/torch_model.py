#!/usr/bin/env python3
"""The GPU benchmark's PyTorch side: DESIGN.md's model, written the way a PyTorch 2 user
would make it fast, trained on the same token shard with the same batch as train_gpt.

    torch_model.py CONFIG SHARD --batch B --seq T --steps S --warmup W --attention sdpa|flex

Same architecture as train_gpt: GQA, QK-norm (per-head RMSNorm before RoPE), rotate-half
RoPE, NoPE on every nope_every-th layer, RMSNorm, SwiGLU, tied embeddings, cross-entropy +
z-loss 1e-4, AdamW (decay on 2-D weights except the embedding), clipping at 1.0. Fast-path
choices, each the usual one:
  - bf16 autocast over fp32 master weights; torch.optim.AdamW(fused=True)
  - torch.compile per block (regional compilation: one compile serves every layer of the
    same kind, so compile time stays short) and of the loss
  - attention, by data:
      --attention sdpa  plain causal data (no document token inside a sequence):
                        F.scaled_dot_product_attention(is_causal=True, enable_gqa=True)
                        restricted to the flash and cuDNN backends; positions are 0..T-1.
      --attention flex  documents: flex_attention with a document-causal BlockMask (skips
                        the tiles no query may see, as train_gpt's kernels do) and native
                        GQA; positions restart at each document.
Everything a step needs but the math (input and target tensors, RoPE cos/sin tables,
block masks) is built before the warm-up, so the timed loop runs only forward, backward,
clipping and the optimizer step (flex also copies the step's B·T document ids into the
buffer its mask reads). Recompiling inside the timed loop is an error, not a slow step.
Prints one line: "torch tok_per_s=<x> step_ms=<y> peak_mem_gib=<z> final_loss=<l>
attention=<a>", timing the steps after the warm-up ones (torch.cuda.synchronize around the
timed region); peak_mem_gib is torch.cuda.max_memory_allocated over the timed steps.
"""
import argparse
import contextlib
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

# The config reader is the CPU benchmark's (bench/torch_cpu_model.py).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from torch_cpu_model import read_config  # noqa: E402

SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION]


def read_shard(path, count):
    """The first `count` tokens of a train_gpt shard (docs/formats.md), as int64."""
    with open(path, "rb") as f:
        head = f.read(64)
        assert head[:8] == b"TGPTSHRD", "not a train_gpt token shard"
        width, = struct.unpack("<I", head[12:16])
        n, = struct.unpack("<Q", head[16:24])
        count = min(count, n)
        raw = f.read(count * width)
    return np.frombuffer(raw, dtype=np.uint16 if width == 2 else np.uint32).astype(np.int64)


class Block(torch.nn.Module):
    def __init__(self, c, layer):
        super().__init__()
        C, self.Hq, self.Hkv, self.D = c["d_model"], c["n_head"], c["n_kv_head"], c["head_dim"]
        self.eps = c["norm_eps"]
        self.attention = c["attention"]
        self.rope = not (c["nope_every"] > 0 and (layer + 1) % c["nope_every"] == 0)
        self.input_layernorm = torch.nn.Parameter(torch.ones(C))
        self.qkv_proj = torch.nn.Linear(C, (self.Hq + 2 * self.Hkv) * self.D, bias=False)  # q, k, v stacked
        self.q_norm = torch.nn.Parameter(torch.ones(self.D))
        self.k_norm = torch.nn.Parameter(torch.ones(self.D))
        self.o_proj = torch.nn.Linear(self.Hq * self.D, C, bias=False)
        self.post_attention_layernorm = torch.nn.Parameter(torch.ones(C))
        self.gate_up_proj = torch.nn.Linear(C, 2 * c["d_ff"], bias=False)  # gate, up stacked
        self.down_proj = torch.nn.Linear(c["d_ff"], C, bias=False)

    # h (B,T,C); cos, sin (B or 1, T, 1, D/2); mask: a BlockMask (flex) or None (sdpa)
    def forward(self, h, cos, sin, mask):
        B, T, C = h.shape
        a = F.rms_norm(h, (C,), self.input_layernorm, self.eps)
        q, k, v = self.qkv_proj(a).split([self.Hq * self.D, self.Hkv * self.D, self.Hkv * self.D], dim=-1)
        q = F.rms_norm(q.view(B, T, self.Hq, self.D), (self.D,), self.q_norm, self.eps)
        k = F.rms_norm(k.view(B, T, self.Hkv, self.D), (self.D,), self.k_norm, self.eps)
        v = v.view(B, T, self.Hkv, self.D)
        if self.rope:
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        # autocast may leave the norms' outputs in fp32; attention wants one dtype
        q, k, v = (x.transpose(1, 2).to(torch.bfloat16) for x in (q, k, v))
        if self.attention == "flex":
            y = flex_attention(q, k, v, block_mask=mask, enable_gqa=True)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        h = h + self.o_proj(y.transpose(1, 2).reshape(B, T, self.Hq * self.D))
        m = F.rms_norm(h, (C,), self.post_attention_layernorm, self.eps)
        gate, up = self.gate_up_proj(m).chunk(2, dim=-1)
        return h + self.down_proj(F.silu(gate) * up)


def rotate(x, cos, sin):
    """Rotate-half RoPE: dims i and i + D/2 turn by pos · theta^(-2i/D)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


class Model(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.embed_tokens = torch.nn.Embedding(c["vocab_size"], c["d_model"])
        self.layers = torch.nn.ModuleList(Block(c, l) for l in range(c["n_layer"]))
        self.norm = torch.nn.Parameter(torch.ones(c["d_model"]))
        for p in self.parameters():
            if p.dim() == 2:
                torch.nn.init.normal_(p, std=0.02)


def loss_fn(h, norm_w, eps, E, y, z_loss):
    logits = F.rms_norm(h, (h.shape[-1],), norm_w, eps) @ E.t()
    logits = logits.view(-1, logits.shape[-1]).float()
    lse = torch.logsumexp(logits, -1)
    ce = F.cross_entropy(logits, y.view(-1))
    return ce, ce + z_loss * (lse ** 2).mean()


def document_layout(x, doc):
    """x (B,T) → (seg, pos), each (B,T): DESIGN.md's documents. A new document starts at
    every s >= 1 with x[b,s] == doc; seg = its index in the row, pos = t - start(t)."""
    B, T = x.shape
    starts = x == doc
    starts[:, 0] = False
    seg = starts.long().cumsum(1)
    idx = torch.arange(T, device=x.device).expand(B, T)
    first = torch.where(starts, idx, torch.zeros_like(idx)).cummax(1).values
    return seg, idx - first


def rope_tables(pos, inv):
    """pos (N,T) → cos, sin (N,T,1,D/2) in fp32."""
    ang = pos.double()[:, :, None] * inv.double()
    return ang.cos().float()[:, :, None, :], ang.sin().float()[:, :, None, :]


def sdpa_backend_chosen(B, c, T, dev):
    """Which backend SDPA picks for this shape within SDPA_BACKENDS (needs a private API;
    '?' if this torch lacks it)."""
    names = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable"}
    q = torch.randn(B, c["n_head"], T, c["head_dim"], device=dev, dtype=torch.bfloat16, requires_grad=True)
    kv = torch.randn(B, c["n_kv_head"], T, c["head_dim"], device=dev, dtype=torch.bfloat16, requires_grad=True)
    try:
        with sdpa_kernel(SDPA_BACKENDS):
            return names.get(int(torch._fused_sdp_choice(q, kv, kv, None, 0.0, True, enable_gqa=True)), "?")
    except Exception:  # noqa: BLE001 — only a label for the result line
        return "?"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("shard")
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--attention", default="flex", choices=["flex", "sdpa"])
    args = ap.parse_args()
    if args.steps < 1 or args.warmup < 1:
        sys.exit("torch_model.py: --steps and --warmup must be at least 1 (torch.compile runs in the warm-up)")
    raw = read_config(args.config)
    ints = ["vocab_size", "n_layer", "d_model", "n_head", "n_kv_head", "d_ff", "doc_token", "nope_every"]
    c = {k: int(raw[k]) for k in ints if k in raw}
    c.setdefault("n_kv_head", c["n_head"])
    c.setdefault("nope_every", 4)
    c["head_dim"] = int(raw.get("head_dim", c["d_model"] // c["n_head"]))
    c["rope_theta"] = float(raw.get("rope_theta", 10000))
    c["norm_eps"] = float(raw.get("norm_eps", 1e-6))
    c["attention"] = args.attention
    B, T, dev = args.batch, args.seq, "cuda"
    steps_total = args.warmup + args.steps
    doc = c.get("doc_token", -1)

    # The data of every step, as train_gpt reads it with shuffle = 0: micro-batch i is
    # tokens [i·B·T, (i+1)·B·T + 1) of the shard, inputs and targets shifted by one.
    need = steps_total * B * T + 1
    host = read_shard(args.shard, need)
    if len(host) < need:
        sys.exit(f"torch_model.py: {args.shard} holds {len(host)} tokens; {need} needed")
    rows = host[:-1].reshape(steps_total * B, T)
    if args.attention == "sdpa" and doc >= 0 and (rows[:, 1:] == doc).any():
        sys.exit("torch_model.py: --attention sdpa is plain causal attention, but the shard has document "
                 "tokens inside sequences; use --attention flex")

    torch.manual_seed(0)
    torch._dynamo.config.cache_size_limit = 64  # one entry per block instance at most
    torch.backends.cuda.matmul.allow_tf32 = True
    model = Model(c).to(dev)
    decay = [p for n, p in model.named_parameters() if p.dim() == 2 and "embed" not in n]
    other = [p for n, p in model.named_parameters() if not (p.dim() == 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=float(raw.get("lr", 1e-3)), betas=(0.9, 0.95), eps=1e-8, fused=True)
    for blk in model.layers:
        blk.compile()
    compiled_loss = torch.compile(loss_fn)

    half = c["head_dim"] // 2
    inv = c["rope_theta"] ** (-2.0 * torch.arange(half, device=dev, dtype=torch.float64) / c["head_dim"])
    tokens = torch.from_numpy(host).to(dev)
    xs = [tokens[i * B * T:(i + 1) * B * T].view(B, T) for i in range(steps_total)]
    ys = [tokens[i * B * T + 1:(i + 1) * B * T + 1].view(B, T) for i in range(steps_total)]
    if args.attention == "sdpa":
        cos, sin = rope_tables(torch.arange(T, device=dev)[None], inv)
        tables = [(cos, sin)] * steps_total
        masks = [None] * steps_total
        segs = None
        attention = "sdpa/" + sdpa_backend_chosen(B, c, T, dev)
        context = sdpa_kernel(SDPA_BACKENDS)
    else:
        # One mask function for every step, reading the document ids from one buffer that
        # each step refills: the compiled blocks then see the same function every step and
        # compile once. Each step's BlockMask (which tiles are empty, partial or full) is
        # built here from that step's ids.
        layouts = [document_layout(x, doc) for x in xs]
        segs = [s for s, _ in layouts]
        tables = [rope_tables(p, inv) for _, p in layouts]
        seg = torch.empty_like(segs[0])

        def doc_causal(b, h, q_idx, kv_idx):
            return (q_idx >= kv_idx) & (seg[b, q_idx] == seg[b, kv_idx])

        masks = []
        for s in segs:
            seg.copy_(s)
            masks.append(create_block_mask(doc_causal, B, None, T, T, device=dev))
        attention = "flex"
        context = contextlib.nullcontext()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # the mask building's temporaries, so nvidia-smi sees the training's memory

    def step(i):
        if segs is not None:
            seg.copy_(segs[i])
        cos, sin = tables[i]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            h = model.embed_tokens(xs[i])
            for blk in model.layers:
                h = blk(h, cos, sin, masks[i])
            ce, objective = compiled_loss(h, model.norm, c["norm_eps"], model.embed_tokens.weight, ys[i], 1e-4)
        opt.zero_grad(set_to_none=True)
        objective.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return ce

    with context:
        for i in range(args.warmup):
            step(i)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        torch._dynamo.config.error_on_recompile = True  # a recompile here would be timed
        t0 = time.perf_counter()
        for i in range(args.warmup, steps_total):
            ce = step(i)
        torch.cuda.synchronize()
        dt = (time.perf_counter() - t0) / args.steps
    peak = torch.cuda.max_memory_allocated() / 2**30
    print(f"torch tok_per_s={B * T / dt:.1f} step_ms={dt * 1e3:.2f} peak_mem_gib={peak:.2f} "
          f"final_loss={ce.item():.4f} attention={attention}", flush=True)


if __name__ == "__main__":
    main()
