// cuda/embedding.cu — token embedding, forward and a deterministic backward.
//
// Forward: a gather of fp32 master rows into the fp32 residual stream (the stream starts
// exact; it is read by the first norm and by the first residual add).
//
// Backward: dE[v] += Σ of the rows of dout whose token is v. The usual atomicAdd scatter
// makes the order of the float additions, and so the bits, depend on scheduling. Instead
// the host, which has the tokens anyway, groups positions by token (a counting sort,
// O(N + V)) and uploads the groups with the micro-batch; one block column owns one token
// and adds its rows in ascending position order, then adds the total to dE once. No two
// blocks touch the same element of dE, so there are no atomics and the result is the same
// on every run. Frequent tokens make some blocks longer than others; the kernel is a
// fraction of a percent of a step either way.
#include "cuda/kernels.h"

__global__ void embedding_forward_kernel(float *out, const int32_t *tokens, const float *E, int64_t N, int64_t C) {
    int64_t n = blockIdx.x;  // rows on x: B·T may exceed y's limit of 65 535
    const float *src = E + (int64_t)tokens[n] * C;
    float *dst = out + n * C;
    for (int64_t c = blockIdx.y * (int64_t)blockDim.x + threadIdx.x; c < C; c += (int64_t)gridDim.y * blockDim.x)
        dst[c] = src[c];
}

void embedding_forward(float *out, const int32_t *tokens, const float *E, int64_t N, int64_t C,
                       cudaStream_t stream) {
    if (N == 0) return;
    dim3 grid((unsigned)N, (unsigned)(cdiv(C, 256) < 65535 ? cdiv(C, 256) : 65535));
    embedding_forward_kernel<<<grid, 256, 0, stream>>>(out, tokens, E, N, C);
    CUDA_CHECK_LAUNCH();
}

int64_t embedding_buckets(int32_t *unique, int32_t *offsets, int32_t *positions, const int32_t *tokens, int64_t N,
                          int32_t *counts) {
    // counts[v] = occurrences of v; the distinct tokens are listed in order of first
    // appearance (any fixed order would do: it only has to depend on the tokens alone).
    for (int64_t n = 0; n < N; n++) counts[tokens[n]]++;
    int64_t U = 0;
    int32_t at = 0;
    for (int64_t n = 0; n < N; n++) {
        int32_t v = tokens[n];
        if (counts[v] > 0) {  // first time seen: give it its range; counts[v] becomes its next free slot
            unique[U] = v;
            offsets[U] = at;
            U++;
            int32_t c = counts[v];
            counts[v] = -1 - at;  // negative = listed; -1 - slot keeps slot 0 distinguishable
            at += c;
        }
    }
    offsets[U] = at;
    for (int64_t n = 0; n < N; n++) {
        int32_t v = tokens[n];
        int32_t slot = -1 - counts[v];
        positions[slot] = (int32_t)n;
        counts[v] = -1 - (slot + 1);
    }
    for (int64_t u = 0; u < U; u++) counts[unique[u]] = 0;
    return U;
}

// grid (U, ⌈C/256⌉): block (u, cb) sums the rows of token unique[u] for 256 columns.
__global__ void embedding_backward_kernel(float *dE, const float *dout, const int32_t *unique,
                                          const int32_t *offsets, const int32_t *positions, int64_t C) {
    int64_t u = blockIdx.x;
    int64_t c = blockIdx.y * (int64_t)blockDim.x + threadIdx.x;
    if (c >= C) return;
    float sum = 0.0f;
    for (int32_t i = offsets[u]; i < offsets[u + 1]; i++) sum += dout[(int64_t)positions[i] * C + c];
    dE[(int64_t)unique[u] * C + c] += sum;
}

void embedding_backward(float *dE, const float *dout, const int32_t *unique, const int32_t *offsets,
                        const int32_t *positions, int64_t num_unique, int64_t C, cudaStream_t stream) {
    if (num_unique == 0) return;
    dim3 grid((unsigned)num_unique, (unsigned)cdiv(C, 256));
    embedding_backward_kernel<<<grid, 256, 0, stream>>>(dE, dout, unique, offsets, positions, C);
    CUDA_CHECK_LAUNCH();
}
