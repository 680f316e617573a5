// bench/gpu/attention.cu — attention alone: the WMMA kernels (cuda/attention.cu, the default)
// against the register-resident ones (cuda/attention_fa2.cuh, TRAIN_GPT_ATTENTION=fa2), forward
// and backward, at the shapes of the benchmark models (seq 4096), plain causal and documents.
// bench/gpu/attention_torch.py times PyTorch's SDPA (flash and cuDNN backends) at the same
// shapes; bench/gpu/attention.sh runs both into one result file.
//
//     build/bench_attention [ITERS]        (make build/bench_attention; ITERS 10)
//
// TFLOP/s count the products a FlashAttention-2 kernel does on the visible (query, key) pairs:
// forward 4·D per pair (Q·Kᵀ, P·V), backward 10·D (5 products) — the usual convention, so the
// figures compare with published ones; our backward does 7 products (it recomputes S and dP
// for dQ instead of adding into dQ atomically), so its own arithmetic rate is 1.4× the figure.
// Causal: T(T+1)/2 pairs per (batch row, head); documents (200–2000 tokens, as bench/gpu/run.sh):
// Σ ℓ(ℓ+1)/2 over the documents. Each row also says how far fa2's outputs are from the WMMA
// kernels' at that shape (max |Δ| / max |WMMA|): a check at sizes the tests do not reach.
#include "cuda/kernels.h"

#include <string.h>

#include <vector>

#include "llmc/rng.h"

namespace {

struct shape {
    const char *name;
    int64_t B, T;
    int Hq, Hkv, D;
};

const shape SHAPES[] = {
    {"gpt-1b (d 2048, 32/8 heads)", 4, 4096, 32, 8, 64},
    {"head_dim 128 (d 2048, 16/4 heads)", 4, 4096, 16, 4, 128},
    {"boom-14b layer (d 5120, 40/8 heads)", 1, 4096, 40, 8, 128},
};

rng_state rng;

std::vector<bf16> random_bf16(int64_t n) {
    std::vector<bf16> x((size_t)n);
    for (auto &v : x) v = float_to_bf16((float)rng_normal(&rng));
    return x;
}

// Document starts: documents of 200..2000 tokens (or one document: plain causal); returns the
// visible (query, key) pairs of one batch row.
double fill_starts(std::vector<int32_t> &start, int64_t B, int64_t T, bool docs) {
    double pairs = 0.0;
    for (int64_t b = 0; b < B; b++) {
        int64_t s = 0;
        while (s < T) {
            int64_t len = docs ? 200 + (int64_t)(rng_next(&rng) % 1801) : T;
            if (s + len > T) len = T - s;
            for (int64_t t = s; t < s + len; t++) start[(size_t)(b * T + t)] = (int32_t)s;
            pairs += (double)len * (double)(len + 1) / 2.0;
            s += len;
        }
    }
    return pairs / (double)B;
}

template <typename F> float time_ms(F f, int iters, cudaStream_t stream) {
    cudaEvent_t a, b;
    CUDA_CHECK(cudaEventCreate(&a));
    CUDA_CHECK(cudaEventCreate(&b));
    f();  // warm-up (and the one-time shared-memory attribute)
    f();
    CUDA_CHECK(cudaEventRecord(a, stream));
    for (int i = 0; i < iters; i++) f();
    CUDA_CHECK(cudaEventRecord(b, stream));
    CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    cudaEventDestroy(a), cudaEventDestroy(b);
    return ms / iters;
}

double max_rel_diff(const bf16 *x, const bf16 *ref, int64_t n) {
    std::vector<bf16> hx((size_t)n), hr((size_t)n);
    CUDA_CHECK(cudaMemcpy(hx.data(), x, (size_t)n * sizeof(bf16), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(hr.data(), ref, (size_t)n * sizeof(bf16), cudaMemcpyDeviceToHost));
    double diff = 0.0, big = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double a = bf16_to_float(hx[(size_t)i]), r = bf16_to_float(hr[(size_t)i]);
        diff = fmax(diff, isfinite(a) ? fabs(a - r) : INFINITY);
        big = fmax(big, fabs(r));
    }
    return big > 0 ? diff / big : diff;
}

void run_shape(const shape &s, bool docs, int iters, cudaStream_t stream) {
    const int64_t N = s.B * s.T, QD = (int64_t)s.Hq * s.D, KD = (int64_t)s.Hkv * s.D, QKV = QD + 2 * KD;
    std::vector<int32_t> start((size_t)N);
    double pairs = fill_starts(start, s.B, s.T, docs) * s.B * s.Hq;
    auto h_qkv = random_bf16(N * QKV), h_dout = random_bf16(N * QD);
    bf16 *qkv, *dout, *out[2], *dqkv[2];
    float *lse[2], *delta;
    int32_t *d_start;
    CUDA_CHECK(cudaMalloc(&qkv, (size_t)(N * QKV) * sizeof(bf16)));
    CUDA_CHECK(cudaMalloc(&dout, (size_t)(N * QD) * sizeof(bf16)));
    CUDA_CHECK(cudaMalloc(&delta, (size_t)(N * s.Hq) * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&d_start, (size_t)N * sizeof(int32_t)));
    for (int i = 0; i < 2; i++) {
        CUDA_CHECK(cudaMalloc(&out[i], (size_t)(N * QD) * sizeof(bf16)));
        CUDA_CHECK(cudaMalloc(&dqkv[i], (size_t)(N * QKV) * sizeof(bf16)));
        CUDA_CHECK(cudaMalloc(&lse[i], (size_t)(N * s.Hq) * sizeof(float)));
    }
    CUDA_CHECK(cudaMemcpy(qkv, h_qkv.data(), h_qkv.size() * sizeof(bf16), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dout, h_dout.data(), h_dout.size() * sizeof(bf16), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_start, start.data(), start.size() * sizeof(int32_t), cudaMemcpyHostToDevice));

    attention_inputs in;
    memset(&in, 0, sizeof in);
    in.q = qkv;
    in.k = qkv + QD;
    in.v = qkv + QD + KD;
    in.q_stride = in.k_stride = in.v_stride = QKV;
    in.start = d_start;
    in.B = s.B;
    in.T = s.T;
    in.Hq = s.Hq;
    in.Hkv = s.Hkv;
    in.D = s.D;
    double fwd_flop = 4.0 * s.D * pairs, bwd_flop = 10.0 * s.D * pairs;
    const char *names[2] = {"wmma", "fa2"};
    for (int i = 0; i < 2; i++) {
        attention_grads g = {dqkv[i], dqkv[i] + QD, dqkv[i] + QD + KD, QKV, QKV, QKV};
        float fwd_ms = time_ms([&] { (i ? attention_fa2_forward : attention_forward)(&in, out[i], lse[i], stream); },
                               iters, stream);
        float bwd_ms = time_ms(
            [&] {
                (i ? attention_fa2_backward : attention_backward)(&in, out[i], lse[i], dout, &g, delta, stream);
            },
            iters, stream);
        printf("%-36s %-6s %-4s fwd %8.3f ms %6.1f TFLOP/s   bwd %8.3f ms %6.1f TFLOP/s", s.name, docs ? "docs" : "causal",
               names[i], fwd_ms, fwd_flop / fwd_ms / 1e9, bwd_ms, bwd_flop / bwd_ms / 1e9);
        if (i == 1)
            printf("   vs wmma: out %.1e, dq|dk|dv %.1e", max_rel_diff(out[1], out[0], N * QD),
                   max_rel_diff(dqkv[1], dqkv[0], N * QKV));
        printf("\n");
        fflush(stdout);
    }
    cudaFree(qkv), cudaFree(dout), cudaFree(delta), cudaFree(d_start);
    for (int i = 0; i < 2; i++) cudaFree(out[i]), cudaFree(dqkv[i]), cudaFree(lse[i]);
}

}  // namespace

int main(int argc, char **argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 10;
    if (iters < 1) {
        fprintf(stderr, "usage: bench_attention [ITERS]\n");
        return 2;
    }
    rng_seed(&rng, 1234, 0);
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("# bench_attention on %s: mean of %d calls after 2 warm-up calls; TFLOP/s of FlashAttention-2's "
           "products on the visible pairs (fwd 4·D, bwd 10·D per pair)\n",
           prop.name, iters);
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreate(&stream));
    for (const shape &s : SHAPES)
        for (int docs = 0; docs < 2; docs++) run_shape(s, docs != 0, iters, stream);
    return 0;
}
