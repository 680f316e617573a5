// test/test_gpu_step.cu — the GPU model (train_gpt.cu's GPU section, which this test
// includes with -DTESTING, as llm.c's test_gpt2.cu does) against the CPU model, whole steps,
// on three small configurations that between them take every path: tied and untied head,
// QK-norm on and off, NoPE layers, document masking on and off, head_dim 32, 64 and 128,
// T not a multiple of the attention tile, a z-loss weight large enough for its gradient to
// show, the classifier over several chunks of rows. `make test-gpu` runs it on a machine with
// a GPU.
//
// Checks, each printed as PASS/FAIL with the measured numbers:
//   - upload → download is bit-exact (checkpoints written from the GPU hold what it trains);
//   - one step of two accumulated micro-batches: loss and z-loss within 1 % of the CPU's;
//     every parameter's gradient (by name, from the table) close to the CPU's in direction
//     (cosine) and in norm (a cosine alone would not see a wrong scale), per tensor class:
//     the GPU's gradients pass through bf16 tensors (2^-9 relative rounding, RMS ≈ 1.1e-3
//     per rounding) several times per layer on the way back; a relative L2 error ε gives a
//     cosine of about 1 − ε²/2.
//       matrices (projections, embedding, head): the sum over rows of bf16 products, whose
//       rounding errors are independent: ε measured ≤ 1.5 % (cosine 0.99989); checked at
//       cosine ≥ 0.999 (ε ≤ 4.5 %) and norm within 2 %.
//       norm gains (1-D): Σ over every row (and head) of dy·x·rstd, a small difference of
//       large sums, so the rounding errors of its terms do not shrink with it: ε measured
//       ≤ 2 % (cosine 0.99981, norm 0.6 % off); checked at cosine ≥ 0.998 (ε ≤ 6.3 %) and
//       norm within 3 %.
//     A wrong index, a missing factor or a dropped term gives ε of tens of percent;
//   - the optimizer step: the global norm within 1 %; the update direction (params after −
//     before) with cosine ≥ 0.95 to the CPU's (AdamW's first steps are nearly sign(g), so
//     elements whose tiny gradient changes sign under bf16 noise move the other way;
//     a wrong learning rate, decay or bias correction changes the cosine or the scale);
//   - 8 training steps on different batches: each step's loss within 2 % of the CPU's;
//   - the same 8 steps again from the same upload: bit-identical losses and weights;
//   - validation loss within 1 % (and the same bits twice); logits within 2 % (L2);
//   - a NaN gradient: the step is skipped, weights and AdamW's t unchanged;
//   - activation recomputation (selective, full, full on every 2nd layer): the loss sums and
//     every gradient of a two-micro-batch step bit-identical to recompute = none's (the same
//     deterministic kernels on the same inputs: attention's backward has no atomics, the
//     matmuls run the same cuBLASLt plan), and the model allocates less than none's (the
//     same for full recompute of one layer only, whose scratch is a layer: see check_recompute).
#define TESTING
// The trainer's static functions that this test leaves unused (train_run, train_plan, ...)
// are expected here. (CUDA's cuComplex.h, reached through cublasLt.h, used to silence the
// warning for the whole file; only cuda/matmul.cu includes it now.) GCC and clang both read it.
#pragma GCC diagnostic ignored "-Wunused-function"
#include "train_gpt.cu"
#include "llmc/optim.h"
#include "llmc/rng.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static const step_limits no_limits = {INFINITY, INFINITY};  // the spike guard off

// `make test` builds this file for the CPU emulator too (build/test_gpu_step_emu: TRAIN_GPT_EMULATION,
// test/warp_emu.h and test/cublaslt_emu.h), where a step of the first case takes seconds:
// there the first two cases train one sequence per micro-batch (the third two, as on a GPU:
// the model at B > 1) and the training run is 3 steps instead of 8. The shapes that matter
// (T, head_dim, layers, tiles) stay.
#if defined(TRAIN_GPT_EMULATION)
enum { EMULATED = 1 };
#else
enum { EMULATED = 0 };
#endif

static int checks = 0, failures = 0;

static void result(bool ok, const char *fmt, ...) PRINTF_LIKE(2, 3);
static void result(bool ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", ok ? "PASS" : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    checks++;
    if (!ok) failures++;
}

static double rel_diff(double a, double b) { return fabs(a - b) / fmax(fabs(b), 1e-30); }

static double cosine(const float *a, const float *b, int64_t n, double *norm_ratio) {
    double ab = 0, aa = 0, bb = 0;
    for (int64_t i = 0; i < n; i++) {
        ab += (double)a[i] * b[i];
        aa += (double)a[i] * a[i];
        bb += (double)b[i] * b[i];
    }
    if (norm_ratio) *norm_ratio = bb > 0 ? sqrt(aa / bb) : (aa > 0 ? INFINITY : 1.0);
    if (aa == 0 && bb == 0) return 1.0;
    return ab / sqrt(aa * bb + 1e-300);
}

typedef struct {
    const char *name;
    model_config m;
    int64_t B;
    double z_loss;               // 1e-4 as a trainer's; larger where its gradient term must show
    int64_t logits_chunk_bytes;  // the classifier's chunk (0: the trainer's, one chunk here)
} test_case;

static model_config base_config(void) {
    model_config m;
    memset(&m, 0, sizeof m);
    m.rope_theta = 10000.0;
    m.norm_eps = 1e-6;
    m.init_std = 0.02;
    return m;
}

static void random_batch(rng_state *r, const model_config *m, int64_t B, int32_t *inputs, int32_t *targets) {
    int64_t N = B * m->seq_len;
    for (int64_t i = 0; i <= N; i++) {
        int32_t t = (int32_t)(rng_next(r) % (uint64_t)m->vocab_size);
        if (m->doc_token >= 0 && rng_next(r) % 40 == 0) t = (int32_t)m->doc_token;
        if (i < N) inputs[i] = t;
        if (i > 0) targets[i - 1] = t;
    }
}

static train_config optimizer_config(void) {
    train_config c;
    memset(&c, 0, sizeof c);
    c.beta1 = 0.9, c.beta2 = 0.95, c.adam_eps = 1e-8, c.weight_decay = 0.1, c.grad_clip = 1.0, c.z_loss = 1e-4;
    return c;
}

// One step's loss sums and gradients (two micro-batches) with recompute r, on a fresh model.
static loss_sums recompute_step(const param_table *t, int64_t B, int64_t T, recompute_setting r, const float *p0,
                                const int32_t *in, const int32_t *tg, float *grads, int64_t *device_bytes) {
    int64_t N = B * T;
    cuda_model *gm = cuda_model_create(t, B, T, r);
    *device_bytes = cuda_model_device_bytes(gm);
    cuda_model_upload(gm, p0, NULL, NULL, 0);
    float scale = 1.0f / (float)(2 * N);
    cuda_forward_backward(gm, in, tg, B, T, scale, 1e-4f);
    cuda_forward_backward(gm, in + N, tg + N, B, T, scale, 1e-4f);
    loss_sums sums = cuda_step_loss_so_far(gm);
    cuda_model_download_grads(gm, grads);
    cuda_model_free(gm);
    return sums;
}

static void check_recompute(const param_table *t, int64_t B, int64_t T, const float *p0, const int32_t *in,
                            const int32_t *tg) {
    int64_t n = t->numel, none_bytes, bytes;
    float *g_none = alloc_floats((size_t)n), *g = alloc_floats((size_t)n);
    loss_sums base = recompute_step(t, B, T, RECOMPUTE_OFF, p0, in, tg, g_none, &none_bytes);
    const recompute_setting modes[3] = {{RECOMPUTE_SELECTIVE, 1}, {RECOMPUTE_FULL, 1}, {RECOMPUTE_FULL, 2}};
    const char *names[3] = {"selective", "full", "full every 2nd layer"};
    for (int i = 0; i < 3; i++) {
        loss_sums got = recompute_step(t, B, T, modes[i], p0, in, tg, g, &bytes);
        int64_t differ = 0;
        for (int64_t j = 0; j < n; j++) differ += memcmp(&g[j], &g_none[j], sizeof(float)) != 0;
        // Full recompute keeps one layer's activations as the scratch it recomputes into, so
        // it allocates less than none only from the second layer it recomputes (not with 2
        // layers at every 2nd: layer 0 alone); selective's scratch is smaller than a layer.
        int64_t recomputed = (t->cfg.n_layer + modes[i].every - 1) / modes[i].every;
        bool saves = modes[i].mode == RECOMPUTE_SELECTIVE || recomputed >= 2;
        result(differ == 0 && got.ce_sum == base.ce_sum && got.lse_sq_sum == base.lse_sq_sum &&
                   (saves ? bytes < none_bytes : bytes == none_bytes),
               "recompute %s: loss sums %s, %lld of %lld gradients differ from none's (want 0); %.2f MiB against "
               "none's %.2f MiB (want %s)",
               names[i], got.ce_sum == base.ce_sum && got.lse_sq_sum == base.lse_sq_sum ? "equal" : "DIFFER",
               (long long)differ, (long long)n, (double)bytes / 1048576.0, (double)none_bytes / 1048576.0,
               saves ? "less" : "the same: one layer recomputed");
    }
    free(g_none);
    free(g);
}

static void run_case(const test_case *tc) {
    printf("== %s: %lld layers, d_model %lld, %lld/%lld heads of %lld, vocab %lld, B %lld, T %lld, qk_norm %d, "
           "tied %d, doc_masking %d\n",
           tc->name, (long long)tc->m.n_layer, (long long)tc->m.d_model, (long long)tc->m.n_head,
           (long long)tc->m.n_kv_head, (long long)tc->m.head_dim, (long long)tc->m.vocab_size, (long long)tc->B,
           (long long)tc->m.seq_len, tc->m.qk_norm, tc->m.tie_embeddings, tc->m.doc_masking);
    param_table t;
    param_table_build(&t, &tc->m);
    int64_t n = t.numel, B = tc->B, T = tc->m.seq_len, N = B * T;
    train_config oc = optimizer_config();
    oc.z_loss = tc->z_loss;
    test_logits_chunk_bytes = tc->logits_chunk_bytes ? tc->logits_chunk_bytes : LOGITS_CHUNK_BYTES;
    const double lr = 1e-3;
    const float z = (float)oc.z_loss;
    float *p0 = alloc_floats((size_t)n), *p_cpu = alloc_floats((size_t)n), *g_cpu = alloc_floats((size_t)n),
          *m_cpu = alloc_floats((size_t)n), *v_cpu = alloc_floats((size_t)n), *g_gpu = alloc_floats((size_t)n),
          *p_gpu = alloc_floats((size_t)n), *m_gpu = alloc_floats((size_t)n), *v_gpu = alloc_floats((size_t)n);
    param_init(&t, p0, 42);
    int32_t *in = (int32_t *)xmalloc((size_t)(2 * N) * sizeof *in), *tg = (int32_t *)xmalloc((size_t)(2 * N) * sizeof *tg);
    rng_state r;
    rng_seed(&r, 7, 3);
    random_batch(&r, &tc->m, B, in, tg);
    random_batch(&r, &tc->m, B, in + N, tg + N);

    cpu_model *cm = cpu_model_create(&t, B, T);
    cuda_model *gm = cuda_model_create(&t, B, T, RECOMPUTE_OFF);
    char dev[64];
    format_count((double)cuda_model_device_bytes(gm), dev, sizeof dev);
    printf("   GPU memory: %sB; z_loss %g; the classifier in chunks of %lld rows (the last %lld)\n", dev, tc->z_loss,
           (long long)gm->chunk_rows, (long long)(N - (N - 1) / gm->chunk_rows * gm->chunk_rows));

    // Upload → download round trip.
    for (int64_t i = 0; i < n; i++) m_cpu[i] = p0[i] * 0.5f, v_cpu[i] = p0[i] * p0[i];
    cuda_model_upload(gm, p0, m_cpu, v_cpu, 0);
    cuda_model_download(gm, p_gpu, m_gpu, v_gpu);
    result(!memcmp(p_gpu, p0, (size_t)n * 4) && !memcmp(m_gpu, m_cpu, (size_t)n * 4) && !memcmp(v_gpu, v_cpu, (size_t)n * 4),
           "upload/download round trip is bit-exact (%lld params)", (long long)n);
    memset(m_cpu, 0, (size_t)n * 4);
    memset(v_cpu, 0, (size_t)n * 4);
    cuda_model_upload(gm, p0, NULL, NULL, 0);

    // One step's gradients: two micro-batches accumulated.
    float scale = 1.0f / (float)(2 * N);
    memcpy(p_cpu, p0, (size_t)n * 4);
    loss_sums a = cpu_forward_backward(cm, p_cpu, g_cpu, in, tg, B, T, scale, z);
    loss_sums b = cpu_forward_backward(cm, p_cpu, g_cpu, in + N, tg + N, B, T, scale, z);
    double cpu_loss = (a.ce_sum + b.ce_sum) / (double)(2 * N), cpu_z = z * (a.lse_sq_sum + b.lse_sq_sum) / (2.0 * N);
    cuda_forward_backward(gm, in, tg, B, T, scale, z);
    cuda_forward_backward(gm, in + N, tg + N, B, T, scale, z);
    loss_sums gs = cuda_step_loss_so_far(gm);
    double gpu_loss = gs.ce_sum / (double)(2 * N), gpu_z = z * gs.lse_sq_sum / (2.0 * N);
    result(rel_diff(gpu_loss, cpu_loss) <= 0.01, "loss: gpu %.6f cpu %.6f (rel %.2e, tol 1e-2)", gpu_loss, cpu_loss,
           rel_diff(gpu_loss, cpu_loss));
    result(rel_diff(gpu_z, cpu_z) <= 0.01, "z-loss term: gpu %.6e cpu %.6e (rel %.2e, tol 1e-2)", gpu_z, cpu_z,
           rel_diff(gpu_z, cpu_z));
    cuda_model_download_grads(gm, g_gpu);
    double worst_cos = 1.0;
    for (int i = 0; i < t.count; i++) {
        const param_info *p = &t.params[i];
        double ratio, c = cosine(g_gpu + p->offset, g_cpu + p->offset, p->numel, &ratio);
        worst_cos = fmin(worst_cos, c);
        double min_cos = p->ndim == 1 ? 0.998 : 0.999, max_ratio = p->ndim == 1 ? 0.03 : 0.02;
        result(c >= min_cos && fabs(ratio - 1.0) <= max_ratio,
               "grad %-44s cosine %.6f (tol %.3f)  norm ratio %.4f (tol %.0f%%)", p->name, c, min_cos, ratio,
               100 * max_ratio);
    }
    printf("   worst gradient cosine: %.6f\n", worst_cos);

    // The optimizer step.
    double cpu_norm = grad_global_norm(g_cpu, n);
    int64_t cpu_t = 0;
    optimizer_apply(&t, p_cpu, g_cpu, m_cpu, v_cpu, &cpu_t, cpu_norm, lr, &oc);
    cuda_step(gm, 1, lr, 2 * N, &oc, &no_limits);
    cuda_step_result sr;
    bool got = cuda_step_poll(gm, &sr, true);
    result(got && rel_diff(sr.grad_norm, cpu_norm) <= 0.01, "grad norm: gpu %.6f cpu %.6f (rel %.2e, tol 1e-2)",
           sr.grad_norm, cpu_norm, rel_diff(sr.grad_norm, cpu_norm));
    result(got && rel_diff(sr.loss, cpu_loss) <= 0.01 && sr.adam_step == 1 && !sr.skipped && sr.rows == 2 * N,
           "step result: loss %.6f, adam_step %lld, skipped %d, rows %lld, %.2f ms on the GPU", sr.loss,
           (long long)sr.adam_step, sr.skipped, (long long)sr.rows, sr.gpu_ms);
    cuda_model_download(gm, p_gpu, m_gpu, v_gpu);
    for (int64_t i = 0; i < n; i++) g_gpu[i] = p_gpu[i] - p0[i], g_cpu[i] = p_cpu[i] - p0[i];
    double ratio, c = cosine(g_gpu, g_cpu, n, &ratio);
    result(c >= 0.95 && fabs(ratio - 1.0) <= 0.05, "AdamW update: cosine %.4f (tol 0.95), norm ratio %.4f (tol 5%%)",
           c, ratio);
    cuda_model_download_grads(gm, g_gpu);
    bool zero = true;
    for (int64_t i = 0; i < n; i++) zero = zero && g_gpu[i] == 0.0f;
    result(zero, "gradients are zero after the step");

    // 8 training steps on fresh batches, both backends; then the GPU again for determinism.
    enum { MAX_STEPS = 8 };
    const int STEPS = EMULATED ? 3 : MAX_STEPS;
    double cpu_losses[MAX_STEPS], gpu_losses[2][MAX_STEPS];
    float *p_first = alloc_floats((size_t)n);
    for (int run = 0; run < 2; run++) {
        rng_seed(&r, 11, 5);
        cuda_model_upload(gm, p0, NULL, NULL, 0);
        if (run == 0) {
            memcpy(p_cpu, p0, (size_t)n * 4);
            memset(m_cpu, 0, (size_t)n * 4);
            memset(v_cpu, 0, (size_t)n * 4);
            cpu_t = 0;
        }
        for (int s = 0; s < STEPS; s++) {
            random_batch(&r, &tc->m, B, in, tg);
            if (run == 0) {
                memset(g_cpu, 0, (size_t)n * 4);
                loss_sums l = cpu_forward_backward(cm, p_cpu, g_cpu, in, tg, B, T, 1.0f / (float)N, z);
                cpu_losses[s] = l.ce_sum / (double)N;
                optimizer_apply(&t, p_cpu, g_cpu, m_cpu, v_cpu, &cpu_t, grad_global_norm(g_cpu, n), lr, &oc);
            }
            cuda_forward_backward(gm, in, tg, B, T, 1.0f / (float)N, z);
            cuda_step(gm, s + 1, lr, N, &oc, &no_limits);
            // Read back one step late, as the training loop does.
            if (s > 0 && cuda_step_poll(gm, &sr, true)) gpu_losses[run][sr.step - 1] = sr.loss;
        }
        while (cuda_step_poll(gm, &sr, true)) gpu_losses[run][sr.step - 1] = sr.loss;
        if (run == 0) cuda_model_download(gm, p_first, NULL, NULL);
    }
    double worst = 0;
    for (int s = 0; s < STEPS; s++) worst = fmax(worst, rel_diff(gpu_losses[0][s], cpu_losses[s]));
    result(worst <= 0.02, "%d steps: losses within %.2e of the CPU's (tol 2e-2); last gpu %.5f cpu %.5f", STEPS,
           worst, gpu_losses[0][STEPS - 1], cpu_losses[STEPS - 1]);
    cuda_model_download(gm, p_gpu, NULL, NULL);
    result(!memcmp(gpu_losses[0], gpu_losses[1], (size_t)STEPS * sizeof gpu_losses[0][0]) &&
               !memcmp(p_gpu, p_first, (size_t)n * 4),
           "%d steps twice from the same upload: bit-identical losses and weights", STEPS);

    // Validation and logits from the trained weights (the CPU gets the GPU's weights).
    random_batch(&r, &tc->m, B, in, tg);
    loss_sums cv = cpu_forward_loss(cm, p_gpu, in, tg, B, T);
    loss_sums gv = cuda_forward_loss(gm, in, tg, B, T), gv2 = cuda_forward_loss(gm, in, tg, B, T);
    result(rel_diff(gv.ce_sum, cv.ce_sum) <= 0.01 && gv.ce_sum == gv2.ce_sum,
           "validation loss: gpu %.6f cpu %.6f (rel %.2e, tol 1e-2), repeatable", gv.ce_sum / (double)N,
           cv.ce_sum / (double)N, rel_diff(gv.ce_sum, cv.ce_sum));
    float *lc = alloc_floats((size_t)(N * tc->m.vocab_size)), *lg = alloc_floats((size_t)(N * tc->m.vocab_size));
    cpu_forward_logits(cm, p_gpu, in, B, T, lc);
    cuda_forward_logits(gm, in, B, T, lg);
    double e2 = 0, w2 = 0;
    for (int64_t i = 0; i < N * tc->m.vocab_size; i++) {
        e2 += ((double)lg[i] - lc[i]) * ((double)lg[i] - lc[i]);
        w2 += (double)lc[i] * lc[i];
    }
    result(sqrt(e2 / w2) <= 0.02, "logits: relative L2 error %.3e (tol 2e-2)", sqrt(e2 / w2));
    float *last = alloc_floats((size_t)tc->m.vocab_size);
    cuda_forward_last_logits(gm, in, T, last);
    e2 = 0, w2 = 0;
    for (int64_t i = 0; i < tc->m.vocab_size; i++) {
        double d = (double)last[i] - lc[(T - 1) * tc->m.vocab_size + i];
        e2 += d * d;
        w2 += (double)lc[(T - 1) * tc->m.vocab_size + i] * lc[(T - 1) * tc->m.vocab_size + i];
    }
    result(sqrt(e2 / w2) <= 0.02, "last-position logits (sampling): relative L2 error %.3e (tol 2e-2)", sqrt(e2 / w2));

    // The outlier guard on the GPU.
    cuda_model_download(gm, p_first, NULL, NULL);
    cuda_forward_backward(gm, in, tg, B, T, 1.0f / (float)N, z);
    cuda_model_poison_grad(gm, NAN);
    cuda_step(gm, 99, lr, N, &oc, &no_limits);
    got = cuda_step_poll(gm, &sr, true);
    cuda_model_download(gm, p_gpu, NULL, NULL);
    result(got && sr.skipped && sr.adam_step == STEPS && !memcmp(p_gpu, p_first, (size_t)n * 4),
           "NaN gradient: step skipped (%d), adam_step stays %lld, weights unchanged", sr.skipped,
           (long long)sr.adam_step);

    free(lc), free(lg), free(last), free(p_first);
    cuda_model_free(gm);
    check_recompute(&t, B, T, p0, in, tg);
    cpu_model_free(cm);
    free(p0), free(p_cpu), free(g_cpu), free(m_cpu), free(v_cpu), free(g_gpu), free(p_gpu), free(m_gpu), free(v_gpu);
    free(in), free(tg);
    param_table_free(&t);
}

int main(void) {
    char why[1024];
    if (device_choose("cuda", gpu_probe(), why, sizeof why) != DEVICE_CUDA) {
        printf("FAIL test_gpu_step needs a GPU: %s\n", why);
        return 1;
    }
    printf("test_gpu_step: %s\n", why);
    test_case cases[3];
    cases[0].name = "tied, qk_norm, docs, D=32";
    cases[0].m = base_config();
    cases[0].m.vocab_size = 512, cases[0].m.n_layer = 4, cases[0].m.d_model = 128, cases[0].m.n_head = 4;
    cases[0].m.n_kv_head = 2, cases[0].m.head_dim = 32, cases[0].m.d_ff = 384, cases[0].m.seq_len = 128;
    cases[0].m.nope_every = 4, cases[0].m.qk_norm = true, cases[0].m.tie_embeddings = true;
    cases[0].m.doc_masking = true, cases[0].m.doc_token = 0, cases[0].B = EMULATED ? 1 : 4;
    cases[0].z_loss = 1e-4, cases[0].logits_chunk_bytes = 0;
    cases[1].name = "untied, no qk_norm, plain causal, D=64";
    cases[1].m = base_config();
    cases[1].m.vocab_size = 1000, cases[1].m.n_layer = 2, cases[1].m.d_model = 256, cases[1].m.n_head = 4;
    cases[1].m.n_kv_head = 4, cases[1].m.head_dim = 64, cases[1].m.d_ff = 512, cases[1].m.seq_len = 96;
    cases[1].m.nope_every = 2, cases[1].m.qk_norm = false, cases[1].m.tie_embeddings = false;
    cases[1].m.doc_masking = false, cases[1].m.doc_token = -1, cases[1].B = EMULATED ? 1 : 3;
    // z-loss's gradient term 2·z·lse·softmax is 1.4e-3 of softmax's at 1e-4 (lse ≈ ln 1000 ≈ 6.9
    // here), under the tolerances; at 0.05 it is 0.7 of it.
    cases[1].z_loss = 0.05, cases[1].logits_chunk_bytes = 0;
    cases[2].name = "untied, qk_norm, docs, D=128, T=200";
    cases[2].m = base_config();
    cases[2].m.vocab_size = 777, cases[2].m.n_layer = 2, cases[2].m.d_model = 256, cases[2].m.n_head = 2;
    cases[2].m.n_kv_head = 1, cases[2].m.head_dim = 128, cases[2].m.d_ff = 512, cases[2].m.seq_len = 200;
    cases[2].m.nope_every = 2, cases[2].m.qk_norm = true, cases[2].m.tie_embeddings = false;
    // Two sequences in the emulator too (their documents start at different places: random_batch
    // draws each), and the classifier over chunks of 39 rows (64 KiB at vocabulary 777, rows
    // padded to 832): 11 chunks, the last of 10.
    cases[2].m.doc_masking = true, cases[2].m.doc_token = 5, cases[2].B = 2;
    cases[2].z_loss = 1e-4, cases[2].logits_chunk_bytes = 1 << 16;
    for (int i = 0; i < 3; i++) run_case(&cases[i]);
    printf("test_gpu_step: %d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}
