// test/nccl_emu.h — the NCCL calls of cuda/collective.cu over MPI, for the emulated GPU of the
// tests (test/warp_emu.h: device memory is host memory and every call completes before it
// returns). With it `mpirun -np 2 build/train_gpt_emu --device cuda` runs the GPU backend's FSDP
// path between CPU processes: the same unit gathering, all-to-all and rank-order sums the NCCL
// build runs on GPUs. Included (-include) into cuda/collective.cu's emulated object only.
//
// A call runs in its stream's order like a kernel: at once, or later on a deferred stream
// (TRAIN_GPT_EMU_DEFER, test/warp_emu.h), so a missing stream dependency around a collective
// shows. What it does not model: NCCL's failure modes (a dead peer makes MPI abort the job
// here, where NCCL would leave gpu_comm_wait to time out).
#ifndef TRAIN_GPT_NCCL_EMU_H
#define TRAIN_GPT_NCCL_EMU_H

#define OMPI_SKIP_MPICXX 1  // the C interface only
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <vector>

#define TRAIN_GPT_NCCL 1

// NCCL's types as cuda/collective.cu declares them; the emulator gives the opaque communicator
// its body.
#include "cuda/nccl_abi.h"
struct ncclComm {
    MPI_Comm mpi;
    int rank, size;
};

namespace nccl_emu {
struct p2p {
    bool send;
    void *buf;
    size_t count;
    ncclDataType_t type;
    int peer;
    ncclComm_t comm;
    cudaStream_t stream;
};
inline std::vector<p2p> &pending() {
    static std::vector<p2p> ops;
    return ops;
}
inline int &group_depth() {
    static int depth = 0;
    return depth;
}
inline MPI_Datatype mpi_type(ncclDataType_t t) {
    return t == ncclFloat64 ? MPI_DOUBLE : t == ncclBfloat16 ? MPI_UINT16_T : MPI_FLOAT;
}
inline size_t type_bytes(ncclDataType_t t) { return t == ncclFloat64 ? 8 : t == ncclBfloat16 ? 2 : 4; }
inline void run(const std::vector<p2p> &ops) {
    std::vector<MPI_Request> reqs(ops.size());
    for (size_t i = 0; i < ops.size(); i++) {
        const p2p &o = ops[i];
        if (o.send) MPI_Isend(o.buf, (int)o.count, mpi_type(o.type), o.peer, 77, o.comm->mpi, &reqs[i]);
        else MPI_Irecv(o.buf, (int)o.count, mpi_type(o.type), o.peer, 77, o.comm->mpi, &reqs[i]);
    }
    MPI_Waitall((int)reqs.size(), reqs.data(), MPI_STATUSES_IGNORE);
}
// A group's sends and receives run together, in their stream's order (test/warp_emu.h's
// deferred streams run them when the stream gets there).
inline void run_pending() {
    std::vector<p2p> ops;
    ops.swap(pending());
    if (ops.empty()) return;  // a world of one: only the copy to itself, outside the group
    emu::enqueue(ops[0].stream, [ops] { run(ops); });
}
}  // namespace nccl_emu

// The id names the communicator: the creating world rank and a count, which every rank turns
// into the same MPI_Comm_split color (every rank of the world makes its communicators in the
// same order, as the trainer does).
inline bool nccl_emu_mpi_up() {
    int up = 0;
    MPI_Initialized(&up);
    return up != 0;
}
inline ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    static int made = 0;
    int world = 0;
    if (nccl_emu_mpi_up()) MPI_Comm_rank(MPI_COMM_WORLD, &world);
    memset(id, 0, sizeof *id);
    int color = world * 4096 + ++made;
    memcpy(id->internal, &color, sizeof color);
    return ncclSuccess;
}
inline ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    int color = 0;
    memcpy(&color, id.internal, sizeof color);
    ncclComm *c = new ncclComm;
    if (nranks == 1 && rank == 0) {  // a world of one (TRAIN_GPT_FSDP_UNITS=1): no MPI needed
        *c = ncclComm{MPI_COMM_NULL, 0, 1};
        *comm = c;
        return ncclSuccess;
    }
    MPI_Comm_split(MPI_COMM_WORLD, color, rank, &c->mpi);
    MPI_Comm_rank(c->mpi, &c->rank);
    MPI_Comm_size(c->mpi, &c->size);
    if (c->size != nranks || c->rank != rank) return ncclInvalidUsage;
    *comm = c;
    return ncclSuccess;
}
inline ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (comm->mpi != MPI_COMM_NULL) MPI_Comm_free(&comm->mpi);
    delete comm;
    return ncclSuccess;
}
// NCCL_EMU_ASYNC_ERROR=1: every communicator reports a peer's loss asynchronously;
// NCCL_EMU_ABORT_HANGS=1: aborting one then never returns (as NCCL's abort may, when a peer died:
// test/test_fsdp_gpu_emu.sh: the trainer must still exit 75 within comm_timeout_s).
inline ncclResult_t ncclCommAbort(ncclComm_t) {
    while (getenv("NCCL_EMU_ABORT_HANGS")) pause();
    return ncclSuccess;
}
inline ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t *e) {
    return *e = getenv("NCCL_EMU_ASYNC_ERROR") ? ncclRemoteError : ncclSuccess, ncclSuccess;
}
inline ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t type, ncclComm_t comm,
                                  cudaStream_t stream) {
    // NCCL_EMU_REMOTE_ERROR=1: the gather answers as NCCL does when a peer or the network is
    // gone (test/test_fsdp_gpu_emu.sh: the trainer must exit 75, which requeues).
    if (getenv("NCCL_EMU_REMOTE_ERROR")) return ncclRemoteError;
    MPI_Datatype t = nccl_emu::mpi_type(type);
    size_t bytes = count * nccl_emu::type_bytes(type);
    emu::enqueue(stream, [=] {
        if (comm->size == 1) memmove(recv, send, bytes);
        else if (MPI_Allgather(send, (int)count, t, recv, (int)count, t, comm->mpi) != MPI_SUCCESS) {
            fprintf(stderr, "test/nccl_emu.h: MPI_Allgather failed\n");
            exit(1);
        }
    });
    return ncclSuccess;
}
inline ncclResult_t ncclSend(const void *buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                             cudaStream_t stream) {
    if (nccl_emu::group_depth() == 0) return ncclInvalidUsage;  // collective.cu always groups them
    nccl_emu::pending().push_back({true, const_cast<void *>(buf), count, type, peer, comm, stream});
    return ncclSuccess;
}
inline ncclResult_t ncclRecv(void *buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                             cudaStream_t stream) {
    if (nccl_emu::group_depth() == 0) return ncclInvalidUsage;
    nccl_emu::pending().push_back({false, buf, count, type, peer, comm, stream});
    return ncclSuccess;
}
inline ncclResult_t ncclGroupStart() {
    nccl_emu::group_depth()++;
    return ncclSuccess;
}
inline ncclResult_t ncclGroupEnd() {
    if (--nccl_emu::group_depth() == 0) nccl_emu::run_pending();
    return ncclSuccess;
}
inline const char *ncclGetErrorString(ncclResult_t r) {
    return r == ncclSuccess ? "no error" : "an error of the NCCL emulation (test/nccl_emu.h)";
}
inline ncclResult_t ncclGetVersion(int *v) { return *v = 22800, ncclSuccess; }

#endif
