// test/reference_dump.c — runs the CPU backend on a small random problem and writes
// everything the PyTorch reference (test/torch_reference.py) needs to check it:
//
//   reference_dump CONFIG OUT_DIR [--key value]...
//
//   OUT_DIR/model.safetensors   the initial weights (what PyTorch builds its model from)
//   OUT_DIR/dump.safetensors    inputs, targets (3 batches, as F32), logits and loss of
//                               batch 0, the z-loss term, every gradient ("grad.NAME"),
//                               and for 3 training steps on batches 0..2 the loss, the
//                               pre-clip gradient norm, the lr, and all weights after each
//                               step ("step1.NAME" ...). Metadata "train_config" holds the
//                               config as key = value lines.
//
// Batches hold several documents per sequence (doc_token every 3–12 tokens) so that the
// document mask and the per-document RoPE positions are exercised.
#include "llmc/checkpoint.h"
#include "llmc/common.h"
#include "llmc/config.h"
#include "cpu/model.h"
#include "llmc/params.h"
#include "llmc/optim.h"
#include "llmc/rng.h"
#include "llmc/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define STEPS 3

static void make_batches(int32_t *tokens, int64_t count, int64_t vocab, int64_t doc_token, uint64_t seed) {
    rng_state r;
    rng_seed(&r, seed, 99);
    int64_t until_doc = 0;
    for (int64_t i = 0; i < count; i++) {
        if (doc_token >= 0 && until_doc-- <= 0) {
            tokens[i] = (int32_t)doc_token;
            until_doc = 3 + (int64_t)(rng_next(&r) % 10);
        } else {
            int32_t t;
            do t = (int32_t)(rng_next(&r) % (uint64_t)vocab);
            while (t == doc_token);
            tokens[i] = t;
        }
    }
}

int main(int argc, char **argv) {
    if (argc < 3) fail("usage: reference_dump CONFIG OUT_DIR [--key value]...");
    const char *out_dir = argv[2];
    train_config cfg;
    config_load(&cfg, argv[1], argc - 3, argv + 3);
    if (!make_dirs(out_dir)) fail("cannot create '%s'", out_dir);
    const model_config *mc = &cfg.model;
    int64_t B = cfg.batch_size, T = mc->seq_len, N = B * T, V = mc->vocab_size;
    param_table table;
    param_table_build(&table, mc);
    int64_t numel = table.numel;
    float *params = alloc_floats((size_t)numel), *grads = alloc_floats((size_t)numel);
    float *m = alloc_floats((size_t)numel), *v = alloc_floats((size_t)numel);
    param_init(&table, params, (uint64_t)cfg.seed);
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", out_dir);
    if (!save_weights(path, &table, params)) fail("cannot write '%s'", path);

    // Each batch b is a window of N+1 tokens: inputs [0,N), targets [1,N+1).
    int32_t *stream = xmalloc((size_t)(STEPS * (N + 1)) * sizeof *stream);
    make_batches(stream, STEPS * (N + 1), V, mc->doc_token, (uint64_t)cfg.seed);
    float *inputs = alloc_floats((size_t)(STEPS * N)), *targets = alloc_floats((size_t)(STEPS * N));
    int32_t *in32 = xmalloc((size_t)(STEPS * N) * sizeof *in32), *tg32 = xmalloc((size_t)(STEPS * N) * sizeof *tg32);
    for (int s = 0; s < STEPS; s++)
        for (int64_t i = 0; i < N; i++) {
            in32[s * N + i] = stream[s * (N + 1) + i];
            tg32[s * N + i] = stream[s * (N + 1) + i + 1];
            inputs[s * N + i] = (float)in32[s * N + i];
            targets[s * N + i] = (float)tg32[s * N + i];
        }

    cpu_model *model = cpu_model_create(&table, B, T);
    float *logits = alloc_floats((size_t)(N * V));
    cpu_forward_logits(model, params, in32, B, T, logits);
    float grad_scale = 1.0f / (float)N;
    loss_sums ls = cpu_forward_backward(model, params, grads, in32, tg32, B, T, grad_scale, (float)cfg.z_loss);
    float loss = (float)(ls.ce_sum / (double)N), z_term = (float)(cfg.z_loss * ls.lse_sq_sum / (double)N);
    float *first_grads = alloc_floats((size_t)numel);
    memcpy(first_grads, grads, (size_t)numel * sizeof(float));

    float step_loss[STEPS], step_norm[STEPS], step_lr[STEPS];
    float *after = alloc_floats((size_t)(STEPS * numel));
    int64_t adam_step = 0;
    for (int s = 0; s < STEPS; s++) {
        memset(grads, 0, (size_t)numel * sizeof(float));
        loss_sums l = cpu_forward_backward(model, params, grads, in32 + s * N, tg32 + s * N, B, T, grad_scale,
                                           (float)cfg.z_loss);
        double norm = grad_global_norm(grads, numel), lr = lr_at_step(&cfg, s);
        step_loss[s] = (float)(l.ce_sum / (double)N);
        step_norm[s] = (float)norm;
        step_lr[s] = (float)lr;
        optimizer_apply(&table, params, grads, m, v, &adam_step, norm, lr, &cfg);
        memcpy(after + s * numel, params, (size_t)numel * sizeof(float));
    }

    int max_tensors = 16 + table.count * (1 + STEPS);
    st_tensor_out *t = xcalloc((size_t)max_tensors, sizeof *t);
    char (*names)[160] = xcalloc((size_t)max_tensors, sizeof *names);
    int n = 0;
    t[n++] = (st_tensor_out){"inputs", inputs, 2, {STEPS, N}};
    t[n++] = (st_tensor_out){"targets", targets, 2, {STEPS, N}};
    t[n++] = (st_tensor_out){"logits", logits, 2, {N, V}};
    t[n++] = (st_tensor_out){"loss", &loss, 1, {1, 0}};
    t[n++] = (st_tensor_out){"z_term", &z_term, 1, {1, 0}};
    t[n++] = (st_tensor_out){"step_loss", step_loss, 1, {STEPS, 0}};
    t[n++] = (st_tensor_out){"step_norm", step_norm, 1, {STEPS, 0}};
    t[n++] = (st_tensor_out){"step_lr", step_lr, 1, {STEPS, 0}};
    for (int i = 0; i < table.count; i++) {
        const param_info *p = &table.params[i];
        snprintf(names[n], sizeof names[n], "grad.%s", p->name);
        t[n] = (st_tensor_out){names[n], first_grads + p->offset, p->ndim, {p->shape[0], p->shape[1]}};
        n++;
        for (int s = 0; s < STEPS; s++) {
            snprintf(names[n], sizeof names[n], "step%d.%s", s + 1, p->name);
            t[n] = (st_tensor_out){names[n], after + s * numel + p->offset, p->ndim, {p->shape[0], p->shape[1]}};
            n++;
        }
    }
    char *config_text = config_to_text(&cfg);
    const char *keys[] = {"train_config"};
    const char *values[] = {config_text};
    snprintf(path, sizeof path, "%s/dump.safetensors", out_dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    uint64_t hash;
    if (fd < 0 || !safetensors_write(fd, t, n, keys, values, 1, &hash) || close(fd) != 0)
        fail("cannot write '%s': %s", path, strerror(errno));
    printf("reference_dump: %s: loss %.6f, z_term %.3g, step norms %.4g %.4g %.4g\n", out_dir, loss, z_term,
           step_norm[0], step_norm[1], step_norm[2]);
    free(config_text);
    return 0;
}
