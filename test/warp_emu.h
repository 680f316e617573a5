// test/warp_emu.h — runs CUDA kernels on the CPU, so that `make test` checks the GPU
// backend without a GPU: the register-resident attention written against cuda/mma.cuh
// (test/test_attention_fa2_emu.cc), every kernel file of cuda/ but the WMMA attention through
// test/test_gpu_kernels.cu, and the GPU model of train_gpt.cu, whole training steps, through
// test/test_gpu_step.cu with test/cublaslt_emu.h for the products (TRAIN_GPT_EMULATION; the
// Makefile's "emulated GPU tests"). It checks what the
// kernels compute and what they assume about the instructions, and (running the lanes of odd
// blocks in reverse) a read of what another thread writes with no barrier between them;
// whether a GPU does what the PTX ISA says, races that need real warps' interleaving and
// speed are left to `make test-gpu` on a GPU.
//
// A block's threads are lanes with their own stacks (ucontext to start one, GCC's
// __builtin_setjmp/__builtin_longjmp to switch, also clang's on x86-64; else _setjmp/_longjmp:
// glibc's swapcontext makes a system call per switch, its _longjmp walks the thread's cleanup
// handlers), run one at a time by a
// scheduler: each runs until it reaches a collective (a warp instruction, __syncwarp,
// __syncthreads) and waits there; when all lanes of a warp wait at the same warp
// instruction they are released together, and likewise all threads at a block barrier.
// Blocks run one after another. The instructions are implemented from the PTX ISA:
//   ldmatrix .m8n8 .x4 (.trans) .b16   lanes 8i..8i+7 address the rows of matrix i; lane l gets
//                                       row l/4, columns 2(l%4), +1 (transposed: rows 2(l%4), +1
//                                       of column l/4), the lower column in the lower half
//   mma .m16n8k16 .row.col bf16→f32      the fragment layouts of cuda/mma.cuh's table
//   cp.async 16 and 4 bytes             copies are queued per thread and happen at the
//                                       cp.async.wait_group that retires their group: a kernel
//                                       that reads a tile before waiting reads stale bytes
//   shfl.sync.bfly                      the value of lane l ^ mask
// and it stops with a message (a failed test) on what the hardware leaves undefined or a
// kernel gets wrong: lanes of a warp at different collectives, a barrier some threads never
// reach, a shared-memory access out of the block's allocation or misaligned.
//
// The runtime (emulated build only): device memory is host memory, copies are memcpy, a
// launch runs the grid at once (streams and events are in order by construction), and
// `k<<<grid, block, smem, stream>>>(args)` is rewritten by the build into
// `emu::launcher(k, grid, block, smem, stream)(args)`. Static __shared__ arrays are function
// statics: the blocks of a grid run one at a time, so each block has them to itself.
//
// Single-threaded and deterministic; slow (fine for the tests' small shapes).
#ifndef TRAIN_GPT_TEST_WARP_EMU_H
#define TRAIN_GPT_TEST_WARP_EMU_H
#define TRAIN_GPT_EMULATION 1  // cuda/portable.cuh takes its emulation branch

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <ucontext.h>

#include <deque>
#include <memory>
#include <functional>
#include <tuple>
#include <utility>
#include <vector>

// The warp width: 32 as NVIDIA's; TRAIN_GPT_EMU_WARP=64 emulates AMD's CDNA wavefronts, with
// no mma.sync (as under HIP) and CDNA's MFMA instead (cuda/mfma.cuh): the kernels' 64-wide
// paths run on the CPU too.
#ifndef TRAIN_GPT_EMU_WARP
#define TRAIN_GPT_EMU_WARP 32
#endif
#if TRAIN_GPT_EMU_WARP != 32 && TRAIN_GPT_EMU_WARP != 64
#error "TRAIN_GPT_EMU_WARP: 32 (NVIDIA) or 64 (AMD CDNA)"
#endif

namespace emu {

enum { WARP = TRAIN_GPT_EMU_WARP };

struct idx3 {
    unsigned x, y, z;
};

enum lane_status { RUNNING, AT_WARP, AT_BLOCK, DONE };
enum collective { OP_LDSM, OP_LDSM_T, OP_MMA, OP_MFMA, OP_SHFL, OP_SYNCWARP };

struct pending_copy {
    unsigned char *dst;
    const unsigned char *src;
    int bytes;
    bool valid;
};

// A switch between stacks: __builtin_setjmp saves where to come back (the frame, the stack
// pointer, the resume address; the compiler saves the call-saved registers around it), and
// __builtin_longjmp, which must sit in another function, goes there. clang has the pair on
// x86-64 only: elsewhere it takes glibc's _setjmp/_longjmp (slower, the same behaviour; the
// _FORTIFY_SOURCE check of longjmp refuses a jump to another stack, which is the point).
#if defined(__clang__) && !defined(__x86_64__)
#undef _FORTIFY_SOURCE
#include <setjmp.h>
typedef jmp_buf jump_buf;
#define EMU_SAVE(buf) _setjmp(buf)
__attribute__((noinline)) inline void jump_to(jump_buf to) { _longjmp(to, 1); }
#else
typedef void *jump_buf[5];
#define EMU_SAVE(buf) __builtin_setjmp(buf)
__attribute__((noinline)) inline void jump_to(jump_buf to) { __builtin_longjmp(to, 1); }
#endif

struct lane {
    ucontext_t ctx;  // the first entry (its own stack)
    jump_buf resume;  // every later one: jump_to, no system call
    bool started = false;  // its context exists and has run: later starts resume it where it waits
    lane_status status;
    int op;        // the collective it waits at
    unsigned seq;  // warp collectives so far: which of the two slot sets it uses
    std::vector<pending_copy> open;
    std::deque<std::vector<pending_copy>> groups;
};

// What a warp's lanes publish for a collective: two sets, so that a lane released from one
// collective can publish for the next before the slowest lane has read the first.
struct slot {
    uint32_t w[6];
    const unsigned char *addr;
    unsigned char raw[8];  // a shuffled value of any type up to 8 bytes
};

struct block {
    int threads = 0;
    idx3 dims{1, 1, 1};  // blockDim
    std::vector<lane> lanes;  // room for 1024 from the start: growing never moves a lane started
    unsigned char *stacks = nullptr;  // the lanes' stacks, one region (stack_area)
    std::vector<slot> slots[2];
    std::vector<unsigned char> smem;
    ucontext_t scheduler;
    jump_buf back;  // where a lane returns to the scheduler
    int current = 0;
    std::function<void()> body;
};

inline block the_current_block;  // a namespace-scope object: no guard to test on every use
inline block &the_block() { return the_current_block; }
inline idx3 &block_index() {
    static idx3 i;
    return i;
}
inline unsigned &launches() {  // kernels launched so far
    static unsigned n;
    return n;
}
inline idx3 &grid_dims() {
    static idx3 g;
    return g;
}
inline idx3 thread_index() {
    block &b = the_block();
    unsigned t = (unsigned)b.current;
    return idx3{t % b.dims.x, t / b.dims.x % b.dims.y, t / (b.dims.x * b.dims.y)};
}
inline idx3 block_dims() { return the_block().dims; }
// Lanes in this thread's warp (the last warp of a block may be partial).
inline int warp_lanes() {
    block &b = the_block();
    int first = b.current / WARP * WARP;
    return b.threads - first < WARP ? b.threads - first : WARP;
}

[[noreturn]] inline void fail(const char *what) {
    block &b = the_block();
    fprintf(stderr, "warp_emu: block (%u,%u,%u) thread %d: %s\n", block_index().x, block_index().y, block_index().z,
            b.current, what);
    exit(1);
}

// Back to the scheduler until released. Not inlined, nor is run_lane: a function that holds a
// __builtin_setjmp saves every call-saved register on entry and restores them on return, so
// the switch stays inside these two and their callers keep their registers.
__attribute__((noinline)) inline void wait_as(lane_status status, int op) {
    block &b = the_block();
    lane &me = b.lanes[b.current];
    me.status = status;
    me.op = op;
    if (!EMU_SAVE(me.resume)) jump_to(b.back);
}

inline slot &publish() {
    block &b = the_block();
    lane &me = b.lanes[b.current];
    return b.slots[me.seq & 1][b.current];
}
// After release: lane `l` of this warp's slots for the collective just passed.
inline const slot &peer(int l) {
    block &b = the_block();
    lane &me = b.lanes[b.current];
    return b.slots[me.seq & 1][b.current / WARP * WARP + l];
}
inline void warp_collective(int op) {
    wait_as(AT_WARP, op);
}
inline void next_slot_set() { the_block().lanes[the_block().current].seq++; }

inline void check_shared(const void *p, size_t bytes, size_t align) {
    block &b = the_block();
    const unsigned char *c = (const unsigned char *)p, *lo = b.smem.data(), *hi = lo + b.smem.size();
    if (c < lo || c + bytes > hi) fail("shared-memory access outside the block's allocation");
    if ((uintptr_t)(c - lo) % align) fail("misaligned shared-memory access");
}

// A vector access to global memory: the GPU requires it aligned to its size.
inline void check_global_aligned(const void *p, size_t bytes) {
    if ((uintptr_t)p % bytes) fail("misaligned vector access to global memory");
}

inline uint16_t bf16_bits(float f) {  // round to nearest even, NaN → 0x7FFF (cuda/portable.cuh's rule)
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
inline float bf16_value(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
inline uint16_t half_of(uint32_t w, int upper) { return (uint16_t)(upper ? w >> 16 : w & 0xffffu); }
inline uint16_t element(const unsigned char *row, int col) {
    uint16_t v;
    memcpy(&v, row + 2 * col, 2);
    return v;
}

// A lane's stack is made once and kept for every later block (making a context costs system
// calls): the lane runs the body, reports DONE, and waits there to run the next block's.
inline void trampoline() {
    for (;;) {
        block &b = the_block();
        b.body();
        wait_as(DONE, -1);
    }
}

// The lanes' stacks: 1024 of 64 KiB in one region of transparent huge pages (a switch lands
// on another lane's stack: with 4 KiB pages every switch missed the TLB), at a stride that
// is not a power of two (the tops of the stacks would otherwise share one cache set).
enum : size_t { STACK_BYTES = 64 << 10, STACK_STRIDE = STACK_BYTES + 256 };
inline unsigned char *stack_area() {
    block &b = the_block();
    if (!b.stacks) {
        size_t bytes = 1024 * STACK_STRIDE;
        b.stacks = (unsigned char *)mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (b.stacks == (unsigned char *)MAP_FAILED) {
            fprintf(stderr, "warp_emu: cannot map %zu bytes for the lanes' stacks\n", bytes);
            exit(1);
        }
        madvise(b.stacks, bytes, MADV_HUGEPAGE);  // advice: without it the stacks still work
    }
    return b.stacks;
}

// Lane l's first start: its context on a stack of its own, entered (getcontext returns
// twice: kept out of the callers).
__attribute__((noinline)) inline void start_lane(block &b, lane &l) {
    getcontext(&l.ctx);
    l.ctx.uc_stack.ss_sp = stack_area() + (size_t)(&l - b.lanes.data()) * STACK_STRIDE;
    l.ctx.uc_stack.ss_size = STACK_BYTES;
    makecontext(&l.ctx, trampoline, 0);
    l.started = true;
    swapcontext(&b.scheduler, &l.ctx);
}

// Runs lane l until it waits (or ends).
__attribute__((noinline)) inline void run_lane(block &b, lane &l) {
    if (!EMU_SAVE(b.back)) {
        if (l.started) jump_to(l.resume);
        start_lane(b, l);
    }
}

// Runs `body` as every thread of one block: blockIdx = `index`, `threads` threads, `smem`
// bytes of dynamic shared memory (filled with a pattern: nothing may rely on zeros).
inline void run_block(idx3 index, idx3 dims, size_t smem, const std::function<void()> &body) {
    block &b = the_block();
    int threads = (int)(dims.x * dims.y * dims.z);
    b.threads = threads;
    b.dims = dims;
    b.body = body;
    if ((int)b.lanes.size() < threads) {
        b.lanes.reserve(1024);  // launch() allows no more threads per block
        b.lanes.resize(threads);
    }
    b.slots[0].assign(threads, slot());
    b.slots[1].assign(threads, slot());
    b.smem.assign(smem, 0xA5);
    block_index() = index;
    for (int i = 0; i < threads; i++) {
        lane &l = b.lanes[i];
        l.status = RUNNING;
        l.op = -1;
        l.seq = 0;
        l.open.clear();
        l.groups.clear();
    }
    // Lanes run in index order in even blocks and in reverse in odd ones (the other way round
    // every other launch, for grids of one block), so that a kernel that reads what another
    // thread writes without a barrier between (a race on a GPU) reads the wrong value in one
    // of the two orders.
    bool reverse = (index.x + index.y + index.z + launches()) % 2 == 1;
    for (;;) {
        for (int k = 0; k < threads; k++) {
            int i = reverse ? threads - 1 - k : k;
            if (b.lanes[i].status != RUNNING) continue;
            b.current = i;
            run_lane(b, b.lanes[i]);
        }
        int done = 0, at_block = 0;
        bool released = false;
        for (int i = 0; i < threads; i++) done += b.lanes[i].status == DONE, at_block += b.lanes[i].status == AT_BLOCK;
        if (done == threads) break;
        for (int w = 0; w * WARP < threads; w++) {
            int lanes = threads - w * WARP < WARP ? threads - w * WARP : WARP, waiting = 0;
            for (int l = 0; l < lanes; l++) waiting += b.lanes[w * WARP + l].status == AT_WARP;
            if (waiting == 0) continue;
            if (waiting < lanes) {
                b.current = w * WARP;
                fail("lanes of a warp wait at a warp instruction that others never reach");
            }
            for (int l = 1; l < lanes; l++)
                if (b.lanes[w * WARP + l].op != b.lanes[w * WARP].op) {
                    b.current = w * WARP + l;
                    fail("lanes of a warp at different warp instructions");
                }
            for (int l = 0; l < lanes; l++) b.lanes[w * WARP + l].status = RUNNING;
            released = true;
        }
        if (released) continue;
        if (at_block == threads) {
            for (int i = 0; i < threads; i++) b.lanes[i].status = RUNNING;
            continue;
        }
        b.current = 0;
        fail("a block barrier that some threads never reach (or that finished threads skip)");
    }
}

// Every block of a grid, in order.
inline void launch(idx3 grid, idx3 dims, size_t smem, const std::function<void()> &body) {
    launches()++;
    if ((uint64_t)dims.x * dims.y * dims.z == 0 || (uint64_t)dims.x * dims.y * dims.z > 1024)
        fail("a launch with 0 or more than 1024 threads per block");
    grid_dims() = grid;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) run_block(idx3{x, y, z}, dims, smem, body);
}
inline void launch(idx3 grid, int threads, size_t smem, const std::function<void()> &body) {
    launch(grid, idx3{(unsigned)threads, 1, 1}, smem, body);
}

// The value of lane (this lane ^ mask) of the warp, any type up to 8 bytes.
template <typename T> T shuffle_xor(T v, int mask) {
    static_assert(sizeof(T) <= 8, "shuffle of a value wider than 8 bytes");
    memcpy(publish().raw, &v, sizeof v);
    wait_as(AT_WARP, OP_SHFL);
    int l = the_block().current % WARP, other = l ^ mask;
    T r = v;
    if (other < warp_lanes()) memcpy(&r, peer(other).raw, sizeof r);
    next_slot_set();
    return r;
}

}  // namespace emu

// ---------------------------------------------------------------- CUDA's names

#define threadIdx (emu::thread_index())
#define blockIdx (emu::block_index())
#define gridDim (emu::grid_dims())
#define blockDim (emu::block_dims())
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __syncthreads() emu::wait_as(emu::AT_BLOCK, -1)
#define __syncwarp(...) emu::wait_as(emu::AT_WARP, emu::OP_SYNCWARP)
#define __expf expf
// fp32 arithmetic rounded to nearest, as the _rn intrinsics (the build has -ffp-contract=off:
// no fused multiply-add), the bit casts, and an atomic or (lanes switch only at collectives,
// so a read-modify-write of one lane is never interleaved with another's).
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline unsigned __float_as_uint(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    return u;
}
inline float __uint_as_float(unsigned u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline unsigned atomicOr(unsigned *p, unsigned v) {
    unsigned old = *p;
    *p = old | v;
    return old;
}
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
template <typename T> inline T min(T a, T b) { return b < a ? b : a; }
template <typename T> inline T max(T a, T b) { return a < b ? b : a; }

// The vector types the kernels load and store 8 or 16 bytes at a time with.
struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(8) float2 {
    float x, y;
};
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
struct alignas(8) uint2 {
    unsigned x, y;
};
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
inline float2 make_float2(float x, float y) { return float2{x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return uint2{x, y}; }

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

// The runtime: device memory is host memory; everything happens at the call, in order.
enum {
    cudaSuccess = 0,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidValue = 1,
    cudaErrorInsufficientDriver = 35,
    cudaErrorDevicesUnavailable = 46,
    cudaErrorNoDevice = 100,
    cudaErrorNoKernelImageForDevice = 209,
    cudaErrorUnsupportedPtxVersion = 222,
    cudaErrorNotReady = 600,
};
typedef int cudaError_t;

// Streams. By default every call runs when it is made, in program order (the streams are one
// order). With TRAIN_GPT_EMU_DEFER set, some streams are deferred: what is queued on them runs
// only when something waits for it (an event or stream synchronization, cudaStreamWaitEvent
// from another stream, a copy into pageable host memory, cudaFree); the others run at once,
// after what they were told to wait for. Two schedules, the extremes a GPU can take:
//   TRAIN_GPT_EMU_DEFER=first    the first stream created is deferred (the model's), the rest
//                                run at once: a comm stream runs as early as its waits allow
//   TRAIN_GPT_EMU_DEFER=others   every stream but the first is deferred: as late as possible
// A missing cross-stream dependency then reads data too early or too late, and the run's
// numbers change (test/test_fsdp_gpu_emu.sh runs FSDP under both).
struct emu_stream {
    std::deque<std::function<void()>> queue;
    int64_t queued = 0, done = 0;   // ops queued and run so far
    bool deferred = false;
};
typedef emu_stream *cudaStream_t;
struct emu_event {
    double seconds;
    emu_stream *stream;   // of its last record (NULL: none, or the default stream)
    int64_t pos;          // complete once stream->done reaches it
    int64_t told;         // the pos a query last answered "not ready" for (-1: none)
};
typedef emu_event *cudaEvent_t;

namespace emu {
inline std::vector<emu_stream *> &streams() {
    static std::vector<emu_stream *> all;
    return all;
}
inline int defer_mode() {  // 0 none, 1 first, 2 others
    static int mode = -1;
    if (mode < 0) {
        const char *e = getenv("TRAIN_GPT_EMU_DEFER");
        mode = !e || !*e ? 0 : strcmp(e, "first") == 0 ? 1 : strcmp(e, "others") == 0 ? 2 : -2;
        if (mode == -2) {
            fprintf(stderr, "test/warp_emu.h: TRAIN_GPT_EMU_DEFER=%s: first or others\n", e);
            exit(2);
        }
    }
    return mode;
}
// Runs stream s's queued ops until `upto` of them have run.
inline void flush(emu_stream *s, int64_t upto) {
    while (s && s->done < upto && !s->queue.empty()) {
        std::function<void()> op = std::move(s->queue.front());
        s->queue.pop_front();
        op();
        s->done++;
    }
}
inline void flush_all() {
    for (emu_stream *s : streams()) flush(s, s->queued);
}
// Queues op on s: run now unless s is deferred.
inline void enqueue(emu_stream *s, std::function<void()> op) {
    if (!s) {
        op();
        return;
    }
    s->queued++;
    if (s->deferred) {
        s->queue.push_back(std::move(op));
        return;
    }
    flush(s, s->queued - 1);
    op();
    s->done++;
}
// Page-locked host allocations (cudaMallocHost): an async copy reads them when it runs;
// pageable memory is read when the call is made (and a copy into it is synchronous), as CUDA does.
inline std::vector<std::pair<const char *, size_t>> &pinned() {
    static std::vector<std::pair<const char *, size_t>> all;
    return all;
}
inline bool is_pinned(const void *p) {
    for (auto &r : pinned())
        if ((const char *)p >= r.first && (const char *)p < r.first + r.second) return true;
    return false;
}
}  // namespace emu
enum cudaMemcpyKind { cudaMemcpyHostToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize };
typedef enum { CUDA_R_32F = 0, CUDA_R_16BF = 14 } cudaDataType_t;  // library_types.h's values
#define cudaStreamNonBlocking 1u
#define cudaEventDisableTiming 2u
struct cudaDeviceProp {
    char name[256];
    int major, minor, multiProcessorCount, warpSize;
    size_t totalGlobalMem;
    size_t sharedMemPerBlockOptin;   // what a kernel may ask for (cudaFuncSetAttribute)
};

namespace emu {
// A block's shared memory on the GPU emulated: an H100's 227 KiB, or TRAIN_GPT_EMU_SMEM_OPTIN
// bytes (101376: an A10, A40, L4 or L40S, sm_86/89), so that a kernel set that asks for more
// than such a GPU has fails here as it would there.
inline size_t smem_optin() {
    const char *v = getenv("TRAIN_GPT_EMU_SMEM_OPTIN");
    return v && *v ? (size_t)strtoull(v, NULL, 10) : (size_t)232448;
}
}  // namespace emu

inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline const char *cudaGetErrorString(cudaError_t) { return "an error of the CPU emulator"; }
inline const char *cudaGetErrorName(cudaError_t) { return "emulatorError"; }
inline cudaError_t cudaGetDeviceCount(int *n) { return *n = 1, cudaSuccess; }
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int) {
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "the CPU (test/warp_emu.h)");
    p->major = 9, p->multiProcessorCount = 1, p->warpSize = emu::WARP, p->totalGlobalMem = (size_t)1 << 34;
    p->sharedMemPerBlockOptin = emu::smem_optin();
    return cudaSuccess;
}
inline cudaError_t cudaDeviceSynchronize() { return emu::flush_all(), cudaSuccess; }
inline cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total) {
    *free_bytes = *total = (size_t)1 << 34;
    return cudaSuccess;
}
template <typename T> cudaError_t cudaMalloc(T **p, size_t bytes) {
    // TRAIN_GPT_EMU_MALLOC_MAX=N: an allocation of more than N bytes fails, as on a full GPU.
    static const char *max_env = getenv("TRAIN_GPT_EMU_MALLOC_MAX");
    if (max_env && bytes > (size_t)strtoull(max_env, NULL, 10)) return *p = NULL, cudaErrorMemoryAllocation;
    *p = (T *)malloc(bytes ? bytes : 1);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
template <typename T> cudaError_t cudaMallocHost(T **p, size_t bytes) {
    cudaError_t e = cudaMalloc(p, bytes);
    if (e == cudaSuccess) emu::pinned().push_back({(const char *)*p, bytes ? bytes : 1});
    return e;
}
inline cudaError_t cudaFree(void *p) {  // like CUDA's, it waits for the device first
    emu::flush_all();
    return free(p), cudaSuccess;
}
inline cudaError_t cudaFreeHost(void *p) {
    emu::flush_all();
    auto &all = emu::pinned();
    for (size_t i = 0; i < all.size(); i++)
        if (all[i].first == (const char *)p) {
            all.erase(all.begin() + (long)i);
            break;
        }
    return free(p), cudaSuccess;
}
// The legacy stream: synchronous, and (as with CUDA's non-blocking streams) not ordered after them.
inline cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind) {
    return memmove(dst, src, bytes), cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind k, cudaStream_t s = nullptr) {
    if (k == cudaMemcpyHostToDevice && !emu::is_pinned(src)) {  // pageable: read now
        std::shared_ptr<std::vector<char>> copy = std::make_shared<std::vector<char>>((const char *)src,
                                                                                      (const char *)src + bytes);
        emu::enqueue(s, [=] { memmove(dst, copy->data(), bytes); });
    } else {
        emu::enqueue(s, [=] { memmove(dst, src, bytes); });
    }
    if (k == cudaMemcpyDeviceToHost && !emu::is_pinned(dst) && s) emu::flush(s, s->queued);  // pageable: synchronous
    return cudaSuccess;
}
inline cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                                     size_t height, cudaMemcpyKind k, cudaStream_t s = nullptr) {
    emu::enqueue(s, [=] {
        for (size_t r = 0; r < height; r++) memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    });
    if (k == cudaMemcpyDeviceToHost && !emu::is_pinned(dst) && s) emu::flush(s, s->queued);
    return cudaSuccess;
}
inline cudaError_t cudaMemset(void *p, int v, size_t bytes) { return memset(p, v, bytes), cudaSuccess; }
inline cudaError_t cudaMemsetAsync(void *p, int v, size_t bytes, cudaStream_t s = nullptr) {
    emu::enqueue(s, [=] { memset(p, v, bytes); });
    return cudaSuccess;
}
inline cudaError_t cudaStreamCreate(cudaStream_t *s) {
    *s = new emu_stream;
    int mode = emu::defer_mode();
    (*s)->deferred = mode == 1 ? emu::streams().empty() : mode == 2 ? !emu::streams().empty() : false;
    emu::streams().push_back(*s);
    return cudaSuccess;
}
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned) { return cudaStreamCreate(s); }
inline cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    if (s) emu::flush(s, s->queued);
    return cudaSuccess;
}
inline cudaError_t cudaStreamDestroy(cudaStream_t s) {
    if (!s) return cudaSuccess;
    emu::flush(s, s->queued);
    auto &all = emu::streams();
    for (size_t i = 0; i < all.size(); i++)
        if (all[i] == s) {
            all.erase(all.begin() + (long)i);
            break;
        }
    delete s;
    return cudaSuccess;
}
inline cudaError_t cudaEventCreate(cudaEvent_t *e) { return *e = new emu_event{0.0, nullptr, 0, -1}, cudaSuccess; }
inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned) { return cudaEventCreate(e); }
inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = nullptr) {
    emu::enqueue(s, [e] {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        e->seconds = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
    });
    e->stream = s;
    e->pos = s ? s->queued : 0;
    return cudaSuccess;
}
inline cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    emu::flush(e->stream, e->pos);
    return cudaSuccess;
}
// A record whose work a deferred stream has not run yet is "not ready" to the first query (the
// host's polling loops take that path, as on a GPU); the next query runs it.
inline cudaError_t cudaEventQuery(cudaEvent_t e) {
    if (e->stream && e->stream->done < e->pos && e->told != e->pos) {
        e->told = e->pos;
        return cudaErrorNotReady;
    }
    return cudaEventSynchronize(e);
}
inline cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    return *ms = (float)((b->seconds - a->seconds) * 1e3), cudaSuccess;
}
inline cudaError_t cudaEventDestroy(cudaEvent_t e) { return delete e, cudaSuccess; }
inline cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned = 0) {
    emu_stream *from = e->stream;
    int64_t pos = e->pos;  // the record this call sees, not a later one
    if (from != s) emu::enqueue(s, [from, pos] { emu::flush(from, pos); });
    return cudaSuccess;
}
inline cudaError_t cudaSetDevice(int) { return cudaSuccess; }
inline cudaError_t cudaGetDevice(int *d) { return *d = 0, cudaSuccess; }
template <typename K> cudaError_t cudaFuncSetAttribute(K, cudaFuncAttribute, int bytes) {
    return bytes < 0 || (size_t)bytes > emu::smem_optin() ? (cudaError_t)cudaErrorInvalidValue : cudaSuccess;
}
struct cudaFuncAttributes {
    int maxThreadsPerBlock, numRegs;
    size_t sharedSizeBytes;
};
template <typename K> cudaError_t cudaFuncGetAttributes(cudaFuncAttributes *a, K) {
    return *a = cudaFuncAttributes{1024, 0, 0}, cudaSuccess;
}

namespace emu {
// What the build makes of `k<<<grid, block, smem, stream>>>(args)`: emu::launcher(k, grid,
// block, smem, stream)(args). The arguments are converted to the kernel's parameter types
// once, as a launch does, and every thread of the grid gets a copy.
template <typename... P> struct kernel_call {
    void (*kernel)(P...);
    dim3 grid, threads;
    size_t smem;
    cudaStream_t stream;
    template <typename... A> void operator()(A &&...args) const {
        std::tuple<P...> params(std::forward<A>(args)...);  // converted now, as a launch does
        void (*k)(P...) = kernel;
        idx3 g{grid.x, grid.y, grid.z}, t{threads.x, threads.y, threads.z};
        size_t bytes = smem;
        enqueue(stream, [=] { launch(g, t, bytes, [&] { std::apply(k, params); }); });
    }
};
template <typename... P>
kernel_call<P...> launcher(void (*kernel)(P...), dim3 grid, dim3 threads, size_t smem = 0,
                           cudaStream_t stream = nullptr) {
    return kernel_call<P...>{kernel, grid, threads, smem, stream};
}
}  // namespace emu

// ---------------------------------------------------------------- cuda/mma.cuh's interface
// (32-wide warps only: the PTX fragment layouts are per 32 lanes; HIP has no mma.sync)
#if TRAIN_GPT_EMU_WARP == 32

#define FA2_DEVICE inline
#define FA2_KERNEL(threads) void
#define FA2_SHARED_BYTES(name) unsigned char *name = emu::the_block().smem.data()

inline void block_barrier() { emu::wait_as(emu::AT_BLOCK, -1); }

inline void ldsm_common(uint32_t (&r)[4], const void *p, bool trans) {
    emu::check_shared(p, 16, 16);
    emu::publish().addr = (const unsigned char *)p;
    emu::warp_collective(trans ? emu::OP_LDSM_T : emu::OP_LDSM);
    int l = emu::the_block().current % 32;
    for (int i = 0; i < 4; i++) {
        uint16_t lo, hi;
        if (!trans) {
            const unsigned char *row = emu::peer(8 * i + l / 4).addr;
            lo = emu::element(row, 2 * (l % 4));
            hi = emu::element(row, 2 * (l % 4) + 1);
        } else {
            lo = emu::element(emu::peer(8 * i + 2 * (l % 4)).addr, l / 4);
            hi = emu::element(emu::peer(8 * i + 2 * (l % 4) + 1).addr, l / 4);
        }
        r[i] = (uint32_t)lo | (uint32_t)hi << 16;
    }
    emu::next_slot_set();
}
inline void ldsm_x4(uint32_t (&r)[4], const void *p) { ldsm_common(r, p, false); }
inline void ldsm_x4_t(uint32_t (&r)[4], const void *p) { ldsm_common(r, p, true); }

inline void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    emu::slot &s = emu::publish();
    for (int i = 0; i < 4; i++) s.w[i] = a[i];
    s.w[4] = b0;
    s.w[5] = b1;
    emu::warp_collective(emu::OP_MMA);
    int l = emu::the_block().current % 32, g = l / 4, t = l % 4;
    const emu::slot *warp = &emu::peer(0);  // lane i's slot is warp[i]
    for (int e = 0; e < 4; e++) {
        int row = g + 8 * (e >> 1), col = 2 * t + (e & 1);
        float sum = 0.0f;
        for (int k = 0; k < 16; k++) {
            // A[row][k]: lane (row%8)·4 + (k%8)/2, register row/8 + 2·(k/8), half k%2
            uint32_t aw = warp[(row % 8) * 4 + (k % 8) / 2].w[row / 8 + 2 * (k / 8)];
            // B[k][col]: lane col·4 + (k%8)/2, register k/8, half k%2
            uint32_t bw = warp[col * 4 + (k % 8) / 2].w[4 + k / 8];
            sum += emu::bf16_value(emu::half_of(aw, k % 2)) * emu::bf16_value(emu::half_of(bw, k % 2));
        }
        c[e] += sum;
    }
    emu::next_slot_set();
}

inline float lane_shfl_xor(float v, int mask) { return emu::shuffle_xor(v, mask); }

inline void cp_async_bytes(void *dst, const void *src, bool valid, int bytes) {
    emu::check_shared(dst, (size_t)bytes, (size_t)bytes);
    if (valid && (uintptr_t)src % (uintptr_t)bytes) emu::fail("misaligned cp.async source");
    emu::block &b = emu::the_block();
    b.lanes[b.current].open.push_back({(unsigned char *)dst, (const unsigned char *)src, bytes, valid});
}
inline void cp_async_16(void *dst, const void *src, bool valid) { cp_async_bytes(dst, src, valid, 16); }
inline void cp_async_4(void *dst, const void *src, bool valid) { cp_async_bytes(dst, src, valid, 4); }
inline void cp_async_commit() {
    emu::lane &me = emu::the_block().lanes[emu::the_block().current];
    me.groups.push_back(me.open);
    me.open.clear();
}
template <int N> inline void cp_async_wait() {
    emu::lane &me = emu::the_block().lanes[emu::the_block().current];
    while ((int)me.groups.size() > N) {
        for (const emu::pending_copy &c : me.groups.front()) {
            if (c.valid) memcpy(c.dst, c.src, (size_t)c.bytes);
            else memset(c.dst, 0, (size_t)c.bytes);
        }
        me.groups.pop_front();
    }
}

inline uint32_t pack_bf16x2(float lo, float hi) { return (uint32_t)emu::bf16_bits(lo) | (uint32_t)emu::bf16_bits(hi) << 16; }
#endif  // TRAIN_GPT_EMU_WARP == 32

// ---------------------------------------------------------------- cuda/mfma.cuh's interface
// (64-wide wavefronts only: CDNA's matrix instructions are per 64 lanes)
#if TRAIN_GPT_EMU_WARP == 64

#define MFMA_DEVICE inline
#define MFMA_KERNEL(threads) void
#define MFMA_SHARED_BYTES(name) unsigned char *name = emu::the_block().smem.data()

inline void block_barrier() { emu::wait_as(emu::AT_BLOCK, -1); }
inline float lane_shfl_xor(float v, int mask) { return emu::shuffle_xor(v, mask); }
inline uint32_t pack_bf16x2(float lo, float hi) { return (uint32_t)emu::bf16_bits(lo) | (uint32_t)emu::bf16_bits(hi) << 16; }

// v_mfma_f32_16x16x16bf16_1k as AMD's CDNA2/CDNA3 ISA guides lay it out over the 64 lanes of a
// wavefront (l = lane, r = l % 16, h = l / 16): A (16 × 16) element [r][4h + j] and B (16 × 16)
// element [4h + j][r] in lane l, j = 0..3, two per 32-bit register (the lower k in the lower
// half); C and D (16 × 16, fp32) element [4h + i][r] in c[i]. Products summed in fp32.
inline void mfma_16x16x16(float (&c)[4], const uint32_t (&a)[2], const uint32_t (&b)[2]) {
    emu::slot &s = emu::publish();
    s.w[0] = a[0];
    s.w[1] = a[1];
    s.w[2] = b[0];
    s.w[3] = b[1];
    emu::warp_collective(emu::OP_MFMA);
    int l = emu::the_block().current % 64, r = l % 16, h = l / 16;
    const emu::slot *wave = &emu::peer(0);  // lane i's slot is wave[i]
    for (int i = 0; i < 4; i++) {
        int row = 4 * h + i, col = r;
        float sum = 0.0f;
        for (int k = 0; k < 16; k++) {
            // A[row][k]: lane row + 16·(k/4), register (k%4)/2, half k%2
            uint32_t aw = wave[row + 16 * (k / 4)].w[(k % 4) / 2];
            // B[k][col]: lane col + 16·(k/4), register 2 + (k%4)/2, half k%2
            uint32_t bw = wave[col + 16 * (k / 4)].w[2 + (k % 4) / 2];
            sum += emu::bf16_value(emu::half_of(aw, k % 2)) * emu::bf16_value(emu::half_of(bw, k % 2));
        }
        c[i] += sum;
    }
    emu::next_slot_set();
}
#endif  // TRAIN_GPT_EMU_WARP == 64

#endif
