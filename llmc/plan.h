// llmc/plan.h — what one rank of a job holds in memory: the per-rank plan that
// `train_gpt plan` prints for a world size and a GPU type, that a run prints next to what it
// measured (docs/fsdp.md "Memory per rank"), and the choice `recompute = auto` makes from it.
//
// A rank of an FSDP group of N ranks holds its pieces of every unit (llmc/shard.h): fp32
// weights, gradients and AdamW's two moments, 16 bytes per value of its ⌈unit/N⌉ pieces. On
// top, whole units while they are in use: the weights gathered for a layer's forward or
// backward (fp32 on the CPU, bf16 on a GPU), the next layer's on their way (fsdp_prefetch),
// every layer's from the forward to the backward when fsdp_reshard_after_forward = 0, and a
// unit's gradient (fp32) before and while it is reduce-scattered. The activations of a
// micro-batch do not shrink with N: the backend that runs them sizes them (cpu/model.c's plan,
// the CUDA model's sizing), split into what the layers keep for the backward (this depends on
// `recompute`) and a workspace that does not, and the caller passes both in. One rank (N = 1)
// is the one-process layout: the weights in place, no gathered units — except the GPU's bf16
// copy of the whole model, which the matmuls read.
//
// A DiLoCo replica (diloco.c) holds, per rank, its pieces of the outer state in host memory:
// θ, the outer momentum, Δ's buffer, the error-feedback residual (diloco_error_feedback with a
// quantized uplink), the state buffer for joins, the encoded payload and the transport's
// buffers. On the CPU backend that is the same memory as the rest; on a GPU it is the host's,
// not the device's.
//
// recompute = auto takes the first of plan_recompute_candidates() whose plan fits the
// budget: the least recomputation (compute) that fits.
#ifndef TRAIN_GPT_PLAN_H
#define TRAIN_GPT_PLAN_H

#include "llmc/config.h"
#include "llmc/params.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// The CUDA backend's FSDP buffers (train_gpt.cu's create): slots for whole units' bf16 weights
// with fsdp_reshard_after_forward (one of the largest unit, the others a layer's: two layers, a
// layer and the final unit, or the final unit and a tied head's at once), and for whole units'
// gradients (one of the largest unit, two of a layer's: the unit whose backward runs, the one
// being reduce-scattered, a tied embedding's from the head's backward to its own).
enum { PLAN_GPU_GATHER_SLOTS = 3, PLAN_GPU_GRAD_SLOTS = 3 };

typedef struct {
    int ranks;          // N: the ranks that shard one copy (fsdp_size)
    bool reshard;       // fsdp_reshard_after_forward
    bool prefetch;      // fsdp_prefetch
    bool gpu;           // gathered weights in bf16 (a GPU), else fp32 (the CPU backend)
    int copies;         // HSDP: dp_replicate (1 or 0: none)
} plan_split;

// A backend's activation memory for one micro-batch.
typedef struct {
    int64_t activations;   // kept for the backward: the layers' inputs, what each layer keeps, the recompute scratch
    int64_t workspace;     // the same in every mode: the backward's scratch, a chunk of logits, tables, buffers
} activation_plan;

// A DiLoCo replica's outer state on one rank (diloco.c, net/transport_*.c), bytes.
typedef struct {
    int64_t theta, momentum, delta;  // fp32 pieces: the outer weights, the outer momentum, Δ's buffer
    int64_t residual;                // fp32 pieces: error feedback (0 without it or with diloco_quant = none)
    int64_t join_state;              // θ and m as a joining replica receives them (tcp; during a join)
    int64_t payload;                 // the encoded outer gradient of the largest fragment, and the transport's copy
    int64_t mean;                    // the mean coming back (and the mpi transport's reducer buffers)
    int64_t total;
} diloco_memory;

typedef struct {
    int64_t weights, grads, optimizer;   // this rank's pieces: fp32 weights, gradients, AdamW's m and v
    int64_t gathered_weights;            // whole units' weights held at once, at the peak (a bound)
    int64_t gathered_grads;              // whole units' gradients and their reduce-scatter's buffers (a bound)
    int64_t activations, workspace;      // the backend's own figures (activation_plan)
    int64_t diloco;                      // the DiLoCo outer state (host memory: in total on the CPU only)
    int64_t total;                       // what the device holds: the CPU's memory, or the GPU's
    bool gpu;                            // plan_split's: total leaves the DiLoCo state out
} rank_memory;

// The plan for one rank of s.ranks; a: the backend's figures for one micro-batch; diloco_bytes:
// plan_diloco_memory's total (0 without DiLoCo), counted in total on the CPU backend only.
rank_memory plan_rank_memory(const param_table *t, plan_split s, activation_plan a, int64_t diloco_bytes);

// The DiLoCo outer state of one rank of a replica of `ranks` ranks, for cfg's diloco_* keys
// (all zero without DiLoCo). With diloco_transport = local (M replicas simulated in one
// process) the process's: θ, m and Δ once, M residuals and M payloads, the reducer's mean and
// downlink residual; its M replicas share it, and each replica's plan counts 1/M of it.
diloco_memory plan_diloco_memory(const train_config *cfg, const param_table *t, int ranks);
// The replicas that share this process's memory: M with diloco_transport = local, else 1. A run
// divides its budget by it, and plan does the same.
int plan_replicas_in_process(const train_config *cfg);

// diloco.c's state header (its counters and 8 recent rounds' records), before θ and m in a
// state transfer; diloco.c checks it equals its own STATE_HEADER_BYTES (the plan said 448).
#define PLAN_STATE_HEADER_BYTES 456

// The tcp transport's framing (docs/protocol.md, "A replica's side"; test_wire checks both
// against net/wire.h): around each segment, the 40-byte DATA head, the 24-byte frame header
// and the 32-byte tag; and one CONTRIBUTE frame per exchange on the way up.
#define PLAN_SEGMENT_FRAMING_BYTES 96
#define PLAN_CONTRIBUTE_FRAME_BYTES 128

// One replica's bytes per outer step (all its fragments' syncs together), each way.
typedef struct {
    int64_t payload_up, payload_down;   // the encoded outer gradient, the encoded mean
    int64_t framing;                    // DATA frames around the segments, each way
    int64_t contribute;                 // the CONTRIBUTE frames (up only)
    int64_t up, down;                   // payload + framing
    int64_t fragment_up, fragment_down; // the largest fragment's sync (streaming: diloco_fragments > 1)
} diloco_traffic;

// What one replica of `ranks` ranks sends and receives per outer step with cfg's codecs
// (all zero without DiLoCo).
diloco_traffic plan_diloco_traffic(const train_config *cfg, const param_table *t, int ranks);

// What one hub host carries per outer step (net/relay.c; docs/protocol.md "What the hub
// stores"). A replica of W ranks meets its groups at W relays per hub (port + rank), each
// reducing its rank's pieces on one thread; with K hubs (diloco_rendezvous = h1,h2,..) each
// relay reduces about 1/K of the segments.
#define PLAN_HUB_BYTES_PER_CORE_S 0.2e9   // contributions reduced per core-second, measured
                                          // (bench/diloco/hub_scale.sh, int8, one thread)
#define PLAN_HUB_WINDOW_SEGMENTS 16       // net/relay.c's WINDOW_SEGMENTS
#define PLAN_HUB_DOWN_BACKLOG_SEGMENTS 8  // net/relay.c's DOWN_BACKLOG_SEGMENTS
typedef struct {
    int hubs;            // K
    int relays;          // relay processes on each hub host: one per rank of a replica (W)
    int64_t in, out;     // bytes into and out of one hub host per outer step (all its relays)
    int64_t residual;    // the downlink residual held on one hub host (diloco_downlink_feedback)
    int64_t in_flight;   // contributions and means on their way on one hub host, at most
    double cpu_s;        // core-seconds per outer step on one hub host at PLAN_HUB_BYTES_PER_CORE_S
} hub_load;

// One hub host's load for cfg with replicas of `ranks` ranks (tcp; all zero otherwise).
hub_load plan_hub_load(const train_config *cfg, const param_table *t, int ranks);

// The hubs a tcp replica meets (diloco_rendezvous = h1:p1,h2:p2,...: K), 1 otherwise.
int plan_hubs(const train_config *cfg);
// The values all `ranks` ranks of a replica hold together: each rank's pieces, ⌈unit/N⌉ of
// every unit (what their states and residuals are made of).
int64_t plan_pieces(const param_table *t, int ranks);

// One line: "4.21 GiB = 1.02 weights + 1.02 grads + ... + 0.03 workspace".
void plan_describe(const rank_memory *m, char *out, size_t out_bytes);
// One line: "0.71 GiB = 0.14 θ + 0.14 momentum + ...".
void plan_describe_diloco(const diloco_memory *m, char *out, size_t out_bytes);

// The recompute settings recompute = auto chooses from, in the order of the compute they add,
// least first: none; selective (norms, QK-norm, RoPE, SwiGLU's activation: no matmul); full on
// every k-th layer for k = L .. 2 (⌈L/k⌉ ≥ 2 layers run their forward twice; each count once,
// at its largest k: one layer would save nothing, its scratch being a layer); full. Returns how
// many were written to out (at most cap).
int plan_recompute_candidates(int64_t n_layer, recompute_setting *out, int cap);
// "none", "selective", "full", "full on 1 layer in 3".
void plan_recompute_label(recompute_setting r, char *out, size_t out_bytes);

// The memory a rank's plan may use when memory_budget_mb = 0: on the CPU backend the smaller of
// the machine's physical memory and the cgroup's limit (SLURM's --mem), shared by the
// local_ranks ranks of the node, less PLAN_CPU_HEADROOM_BYTES each (the libraries, MPI's
// buffers, the data loader, the allocator's own); on a GPU its memory less GPU_MEMORY_HEADROOM_BYTES
// (llmc/device.h). what receives one line saying where the figure came from.
#define PLAN_CPU_HEADROOM_BYTES ((int64_t)1 << 30)
// The cgroup's memory limit for this process: the lowest memory.max (v2: the "0::PATH" line of
// proc_self_cgroup, under cgroup_root) or memory.limit_in_bytes (v1: the line whose controllers
// include memory, under cgroup_root/memory) from the process's own cgroup up to the root —
// SLURM puts a job step in a cgroup below the root, with --mem on the job's — or -1 when there
// is none ("max", absent). The run passes "/proc/self/cgroup" and "/sys/fs/cgroup"; tests a
// fake tree.
int64_t plan_cgroup_limit_bytes(const char *proc_self_cgroup, const char *cgroup_root);
int64_t plan_cpu_budget_bytes(int local_ranks, char *what, size_t what_bytes);

#ifdef __cplusplus
}
#endif

#endif
