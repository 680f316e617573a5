// llmc/fault.h — fault injection for the crash and outlier tests, off unless the environment
// asks for it: TRAIN_GPT_FAULT=KIND:STEP[,KIND:STEP...]. Kinds:
//   kill_in_checkpoint  SIGKILL the process halfway through writing that step's checkpoint
//   slow_ckpt_cleanup   a save of that step that failed: its writer (a job's rank 0) waits 2 s
//                       before it removes the unfinished directory (a big one on a slow file
//                       system); the other ranks must wait for it (test/test_ckpt_space.sh)
//   nan_grad            poison one gradient with NaN on that (0-based) step
//   nan_batch           poison one gradient with NaN in the step that takes the train
//                       loader's micro-batch STEP (counted over epochs from 0): bad data,
//                       which a rollback skips
//   kill_in_rollback    SIGKILL right after a rollback loaded the checkpoint of step STEP
//   grad_spike          set one gradient to 1e4 on that (0-based) step: a finite spike of
//                       the gradient norm (the spike guard must skip it)
//   grad_shift          from that (0-based) step on, every gradient 10 times larger (the loss
//                       as before): a lasting shift of the gradient norm, which the spike guard
//                       must accept after max_bad_steps − 1 skips
//   hang_in_step        stop making progress in that (0-based) step, forever (the watchdog
//                       must end the process)
//   stop_in_start       (STEP 0) SIGSTOP itself during start-up, after the allocation, until a
//                       SIGCONT (a signal that comes while a big model starts: test/test_slurm.sh)
//   stop_in_step        SIGSTOP itself in that (0-based) step, until a SIGCONT (a DiLoCo
//                       replica stopped mid-phase: test/test_diloco_late.sh)
//   half_speed          (STEP 0) every training step takes twice its time: the process sleeps
//                       as long as the step computed (a slower cluster: bench/diloco/speeds.sh)
//   diloco_nan_payload  DiLoCo: this replica sends a NaN in its outer gradient for outer
//                       step STEP+1 (the others must leave it out of the average)
//   diloco_hostile      DiLoCo (STEP 0): this replica sends 100 times its outer gradient in
//                       every round (the reducer's bound must hold it)
//   diloco_late_sender  DiLoCo (STEP 0): a donor's state-sending thread starts 1 s late (as if
//                       descheduled): a catch-up transfer must still be under way before the
//                       donor's next exchange (test/test_diloco_late.sh)
//   diloco_late         DiLoCo: this process waits diloco_timeout_s + 1 s before its exchange
//                       for outer step STEP+1, so the hub evicts it as late (one rank of a
//                       sharded replica: the whole replica must rejoin)
//   hsdp_skip_follow    an HSDP copy other than the first of a DiLoCo replica drops the
//                       weights the sync after step STEP sent it (the copies' check before
//                       the next checkpoint must stop the run: test/test_hsdp_diloco.sh)
//   tcp_slow_read, tcp_die_in_state, tcp_slow_state, tcp_slow_means, tcp_slow_upload,
//   tcp_die_in_upload, tcp_die_in_upload_after_full, tcp_lose_mean_after_full, tcp_trace, tcp_join_late,
//   tcp_caught_up_late, tcp_slow_resolve, tcp_slow_stream, tcp_blackhole, tcp_hold_state, tcp_foreign_chunk
//                       the tcp transport's own hooks for its tests (test/test_transport.c, test/*.sh; see
//                       net/transport_tcp.c and docs/protocol.md)
//   prepare_term_after_shard  `train_gpt prepare` sends itself SIGTERM once train shard STEP
//                       (0-based) is finished: a run stopped by a time limit (test/test_prepare.sh)
//   prepare_summary_enospc  (STEP 0) `train_gpt prepare`'s summary fails to write as on a full
//                       disk, after every shard is finished: nothing may be published (test_prepare)
//   prepare_publish_eio  `train_gpt prepare`'s rename of shard STEP (0-based, train's then val's;
//                       one past the last: the summary) to its final name fails with EIO: those
//                       renamed before must be taken back, and with --overwrite the earlier
//                       run's files put back (test_prepare)
//   prepare_aside_eio   `prepare --overwrite`'s rename of the earlier run's file STEP (0-based:
//                       train shards, val shards, summary) to NAME.replaced fails with EIO: those
//                       moved before must be put back (test_prepare)
//   shard_write_enospc  the shard writer (dataloader.h) of the STEP-th shard this process opens
//                       one for (0-based) meets a full disk at its first payload write, after
//                       half its bytes: NAME.tmp must go, NAME stay as it was (test_shards_upgrade)
//   shard_rename_eio    that writer's rename of NAME.tmp over NAME fails with EIO
//   metrics_enospc      lines STEP, STEP+1 and STEP+2 (0-based, this process's) of metrics.jsonl
//                       meet a full disk, the first after half its bytes: the file keeps whole
//                       lines only (test/test_tensorboard.sh)
//   tb_enospc           TensorBoard record STEP (0-based, this file's) meets a full disk after
//                       half its bytes: the file ends at its last whole record
//   stop_in_extra_step  SIGSTOP in the first extra inner step (diloco_sync_every_s) after step
//                       STEP (0-based: the phase's last), once (test/test_slurm.sh)
//   stop_before_rename  shards upgrade: SIGSTOP with writer STEP's new file fsynced, before the
//                       name is checked a last time and the file renamed (test_shards_upgrade)
//   relay_die_in_close  the relay (STEP = N): at the close of the first round with two or more
//                       contributors after N such rounds, ROUND to the lowest-id contributor
//                       only, then SIGKILL itself once that replica says DONE (net/relay.c)
// A real run never sets the variable; the cost when unset is one getenv per query.
#ifndef TRAIN_GPT_FAULT_H
#define TRAIN_GPT_FAULT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

// Whether TRAIN_GPT_FAULT holds kind:N with N = step, or with lasting, N ≤ step.
static inline bool fault_match(const char *kind, int64_t step, bool lasting) {
    const char *spec = getenv("TRAIN_GPT_FAULT");
    size_t n = strlen(kind);
    for (const char *p = spec; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL) {
        if (strncmp(p, kind, n) != 0 || p[n] != ':') continue;
        int64_t at = atoll(p + n + 1);
        if (at == step || (lasting && at <= step)) return true;
    }
    return false;
}

static inline bool fault_requested(const char *kind, int64_t step) { return fault_match(kind, step, false); }
// A fault that lasts from step N on (grad_shift).
static inline bool fault_from(const char *kind, int64_t step) { return fault_match(kind, step, true); }

#ifdef __cplusplus
}
#endif

#endif
