// llmc/checkpoint.c — atomic, checksummed checkpoints (format in llmc/checkpoint.h, docs/formats.md).
#include "llmc/checkpoint.h"
#include "llmc/checksum.h"
#include "llmc/common.h"
#include "llmc/fault.h"
#include "llmc/json.h"
#include "llmc/optim.h"
#include "llmc/safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define STATE_FORMAT "train_gpt-state"
#define STATE_VERSION 1
// The first three are in every checkpoint; outer.safetensors only in DiLoCo runs.
static const char *const CHECKPOINT_FILES[] = {"model.safetensors", "optimizer.safetensors", "state.json",
                                               "outer.safetensors"};
#define N_CHECKPOINT_FILES 4
#define N_REQUIRED_FILES 3
#define OUTER_FILE 3

// ---------------------------------------------------------------- helpers

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void remove_tree(const char *path) { nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS); }

static bool hash_file(const char *path, uint64_t *out) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    size_t chunk = 16 << 20;
    char *buf = xmalloc(chunk);
    xxh64_state h;
    xxh64_init(&h, 0);
    bool ok = true;
    while (true) {
        ssize_t n = read(fd, buf, chunk);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) ok = false;
        if (n <= 0) break;
        xxh64_update(&h, buf, (size_t)n);
    }
    free(buf);
    close(fd);
    *out = xxh64_digest(&h);
    return ok;
}

static void maybe_inject_fault(int64_t step) {
    if (fault_requested("kill_in_checkpoint", step)) {
        fflush(NULL);
        raise(SIGKILL);
    }
}

static int open_new_file(const char *dir, const char *name, char *path, size_t path_bytes) {
    snprintf(path, path_bytes, "%s/%s", dir, name);
    return open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
}

static bool finish_file(int fd, bool ok) {
    ok = ok && fsync(fd) == 0;
    int e = errno;
    ok = close(fd) == 0 && ok;
    if (!ok && errno == 0) errno = e;
    return ok;
}

static bool write_weights_fd(int fd, const param_table *t, const float *params, uint64_t *hash) {
    st_tensor_out *out = xcalloc((size_t)t->count, sizeof *out);
    for (int i = 0; i < t->count; i++) {
        const param_info *p = &t->params[i];
        out[i] = (st_tensor_out){p->name, params + p->offset, p->ndim, {p->shape[0], p->shape[1]}};
    }
    char *config_json = model_config_to_json(&t->cfg);
    const char *keys[] = {"format", "model_config", "written_by"};
    const char *values[] = {"pt", config_json, "train_gpt"};
    bool ok = safetensors_write(fd, out, t->count, keys, values, 3, hash);
    free(config_json);
    free(out);
    return ok;
}

static bool write_model_file(const char *dir, const model_buffers *b, uint64_t *hash) {
    char path[4200];
    int fd = open_new_file(dir, "model.safetensors", path, sizeof path);
    return fd >= 0 && finish_file(fd, write_weights_fd(fd, b->table, b->params, hash));
}

bool save_weights(const char *path, const param_table *t, const float *params) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    uint64_t hash;
    bool ok = fd >= 0 && finish_file(fd, write_weights_fd(fd, t, params, &hash)) && rename(tmp, path) == 0;
    if (!ok) unlink(tmp);
    return ok;
}

// Writes DIR/FILE holding, for every tensor of the table and each of `kinds` flat buffers,
// the tensor "<prefix><name>"; metadata: optimizer = what, count_key = count.
static bool write_table_file(const char *dir, const char *file, const param_table *t, int kinds,
                             const char *const *prefixes, float *const *buffers, const char *what,
                             const char *count_key, int64_t count, uint64_t *hash) {
    st_tensor_out *out = xcalloc((size_t)t->count * (size_t)kinds, sizeof *out);
    char (*names)[160] = xcalloc((size_t)t->count * (size_t)kinds, sizeof *names);
    int n = 0;
    for (int i = 0; i < t->count; i++)
        for (int k = 0; k < kinds; k++, n++) {
            const param_info *p = &t->params[i];
            snprintf(names[n], sizeof names[0], "%s%s", prefixes[k], p->name);
            out[n] = (st_tensor_out){names[n], buffers[k] + p->offset, p->ndim, {p->shape[0], p->shape[1]}};
        }
    char count_text[32];
    snprintf(count_text, sizeof count_text, "%lld", (long long)count);
    const char *keys[] = {"optimizer", count_key};
    const char *values[] = {what, count_text};
    char path[4200];
    int fd = open_new_file(dir, file, path, sizeof path);
    bool ok = fd >= 0 && finish_file(fd, safetensors_write(fd, out, n, keys, values, 2, hash));
    free(names);
    free(out);
    return ok;
}

static bool write_optimizer_file(const char *dir, const model_buffers *b, int64_t adam_step, uint64_t *hash) {
    const char *prefixes[] = {"exp_avg.", "exp_avg_sq."};
    float *buffers[] = {b->exp_avg, b->exp_avg_sq};
    return write_table_file(dir, "optimizer.safetensors", b->table, 2, prefixes, buffers, "AdamW", "adam_step",
                            adam_step, hash);
}

static bool write_outer_file(const char *dir, const model_buffers *b, int64_t outer_step, uint64_t *hash) {
    const char *prefixes[] = {"outer.theta.", "outer.momentum.", "outer.residual."};
    float *buffers[] = {b->outer_theta, b->outer_momentum, b->outer_residual};
    return write_table_file(dir, "outer.safetensors", b->table, b->outer_residual ? 3 : 2, prefixes, buffers,
                            "DiLoCo outer Nesterov SGD", "outer_step", outer_step, hash);
}

static bool write_text_file(const char *dir, const char *name, const char *text, uint64_t *hash) {
    char path[4200];
    int fd = open_new_file(dir, name, path, sizeof path);
    if (fd < 0) return false;
    if (hash) *hash = xxh64(text, strlen(text), 0);
    return finish_file(fd, write_exact(fd, text, strlen(text)));
}

// The spike guard's window (llmc/guard.h), absent in checkpoints without one: empty then.
static bool read_spike_window(const json_value *root, spike_window *w) {
    memset(w, 0, sizeof *w);
    const json_value *size = json_get(root, "spike_window"), *count = json_get(root, "spike_count");
    const json_value *loss = json_get(root, "spike_loss"), *norm = json_get(root, "spike_grad_norm");
    if (!size && !count && !loss && !norm) return true;
    if (!size || !count || !loss || !norm || size->type != JSON_NUMBER || !size->is_integer || size->integer < 1 ||
        size->integer > SPIKE_WINDOW_MAX || count->type != JSON_NUMBER || !count->is_integer || count->integer < 0 ||
        loss->type != JSON_ARRAY || norm->type != JSON_ARRAY)
        return false;
    int64_t n = count->integer < size->integer ? count->integer : size->integer;
    if ((int64_t)loss->count != n || (int64_t)norm->count != n) return false;
    for (int64_t i = 0; i < n; i++) {
        if (loss->items[i].type != JSON_NUMBER || norm->items[i].type != JSON_NUMBER) return false;
        w->loss[i] = loss->items[i].number;
        w->grad_norm[i] = norm->items[i].number;
    }
    w->size = size->integer;
    w->count = count->integer;
    return true;
}

static char *state_to_json(const train_state *s, const train_config *cfg) {
    char *config_text = config_to_text(cfg);
    strbuf sb = {0};
    sb_printf(&sb, "{\n  \"format\": \"%s\",\n  \"version\": %d,\n", STATE_FORMAT, STATE_VERSION);
    sb_printf(&sb, "  \"step\": %lld,\n  \"adam_step\": %lld,\n", (long long)s->step, (long long)s->adam_step);
    sb_printf(&sb, "  \"data_epoch\": %lld,\n  \"data_index\": %lld,\n", (long long)s->data.epoch,
              (long long)s->data.index);
    sb_printf(&sb, "  \"bad_steps\": %lld,\n  \"tokens_seen\": %lld,\n", (long long)s->bad_steps,
              (long long)s->tokens_seen);
    sb_printf(&sb, "  \"outer_step\": %lld,\n", (long long)s->outer_step);
    if (s->data_world > 0) sb_printf(&sb, "  \"data_world\": %lld,\n", (long long)s->data_world);
    if (s->merge_step > 0) sb_printf(&sb, "  \"outer_merge_step\": %lld,\n", (long long)s->merge_step);
    if (s->rollbacks > 0) sb_printf(&sb, "  \"rollbacks\": %lld,\n", (long long)s->rollbacks);
    if (s->spikes.size > 0) {  // the spike guard's window: the values exactly (shortest round-trip form)
        const spike_window *w = &s->spikes;
        int64_t n = w->count < w->size ? w->count : w->size;
        sb_printf(&sb, "  \"spike_window\": %lld,\n  \"spike_count\": %lld,\n", (long long)w->size,
                  (long long)w->count);
        const double *arrays[2] = {w->loss, w->grad_norm};
        const char *names[2] = {"spike_loss", "spike_grad_norm"};
        for (int a = 0; a < 2; a++) {
            sb_printf(&sb, "  \"%s\": [", names[a]);
            for (int64_t i = 0; i < n; i++) {
                if (i) sb_append(&sb, ",");
                sb_json_number(&sb, arrays[a][i]);
            }
            sb_append(&sb, "],\n");
        }
    }
    sb_printf(&sb, "  \"batch_size\": %lld,\n  \"seq_len\": %lld,\n  \"grad_accum\": %lld,\n",
              (long long)cfg->batch_size, (long long)cfg->model.seq_len, (long long)cfg->grad_accum);
    sb_printf(&sb, "  \"shuffle\": %s,\n  \"seed\": %lld,\n  \"saved_at_unix\": %lld,\n  \"config\": ",
              cfg->shuffle ? "true" : "false", (long long)cfg->seed, (long long)time(NULL));
    sb_json_string(&sb, config_text);
    sb_append(&sb, "\n}\n");
    free(config_text);
    return sb.data;
}

// ---------------------------------------------------------------- save

// Renames the finished tmp_dir to final_dir and syncs out_dir; false (warned, tmp_dir
// removed where it is still there) on failure.
static bool commit_dir(const char *tmp_dir, const char *final_dir, const char *out_dir) {
    if (dir_exists(final_dir)) {
        // Only reachable when a newer checkpoint was skipped as corrupt on resume: keep it
        // for inspection rather than delete it.
        char aside[4200];
        snprintf(aside, sizeof aside, "%s.replaced-%lld", final_dir, (long long)time(NULL));
        if (rename(final_dir, aside) != 0) {
            warn("cannot move the old '%s' aside: %s", final_dir, strerror(errno));
            remove_tree(tmp_dir);
            return false;
        }
        warn("an older '%s' was moved to '%s'", final_dir, aside);
    }
    if (rename(tmp_dir, final_dir) != 0 || !fsync_dir(out_dir)) {
        warn("cannot commit checkpoint '%s': %s", final_dir, strerror(errno));
        return false;
    }
    return true;
}

static bool save_pieces(const char *out_dir, const model_buffers *b, const train_state *s, const train_config *cfg);
static bool load_pieces(const char *dir, const model_buffers *b, train_state *s, char *why, size_t why_bytes);

bool checkpoint_save(const char *out_dir, const model_buffers *b, const train_state *s, const train_config *cfg) {
    if (b->job) return save_pieces(out_dir, b, s, cfg);
    int64_t numel = b->table->numel;
    bool finite = all_finite(b->params, numel) && all_finite(b->exp_avg, numel) && all_finite(b->exp_avg_sq, numel);
    if (b->outer_theta) finite = finite && all_finite(b->outer_theta, numel) && all_finite(b->outer_momentum, numel);
    if (!finite) {
        warn("not saving checkpoint at step %lld: the weights or moments hold NaN/Inf", (long long)s->step);
        return false;
    }
    char final_dir[4096], tmp_dir[4096];
    snprintf(final_dir, sizeof final_dir, "%s/step_%08lld", out_dir, (long long)s->step);
    snprintf(tmp_dir, sizeof tmp_dir, "%s/.tmp-step_%08lld", out_dir, (long long)s->step);
    if (dir_exists(tmp_dir)) remove_tree(tmp_dir);
    if (!make_dirs(out_dir) || mkdir(tmp_dir, 0755) != 0) {
        warn("cannot create checkpoint directory '%s': %s", tmp_dir, strerror(errno));
        return false;
    }
    uint64_t hashes[N_CHECKPOINT_FILES];
    char *state_json = state_to_json(s, cfg);
    bool ok = write_model_file(tmp_dir, b, &hashes[0]);
    if (ok) maybe_inject_fault(s->step);
    ok = ok && write_optimizer_file(tmp_dir, b, s->adam_step, &hashes[1]);
    ok = ok && write_text_file(tmp_dir, "state.json", state_json, &hashes[2]);
    int files = N_REQUIRED_FILES;
    if (b->outer_theta) {
        ok = ok && write_outer_file(tmp_dir, b, s->outer_step, &hashes[OUTER_FILE]);
        files = N_CHECKPOINT_FILES;
    }
    free(state_json);
    if (ok) {
        strbuf sums = {0};
        for (int i = 0; i < files; i++)
            sb_printf(&sums, "%016llx  %s\n", (unsigned long long)hashes[i], CHECKPOINT_FILES[i]);
        ok = write_text_file(tmp_dir, "checksums.xxh64", sums.data, NULL);
        sb_free(&sums);
    }
    ok = ok && fsync_dir(tmp_dir);
    if (!ok) {
        warn("checkpoint at step %lld failed: %s (the previous checkpoints are untouched)", (long long)s->step,
             strerror(errno));
        remove_tree(tmp_dir);
        return false;
    }
    return commit_dir(tmp_dir, final_dir, out_dir);
}

// ---------------------------------------------------------------- load

// The whole of DIR/NAME, NUL-terminated (caller frees), or NULL with a reason in why.
static char *read_checkpoint_file(const char *dir, const char *name, size_t *bytes, char *why, size_t why_bytes) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    char *text = read_file_or_null(path, bytes);
    if (!text) snprintf(why, why_bytes, "cannot read %s: %s", name, strerror(errno));
    return text;
}

// Checks every file checksums.xxh64 lists; *has_outer tells whether outer.safetensors is one.
static bool verify_checksums(const char *dir, bool *has_outer, char *why, size_t why_bytes) {
    char path[4200];
    size_t bytes;
    char *text = read_checkpoint_file(dir, "checksums.xxh64", &bytes, why, why_bytes);
    if (!text) return false;
    bool seen[N_CHECKPOINT_FILES] = {false};
    bool ok = true;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); ok && line; line = strtok_r(NULL, "\n", &save)) {
        char hex[17], name[256];
        int consumed = 0;
        if (sscanf(line, "%16[0-9a-f]  %255s%n", hex, name, &consumed) != 2 || strlen(hex) != 16 ||
            line[consumed] != '\0') {
            snprintf(why, why_bytes, "checksums.xxh64 is malformed");
            ok = false;
            break;
        }
        int which = -1;
        for (int i = 0; i < N_CHECKPOINT_FILES; i++)
            if (strcmp(name, CHECKPOINT_FILES[i]) == 0) which = i;
        if (which < 0 || seen[which]) {
            snprintf(why, why_bytes, "checksums.xxh64 names an unexpected file '%s'", name);
            ok = false;
            break;
        }
        seen[which] = true;
        uint64_t expected = strtoull(hex, NULL, 16), actual;
        snprintf(path, sizeof path, "%s/%s", dir, name);
        if (!hash_file(path, &actual)) {
            snprintf(why, why_bytes, "cannot read %s: %s", name, strerror(errno));
            ok = false;
        } else if (actual != expected) {
            snprintf(why, why_bytes, "%s fails its checksum (corrupt or modified)", name);
            ok = false;
        }
    }
    free(text);
    *has_outer = seen[OUTER_FILE];
    for (int i = 0; ok && i < N_REQUIRED_FILES; i++)
        if (!seen[i]) {
            snprintf(why, why_bytes, "checksums.xxh64 does not cover %s", CHECKPOINT_FILES[i]);
            ok = false;
        }
    return ok;
}

// Reads every tensor of the table from f, named prefix + table name, into flat.
static bool read_table_tensors(const st_file *f, const param_table *t, const char *prefix, float *flat, char *why,
                               size_t why_bytes) {
    for (int i = 0; i < t->count; i++) {
        const param_info *p = &t->params[i];
        char name[160];
        snprintf(name, sizeof name, "%s%s", prefix, p->name);
        const st_entry *e = safetensors_find(f, name);
        if (!e) {
            snprintf(why, why_bytes, "tensor '%s' is missing", name);
            return false;
        }
        bool shape_ok = e->ndim == p->ndim && e->shape[0] == p->shape[0] && (p->ndim == 1 || e->shape[1] == p->shape[1]);
        if (!shape_ok) {
            snprintf(why, why_bytes, "tensor '%s' has shape [%lld%s%lld], the config needs [%lld%s%lld]", name,
                     (long long)e->shape[0], e->ndim > 1 ? "," : "", e->ndim > 1 ? (long long)e->shape[1] : 0LL,
                     (long long)p->shape[0], p->ndim > 1 ? "," : "", p->ndim > 1 ? (long long)p->shape[1] : 0LL);
            return false;
        }
        if (!safetensors_read(f, e, flat + p->offset)) {
            snprintf(why, why_bytes, "cannot read tensor '%s': %s", name, strerror(errno));
            return false;
        }
    }
    return true;
}

// The checkpoint's architecture must be the config's; other model keys only warn.
static bool check_model_config(const st_file *f, const model_config *want, char *why, size_t why_bytes) {
    const char *json = safetensors_meta(f, "model_config");
    if (!json) {
        snprintf(why, why_bytes, "model.safetensors has no model_config metadata");
        return false;
    }
    model_config have;
    const char *reason;
    if (!model_config_from_json(json, &have, &reason)) {
        snprintf(why, why_bytes, "%s", reason);
        return false;
    }
    struct {
        const char *name;
        long long have, want;
    } shape_keys[] = {
        {"vocab_size", have.vocab_size, want->vocab_size}, {"n_layer", have.n_layer, want->n_layer},
        {"d_model", have.d_model, want->d_model},          {"n_head", have.n_head, want->n_head},
        {"n_kv_head", have.n_kv_head, want->n_kv_head},    {"head_dim", have.head_dim, want->head_dim},
        {"d_ff", have.d_ff, want->d_ff},                   {"qk_norm", have.qk_norm, want->qk_norm},
        {"tie_embeddings", have.tie_embeddings, want->tie_embeddings},
    };
    for (size_t i = 0; i < sizeof shape_keys / sizeof shape_keys[0]; i++)
        if (shape_keys[i].have != shape_keys[i].want) {
            snprintf(why, why_bytes, "it was trained with %s = %lld, the config says %lld", shape_keys[i].name,
                     shape_keys[i].have, shape_keys[i].want);
            return false;
        }
    if (!model_config_equal(&have, want))
        warn("the checkpoint's model config differs from the config in a non-shape key (seq_len, rope_theta, "
             "nope_every, norm_eps, doc_masking or doc_token); continuing with the config's values");
    return true;
}

static bool read_state(const char *dir, train_state *s, char *why, size_t why_bytes) {
    size_t bytes;
    char *text = read_checkpoint_file(dir, "state.json", &bytes, why, why_bytes);
    if (!text) return false;
    json_doc doc;
    bool ok = json_parse(text, bytes, &doc);
    free(text);
    if (!ok) {
        snprintf(why, why_bytes, "state.json: %s", doc.error);
        return false;
    }
    const json_value *format = json_get(&doc.root, "format"), *version = json_get(&doc.root, "version");
    if (!format || format->type != JSON_STRING || strcmp(format->string, STATE_FORMAT) != 0 || !version ||
        !version->is_integer || version->integer != STATE_VERSION) {
        snprintf(why, why_bytes, "state.json is not a version-%d train_gpt state", STATE_VERSION);
        json_free(&doc);
        return false;
    }
    struct {
        const char *key;
        int64_t *field;
    } fields[] = {{"step", &s->step},           {"adam_step", &s->adam_step}, {"data_epoch", &s->data.epoch},
                  {"data_index", &s->data.index}, {"bad_steps", &s->bad_steps}, {"tokens_seen", &s->tokens_seen}};
    for (size_t i = 0; ok && i < sizeof fields / sizeof fields[0]; i++) {
        const json_value *v = json_get(&doc.root, fields[i].key);
        if (!v || v->type != JSON_NUMBER || !v->is_integer || v->integer < 0) {
            snprintf(why, why_bytes, "state.json: bad or missing '%s'", fields[i].key);
            ok = false;
        } else {
            *fields[i].field = v->integer;
        }
    }
    // Absent in checkpoints written before DiLoCo existed.
    const json_value *outer = json_get(&doc.root, "outer_step");
    s->outer_step = outer && outer->type == JSON_NUMBER && outer->is_integer && outer->integer >= 0 ? outer->integer : 0;
    // Only while a streaming DiLoCo fragment has landed and not yet merged (diloco.h).
    const json_value *merge = json_get(&doc.root, "outer_merge_step");
    s->merge_step = merge && merge->type == JSON_NUMBER && merge->is_integer && merge->integer > 0 ? merge->integer : 0;
    const json_value *data_world = json_get(&doc.root, "data_world");  // absent: not recorded
    s->data_world = data_world && data_world->type == JSON_NUMBER && data_world->is_integer && data_world->integer > 0
                        ? data_world->integer
                        : 0;
    const json_value *rollbacks = json_get(&doc.root, "rollbacks");  // absent: none
    s->rollbacks = rollbacks && rollbacks->type == JSON_NUMBER && rollbacks->is_integer && rollbacks->integer > 0
                       ? rollbacks->integer
                       : 0;
    if (ok && !read_spike_window(&doc.root, &s->spikes)) {
        snprintf(why, why_bytes, "state.json: bad spike_window / spike_count / spike_loss / spike_grad_norm");
        ok = false;
    }
    json_free(&doc);
    return ok;
}

static bool read_outer_state(const char *dir, const model_buffers *b, char *why, size_t why_bytes) {
    char path[4200];
    st_file f;
    snprintf(path, sizeof path, "%s/outer.safetensors", dir);
    if (!safetensors_open(path, &f, why, why_bytes)) return false;
    bool ok = read_table_tensors(&f, b->table, "outer.theta.", b->outer_theta, why, why_bytes) &&
              read_table_tensors(&f, b->table, "outer.momentum.", b->outer_momentum, why, why_bytes);
    if (ok && b->outer_residual) {
        size_t bytes = (size_t)b->table->numel * sizeof(float);
        char first[160];
        snprintf(first, sizeof first, "outer.residual.%s", b->table->params[0].name);
        if (safetensors_find(&f, first))
            ok = read_table_tensors(&f, b->table, "outer.residual.", b->outer_residual, why, why_bytes);
        else
            memset(b->outer_residual, 0, bytes);  // written without error feedback: start with none
    }
    safetensors_close(&f);
    if (ok && (!all_finite(b->outer_theta, b->table->numel) || !all_finite(b->outer_momentum, b->table->numel))) {
        snprintf(why, why_bytes, "the outer state holds NaN/Inf");
        ok = false;
    }
    return ok;
}

bool checkpoint_load(const char *dir, const model_buffers *b, train_state *s, char *why, size_t why_bytes) {
    if (b->job) return load_pieces(dir, b, s, why, why_bytes);
    bool has_outer = false;
    if (!verify_checksums(dir, &has_outer, why, why_bytes)) return false;
    char path[4200];
    st_file f;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (!safetensors_open(path, &f, why, why_bytes)) return false;
    bool ok = check_model_config(&f, &b->table->cfg, why, why_bytes) &&
              read_table_tensors(&f, b->table, "", b->params, why, why_bytes);
    if (ok && f.count != b->table->count) {
        snprintf(why, why_bytes, "model.safetensors holds %d tensors, the config has %d", f.count, b->table->count);
        ok = false;
    }
    safetensors_close(&f);
    if (!ok) return false;
    snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
    if (!safetensors_open(path, &f, why, why_bytes)) return false;
    ok = read_table_tensors(&f, b->table, "exp_avg.", b->exp_avg, why, why_bytes) &&
         read_table_tensors(&f, b->table, "exp_avg_sq.", b->exp_avg_sq, why, why_bytes);
    safetensors_close(&f);
    if (!ok || !read_state(dir, s, why, why_bytes)) return false;
    if (!all_finite(b->params, b->table->numel)) {
        snprintf(why, why_bytes, "the weights hold NaN/Inf");
        return false;
    }
    if (b->outer_theta && has_outer) return read_outer_state(dir, b, why, why_bytes);
    if (b->outer_theta) {
        size_t bytes = (size_t)b->table->numel * sizeof(float);
        note("'%s' has no DiLoCo outer state: θ starts from its weights, with zero momentum", dir);
        memcpy(b->outer_theta, b->params, bytes);
        memset(b->outer_momentum, 0, bytes);
        if (b->outer_residual) memset(b->outer_residual, 0, bytes);
        s->outer_step = 0;
        s->merge_step = 0;
    }
    return true;
}

// ---------------------------------------------------------------- FSDP: pieces in parallel

// Whether every rank of the job says ok (one collective; every rank gets the same answer).
static bool all_ok(const model_buffers *b, bool ok) { return comm_max(b->job, ok ? 0.0 : 1.0) == 0.0; }

// One tensor table file of `kinds` local buffers, named prefix + name: tensor (i, k) lies
// at header + Σ of the sizes before it.
typedef struct {
    const param_table *t;
    int kinds;
    const char *const *prefixes;
    float *const *buffers;
    const char *meta_keys[3], *meta_values[3];
    int meta_count;
} table_file;

static char *table_file_header(const table_file *tf, size_t *header_bytes) {
    const param_table *t = tf->t;
    int n = t->count * tf->kinds;
    st_tensor_out *out = xcalloc((size_t)n, sizeof *out);
    char (*names)[160] = xcalloc((size_t)n, sizeof *names);
    for (int i = 0, j = 0; i < t->count; i++)
        for (int k = 0; k < tf->kinds; k++, j++) {
            const param_info *p = &t->params[i];
            snprintf(names[j], sizeof names[0], "%s%s", tf->prefixes[k], p->name);
            out[j] = (st_tensor_out){names[j], NULL, p->ndim, {p->shape[0], p->shape[1]}};
        }
    char *header = safetensors_header(out, n, tf->meta_keys, tf->meta_values, tf->meta_count, header_bytes);
    free(names);
    free(out);
    return header;
}

typedef struct {
    int fd;
    const float *local;
    uint64_t at;      // file offset of the tensor's first value
    int64_t first;    // the tensor's flat offset
    bool ok;
} piece_io;

static void write_stretch(void *ctx, int64_t global, int64_t local, int64_t count) {
    piece_io *io = ctx;
    io->ok = io->ok && pwrite_exact(io->fd, io->local + local, (size_t)count * 4,
                                    io->at + (uint64_t)(global - io->first) * 4);
}

// Rank 0 creates DIR/FILE, its header and its full size; then every writer writes its pieces.
static bool write_table_file_pieces(const model_buffers *b, const char *dir, const char *file, const table_file *tf) {
    size_t header_bytes;
    char *header = table_file_header(tf, &header_bytes);
    uint64_t total = header_bytes + (uint64_t)tf->t->numel * 4 * (uint64_t)tf->kinds;
    char path[4200];
    bool ok = true;
    if (comm_rank(b->job) == 0) {
        int fd = open_new_file(dir, file, path, sizeof path);
        ok = fd >= 0 && finish_file(fd, write_exact(fd, header, header_bytes) && ftruncate(fd, (off_t)total) == 0);
    }
    free(header);
    if (!all_ok(b, ok)) return false;
    if (b->writer) {
        snprintf(path, sizeof path, "%s/%s", dir, file);
        int fd = open(path, O_WRONLY | O_CLOEXEC);
        piece_io io = {fd, NULL, 0, 0, fd >= 0};
        uint64_t at = header_bytes;
        for (int i = 0; io.ok && i < tf->t->count; i++)
            for (int k = 0; k < tf->kinds; k++) {
                const param_info *p = &tf->t->params[i];
                io.local = tf->buffers[k];
                io.at = at;
                io.first = p->offset;
                shard_visit(b->shard, p->offset, p->offset + p->numel, write_stretch, &io);
                at += (uint64_t)p->numel * 4;
            }
        ok = fd >= 0 && finish_file(fd, io.ok);
    }
    return all_ok(b, ok);
}

static table_file model_table(const model_buffers *b, char *config_json) {
    static const char *const prefixes[] = {""};
    table_file tf = {b->table, 1, prefixes, &b->params, {"format", "model_config", "written_by"},
                     {"pt", config_json, "train_gpt"}, 3};
    return tf;
}

static bool local_finite(const model_buffers *b) {
    int64_t n = b->shard->local_numel;
    bool finite = all_finite(b->params, n) && all_finite(b->exp_avg, n) && all_finite(b->exp_avg_sq, n);
    if (b->outer_theta) finite = finite && all_finite(b->outer_theta, n) && all_finite(b->outer_momentum, n);
    return finite;
}

static bool save_pieces(const char *out_dir, const model_buffers *b, const train_state *s, const train_config *cfg) {
    bool root = comm_rank(b->job) == 0;
    if (!all_ok(b, local_finite(b))) {
        if (root) warn("not saving checkpoint at step %lld: the weights or moments hold NaN/Inf", (long long)s->step);
        return false;
    }
    char final_dir[4096], tmp_dir[4096];
    snprintf(final_dir, sizeof final_dir, "%s/step_%08lld", out_dir, (long long)s->step);
    snprintf(tmp_dir, sizeof tmp_dir, "%s/.tmp-step_%08lld", out_dir, (long long)s->step);
    bool ok = true;
    if (root) {
        if (dir_exists(tmp_dir)) remove_tree(tmp_dir);
        ok = make_dirs(out_dir) && mkdir(tmp_dir, 0755) == 0;
        if (!ok) warn("cannot create checkpoint directory '%s': %s", tmp_dir, strerror(errno));
    }
    if (!all_ok(b, ok)) return false;
    char *config_json = model_config_to_json(&b->table->cfg);
    table_file model = model_table(b, config_json);
    ok = write_table_file_pieces(b, tmp_dir, "model.safetensors", &model);
    free(config_json);
    if (ok && root) maybe_inject_fault(s->step);
    char count_text[32];
    snprintf(count_text, sizeof count_text, "%lld", (long long)s->adam_step);
    const char *moment_prefixes[] = {"exp_avg.", "exp_avg_sq."};
    float *moments[] = {b->exp_avg, b->exp_avg_sq};
    table_file optimizer = {b->table, 2, moment_prefixes, moments, {"optimizer", "adam_step"}, {"AdamW", count_text}, 2};
    ok = ok && write_table_file_pieces(b, tmp_dir, "optimizer.safetensors", &optimizer);
    int files = N_REQUIRED_FILES;
    if (ok && b->outer_theta) {
        char outer_text[32];
        snprintf(outer_text, sizeof outer_text, "%lld", (long long)s->outer_step);
        const char *outer_prefixes[] = {"outer.theta.", "outer.momentum.", "outer.residual."};
        float *outer[] = {b->outer_theta, b->outer_momentum, b->outer_residual};
        table_file tf = {b->table, b->outer_residual ? 3 : 2, outer_prefixes, outer, {"optimizer", "outer_step"},
                         {"DiLoCo outer Nesterov SGD", outer_text}, 2};
        ok = write_table_file_pieces(b, tmp_dir, "outer.safetensors", &tf);
        files = N_CHECKPOINT_FILES;
    }
    // Rank 0 checksums what the ranks wrote (one read of the files), then commits as one process does.
    if (ok && root) {
        uint64_t hashes[N_CHECKPOINT_FILES];
        char *state_json = state_to_json(s, cfg);
        ok = write_text_file(tmp_dir, "state.json", state_json, &hashes[2]);
        free(state_json);
        char path[4200];
        for (int i = 0; ok && i < files; i++) {
            if (i == 2) continue;
            snprintf(path, sizeof path, "%s/%s", tmp_dir, CHECKPOINT_FILES[i]);
            ok = hash_file(path, &hashes[i]);
        }
        if (ok) {
            strbuf sums = {0};
            for (int i = 0; i < files; i++)
                sb_printf(&sums, "%016llx  %s\n", (unsigned long long)hashes[i], CHECKPOINT_FILES[i]);
            ok = write_text_file(tmp_dir, "checksums.xxh64", sums.data, NULL);
            sb_free(&sums);
        }
        ok = ok && fsync_dir(tmp_dir) && commit_dir(tmp_dir, final_dir, out_dir);
    }
    if (!all_ok(b, ok)) {
        if (root) {
            warn("checkpoint at step %lld failed: %s (the previous checkpoints are untouched)", (long long)s->step,
                 strerror(errno));
            remove_tree(tmp_dir);
        }
        return false;
    }
    return true;
}

typedef struct {
    const st_file *f;
    const st_entry *e;
    float *local;
    int64_t first;
    bool ok;
} read_io;

static void read_stretch(void *ctx, int64_t global, int64_t local, int64_t count) {
    read_io *io = ctx;
    io->ok = io->ok && safetensors_read_range(io->f, io->e, global - io->first, count, io->local + local);
}

// This rank's pieces of every tensor of the table, named prefix + table name, from f.
static bool read_table_pieces(const st_file *f, const model_buffers *b, const char *prefix, float *local, char *why,
                              size_t why_bytes) {
    const param_table *t = b->table;
    memset(local, 0, (size_t)b->shard->local_numel * sizeof(float));
    for (int i = 0; i < t->count; i++) {
        const param_info *p = &t->params[i];
        char name[160];
        snprintf(name, sizeof name, "%s%s", prefix, p->name);
        const st_entry *e = safetensors_find(f, name);
        if (!e) {
            snprintf(why, why_bytes, "tensor '%s' is missing", name);
            return false;
        }
        if (e->numel != p->numel || e->ndim != p->ndim || e->shape[0] != p->shape[0]) {
            snprintf(why, why_bytes, "tensor '%s' does not have the config's shape", name);
            return false;
        }
        read_io io = {f, e, local, p->offset, true};
        shard_visit(b->shard, p->offset, p->offset + p->numel, read_stretch, &io);
        if (!io.ok) {
            snprintf(why, why_bytes, "cannot read tensor '%s': %s", name, strerror(errno));
            return false;
        }
    }
    return true;
}

static bool open_in(const char *dir, const char *file, st_file *f, char *why, size_t why_bytes) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    return safetensors_open(path, f, why, why_bytes);
}

// Every rank: its pieces of the checkpoint that rank 0 verified.
static bool load_my_pieces(const char *dir, const model_buffers *b, bool has_outer, train_state *s, char *why,
                           size_t why_bytes) {
    st_file f;
    if (!open_in(dir, "model.safetensors", &f, why, why_bytes)) return false;
    bool ok = check_model_config(&f, &b->table->cfg, why, why_bytes) && read_table_pieces(&f, b, "", b->params, why,
                                                                                         why_bytes);
    if (ok && f.count != b->table->count) {
        snprintf(why, why_bytes, "model.safetensors holds %d tensors, the config has %d", f.count, b->table->count);
        ok = false;
    }
    safetensors_close(&f);
    if (!ok || !open_in(dir, "optimizer.safetensors", &f, why, why_bytes)) return false;
    ok = read_table_pieces(&f, b, "exp_avg.", b->exp_avg, why, why_bytes) &&
         read_table_pieces(&f, b, "exp_avg_sq.", b->exp_avg_sq, why, why_bytes);
    safetensors_close(&f);
    if (!ok || !read_state(dir, s, why, why_bytes)) return false;
    int64_t n = b->shard->local_numel;
    if (!all_finite(b->params, n)) {
        snprintf(why, why_bytes, "the weights hold NaN/Inf");
        return false;
    }
    if (!b->outer_theta) return true;
    if (!has_outer) {
        note("'%s' has no DiLoCo outer state: θ starts from its weights, with zero momentum", dir);
        memcpy(b->outer_theta, b->params, (size_t)n * sizeof(float));
        memset(b->outer_momentum, 0, (size_t)n * sizeof(float));
        if (b->outer_residual) memset(b->outer_residual, 0, (size_t)n * sizeof(float));
        s->outer_step = 0;
        s->merge_step = 0;
        return true;
    }
    if (!open_in(dir, "outer.safetensors", &f, why, why_bytes)) return false;
    ok = read_table_pieces(&f, b, "outer.theta.", b->outer_theta, why, why_bytes) &&
         read_table_pieces(&f, b, "outer.momentum.", b->outer_momentum, why, why_bytes);
    if (ok && b->outer_residual) {
        char first[160];
        snprintf(first, sizeof first, "outer.residual.%s", b->table->params[0].name);
        if (safetensors_find(&f, first)) ok = read_table_pieces(&f, b, "outer.residual.", b->outer_residual, why,
                                                                why_bytes);
        else memset(b->outer_residual, 0, (size_t)n * sizeof(float));
    }
    safetensors_close(&f);
    if (ok && (!all_finite(b->outer_theta, n) || !all_finite(b->outer_momentum, n))) {
        snprintf(why, why_bytes, "the outer state holds NaN/Inf");
        ok = false;
    }
    return ok;
}

static bool load_pieces(const char *dir, const model_buffers *b, train_state *s, char *why, size_t why_bytes) {
    // Rank 0 reads every byte once against checksums.xxh64; the verdict and reason go to all.
    bool has_outer = false, ok = true;
    if (comm_rank(b->job) == 0) ok = verify_checksums(dir, &has_outer, why, why_bytes);
    char verdict[514];
    verdict[0] = (char)ok;
    verdict[1] = (char)has_outer;
    snprintf(verdict + 2, sizeof verdict - 2, "%s", ok ? "" : why);
    comm_broadcast(b->job, verdict, sizeof verdict, 0);
    if (!verdict[0]) {
        snprintf(why, why_bytes, "%s", verdict + 2);
        return false;
    }
    ok = load_my_pieces(dir, b, verdict[1] != 0, s, why, why_bytes);
    // A rank that failed says why to all (the lowest such rank's reason).
    double failed_rank = comm_max(b->job, ok ? -1.0 : (double)(comm_size(b->job) - comm_rank(b->job)));
    if (failed_rank < 0) return true;
    int from = comm_size(b->job) - (int)failed_rank;
    snprintf(verdict, sizeof verdict, "%s", comm_rank(b->job) == from ? why : "");
    comm_broadcast(b->job, verdict, sizeof verdict, from);
    snprintf(why, why_bytes, "rank %d: %s", from, verdict);
    return false;
}

// Checkpoint directories in out_dir, newest first. Names are step_ + digits only.
typedef struct {
    int64_t step;
    char path[4200];
} checkpoint_dir;

static int newer_first(const void *a, const void *b) {
    const checkpoint_dir *x = a, *y = b;
    return x->step > y->step ? -1 : x->step < y->step;
}

static int list_checkpoints(const char *out_dir, checkpoint_dir **out) {
    DIR *d = opendir(out_dir);
    int count = 0, capacity = 0;
    checkpoint_dir *dirs = NULL;
    for (struct dirent *e; d && (e = readdir(d));) {
        const char *n = e->d_name;
        if (strncmp(n, "step_", 5) != 0 || n[5] == '\0' || strspn(n + 5, "0123456789") != strlen(n + 5)) continue;
        if (count == capacity) {
            capacity = capacity ? capacity * 2 : 16;
            dirs = xrealloc(dirs, (size_t)capacity * sizeof *dirs);
        }
        dirs[count].step = atoll(n + 5);
        snprintf(dirs[count].path, sizeof dirs[count].path, "%s/%s", out_dir, n);
        if (dir_exists(dirs[count].path)) count++;
    }
    if (d) closedir(d);
    if (count > 1) qsort(dirs, (size_t)count, sizeof *dirs, newer_first);
    *out = dirs;
    return count;
}

char *checkpoint_load_latest(const char *out_dir, const model_buffers *b, train_state *s) {
    checkpoint_dir *dirs;
    int count = list_checkpoints(out_dir, &dirs);
    for (int i = 0; i < count; i++) {
        char why[512];
        if (checkpoint_load(dirs[i].path, b, s, why, sizeof why)) {
            char *found = xstrdup(dirs[i].path);
            free(dirs);
            return found;
        }
        if (!b->job || comm_rank(b->job) == 0) warn("skipping checkpoint '%s': %s", dirs[i].path, why);
    }
    free(dirs);
    if (count > 0)
        fail("resume = auto: none of the %d checkpoints in '%s' is valid (see the warnings above); nothing was "
             "deleted. Fix or move them, or set resume = never to start over",
             count, out_dir);
    return NULL;
}

int checkpoint_count(const char *out_dir) {
    checkpoint_dir *dirs;
    int count = list_checkpoints(out_dir, &dirs);
    free(dirs);
    return count;
}

void checkpoint_prune(const char *out_dir, int64_t keep) {
    if (keep <= 0) return;
    checkpoint_dir *dirs;
    int count = list_checkpoints(out_dir, &dirs);
    for (int i = (int)keep; i < count; i++) remove_tree(dirs[i].path);
    free(dirs);
}

bool load_weights(const char *path, const param_table *t, float *params, char *why, size_t why_bytes) {
    st_file f;
    if (!safetensors_open(path, &f, why, why_bytes)) return false;
    bool ok = read_table_tensors(&f, t, "", params, why, why_bytes);
    safetensors_close(&f);
    if (ok && !all_finite(params, t->numel)) {
        snprintf(why, why_bytes, "the weights hold NaN/Inf");
        ok = false;
    }
    return ok;
}

bool load_weights_pieces(const char *path, const shard_map *shard, float *local, char *why, size_t why_bytes) {
    if (shard->ranks == 1) return load_weights(path, shard->table, local, why, why_bytes);
    st_file f;
    if (!safetensors_open(path, &f, why, why_bytes)) return false;
    model_buffers b;
    memset(&b, 0, sizeof b);
    b.table = shard->table;
    b.shard = shard;
    bool ok = read_table_pieces(&f, &b, "", local, why, why_bytes);
    safetensors_close(&f);
    if (ok && !all_finite(local, shard->local_numel)) {
        snprintf(why, why_bytes, "the weights hold NaN/Inf");
        ok = false;
    }
    return ok;
}
