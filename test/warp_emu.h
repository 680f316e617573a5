// test/warp_emu.h — runs a CUDA block's threads on the CPU, so that kernels written against
// cuda/mma.cuh's instructions (cuda/attention_fa2.cuh) can be tested by `make test` without
// a GPU. It checks what a kernel assumes about the instructions; whether the GPU does what
// the PTX ISA says is left to `make test-gpu` on a GPU.
//
// A block's threads are lanes with their own stacks (ucontext), run one at a time by a
// scheduler: each runs until it reaches a collective (a warp instruction, __syncwarp,
// __syncthreads) and waits there; when all 32 lanes of a warp wait at the same warp
// instruction they are released together, and likewise all threads at a block barrier. The
// instructions are implemented from the PTX ISA's description:
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
// Single-threaded and deterministic; slow (fine for the tests' small shapes).
#ifndef TRAIN_GPT_TEST_WARP_EMU_H
#define TRAIN_GPT_TEST_WARP_EMU_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#include <deque>
#include <functional>
#include <vector>

namespace emu {

struct idx3 {
    unsigned x, y, z;
};

enum lane_status { RUNNING, AT_WARP, AT_BLOCK, DONE };
enum collective { OP_LDSM, OP_LDSM_T, OP_MMA, OP_SHFL };

struct pending_copy {
    unsigned char *dst;
    const unsigned char *src;
    int bytes;
    bool valid;
};

struct lane {
    ucontext_t ctx;
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
    float f;
};

struct block {
    int threads = 0;
    std::vector<lane> lanes;
    std::vector<std::vector<unsigned char>> stacks;
    std::vector<slot> slots[2];
    std::vector<unsigned char> smem;
    ucontext_t scheduler;
    int current = 0;
    std::function<void()> body;
};

inline block &the_block() {
    static block b;
    return b;
}
inline idx3 &block_index() {
    static idx3 i;
    return i;
}
inline idx3 &grid_dims() {
    static idx3 g;
    return g;
}
inline idx3 thread_index() { return idx3{(unsigned)the_block().current, 0, 0}; }

[[noreturn]] inline void fail(const char *what) {
    block &b = the_block();
    fprintf(stderr, "warp_emu: block (%u,%u,%u) thread %d: %s\n", block_index().x, block_index().y, block_index().z,
            b.current, what);
    exit(1);
}

// Back to the scheduler until released.
inline void wait_as(lane_status status, int op) {
    block &b = the_block();
    lane &me = b.lanes[b.current];
    me.status = status;
    me.op = op;
    swapcontext(&me.ctx, &b.scheduler);
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
    return b.slots[me.seq & 1][b.current / 32 * 32 + l];
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

inline void trampoline() {
    block &b = the_block();
    b.body();
    b.lanes[b.current].status = DONE;  // uc_link returns to the scheduler
}

// Runs `body` as every thread of one block: blockIdx = `index`, `threads` threads, `smem`
// bytes of dynamic shared memory (filled with a pattern: nothing may rely on zeros).
inline void run_block(idx3 index, int threads, size_t smem, const std::function<void()> &body) {
    block &b = the_block();
    const size_t stack_bytes = 256 << 10;
    b.threads = threads;
    b.body = body;
    b.lanes.assign(threads, lane());
    b.stacks.resize(threads);
    b.slots[0].assign(threads, slot());
    b.slots[1].assign(threads, slot());
    b.smem.assign(smem, 0xA5);
    block_index() = index;
    for (int i = 0; i < threads; i++) {
        lane &l = b.lanes[i];
        b.stacks[i].resize(stack_bytes);
        getcontext(&l.ctx);
        l.ctx.uc_stack.ss_sp = b.stacks[i].data();
        l.ctx.uc_stack.ss_size = stack_bytes;
        l.ctx.uc_link = &b.scheduler;
        makecontext(&l.ctx, trampoline, 0);
        l.status = RUNNING;
    }
    for (;;) {
        for (int i = 0; i < threads; i++) {
            if (b.lanes[i].status != RUNNING) continue;
            b.current = i;
            swapcontext(&b.scheduler, &b.lanes[i].ctx);
        }
        int done = 0, at_block = 0;
        bool released = false;
        for (int i = 0; i < threads; i++) done += b.lanes[i].status == DONE, at_block += b.lanes[i].status == AT_BLOCK;
        if (done == threads) break;
        for (int w = 0; w < threads / 32; w++) {
            int waiting = 0;
            for (int l = 0; l < 32; l++) waiting += b.lanes[w * 32 + l].status == AT_WARP;
            if (waiting == 0) continue;
            if (waiting < 32) {
                b.current = w * 32;
                fail("lanes of a warp wait at a warp instruction that others never reach");
            }
            for (int l = 1; l < 32; l++)
                if (b.lanes[w * 32 + l].op != b.lanes[w * 32].op) {
                    b.current = w * 32 + l;
                    fail("lanes of a warp at different warp instructions");
                }
            for (int l = 0; l < 32; l++) b.lanes[w * 32 + l].status = RUNNING;
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
inline void launch(idx3 grid, int threads, size_t smem, const std::function<void()> &body) {
    grid_dims() = grid;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) run_block(idx3{x, y, z}, threads, smem, body);
}

}  // namespace emu

// ---------------------------------------------------------------- cuda/mma.cuh's interface

#define threadIdx (emu::thread_index())
#define blockIdx (emu::block_index())
#define gridDim (emu::grid_dims())
#define FA2_DEVICE inline
#define FA2_KERNEL(threads) void
#define FA2_SHARED_BYTES(name) unsigned char *name = emu::the_block().smem.data()

inline void block_barrier() { emu::wait_as(emu::AT_BLOCK, -1); }

inline void ldsm_common(uint32_t (&r)[4], const void *p, bool trans) {
    emu::check_shared(p, 16, 16);
    emu::publish().addr = (const unsigned char *)p;
    emu::warp_collective(trans ? emu::OP_LDSM_T : emu::OP_LDSM);
    int l = (int)(threadIdx.x % 32);
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
    int l = (int)(threadIdx.x % 32), g = l / 4, t = l % 4;
    for (int e = 0; e < 4; e++) {
        int row = g + 8 * (e >> 1), col = 2 * t + (e & 1);
        float sum = 0.0f;
        for (int k = 0; k < 16; k++) {
            // A[row][k]: lane (row%8)·4 + (k%8)/2, register row/8 + 2·(k/8), half k%2
            uint32_t aw = emu::peer((row % 8) * 4 + (k % 8) / 2).w[row / 8 + 2 * (k / 8)];
            // B[k][col]: lane col·4 + (k%8)/2, register k/8, half k%2
            uint32_t bw = emu::peer(col * 4 + (k % 8) / 2).w[4 + k / 8];
            sum += emu::bf16_value(emu::half_of(aw, k % 2)) * emu::bf16_value(emu::half_of(bw, k % 2));
        }
        c[e] += sum;
    }
    emu::next_slot_set();
}

inline float lane_shfl_xor(float v, int mask) {
    emu::publish().f = v;
    emu::warp_collective(emu::OP_SHFL);
    float r = emu::peer((int)(threadIdx.x % 32) ^ mask).f;
    emu::next_slot_set();
    return r;
}

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

#endif
