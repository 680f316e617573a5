#!/usr/bin/python3
"""The benchmark's PyTorch side: the model of DESIGN.md as an idiomatic PyTorch 1.13
module (fp32, CPU), trained with torch.optim.AdamW, gradient clipping and z-loss on the
same token shard as train_gpt, with the same batch and thread count.

    torch_cpu_model.py CONFIG SHARD STEPS THREADS

Prints one line: "torch steps_per_s=<x> tok_per_s=<y> final_loss=<z>", timing all steps
after the first two (warm-up). PyTorch 1.13 has no scaled_dot_product_attention, so
attention is the usual masked matmul + softmax (what a 1.13 user writes)."""
import math
import struct
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F


def read_config(path):
    cfg = {}
    for line in open(path):
        line = line.split("#")[0].strip()
        if "=" in line:
            k, v = line.split("=", 1)
            cfg[k.strip()] = v.strip().strip('"')
    return cfg


def read_shard(path):
    raw = open(path, "rb").read()
    assert raw[:8] == b"TGPTSHRD"
    width, = struct.unpack("<I", raw[12:16])
    n, = struct.unpack("<Q", raw[16:24])
    dtype = np.uint16 if width == 2 else np.uint32
    return np.frombuffer(raw[64:64 + n * width], dtype=dtype).astype(np.int64)


class RMSNorm(torch.nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Block(torch.nn.Module):
    def __init__(self, c, layer):
        super().__init__()
        C, self.Hq, self.Hkv, self.D = c["d_model"], c["n_head"], c["n_kv_head"], c["head_dim"]
        self.rope = not (c["nope_every"] > 0 and (layer + 1) % c["nope_every"] == 0)
        self.input_layernorm = RMSNorm(C, c["norm_eps"])
        self.q_proj = torch.nn.Linear(C, self.Hq * self.D, bias=False)
        self.k_proj = torch.nn.Linear(C, self.Hkv * self.D, bias=False)
        self.v_proj = torch.nn.Linear(C, self.Hkv * self.D, bias=False)
        self.q_norm = RMSNorm(self.D, c["norm_eps"])
        self.k_norm = RMSNorm(self.D, c["norm_eps"])
        self.o_proj = torch.nn.Linear(self.Hq * self.D, C, bias=False)
        self.post_attention_layernorm = RMSNorm(C, c["norm_eps"])
        self.gate_proj = torch.nn.Linear(C, c["d_ff"], bias=False)
        self.up_proj = torch.nn.Linear(C, c["d_ff"], bias=False)
        self.down_proj = torch.nn.Linear(c["d_ff"], C, bias=False)

    def forward(self, h, cos, sin, mask):
        B, T, _ = h.shape
        a = self.input_layernorm(h)
        q = self.q_norm(self.q_proj(a).view(B, T, self.Hq, self.D))
        k = self.k_norm(self.k_proj(a).view(B, T, self.Hkv, self.D))
        v = self.v_proj(a).view(B, T, self.Hkv, self.D)
        if self.rope:
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        rep = self.Hq // self.Hkv
        q = q.transpose(1, 2)
        k = k.repeat_interleave(rep, dim=2).transpose(1, 2)
        v = v.repeat_interleave(rep, dim=2).transpose(1, 2)
        att = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(self.D))
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, self.Hq * self.D)
        h = h + self.o_proj(y)
        m = self.post_attention_layernorm(h)
        return h + self.down_proj(F.silu(self.gate_proj(m)) * self.up_proj(m))


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Model(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.embed_tokens = torch.nn.Embedding(c["vocab_size"], c["d_model"])
        self.layers = torch.nn.ModuleList(Block(c, l) for l in range(c["n_layer"]))
        self.norm = RMSNorm(c["d_model"], c["norm_eps"])
        for p in self.parameters():
            if p.dim() == 2:
                torch.nn.init.normal_(p, std=0.02)

    def forward(self, x, y, z_loss):
        c = self.c
        B, T = x.shape
        starts = (x == c["doc_token"]).long()
        starts[:, 0] = 0
        seg = starts.cumsum(1)
        idx = torch.arange(T).expand(B, T)
        first = torch.zeros_like(idx).scatter_reduce(1, seg, idx, reduce="amin", include_self=False)
        pos = idx - first.gather(1, seg)
        mask = (torch.tril(torch.ones(T, T, dtype=torch.bool))[None] & (seg[:, :, None] == seg[:, None, :]))[:, None]
        half = c["head_dim"] // 2
        inv = c["rope_theta"] ** (-2.0 * torch.arange(half) / c["head_dim"])
        ang = pos[:, :, None].float() * inv
        cos, sin = ang.cos()[:, :, None, :], ang.sin()[:, :, None, :]
        h = self.embed_tokens(x)
        for layer in self.layers:
            h = layer(h, cos, sin, mask)
        logits = self.norm(h) @ self.embed_tokens.weight.T
        logits = logits.view(-1, logits.shape[-1])
        lse = torch.logsumexp(logits, -1)
        ce = F.cross_entropy(logits, y.view(-1))
        return ce, ce + z_loss * (lse ** 2).mean()


def main():
    cfg_path, shard, steps, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    raw = read_config(cfg_path)
    c = {k: raw[k] for k in raw}
    ints = ["vocab_size", "n_layer", "d_model", "n_head", "n_kv_head", "d_ff", "seq_len", "batch_size", "doc_token",
            "nope_every"]
    c = {k: int(c[k]) if k in ints else c[k] for k in c}
    c.setdefault("n_kv_head", c["n_head"])
    c["head_dim"] = c["d_model"] // c["n_head"]
    c["rope_theta"] = float(raw.get("rope_theta", 10000))
    c["norm_eps"] = float(raw.get("norm_eps", 1e-6))
    c.setdefault("nope_every", 4)
    model = Model(c)
    decay = [p for n, p in model.named_parameters() if p.dim() == 2 and "embed" not in n]
    other = [p for n, p in model.named_parameters() if not (p.dim() == 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=float(raw["lr"]), betas=(0.9, 0.95), eps=1e-8)
    tokens = torch.from_numpy(read_shard(shard))
    B, T = c["batch_size"], c["seq_len"]
    t_start = None
    for step in range(steps):
        if step == 2:
            t_start = time.perf_counter()
        i = step * B * T
        chunk = tokens[i:i + B * T + 1]
        x, y = chunk[:-1].view(B, T), chunk[1:].view(B, T)
        ce, objective = model(x, y, 1e-4)
        opt.zero_grad(set_to_none=True)
        objective.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    elapsed = time.perf_counter() - t_start
    sps = (steps - 2) / elapsed
    print(f"torch steps_per_s={sps:.4f} tok_per_s={sps * B * T:.1f} final_loss={ce.item():.4f}")


if __name__ == "__main__":
    main()
