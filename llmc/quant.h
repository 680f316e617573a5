// llmc/quant.h — blockwise quantization of DiLoCo outer gradients (int8 / int4 / int2), dense
// or top-k sparse, with optional error feedback. The same functions exist in C (quant.cu's
// host section, the reference, used on the CPU and for every decode) and in CUDA (its GPU
// section, encode on the GPU).
//
// Layout of an encoded buffer of n values in blocks of `block` values (the last block may
// be short), little-endian, byte for byte (docs/quant.md repeats it, with the error bounds):
//   n_blocks = ceil(n / block) float32 scales, one per block, then the codes:
//   int8: n int8 codes, value = code * scale, code in [-127, 127]
//   int4: ceil(n / 2) bytes, two 4-bit two's-complement codes per byte (element 2i in the
//         low nibble, 2i+1 in the high nibble; for odd n the last high nibble is 0), code in
//         [-7, 7], value = code * scale; a byte may hold the last code of one block and the
//         first of the next
//   int2: ceil(n / 4) bytes, four 2-bit two's-complement codes per byte (element 4i + j in
//         bits 2j, 2j+1; unused bits 0), code in [-1, 1], value = code * scale
//   none: n float32 values (no scales)
//   bf16: n bfloat16 values (the top 16 bits of the float32, rounded to nearest even; every
//         NaN written as 0x7FC0), no scales: a downlink codec of the hub (docs/quant.md)
// scale = max|x| over the block / 127 (int8), / 7 (int4) or / 1 (int2), an fp32 division; a
// block of zeros (or of values so tiny that the division underflows to 0) has scale 0 and
// codes 0. code = round(clamp(x / scale, ±qmax)), an fp32 division, rounding to nearest with
// ties away from zero (roundf), so encode is deterministic and the C and CUDA encoders
// produce the same bytes, on any number of threads. Decoding is one fp32 multiply per
// value, so every replica that decodes the same bytes gets the same bits.
// A block holding a NaN or an Inf gets scale NaN (bits 0x7FC00000) and codes 0, so that it
// decodes to NaN and cannot pass for an update (callers check finiteness first anyway).
//
// Sparse (top-k) codecs: int8 / int4 / int2 that keep K values of every block (K < block;
// a short last block of len values keeps min(K, len)): the K largest |x| of the block, ties
// to the lower index. The encoding is exactly the dense one of codes that are 0 off the kept
// set (same scales, same codes on it, decode = code * scale everywhere), stored compactly:
//   n_blocks float32 scales, then one record per block, back to back:
//     index  which values are kept, in one of two codings chosen from (block, K) alone:
//            offsets: K offsets in the block of w = ceil(log2(block)) bits each, ascending,
//                     packed LSB first, ceil(K·w / 8) bytes;
//            bitmap:  bit i (byte i / 8, bit i % 8) set iff value i is kept, ceil(len / 8)
//                     bytes;
//            offsets when ceil(K·w / 8) < ceil(block / 8), else the bitmap;
//     codes  the K kept codes in ascending index order, 8 / 4 / 2 bits each, packed LSB
//            first, ceil(K·bits / 8) bytes (unused bits 0).
// Every full block's record has the same size, so the encoded size depends on (n, block, K)
// only and a block's record sits at a fixed offset: selection, encode and decode are per block
// and parallel.
#ifndef TRAIN_GPT_QUANT_H
#define TRAIN_GPT_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// The GPU launchers' stream: CUDA's, or HIP's (cuda/portable.cuh maps one to the other for
// the kernels; llmc/ cannot include cuda/).
#if defined(__CUDACC__)
#include <cuda_runtime_api.h>
#define QUANT_GPU_STREAM cudaStream_t
#elif defined(__HIPCC__)
#include <hip/hip_runtime_api.h>
#define QUANT_GPU_STREAM hipStream_t
#elif defined(TRAIN_GPT_EMULATION)  // test/warp_emu.h, the tests' CPU emulator of the GPU
#define QUANT_GPU_STREAM cudaStream_t
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { QUANT_NONE = 0, QUANT_INT8 = 1, QUANT_INT4 = 2, QUANT_BF16 = 3, QUANT_INT2 = 4 } quant_kind;

// "none" | "int8" | "int4" | "int2" | "bf16" -> kind; -1 for anything else.
int quant_kind_from_name(const char *name);
const char *quant_kind_name(quant_kind k);

// A codec: a kind, dense, or (int8 / int4 / int2) sparse, keeping `keep` values of every
// block: kind | keep << 8. A dense codec is its kind's number, so a quant_kind passes for
// one wherever a codec is asked for. Every function below takes a codec.
typedef int32_t quant_codec;
quant_codec quant_codec_of(quant_kind kind, int64_t keep);   // keep 0: dense
quant_kind quant_codec_kind(quant_codec c);
int64_t quant_codec_keep(quant_codec c);                     // 0 for a dense codec

// diloco_topk -> values kept per block: ceil(topk·block) (less 1e-9, so that 0.3·10 is 3),
// at least 1; 0 (dense) when that is the whole block, so topk = 1 is the dense codec itself.
int64_t quant_topk_keep(double topk, int64_t block);
// Whether a sparse codec of `keep` values per block codes its indices as offsets (else as
// a bitmap), and the bytes of one full block's record (index + codes; the scale not counted).
bool quant_sparse_offsets(int64_t block, int64_t keep);
size_t quant_sparse_record_bytes(quant_codec c, int64_t block);

// Bytes of the encoded form of n values.
size_t quant_encoded_bytes(quant_codec c, int64_t n, int64_t block);

// Encodes x[n] into out[quant_encoded_bytes(c, n, block)].
void quant_encode(quant_codec c, const float *x, int64_t n, int64_t block, uint8_t *out);

// Decodes in[] into x[n].
void quant_decode(quant_codec c, const uint8_t *in, int64_t n, int64_t block, float *x);

// Error feedback around encode. x[n] is this round's true outer gradient, residual[n] the
// part of earlier rounds that quantization did not send (NULL = no error feedback; a sparse
// codec sends the values it did not keep in later rounds through it, so it wants one).
// Encodes x + residual into out, then sets residual = (x + residual) - decode(out).
// Returns the relative L2 error of the sent values against x alone:
// ||decode(out) - x|| / ||x|| (0 when x is all zeros).
double quant_encode_feedback(quant_codec c, const float *x, float *residual, int64_t n, int64_t block, uint8_t *out);

// ---------------------------------------------------------------- segments and the hub's mean
// A DiLoCo payload is cut into segments of quant_segment_values(block) values (whole blocks,
// an even count, about 2^18 values), each encoded on its own and laid end to end: the unit
// the hub reduces as it arrives (one segment = one DATA chunk). docs/quant.md has the layout.
int64_t quant_segment_values(int64_t block);
size_t quant_segmented_bytes(quant_codec c, int64_t n, int64_t block, int64_t segment);
// quant_encode_feedback (residual NULL: quant_encode) segment by segment into the segmented
// layout; returns the relative L2 error of what is sent against x.
double quant_encode_segments(quant_codec c, const float *x, float *residual, int64_t n, int64_t block,
                             int64_t segment, uint8_t *out);
void quant_decode_segments(quant_codec c, const uint8_t *in, int64_t n, int64_t block, int64_t segment, float *x);

// Whether every value in[] decodes to is finite (int8 / int4 / int2: every block scale is).
bool quant_is_finite(quant_codec c, const uint8_t *in, int64_t n, int64_t block);

// The hub's mean of `count` (>= 1) encodings of n values: decoded (a sparse one to its dense
// values: 0 off its kept set, so the sum covers the union of the kept sets), each times factors[j]
// (factors NULL: none; a factor of 1 is skipped), summed in fp32 in the order given (ascending
// replica id), then divided by count (one fp32 division; none for count 1). Every fp32
// operation is rounded on its own, so the hub, the MPI transport and diloco_transport =
// local get the same bits.
void quant_mean(quant_codec c, const uint8_t *const *in, int count, int64_t n, int64_t block, const float *factors,
                float *mean);

// The L2 norm of the decoded values: squares summed in double, in order (reproducible).
double quant_norm(quant_codec c, const uint8_t *in, int64_t n, int64_t block);

// How a hub reduces a segment.
typedef struct {
    quant_codec up, down;       // the contributions' codec (dense or sparse), the mean's
    int64_t block;
    float bound;                // > 0 (Δ codecs only, not none, which carries weights): a
                                // contribution whose norm exceeds bound × the lower median of the
                                // segment's norms is scaled down to that (diloco_bound)
    const double *weights;      // NULL: every contribution counts alike; else in[j] counts
                                // weights[j] (the tokens it was trained on; 0: none, and it is
                                // left out as if it were not there)
} quant_reduction;

// What the reduction did to one contribution.
typedef struct {
    bool left_out;              // it held NaN/Inf
    float factor;               // 1, or the bound's scale
    bool weight_capped;         // its weight was above bound × the lower median weight: capped
} quant_effect;

// One segment through the hub: the mean of in[0..count) (ascending replica id), each bounded
// as q says, encoded in q->down into out, with error feedback on residual[n] (NULL: none);
// with weights, the weighted mean Σ wⱼ·xⱼ / Σ wⱼ over the finite contributions, computed as
// the plain mean of the xⱼ each scaled by fⱼ = (float)(wⱼ · kept / Σ wⱼ) (in double, then
// rounded; times the bound's scale): equal weights give fⱼ = 1 exactly, the unweighted bits;
// with a bound, each wⱼ is first capped at bound × the lower median of the weights;
// scratch holds n floats. A contribution with a NaN or Inf is left out, and one of weight 0
// (no work behind it) is not counted at all: the bytes are those of the mean without it.
// effect[j] (when not NULL) says what happened to contribution j; returns how many were left
// out (NaN/Inf) or scaled. With none left (or count 0) it writes a segment of NaN, which every
// replica refuses to apply.
int quant_reduce_segment(const quant_reduction *q, const uint8_t *const *in, int count, int64_t n, float *residual,
                         float *scratch, uint8_t *out, quant_effect *effect);

// ---------------------------------------------------------------- on the GPU
// The same encoder and decoder as CUDA kernels (quant.cu's GPU section), so that a replica
// training on a GPU quantizes its outer gradient where it lives and copies the 4x / 8x
// smaller encoded form to the host, not the fp32 gradient. The encoder writes byte for
// byte what quant_encode writes, sparse codecs included (test/test_quant_gpu.cu checks it on
// random data, ties, subnormals, zero and non-finite blocks): the same IEEE fp32 division for
// scale and code, the same round-half-away, no FMA contraction, the same top-k set (the
// order: |x| as bits, descending, then the index ascending). The decoder gives the same bits as
// quant_decode. Every launcher takes the stream last and never synchronizes. Declared for
// code compiled by nvcc or hipcc only (and the tests' CPU emulator of the GPU).
#if defined(__CUDACC__) || defined(__HIPCC__) || defined(TRAIN_GPT_EMULATION)
// d_x[n] (+ d_residual[n]) -> d_out[quant_encoded_bytes(c, n, block)], all device memory;
// d_out 4-byte aligned (its head is the float32 scales; cudaMalloc'ed memory is); a sparse
// codec's records are or-ed in through the 32-bit words that hold them, so the allocation must
// also cover the last of those words (up to 3 bytes past the encoding: cudaMalloc'ed memory does).
// d_residual NULL: quant_encode. Otherwise quant_encode_feedback without its return value:
// encodes x + residual and sets residual = (x + residual) - decode(out). The relative error
// is not computed here (a reduction and a host sync the step does not need); quant_decode
// on the host copy gives it where it is wanted.
void quant_encode_cuda(quant_codec c, const float *d_x, float *d_residual, int64_t n, int64_t block, uint8_t *d_out,
                       QUANT_GPU_STREAM stream);

// d_in[quant_encoded_bytes(c, n, block)] -> d_x[n], as quant_decode; d_in 4-byte aligned.
void quant_decode_cuda(quant_codec c, const uint8_t *d_in, int64_t n, int64_t block, float *d_x,
                       QUANT_GPU_STREAM stream);
#endif  // __CUDACC__ || __HIPCC__

#ifdef __cplusplus
}
#endif

#endif
