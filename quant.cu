// quant.cu — llmc/quant.h's blockwise int8 / int4 encoder and decoder on the GPU, byte for byte
// what quant.c writes. See llmc/quant_cuda.h for the API and quant.c for the design.
//
// Two kernels encode, as quant.c's two passes do:
//   quant_scales_kernel  one warp per block: max of |y| (y = x + residual) as an integer max
//                        on the bits (exact, so the reduction order does not matter), then
//                        scale = max / qmax, or NaN for a block holding NaN or Inf;
//   quant_codes_kernel   one thread per code byte (an int8 element, or an int4 pair, so no
//                        two threads write one byte): code = round(clamp(y / scale)), and
//                        with feedback residual = y - code·scale.
// Exactness: every fp32 operation is an explicit round-to-nearest intrinsic (__fadd_rn,
// __fdiv_rn, __fmul_rn, __fsub_rn), which nvcc never contracts into an FMA nor replaces
// by an approximation (-prec-div=false does not touch __fdiv_rn); roundf is exact. quant.c
// clamps before rounding like here, and rounds by hand; both equal roundf for |v| <= qmax.
// Subnormals: -ftz=true (part of -use_fast_math) flushes them in these intrinsics too,
// which would break the match for blocks of tiny values: build this file without it.
//
// A warp per block suits the block sizes DiLoCo uses (32 .. 4096); a block of millions of
// values is correct but leaves most of the GPU idle in the first kernel.
#include "llmc/quant_cuda.h"

#include "cuda/common.cuh"

extern "C" {
#include "llmc/common.h"
}

namespace {

constexpr int THREADS = 256;
constexpr int64_t MAX_GRID = 1 << 16; // grid-stride loops cover the rest
constexpr unsigned NAN_BITS = 0x7FC00000u; // the NaN quant.c writes too
constexpr unsigned FLT_MAX_BITS = 0x7F7FFFFFu;

__host__ __device__ int64_t blocks_of(int64_t n, int64_t block) { return n / block + (n % block != 0); }

unsigned grid_for(int64_t threads) {
    int64_t grid = (threads + THREADS - 1) / THREADS;
    return (unsigned)(grid < 1 ? 1 : grid > MAX_GRID ? MAX_GRID : grid);
}

__device__ __forceinline__ float y_at(const float *x, const float *r, int64_t i) {
    return r ? __fadd_rn(x[i], r[i]) : x[i];
}

// The code of y in a block of scale s: 0 for a zero or NaN scale.
__device__ __forceinline__ int code_of(float y, float s, float qmax) {
    if (!(s > 0.0f)) return 0;
    float v = __fdiv_rn(y, s);
    v = fminf(fmaxf(v, -qmax), qmax);
    return (int)roundf(v);
}

// 4-bit two's complement: 0..7 stay, 8..15 become -8..-1.
__device__ __forceinline__ int int4_code(unsigned nibble) { return (int)(nibble ^ 8u) - 8; }

// scales[b] for every block b; x, r (may be NULL) [n]; scales [ceil(n / block)].
__global__ void quant_scales_kernel(const float *x, const float *r, int64_t n, int64_t block, float qmax,
                                    float *scales) {
    const int lane = threadIdx.x % 32;
    const int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int64_t n_warps = (int64_t)gridDim.x * blockDim.x / 32;
    const int64_t n_blocks = blocks_of(n, block);
    for (int64_t b = warp; b < n_blocks; b += n_warps) { // uniform across the warp
        int64_t start = b * block, end = min(start + block, n);
        unsigned max_bits = 0;
        for (int64_t i = start + lane; i < end; i += 32)
            max_bits = max(max_bits, __float_as_uint(y_at(x, r, i)) & 0x7FFFFFFFu);
        for (int offset = 16; offset > 0; offset /= 2)
            max_bits = max(max_bits, __shfl_xor_sync(0xFFFFFFFFu, max_bits, offset));
        if (lane == 0)
            scales[b] = max_bits > FLT_MAX_BITS ? __uint_as_float(NAN_BITS) : __fdiv_rn(__uint_as_float(max_bits), qmax);
    }
}

// Codes (and the residual update) of element i; returns the code.
__device__ __forceinline__ int encode_element(const float *x, float *r, int64_t i, int64_t block, float qmax,
                                              const float *scales) {
    float s = scales[i / block];
    float y = y_at(x, r, i);
    int code = code_of(y, s, qmax);
    if (r) r[i] = __fsub_rn(y, __fmul_rn((float)code, s));
    return code;
}

// int8: codes [n]; int4: codes [ceil(n / 2)], element 2j in the low nibble of byte j.
__global__ void quant_codes_kernel(bool int4, const float *x, float *r, int64_t n, int64_t block, float qmax,
                                   const float *scales, uint8_t *codes) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const int64_t n_bytes = int4 ? n / 2 + n % 2 : n;
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < n_bytes; j += stride) {
        if (!int4) {
            codes[j] = (uint8_t)(int8_t)encode_element(x, r, j, block, qmax, scales);
            continue;
        }
        unsigned low = (unsigned)encode_element(x, r, 2 * j, block, qmax, scales) & 0x0Fu;
        unsigned high = 2 * j + 1 < n ? (unsigned)encode_element(x, r, 2 * j + 1, block, qmax, scales) & 0x0Fu : 0u;
        codes[j] = (uint8_t)(low | high << 4);
    }
}

// QUANT_NONE with feedback: out = y = x + r (a NaN as NAN_BITS), r = y - y (0, or NaN for a
// non-finite y).
__global__ void quant_none_feedback_kernel(const float *x, float *r, int64_t n, float *out) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float y = __fadd_rn(x[i], r[i]);
        out[i] = isnan(y) ? __uint_as_float(NAN_BITS) : y;  // quant.c's one NaN
        r[i] = __fsub_rn(y, y);
    }
}

// x [n] = code · scale.
__global__ void quant_decode_kernel(bool int4, const float *scales, const uint8_t *codes, int64_t n, int64_t block,
                                    float *x) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        int code = int4 ? int4_code((codes[i / 2] >> (4 * (i % 2))) & 0x0Fu) : (int)(int8_t)codes[i];
        x[i] = __fmul_rn((float)code, scales[i / block]);
    }
}

void check_arguments(quant_kind k, int64_t n, int64_t block) {
    CHECK(k == QUANT_NONE || k == QUANT_INT8 || k == QUANT_INT4);
    CHECK(n >= 0);
    CHECK(block >= 1);
}

} // namespace

extern "C" void quant_encode_cuda(quant_kind k, const float *d_x, float *d_residual, int64_t n, int64_t block,
                                  uint8_t *d_out, cudaStream_t stream) {
    check_arguments(k, n, block);
    if (n == 0) return;
    if (k == QUANT_NONE) {
        if (d_residual) {
            quant_none_feedback_kernel<<<grid_for(n), THREADS, 0, stream>>>(d_x, d_residual, n, (float *)d_out);
            CUDA_CHECK_LAUNCH();
        } else {
            CUDA_CHECK(cudaMemcpyAsync(d_out, d_x, (size_t)n * sizeof(float), cudaMemcpyDeviceToDevice, stream));
        }
        return;
    }
    const float qmax = k == QUANT_INT8 ? 127.0f : 7.0f;
    const int64_t n_blocks = blocks_of(n, block);
    float *scales = (float *)d_out;
    uint8_t *codes = d_out + (size_t)n_blocks * sizeof(float);
    quant_scales_kernel<<<grid_for(n_blocks * 32), THREADS, 0, stream>>>(d_x, d_residual, n, block, qmax, scales);
    CUDA_CHECK_LAUNCH();
    const int64_t n_bytes = k == QUANT_INT4 ? n / 2 + n % 2 : n;
    quant_codes_kernel<<<grid_for(n_bytes), THREADS, 0, stream>>>(k == QUANT_INT4, d_x, d_residual, n, block, qmax,
                                                                   scales, codes);
    CUDA_CHECK_LAUNCH();
}

extern "C" void quant_decode_cuda(quant_kind k, const uint8_t *d_in, int64_t n, int64_t block, float *d_x,
                                  cudaStream_t stream) {
    check_arguments(k, n, block);
    if (n == 0) return;
    if (k == QUANT_NONE) {
        CUDA_CHECK(cudaMemcpyAsync(d_x, d_in, (size_t)n * sizeof(float), cudaMemcpyDeviceToDevice, stream));
        return;
    }
    const float *scales = (const float *)d_in;
    const uint8_t *codes = d_in + (size_t)blocks_of(n, block) * sizeof(float);
    quant_decode_kernel<<<grid_for(n), THREADS, 0, stream>>>(k == QUANT_INT4, scales, codes, n, block, d_x);
    CUDA_CHECK_LAUNCH();
}
