// train.c — the training loop (see train.h).
#include "train.h"
#include "cpu/gemm.h"
#include "cpu/model.h"
#include "cuda/backend.h"
#include "dataloader.h"
#include "diloco.h"
#include "llmc/backend.h"
#include "llmc/checkpoint.h"
#include "llmc/common.h"
#include "llmc/device.h"
#include "llmc/fault.h"
#include "llmc/json.h"
#include "llmc/metrics.h"
#include "llmc/optim.h"
#include "llmc/params.h"
#include "net/transport.h"
#include "tok/sample.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

// The one piece of process-wide state the loop needs: which stop signal arrived.
static volatile sig_atomic_t stop_signal = 0;

static void on_stop_signal(int sig) {
    stop_signal = sig;
    // A second Ctrl-C should not wait for the checkpoint.
    if (sig == SIGINT) signal(SIGINT, SIG_DFL);
}

static void install_signal_handlers(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
}

typedef struct {
    train_config *cfg;
    param_table table;
    float *params, *exp_avg, *exp_avg_sq;  // the host's copy: checkpoints and DiLoCo
    device_kind device;
    backend *be;                           // does the math, on the CPU or the GPU
    dataloader *train, *val;
    int32_t *inputs, *targets;
    train_state state;
    metrics_log *log;
    sampler *sampler;
    double flops_per_token;
    int threads;
    int rank, world;     // the data split: DiLoCo replica id and replica count, or 0 and 1
    diloco *outer;       // NULL without DiLoCo
    double peak_tflops;  // for MFU; 0 = unknown (mfu logged as null)
} trainer;

static int setup_threads(const train_config *cfg) {
    int threads = 1;
#ifdef _OPENMP
    if (cfg->threads > 0) omp_set_num_threads((int)cfg->threads);
    threads = omp_get_max_threads();
#endif
    gemm_set_threads(threads);
    return threads;
}

// device = auto | cpu | cuda, decided once (llmc/device.h), and the peak that MFU is against.
static device_kind select_device(trainer *tr) {
    const train_config *cfg = tr->cfg;
    char why[600];
    device_kind kind = device_choose(cfg->device, why, sizeof why);
    if (kind == DEVICE_ERROR) fail("device: %s", why);
    if (kind == DEVICE_CUDA || strcmp(cfg->device, "auto") == 0) note("%s", why);
    tr->peak_tflops = device_mfu_peak(kind, cfg->peak_tflops, why, sizeof why);
    if (why[0]) warn("%s", why);
    return kind;
}

// doc_token = -1 means "whatever the train shards were written with".
static void resolve_doc_token(train_config *cfg, const dataloader *train) {
    model_config *m = &cfg->model;
    uint32_t shard_vocab = dataloader_vocab_size(train);
    if ((int64_t)shard_vocab > m->vocab_size)
        fail("vocab_size: the train shards hold token ids up to %u, above vocab_size %lld", shard_vocab - 1,
             (long long)m->vocab_size);
    if (m->doc_token >= 0) return;
    uint32_t from_shards = dataloader_doc_token(train);
    if (from_shards == SHARD_NO_DOC_TOKEN) {
        if (m->doc_masking)
            fail("doc_token: not set, and the train shards were written without one; set doc_token or "
                 "doc_masking = 0");
        m->doc_token = -1;
        return;
    }
    if ((int64_t)from_shards >= m->vocab_size)
        fail("doc_token: the shards' doc_token %u is not below vocab_size %lld", from_shards, (long long)m->vocab_size);
    m->doc_token = from_shards;
}

// Model shape, size, FLOPs and the memory plan: the start-up banner and `train_gpt plan`.
static void print_model_summary(const param_table *t, const train_config *cfg, int world) {
    const model_config *m = &cfg->model;
    int64_t tokens_per_step = cfg->batch_size * m->seq_len * cfg->grad_accum * world;
    double state_gib = (double)t->numel * 16 / 1073741824.0;
    double act_gib = (double)cpu_model_plan_bytes(t, cfg->batch_size, m->seq_len) / 1073741824.0;
    printf("train_gpt | model: %lld layers, d_model %lld, %lld/%lld heads of %lld, d_ff %lld, vocab %lld, seq %lld\n",
           (long long)m->n_layer, (long long)m->d_model, (long long)m->n_head, (long long)m->n_kv_head,
           (long long)m->head_dim, (long long)m->d_ff, (long long)m->vocab_size, (long long)m->seq_len);
    char all[32], matmul[32];
    printf("train_gpt | parameters: %s (%s in matmuls, LM head counted once); %.3f GFLOP/token "
           "(6N + 12·L·Hq·D·T)\n",
           format_count((double)t->numel, all, sizeof all), format_count((double)model_matmul_params(t), matmul,
           sizeof matmul), model_flops_per_token(t) / 1e9);
    printf("train_gpt | cpu memory: %.2f GiB weights+grads+AdamW (16 B/param) + %.2f GiB activations = %.2f GiB\n",
           state_gib, act_gib, state_gib + act_gib);
    if (device_has_cuda_backend())
        printf("train_gpt | gpu memory: %.2f GiB (fp32 weights, grads and AdamW + bf16 weights + activations, one "
               "device)\n",
               (double)cuda_model_plan_bytes(t, cfg->batch_size, m->seq_len) / 1073741824.0);
    char run_tokens[32];
    printf("train_gpt | batch: %lld x %lld tokens x %lld accum x %d process(es) = %lld tokens/step; %lld steps = "
           "%s tokens\n",
           (long long)cfg->batch_size, (long long)m->seq_len, (long long)cfg->grad_accum, world,
           (long long)tokens_per_step, (long long)cfg->max_steps,
           format_count((double)tokens_per_step * (double)cfg->max_steps, run_tokens, sizeof run_tokens));
}

static void print_banner(const trainer *tr) {
    print_model_summary(&tr->table, tr->cfg, tr->world);
    printf("train_gpt | data: %llu train tokens (%lld micro-batches per epoch per process)%s\n",
           (unsigned long long)dataloader_total_tokens(tr->train), (long long)dataloader_batches_per_epoch(tr->train),
           tr->val ? "" : ", no validation set");
    printf("train_gpt | cpu: %d threads, %s\n", tr->threads, gemm_backend_name());
    if (backend_device_bytes(tr->be) > 0) {
        const gpu_info *g = device_gpu_info();
        printf("train_gpt | gpu: %s (sm_%d%d, %.1f GiB), model %.2f GiB on the GPU, MFU against %.1f TFLOP/s%s\n",
               g->name, g->cc_major, g->cc_minor, (double)g->memory_bytes / 1073741824.0,
               (double)backend_device_bytes(tr->be) / 1073741824.0, tr->peak_tflops,
               tr->peak_tflops > 0 ? "" : " (unknown: mfu is logged as null)");
    }
    const train_config *cfg = tr->cfg;
    if (tr->outer)
        printf("train_gpt | diloco: replica %d of %d, %lld inner steps per outer step, outer lr %g, momentum %g, %s "
               "transport, %s outer gradients%s\n",
               tr->rank, tr->world, (long long)cfg->diloco_inner_steps, cfg->diloco_outer_lr,
               cfg->diloco_outer_momentum, cfg->diloco_transport, cfg->diloco_quant,
               cfg->diloco_error_feedback ? " with error feedback" : "");
    fflush(stdout);
}

int train_plan(train_config *cfg) {
    param_table t;
    param_table_build(&t, &cfg->model);
    print_model_summary(&t, cfg, 1);
    if (cfg->peak_tflops > 0) {
        double tokens = (double)(cfg->batch_size * cfg->model.seq_len * cfg->grad_accum) * (double)cfg->max_steps;
        double seconds_at_40 = tokens * model_flops_per_token(&t) / (0.4 * cfg->peak_tflops * 1e12);
        char d[32];
        printf("train_gpt | at 40%% MFU of %.0f TFLOP/s: %.0f tokens/s, the run takes %s on one device\n",
               cfg->peak_tflops, 0.4 * cfg->peak_tflops * 1e12 / model_flops_per_token(&t),
               format_duration(seconds_at_40, d, sizeof d));
    }
    param_table_free(&t);
    return 0;
}

static void allocate(trainer *tr) {
    train_config *cfg = tr->cfg;
    param_table_build(&tr->table, &cfg->model);
    size_t n = (size_t)tr->table.numel;
    tr->params = alloc_floats(n);
    tr->exp_avg = alloc_floats(n);
    tr->exp_avg_sq = alloc_floats(n);
    // The one place that knows which backend runs: the CPU's works on the host buffers, the
    // GPU's on its own copy.
    int64_t B = cfg->batch_size, T = cfg->model.seq_len;
    tr->be = tr->device == DEVICE_CUDA
                 ? cuda_backend_create(&tr->table, B, T)
                 : cpu_backend_create(&tr->table, B, T, tr->params, tr->exp_avg, tr->exp_avg_sq);
    size_t tokens = (size_t)(cfg->batch_size * cfg->model.seq_len);
    tr->inputs = xmalloc(tokens * sizeof *tr->inputs);
    tr->targets = xmalloc(tokens * sizeof *tr->targets);
    tr->flops_per_token = model_flops_per_token(&tr->table);
}

static model_buffers buffers_of(trainer *tr) {
    model_buffers b = {&tr->table, tr->params, tr->exp_avg, tr->exp_avg_sq, NULL, NULL, NULL};
    if (tr->outer) diloco_attach_buffers(tr->outer, &b);
    return b;
}

// Fresh init, init_from, or a checkpoint, as `resume` and `init_from` say. Returns whether
// a checkpoint was loaded.
static bool restore_or_init(trainer *tr) {
    train_config *cfg = tr->cfg;
    model_buffers b = buffers_of(tr);
    memset(&tr->state, 0, sizeof tr->state);
    char *from = NULL;
    if (strcmp(cfg->resume, "auto") == 0) {
        from = checkpoint_load_latest(cfg->out_dir, &b, &tr->state);
    } else if (strcmp(cfg->resume, "never") != 0) {
        char why[512];
        if (!checkpoint_load(cfg->resume, &b, &tr->state, why, sizeof why))
            fail("resume: checkpoint '%s' cannot be used: %s", cfg->resume, why);
        from = xstrdup(cfg->resume);
    }
    if (from) {
        note("resuming from '%s' at step %lld", from, (long long)tr->state.step);
        dataloader_seek(tr->train, tr->state.data);
        strbuf extra = {0};
        sb_append(&extra, "\"checkpoint\":");
        sb_json_string(&extra, from);
        metrics_event(tr->log, "resume", tr->state.step, extra.data);
        sb_free(&extra);
        free(from);
        return true;
    }
    // Starting over in a directory that holds another run's checkpoints would mix the two
    // runs and let ckpt_keep prune the old run's files.
    if (strcmp(cfg->resume, "never") == 0 && checkpoint_count(cfg->out_dir) > 0)
        fail("resume = never, but out_dir '%s' already holds checkpoints of another run; choose a new out_dir or "
             "move them",
             cfg->out_dir);
    if (cfg->init_from[0]) {
        char why[512];
        if (!load_weights(cfg->init_from, &tr->table, tr->params, why, sizeof why))
            fail("init_from: '%s': %s", cfg->init_from, why);
        note("initialized from '%s'", cfg->init_from);
    } else {
        param_init(&tr->table, tr->params, (uint64_t)cfg->seed);
    }
    metrics_event(tr->log, "start", 0, "");
    return false;
}

static double validate(trainer *tr) {
    const train_config *cfg = tr->cfg;
    int64_t B = cfg->batch_size, T = cfg->model.seq_len;
    int64_t batches = min_i64(cfg->val_steps, dataloader_batches_per_epoch(tr->val));
    dataloader_rewind(tr->val);
    double ce = 0.0;
    int64_t rows = 0;
    for (int64_t i = 0; i < batches; i++) {
        dataloader_next(tr->val, tr->inputs, tr->targets);
        loss_sums s = backend_forward_loss(tr->be, tr->inputs, tr->targets, B, T);
        ce += s.ce_sum;
        rows += s.rows;
    }
    double loss = ce / (double)rows;
    metrics_val(tr->log, tr->state.step, loss, rows);
    printf("step %6lld | val_loss %.4f (%lld tokens)\n", (long long)tr->state.step, loss, (long long)rows);
    fflush(stdout);
    return loss;
}

static bool save_checkpoint(trainer *tr) {
    model_buffers b = buffers_of(tr);
    double t0 = wall_seconds();
    backend_download(tr->be, tr->params, tr->exp_avg, tr->exp_avg_sq);
    if (!checkpoint_save(tr->cfg->out_dir, &b, &tr->state, tr->cfg)) return false;
    checkpoint_prune(tr->cfg->out_dir, tr->cfg->ckpt_keep);
    char extra[64];
    snprintf(extra, sizeof extra, "\"seconds\":%.3f", wall_seconds() - t0);
    metrics_event(tr->log, "checkpoint", tr->state.step, extra);
    note("checkpoint step_%08lld written in %.2f s", (long long)tr->state.step, wall_seconds() - t0);
    return true;
}

static bool due(int64_t step, int64_t every, int64_t last) { return step == last || (every > 0 && step % every == 0); }

// The outlier guard's bookkeeping: count NaN/Inf steps in a row and stop the run at
// max_bad_steps.
static void count_bad_step(trainer *tr, const step_metrics *m, int64_t s) {
    const train_config *cfg = tr->cfg;
    tr->state.bad_steps++;
    warn("step %lld: loss %g, gradient norm %g: update skipped (%lld in a row, max_bad_steps %lld)",
         (long long)s + 1, m->loss, m->grad_norm, (long long)tr->state.bad_steps, (long long)cfg->max_bad_steps);
    if (tr->state.bad_steps >= cfg->max_bad_steps)
        fail("stopping: %lld steps in a row had a NaN/Inf loss or gradient norm (last at step %lld); the "
             "checkpoints in '%s' hold only finite weights",
             (long long)tr->state.bad_steps, (long long)s + 1, cfg->out_dir);
}

// One optimizer step: grad_accum micro-batches of data through the backend's forward and
// backward, then its step (norm, guard, clip, AdamW); returns the step's metrics.
static step_metrics train_step(trainer *tr) {
    const train_config *cfg = tr->cfg;
    int64_t B = cfg->batch_size, T = cfg->model.seq_len, s = tr->state.step;
    int64_t step_tokens = B * T * cfg->grad_accum;
    double t0 = wall_seconds();
    float grad_scale = 1.0f / (float)step_tokens;
    for (int64_t a = 0; a < cfg->grad_accum; a++) {
        dataloader_next(tr->train, tr->inputs, tr->targets);
        backend_forward_backward(tr->be, tr->inputs, tr->targets, B, T, grad_scale, (float)cfg->z_loss);
    }
    if (fault_requested("nan_grad", s)) backend_poison_grad(tr->be);
    step_metrics m = {0};
    m.lr = lr_at_step(cfg, s);
    step_result r = backend_step(tr->be, m.lr, step_tokens, cfg);
    m.loss = r.loss;
    m.z_loss = r.z_loss;
    m.grad_norm = r.grad_norm;
    m.skipped = r.skipped;
    tr->state.adam_step = r.adam_step;
    if (m.skipped) count_bad_step(tr, &m, s);
    else tr->state.bad_steps = 0;

    // tok/s and MFU are per process (per device); tokens_seen counts every process's tokens.
    tr->state.step++;
    tr->state.tokens_seen += step_tokens * tr->world;
    tr->state.data = dataloader_position(tr->train);
    double dt = wall_seconds() - t0;
    m.step = tr->state.step;
    m.step_ms = dt * 1e3;
    m.tok_per_s = (double)step_tokens / dt;
    m.mfu = tr->peak_tflops > 0 ? tr->flops_per_token * m.tok_per_s / (tr->peak_tflops * 1e12) : NAN;
    m.tokens = tr->state.tokens_seen;
    return m;
}

static void print_progress(const trainer *tr, const step_metrics *m, double mean_step_s) {
    char eta[32], mfu[32] = "";
    format_duration(mean_step_s * (double)(tr->cfg->max_steps - m->step), eta, sizeof eta);
    if (isfinite(m->mfu)) snprintf(mfu, sizeof mfu, " | MFU %.1f%%", 100.0 * m->mfu);
    printf("step %6lld/%lld | loss %.4f | lr %.2e | norm %.3f | %.0f tok/s%s | %.0f ms | ETA %s%s\n",
           (long long)m->step, (long long)tr->cfg->max_steps, m->loss, m->lr, m->grad_norm, m->tok_per_s, mfu,
           m->step_ms, eta, m->skipped ? " | SKIPPED" : "");
    fflush(stdout);
}

// The data split: with DiLoCo each replica reads its own 1/M of the data.
static void choose_data_split(trainer *tr) {
    train_config *cfg = tr->cfg;
    tr->rank = 0;
    tr->world = 1;
    if (cfg->diloco_replicas <= 0) return;
    if (cfg->diloco_replica_id < 0) cfg->diloco_replica_id = transport_mpi_world_rank();
    tr->rank = (int)cfg->diloco_replica_id;
    tr->world = (int)cfg->diloco_replicas;
}

// Checkpoint, then say where the run stands.
static void checkpoint_now(trainer *tr, bool must_succeed) {
    if (!save_checkpoint(tr) && must_succeed)
        fail("the checkpoint at step %lld could not be written (see above); the run stops with an error so that "
             "the job is not counted as finished",
             (long long)tr->state.step);
}

int train_run(train_config *cfg) {
    trainer tr;
    memset(&tr, 0, sizeof tr);
    tr.cfg = cfg;
    config_check_files(cfg);
    tr.device = select_device(&tr);
    tr.threads = setup_threads(cfg);
    choose_data_split(&tr);
    tr.train = dataloader_open(cfg->train_data, "train_data", cfg->batch_size, cfg->model.seq_len, cfg->shuffle,
                               (uint64_t)cfg->seed, tr.rank, tr.world);
    resolve_doc_token(cfg, tr.train);
    // Every replica validates on the whole validation set, so their val_loss compare.
    if (cfg->val_data[0])
        tr.val = dataloader_open(cfg->val_data, "val_data", cfg->batch_size, cfg->model.seq_len, false, 0, 0, 1);
    tr.log = metrics_open(cfg->out_dir);
    allocate(&tr);
    tr.outer = diloco_open(cfg, &tr.table, tr.log);
    if (cfg->sample_every > 0) tr.sampler = sampler_create(cfg, &tr.table);
    bool resumed = restore_or_init(&tr);
    print_banner(&tr);
    install_signal_handlers();
    if (tr.outer) diloco_join(tr.outer, tr.params, &tr.state, tr.train, !resumed);
    backend_upload(tr.be, tr.params, tr.exp_avg, tr.exp_avg_sq, tr.state.adam_step);

    double step_time_sum = 0.0;
    int64_t timed_steps = 0;
    int64_t first_step = tr.state.step;
    while (tr.state.step < cfg->max_steps) {
        step_metrics m = train_step(&tr);
        metrics_step(tr.log, &m);
        if (m.step > 1 || cfg->max_steps == 1) {  // the first step includes warm-up costs
            step_time_sum += m.step_ms / 1e3;
            timed_steps++;
        }
        double mean_step_s = timed_steps ? step_time_sum / (double)timed_steps : m.step_ms / 1e3;
        if (due(m.step, cfg->log_every, cfg->max_steps) || m.skipped) print_progress(&tr, &m, mean_step_s);
        // The outer step comes first, so that validation, samples and checkpoints at an outer
        // boundary see the global weights. A replica that had to rejoin may jump to the
        // group's step here.
        if (tr.outer && diloco_outer_step_due(tr.outer, m.step, cfg->max_steps)) {
            backend_download(tr.be, tr.params, NULL, NULL);
            diloco_outer_step(tr.outer, tr.params, &tr.state, tr.train);
            backend_upload_params(tr.be, tr.params);
        }
        int64_t step = tr.state.step;
        if (tr.val && due(step, cfg->val_every, cfg->max_steps)) validate(&tr);
        if (tr.sampler && due(step, cfg->sample_every, cfg->max_steps))
            sampler_run(tr.sampler, tr.be, step, tr.log);
        bool stop_here = stop_signal || step == cfg->stop_at_step;
        if (tr.outer) stop_here = diloco_agree_stop(tr.outer, stop_here);
        if (due(step, cfg->ckpt_every, cfg->max_steps) || stop_here)
            checkpoint_now(&tr, stop_here || step == cfg->max_steps);
        if (stop_here) {
            if (stop_signal)
                note("stopped by signal %d after step %lld; checkpoint written, run the same command to resume",
                     (int)stop_signal, (long long)step);
            else
                note("stopped after step %lld (%s); checkpoint written, run again to resume", (long long)step,
                     step == cfg->stop_at_step ? "stop_at_step" : "another replica was stopped");
            metrics_event(tr.log, "stop", step, stop_signal ? "\"reason\":\"signal\"" : "\"reason\":\"stop_at_step\"");
            break;
        }
    }
    if (tr.state.step == first_step)
        note("nothing to do: the run had already reached max_steps = %lld", (long long)cfg->max_steps);
    diloco_leave(tr.outer);
    diloco_close(tr.outer);
    sampler_free(tr.sampler);
    metrics_close(tr.log);
    backend_free(tr.be);
    dataloader_close(tr.train);
    dataloader_close(tr.val);
    free(tr.params);
    free(tr.exp_avg);
    free(tr.exp_avg_sq);
    free(tr.inputs);
    free(tr.targets);
    param_table_free(&tr.table);
    return 0;
}
