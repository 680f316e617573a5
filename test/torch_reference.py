#!/usr/bin/python3
"""PyTorch oracle for the CPU backend (run with Debian's /usr/bin/python3 + python3-torch).

    torch_reference.py DUMP_DIR

Reads DUMP_DIR/model.safetensors (our initial weights) and DUMP_DIR/dump.safetensors
(written by build/reference_dump), rebuilds the model of DESIGN.md in PyTorch from the
weights alone, and checks, in float64:

  * logits, loss and the z-loss term of batch 0,
  * the gradient of every parameter (of loss + z-loss),
  * three optimizer steps on batches 0..2: torch.optim.AdamW (decay only on 2-D weights
    except the embedding), torch.nn.utils.clip_grad_norm_, and the WSD lr computed here
    from DESIGN.md's formula — the loss, the pre-clip norm, the lr and every weight after
    each step.

Error measure, per tensor: max|ours - ref| / max|ref| (relative to the tensor's scale;
an element-wise relative error is meaningless where a value crosses zero).
Tolerances: 1e-4 for logits, loss and gradients, 1e-5 for weights after AdamW steps.
Our side runs in fp32, so its rounding error is ~1e-6 of a tensor's scale; a wrong
formula (sign, scale, mask, position, GQA head mapping) shows up as an O(1) error.

The model here is written independently of the C code: masks are built as full (T, T)
boolean matrices from a cumulative document count, GQA repeats K/V heads, RoPE uses
cat/rotate-half, and the loss uses torch.logsumexp.
"""
import json
import math
import struct
import sys

import numpy as np
import torch

torch.set_default_dtype(torch.float64)
torch.set_num_threads(max(1, torch.get_num_threads()))

FAILURES = []


def load_safetensors(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    base = 8 + n
    tensors = {}
    for name, info in header.items():
        assert info["dtype"] == "F32", (name, info["dtype"])
        a, b = info["data_offsets"]
        arr = np.frombuffer(raw[base + a:base + b], dtype="<f4").reshape(info["shape"])
        tensors[name] = torch.from_numpy(arr.astype(np.float64))
    return tensors, meta


def parse_config_text(text):
    cfg = {}
    for line in text.splitlines():
        key, _, value = line.partition("=")
        value = value.strip()
        if value.startswith('"'):
            value = value[1:-1]
        cfg[key.strip()] = value
    return cfg


def check(what, ours, ref, tol):
    ours = torch.as_tensor(ours, dtype=torch.float64)
    ref = torch.as_tensor(ref, dtype=torch.float64)
    if ours.shape != ref.shape:
        FAILURES.append(f"{what}: shape {tuple(ours.shape)} vs reference {tuple(ref.shape)}")
        return
    scale = ref.abs().max().item()
    err = (ours - ref).abs().max().item() / (scale if scale > 0 else 1.0)
    status = "ok " if err <= tol else "BAD"
    if err > tol:
        FAILURES.append(f"{what}: relative error {err:.3e} > {tol:.0e}")
    return err, status


class Model:
    """DESIGN.md's model as a pure function of a dict of weights."""

    def __init__(self, mc):
        self.V = mc["vocab_size"]
        self.L = mc["n_layer"]
        self.C = mc["d_model"]
        self.Hq = mc["n_head"]
        self.Hkv = mc["n_kv_head"]
        self.D = mc["head_dim"]
        self.theta = mc["rope_theta"]
        self.nope_every = mc["nope_every"]
        self.qk_norm = mc["qk_norm"]
        self.tied = mc["tie_embeddings"]
        self.eps = mc["norm_eps"]
        self.doc_masking = mc["doc_masking"]
        self.doc_token = mc["doc_token"]

    def rmsnorm(self, x, g):
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * g

    def segments(self, x):
        B, T = x.shape
        if not self.doc_masking:
            seg = torch.zeros(B, T, dtype=torch.long)
            pos = torch.arange(T).expand(B, T)
            return seg, pos
        starts = (x == self.doc_token).long()
        starts[:, 0] = 0  # a document starts at s >= 1 only
        seg = torch.cumsum(starts, dim=1)
        pos = torch.empty(B, T, dtype=torch.long)
        for b in range(B):
            first = {}
            for t in range(T):
                s = int(seg[b, t])
                first.setdefault(s, t)
                pos[b, t] = t - first[s]
        return seg, pos

    def rope(self, x, pos):  # x (B, T, H, D)
        half = self.D // 2
        inv = self.theta ** (-2.0 * torch.arange(half, dtype=torch.float64) / self.D)
        ang = pos.to(torch.float64)[:, :, None] * inv  # (B, T, half)
        cos = torch.cos(ang)[:, :, None, :]
        sin = torch.sin(ang)[:, :, None, :]
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    def logits(self, w, x):
        B, T = x.shape
        seg, pos = self.segments(x)
        causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
        same_doc = seg[:, :, None] == seg[:, None, :]
        mask = causal[None] & same_doc  # (B, T, T): query t may see key s
        h = w["model.embed_tokens.weight"][x]
        for l in range(self.L):
            p = f"model.layers.{l}."
            a = self.rmsnorm(h, w[p + "input_layernorm.weight"])
            q = (a @ w[p + "self_attn.q_proj.weight"].T).view(B, T, self.Hq, self.D)
            k = (a @ w[p + "self_attn.k_proj.weight"].T).view(B, T, self.Hkv, self.D)
            v = (a @ w[p + "self_attn.v_proj.weight"].T).view(B, T, self.Hkv, self.D)
            if self.qk_norm:
                q = self.rmsnorm(q, w[p + "self_attn.q_norm.weight"])
                k = self.rmsnorm(k, w[p + "self_attn.k_norm.weight"])
            if not (self.nope_every > 0 and (l + 1) % self.nope_every == 0):
                q = self.rope(q, pos)
                k = self.rope(k, pos)
            rep = self.Hq // self.Hkv
            k = k.repeat_interleave(rep, dim=2)
            v = v.repeat_interleave(rep, dim=2)
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
            scores = q @ k.transpose(-1, -2) / math.sqrt(self.D)
            scores = scores.masked_fill(~mask[:, None], float("-inf"))
            att = torch.softmax(scores, dim=-1) @ v
            att = att.transpose(1, 2).reshape(B, T, self.Hq * self.D)
            h = h + att @ w[p + "self_attn.o_proj.weight"].T
            m = self.rmsnorm(h, w[p + "post_attention_layernorm.weight"])
            gate = m @ w[p + "mlp.gate_proj.weight"].T
            up = m @ w[p + "mlp.up_proj.weight"].T
            h = h + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
        head = w["model.embed_tokens.weight"] if self.tied else w["lm_head.weight"]
        return self.rmsnorm(h, w["model.norm.weight"]) @ head.T

    def losses(self, w, x, y, z_loss):
        logits = self.logits(w, x).reshape(-1, self.V)
        lse = torch.logsumexp(logits, dim=-1)
        ce = (lse - logits.gather(1, y.reshape(-1, 1)).squeeze(1)).mean()
        z = z_loss * (lse ** 2).mean()
        return logits, ce, z


def wsd_lr(tc, s):
    peak = float(tc["lr"])
    low = float(tc["min_lr_frac"]) * peak
    S = int(tc["max_steps"])
    warm = int(tc["warmup_steps"])
    if s < warm:
        return peak * (s + 1) / warm
    sd = S - int(math.floor(float(tc["decay_frac"]) * S + 0.5))
    if s >= sd and S > sd:
        p = (s - sd) / (S - sd)
        if tc["decay_shape"] == "sqrt":
            return low + (peak - low) * (1 - math.sqrt(p))
        return peak + (low - peak) * p
    return peak


def main(dump_dir):
    weights, meta = load_safetensors(f"{dump_dir}/model.safetensors")
    dump, dmeta = load_safetensors(f"{dump_dir}/dump.safetensors")
    mc = json.loads(meta["model_config"])
    tc = parse_config_text(dmeta["train_config"])
    model = Model(mc)
    B, T = int(tc["batch_size"]), mc["seq_len"]
    z_loss = float(tc["z_loss"])
    inputs = dump["inputs"].long().view(-1, B, T)
    targets = dump["targets"].long().view(-1, B, T)
    report = []

    # --- forward and gradients on batch 0
    w = {k: v.clone().requires_grad_(True) for k, v in weights.items()}
    logits, ce, z = model.losses(w, inputs[0], targets[0], z_loss)
    (ce + z).backward()
    report.append(("logits", *check("logits", dump["logits"], logits.detach(), 1e-4)))
    report.append(("loss", *check("loss", dump["loss"], ce.detach().reshape(1), 1e-4)))
    report.append(("z_term", *check("z_term", dump["z_term"], z.detach().reshape(1), 1e-4)))
    worst_grad = 0.0
    for name in weights:
        err, _ = check(f"grad {name}", dump[f"grad.{name}"], w[name].grad, 1e-4)
        worst_grad = max(worst_grad, err)
    report.append((f"gradients ({len(weights)} tensors, worst)", worst_grad, "ok " if worst_grad <= 1e-4 else "BAD"))

    # --- three AdamW steps
    w = {k: v.clone().requires_grad_(True) for k, v in weights.items()}
    decay = [w[n] for n in w if w[n].dim() == 2 and n != "model.embed_tokens.weight"]
    no_decay = [w[n] for n in w if not (w[n].dim() == 2 and n != "model.embed_tokens.weight")]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": float(tc["weight_decay"])}, {"params": no_decay, "weight_decay": 0.0}],
        lr=float(tc["lr"]), betas=(float(tc["beta1"]), float(tc["beta2"])), eps=float(tc["adam_eps"]))
    clip = float(tc["grad_clip"])
    clipped_steps = 0
    for s in range(inputs.shape[0]):
        opt.zero_grad()
        _, ce, z = model.losses(w, inputs[s], targets[s], z_loss)
        (ce + z).backward()
        norm = torch.nn.utils.clip_grad_norm_(list(w.values()), clip).item()
        clipped_steps += norm > clip
        lr = wsd_lr(tc, s)
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
        report.append((f"step {s + 1} loss", *check(f"step {s + 1} loss", dump["step_loss"][s:s + 1], [ce.item()], 1e-4)))
        report.append((f"step {s + 1} grad norm", *check(f"step {s + 1} norm", dump["step_norm"][s:s + 1], [norm], 1e-4)))
        report.append((f"step {s + 1} lr", *check(f"step {s + 1} lr", dump["step_lr"][s:s + 1], [lr], 1e-6)))
        worst = 0.0
        for name in w:
            err, _ = check(f"step {s + 1} weights {name}", dump[f"step{s + 1}.{name}"], w[name].detach(), 1e-5)
            worst = max(worst, err)
        report.append((f"step {s + 1} weights (worst)", worst, "ok " if worst <= 1e-5 else "BAD"))
    if clipped_steps == 0:
        FAILURES.append(f"clipping was never active (grad_clip {clip}): the test does not exercise it")

    for what, err, status in report:
        print(f"  {status} {what:40s} rel err {err:.2e}")
    if FAILURES:
        for f in FAILURES[:20]:
            print("FAIL:", f)
        sys.exit(1)
    print(f"torch_reference: {dump_dir}: all checks passed ({clipped_steps}/{inputs.shape[0]} steps clipped)")


if __name__ == "__main__":
    main(sys.argv[1])
