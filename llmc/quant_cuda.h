// llmc/quant_cuda.h — llmc/quant.h's int8 / int4 encoder and decoder as CUDA kernels (quant.cu), so
// that a replica training on a GPU quantizes its outer gradient where it lives and copies
// the 4x / 8x smaller encoded form to the host, not the fp32 gradient.
//
// The encoder writes byte for byte what quant.c writes (test/test_quant_gpu.cu checks it on
// random data, ties, subnormals, zero and non-finite blocks): the same IEEE fp32 division
// for scale and code, the same round-half-away, no FMA contraction. The decoder gives the
// same bits as quant_decode. Callable from C; every launcher takes the stream last and
// never synchronizes.
#ifndef TRAIN_GPT_QUANT_CUDA_H
#define TRAIN_GPT_QUANT_CUDA_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "llmc/quant.h"

// d_x[n] (+ d_residual[n]) -> d_out[quant_encoded_bytes(k, n, block)], all device memory;
// d_out 4-byte aligned (its head is the float32 scales; cudaMalloc'ed memory is).
// d_residual NULL: quant_encode. Otherwise quant_encode_feedback without its return value:
// encodes x + residual and sets residual = (x + residual) - decode(out). The relative error
// is not computed here (a reduction and a host sync the step does not need); quant_decode
// on the host copy gives it where it is wanted.
void quant_encode_cuda(quant_kind k, const float *d_x, float *d_residual, int64_t n, int64_t block, uint8_t *d_out,
                       cudaStream_t stream);

// d_in[quant_encoded_bytes(k, n, block)] -> d_x[n], as quant_decode; d_in 4-byte aligned.
void quant_decode_cuda(quant_kind k, const uint8_t *d_in, int64_t n, int64_t block, float *d_x, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
