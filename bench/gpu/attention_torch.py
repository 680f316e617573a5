"""PyTorch's attention at bench/gpu/attention.cu's shapes, for the same result file.

    python3 bench/gpu/attention_torch.py [ITERS]      (bench/gpu/attention.sh runs it)

Plain causal: F.scaled_dot_product_attention(is_causal=True, enable_gqa=True) restricted to
each of its fast backends (FlashAttention, cuDNN); documents (200..2000 tokens, as
bench/gpu/run.sh): flex_attention, compiled, with a document-causal BlockMask. Forward and
backward timed separately with CUDA events (backward = forward + backward − forward), mean of
ITERS calls after two warm-up calls. TFLOP/s use attention.cu's convention: 4·D per visible
(query, key) pair forward, 10·D backward. A backend that refuses a shape prints why.
"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

SHAPES = [  # name, B, T, Hq, Hkv, D: bench/gpu/attention.cu's
    ("gpt-1b (d 2048, 32/8 heads)", 4, 4096, 32, 8, 64),
    ("head_dim 128 (d 2048, 16/4 heads)", 4, 4096, 16, 4, 128),
    ("boom-14b layer (d 5120, 40/8 heads)", 1, 4096, 40, 8, 128),
]


def timed(fn, iters):
    fn()
    fn()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / iters


def measure(label, attend, q, k, v, dout, pairs, D, iters):
    def fwd():
        with torch.no_grad():
            attend(q, k, v)

    def fwd_bwd():
        out = attend(q, k, v)
        out.backward(dout)

    try:
        f = timed(fwd, iters)
        fb = timed(fwd_bwd, iters)
    except Exception as e:  # a backend that does not take this shape
        print(f"{label}: not run ({type(e).__name__}: {str(e).splitlines()[0][:120]})", flush=True)
        return
    b = max(fb - f, 1e-6)
    print(f"{label} fwd {f:8.3f} ms {4 * D * pairs / f / 1e9:6.1f} TFLOP/s   "
          f"bwd {b:8.3f} ms {10 * D * pairs / b / 1e9:6.1f} TFLOP/s", flush=True)


def documents(B, T, gen):
    """Document ids (B, T) of 200..2000-token documents, and the visible pairs per row."""
    ids = torch.empty(B, T, dtype=torch.int32)
    pairs = 0.0
    for b in range(B):
        s, d = 0, 0
        while s < T:
            n = min(int(torch.randint(200, 2001, (1,), generator=gen)), T - s)
            ids[b, s:s + n] = d
            pairs += n * (n + 1) / 2
            s, d = s + n, d + 1
    return ids, pairs / B


def main():
    iters = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    torch.manual_seed(1234)
    gen = torch.Generator().manual_seed(1234)
    flex = torch.compile(flex_attention)
    print(f"# attention_torch.py on {torch.cuda.get_device_name(0)}, torch {torch.__version__}: "
          f"mean of {iters} calls after 2 warm-up calls", flush=True)
    for name, B, T, Hq, Hkv, D in SHAPES:
        dev = "cuda"
        q = torch.randn(B, Hq, T, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(B, Hkv, T, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(B, Hkv, T, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
        dout = torch.randn(B, Hq, T, D, device=dev, dtype=torch.bfloat16)
        causal_pairs = B * Hq * T * (T + 1) / 2
        for backend, tag in ((SDPBackend.FLASH_ATTENTION, "sdpa-flash"), (SDPBackend.CUDNN_ATTENTION, "sdpa-cudnn")):
            def attend(q, k, v, backend=backend):
                with sdpa_kernel([backend]):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            measure(f"{name:<36} causal {tag:<10}", attend, q, k, v, dout, causal_pairs, D, iters)

        ids, row_pairs = documents(B, T, gen)
        ids = ids.to(dev)

        def doc_causal(b, h, qi, ki):
            return (qi >= ki) & (ids[b, qi] == ids[b, ki])

        mask = create_block_mask(doc_causal, B, None, T, T, device=dev)

        def attend_flex(q, k, v):
            return flex(q, k, v, block_mask=mask, enable_gqa=True)
        measure(f"{name:<36} docs   {'flex':<10}", attend_flex, q, k, v, dout, row_pairs * B * Hq, D, iters)


if __name__ == "__main__":
    main()
