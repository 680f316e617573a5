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
#include <float.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define STATE_FORMAT "train_gpt-state"
#define STATE_VERSION 1
// The first three are in every checkpoint; outer.safetensors only in DiLoCo runs,
// outer_reducer.bin only in those whose transport keeps a reducer state (mpi).
static const char *const CHECKPOINT_FILES[] = {"model.safetensors", "optimizer.safetensors", "state.json",
                                               "outer.safetensors", "outer_reducer.bin"};
#define N_CHECKPOINT_FILES 5
#define N_REQUIRED_FILES 3
#define OUTER_FILE 3
#define REDUCER_FILE 4
// Which files verify_checksums reads and hashes (bit i: CHECKPOINT_FILES[i]); the others' lines
// are checked for their form only. init_from uses the weights and state.json alone: hashing the
// moments too (and DiLoCo's outer state) read 3-6 times the bytes it uses, 168-336 GB at 14B.
#define ALL_FILES ((1u << N_CHECKPOINT_FILES) - 1)
#define WEIGHTS_AND_STATE ((1u << 0) | (1u << 2))

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

// The test hook slow_ckpt_cleanup: 2 s that a signal does not cut short (a launcher's SIGTERM is
// a stop request here, which a long removal does not heed either).
static void slow_cleanup(void) {
    struct timespec left = {2, 0};
    while (nanosleep(&left, &left) != 0 && errno == EINTR) continue;
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

// ---------------------------------------------------------------- the tensor files

// One safetensors file of the table's tensors from `kinds` buffers, tensor (i, k) named
// prefixes[k] + name i, in that order (the offsets of every file: safetensors_header).
typedef struct {
    const param_table *t;
    int kinds;
    const char *const *prefixes;
    float *const *buffers;
    const char *meta_keys[3], *meta_values[3];
    int meta_count;
} table_file;

static const char *const MODEL_PREFIXES[] = {""};
static const char *const MOMENT_PREFIXES[] = {"exp_avg.", "exp_avg_sq."};
static const char *const OUTER_PREFIXES[] = {"outer.theta.", "outer.momentum.", "outer.residual."};

static table_file model_table(const param_table *t, float *const *params, const char *config_json) {
    table_file tf = {t, 1, MODEL_PREFIXES, params, {"format", "model_config", "written_by"},
                     {"pt", config_json, "train_gpt"}, 3};
    return tf;
}

// The tensors of tf (caller frees both); with_data: buffers hold the whole model, so tensor
// (i, k) is buffers[k] + offset i (else the data pointers are left NULL: a header only).
static st_tensor_out *table_tensors(const table_file *tf, bool with_data, char (**names_out)[160]) {
    const param_table *t = tf->t;
    int n = t->count * tf->kinds;
    st_tensor_out *out = xcalloc((size_t)n, sizeof *out);
    char (*names)[160] = xcalloc((size_t)n, sizeof *names);
    for (int i = 0, j = 0; i < t->count; i++)
        for (int k = 0; k < tf->kinds; k++, j++) {
            const param_info *p = &t->params[i];
            snprintf(names[j], sizeof names[0], "%s%s", tf->prefixes[k], p->name);
            out[j] = (st_tensor_out){names[j], with_data ? tf->buffers[k] + p->offset : NULL, p->ndim,
                                     {p->shape[0], p->shape[1]}};
        }
    *names_out = names;
    return out;
}

// Writes a whole-model table file to fd, XXH64 of every byte into *hash.
static bool write_table_fd(int fd, const table_file *tf, uint64_t *hash) {
    char (*names)[160];
    st_tensor_out *out = table_tensors(tf, true, &names);
    bool ok = safetensors_write(fd, out, tf->t->count * tf->kinds, tf->meta_keys, tf->meta_values, tf->meta_count,
                                hash);
    free(names);
    free(out);
    return ok;
}

bool save_weights(const char *path, const param_table *t, const float *params) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    char *config_json = model_config_to_json(&t->cfg);
    float *buffers[] = {(float *)params};
    table_file tf = model_table(t, buffers, config_json);
    uint64_t hash;
    bool ok = fd >= 0 && finish_file(fd, write_table_fd(fd, &tf, &hash)) && rename(tmp, path) == 0;
    free(config_json);
    if (!ok) unlink(tmp);
    return ok;
}

static bool write_text_file(const char *dir, const char *name, const char *text, uint64_t *hash) {
    char path[4200];
    int fd = open_new_file(dir, name, path, sizeof path);
    if (fd < 0) return false;
    if (hash) *hash = xxh64(text, strlen(text), 0);
    return finish_file(fd, write_exact(fd, text, strlen(text)));
}

// A file of two stretches of bytes one after the other (outer_reducer.bin: header, values).
static bool write_two_part_file(const char *dir, const char *name, const void *a, size_t a_bytes, const void *b,
                                size_t b_bytes, uint64_t *hash) {
    char path[4200];
    int fd = open_new_file(dir, name, path, sizeof path);
    if (fd < 0) return false;
    xxh64_state h;
    xxh64_init(&h, 0);
    xxh64_update(&h, a, a_bytes);
    xxh64_update(&h, b, b_bytes);
    *hash = xxh64_digest(&h);
    return finish_file(fd, write_exact(fd, a, a_bytes) && write_exact(fd, b, b_bytes));
}

// The spike guard's window (llmc/guard.h), absent in checkpoints without one: empty then.
static bool read_spike_window(const json_value *root, spike_window *w) {
    memset(w, 0, sizeof *w);
    const json_value *size = json_get(root, "spike_window"), *count = json_get(root, "spike_count");
    const json_value *loss = json_get(root, "spike_loss"), *norm = json_get(root, "spike_grad_norm");
    if (!size && !count && !loss && !norm) return true;
    if (!size || !count || !loss || !norm || size->type != JSON_NUMBER || !size->is_integer || size->integer < 1 ||
        size->integer > SPIKE_WINDOW_MAX || count->type != JSON_NUMBER || !count->is_integer || count->integer < 0 ||
        count->integer > ((int64_t)1 << 53) || loss->type != JSON_ARRAY || norm->type != JSON_ARRAY)
        return false;
    int64_t n = count->integer < size->integer ? count->integer : size->integer;
    if ((int64_t)loss->count != n || (int64_t)norm->count != n) return false;
    for (int64_t i = 0; i < n; i++) {
        if (loss->items[i].type != JSON_NUMBER || norm->items[i].type != JSON_NUMBER) return false;
        // As spike_push keeps them: positive and finite. (A count near 2^63 overflowed at the next
        // push and wrote outside the window; a 0 made every step a spike, blamed on training.)
        double l = loss->items[i].number, g = norm->items[i].number;
        if (!(l > 0.0 && l <= DBL_MAX) || !(g > 0.0 && g <= DBL_MAX)) return false;
        w->loss[i] = l;
        w->grad_norm[i] = g;
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
    if (s->data_id.tokens > 0)
        sb_printf(&sb, "  \"data_tokens\": %lld,\n  \"data_shards\": %lld,\n  \"data_fingerprint\": \"%016llx\",\n",
                  (long long)s->data_id.tokens, (long long)s->data_id.shards, (unsigned long long)s->data_id.fingerprint);
    if (s->merge_step > 0) sb_printf(&sb, "  \"outer_merge_step\": %lld,\n", (long long)s->merge_step);
    if (s->merge_step > 0 && s->merge_fragments > 0)
        sb_printf(&sb, "  \"outer_merge_fragment\": %lld,\n  \"outer_merge_fragments\": %lld,\n",
                  (long long)s->merge_fragment, (long long)s->merge_fragments);
    if (s->restart_step > 0) sb_printf(&sb, "  \"outer_restart_step\": %lld,\n", (long long)s->restart_step);
    if (s->rollbacks > 0) sb_printf(&sb, "  \"rollbacks\": %lld,\n", (long long)s->rollbacks);
    if (s->norm_spikes > 0) sb_printf(&sb, "  \"norm_spikes\": %lld,\n", (long long)s->norm_spikes);
    if (s->loss_spikes > 0) sb_printf(&sb, "  \"loss_spikes\": %lld,\n", (long long)s->loss_spikes);
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
    sb_json_string_bytes(&sb, config_text);   // read back and compared (train_data): exact bytes
    sb_append(&sb, "\n}\n");
    free(config_text);
    return sb.data;
}

// ---------------------------------------------------------------- save

// Whether a directory entry is the name a save gives step N: PREFIX then N as %08lld (step_N,
// .tmp-step_N), N into *step. Only that spelling: step_0008 and step_00000008 would both be step
// 8, in no defined order, and pruning once deleted the checkpoint just written for the other.
static bool canonical_step(const char *name, const char *prefix, int64_t *step) {
    size_t n = strlen(prefix);
    if (strncmp(name, prefix, n) != 0) return false;
    size_t digits = strlen(name + n);
    if (digits < 8 || digits > 16 || strspn(name + n, "0123456789") != digits) return false;
    char again[64];
    long long v = strtoll(name + n, NULL, 10);   // at most 16 digits: no overflow
    snprintf(again, sizeof again, "%s%08lld", prefix, v);
    if (strcmp(again, name) != 0) return false;   // a leading zero beyond the eight
    *step = v;
    return true;
}

// The .tmp-step_N directories of saves that never committed (the process was killed while it
// wrote; SLURM's SIGKILL after its grace time hits a save at the walltime signal): nothing
// reads them, and each is a whole checkpoint's size (168 GB at 14B). Removed before each save
// writes anything, by the job's only writer of out_dir (checkpoint_lock_out_dir): removed only
// after a commit, a leftover on a disk or quota with room for ckpt_keep + 1 checkpoints made
// every later save fail for want of its space, so that none ever committed.
static void remove_stale_temps(const char *out_dir) {
    DIR *d = opendir(out_dir);
    if (!d) return;
    char path[4200];
    for (struct dirent *e; (e = readdir(d));) {
        const char *n = e->d_name;
        int64_t step;
        if (!canonical_step(n, ".tmp-step_", &step)) continue;   // not a save's: not ours to remove
        snprintf(path, sizeof path, "%s/%s", out_dir, n);
        warn("removing '%s', a checkpoint that was never finished (its process stopped while writing it)", path);
        remove_tree(path);
    }
    closedir(d);
}

// Renames the finished tmp_dir to final_dir and syncs out_dir; false (warned, tmp_dir
// removed where it is still there) on failure.
static bool commit_dir(const char *tmp_dir, const char *final_dir, const char *out_dir) {
    if (dir_exists(final_dir)) {
        // Only reachable when a newer checkpoint was skipped as corrupt on resume: keep it
        // for inspection rather than delete it. (A rollback moves the checkpoints newer than
        // its target aside itself, as step_N.rolled-back: checkpoint_set_aside_after. Before
        // 2026-12 they stayed, and the run's second pass over their steps landed here.)
        char aside[4200];
        snprintf(aside, sizeof aside, "%s.replaced-%lld", final_dir, (long long)time(NULL));
        for (int k = 2; dir_exists(aside) && k < 1000; k++)   // twice in one second
            snprintf(aside, sizeof aside, "%s.replaced-%lld-%d", final_dir, (long long)time(NULL), k);
        if (rename(final_dir, aside) != 0) {
            warn("cannot move the old '%s' aside: %s", final_dir, strerror(errno));
            remove_tree(tmp_dir);
            return false;
        }
        warn("an older '%s' was moved to '%s'", final_dir, aside);
    }
    if (rename(tmp_dir, final_dir) != 0 || !fsync_dir(out_dir)) {
        warn("cannot commit checkpoint '%s': %s", final_dir, strerror(errno));
        if (dir_exists(tmp_dir)) remove_tree(tmp_dir);
        return false;
    }
    return true;
}

// The split the buffers are in: b->shard, or (NULL) the whole model, built into *whole
// (shard_map_free it after).
static const shard_map *split_of(const model_buffers *b, shard_map *whole) {
    memset(whole, 0, sizeof *whole);
    if (b->shard) return b->shard;
    shard_map_build(whole, b->table, 0, 1);
    return whole;
}

// Whether every rank of the job says ok (one collective, the same answer on every rank);
// one process: ok.
static bool all_ok(const model_buffers *b, bool ok) { return b->job ? comm_max(b->job, ok ? 0.0 : 1.0) == 0.0 : ok; }
static bool is_root(const model_buffers *b) { return !b->job || comm_rank(b->job) == 0; }

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

// ok, or a warning on this process (a job's rank prefixes its number) naming the file and the
// error: the one line that says where a save failed, whichever rank it failed on.
static bool said(bool ok, const char *verb, const char *dir, const char *file) {
    if (!ok) warn("cannot %s checkpoint file '%s/%s': %s", verb, dir, file, strerror(errno));
    return ok;
}

// DIR/FILE of a job: rank 0 creates it with its header and full size, then every writer
// writes its pieces at their offsets (the XXH64 is rank 0's, later, from the file).
static bool write_table_pieces(const model_buffers *b, const char *dir, const char *file, const table_file *tf) {
    char (*names)[160];
    st_tensor_out *out = table_tensors(tf, false, &names);
    size_t header_bytes;
    char *header = safetensors_header(out, tf->t->count * tf->kinds, tf->meta_keys, tf->meta_values, tf->meta_count,
                                      &header_bytes);
    free(names);
    free(out);
    uint64_t total = header_bytes + (uint64_t)tf->t->numel * 4 * (uint64_t)tf->kinds;
    char path[4200];
    bool ok = true;
    if (is_root(b)) {
        int fd = open_new_file(dir, file, path, sizeof path);
        ok = said(fd >= 0 && finish_file(fd, write_exact(fd, header, header_bytes) && ftruncate(fd, (off_t)total) == 0),
                  "write", dir, file);
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
        ok = said(fd >= 0 && finish_file(fd, io.ok), "write", dir, file);
    }
    return all_ok(b, ok);
}

// One table file: one process streams it and hashes it on the way; a job writes pieces.
static bool write_table(const model_buffers *b, const char *dir, const char *file, const table_file *tf,
                        uint64_t *hash) {
    if (b->job) return write_table_pieces(b, dir, file, tf);
    char path[4200];
    int fd = open_new_file(dir, file, path, sizeof path);
    return said(fd >= 0 && finish_file(fd, write_table_fd(fd, tf, hash)), "write", dir, file);
}

bool checkpoint_save(const char *out_dir, const model_buffers *b, const train_state *s, const train_config *cfg) {
    bool root = is_root(b);
    shard_map whole;
    int64_t n = split_of(b, &whole)->local_numel;
    shard_map_free(&whole);
    bool finite = all_finite(b->params, n) && all_finite(b->exp_avg, n) && all_finite(b->exp_avg_sq, n);
    if (b->outer_theta) finite = finite && all_finite(b->outer_theta, n) && all_finite(b->outer_momentum, n);
    if (!all_ok(b, finite)) {
        if (root) warn("not saving checkpoint at step %lld: the weights or moments hold NaN/Inf", (long long)s->step);
        return false;
    }
    char final_dir[4096], tmp_dir[4096];
    snprintf(final_dir, sizeof final_dir, "%s/step_%08lld", out_dir, (long long)s->step);
    snprintf(tmp_dir, sizeof tmp_dir, "%s/.tmp-step_%08lld", out_dir, (long long)s->step);
    bool ok = true;
    if (root) {
        remove_stale_temps(out_dir);   // this step's own too; the collective below holds the others
        ok = make_dirs(out_dir) && mkdir(tmp_dir, 0755) == 0;
        if (!ok) warn("cannot create checkpoint directory '%s': %s", tmp_dir, strerror(errno));
    }
    if (!all_ok(b, ok)) return false;

    char *config_json = model_config_to_json(&b->table->cfg);
    char adam_text[32], outer_text[32];
    snprintf(adam_text, sizeof adam_text, "%lld", (long long)s->adam_step);
    snprintf(outer_text, sizeof outer_text, "%lld", (long long)s->outer_step);
    float *moments[] = {b->exp_avg, b->exp_avg_sq};
    float *outer[] = {b->outer_theta, b->outer_momentum, b->outer_residual};
    table_file tables[] = {  // CHECKPOINT_FILES' order; state.json (2) is no table
        model_table(b->table, &b->params, config_json),
        {b->table, 2, MOMENT_PREFIXES, moments, {"optimizer", "adam_step"}, {"AdamW", adam_text}, 2},
        {0},
        {b->table, b->outer_residual ? 3 : 2, OUTER_PREFIXES, outer, {"optimizer", "outer_step"},
         {"DiLoCo outer Nesterov SGD", outer_text}, 2},
    };
    int files = b->outer_theta || b->outer_elsewhere ? OUTER_FILE + 1 : N_REQUIRED_FILES;  // the table files + state.json
    uint64_t hashes[N_CHECKPOINT_FILES];
    for (int i = 0; ok && i < files; i++) {
        if (i == 2) continue;
        ok = write_table(b, tmp_dir, CHECKPOINT_FILES[i], &tables[i], &hashes[i]);
        if (ok && i == 0 && root) maybe_inject_fault(s->step);
    }
    free(config_json);
    bool reducer = ok && root && b->reducer_head && b->outer_theta;
    if (reducer)
        ok = said(write_two_part_file(tmp_dir, CHECKPOINT_FILES[REDUCER_FILE], b->reducer_head, b->reducer_head_bytes,
                                      b->reducer_body, b->reducer_body_bytes, &hashes[REDUCER_FILE]),
                  "write", tmp_dir, CHECKPOINT_FILES[REDUCER_FILE]);
    // Rank 0 finishes as one process does; a job's table files are hashed from disk (one read).
    if (ok && root) {
        char *state_json = state_to_json(s, cfg);
        ok = said(write_text_file(tmp_dir, "state.json", state_json, &hashes[2]), "write", tmp_dir, "state.json");
        free(state_json);
        char path[4200];
        for (int i = 0; ok && b->job && i < files; i++) {
            if (i == 2) continue;
            snprintf(path, sizeof path, "%s/%s", tmp_dir, CHECKPOINT_FILES[i]);
            ok = said(hash_file(path, &hashes[i]), "read back", tmp_dir, CHECKPOINT_FILES[i]);
        }
        if (ok) {
            strbuf sums = {0};
            for (int i = 0; i < files; i++)
                sb_printf(&sums, "%016llx  %s\n", (unsigned long long)hashes[i], CHECKPOINT_FILES[i]);
            if (reducer)
                sb_printf(&sums, "%016llx  %s\n", (unsigned long long)hashes[REDUCER_FILE],
                          CHECKPOINT_FILES[REDUCER_FILE]);
            ok = said(write_text_file(tmp_dir, "checksums.xxh64", sums.data, NULL), "write", tmp_dir, "checksums.xxh64");
            sb_free(&sums);
        }
        ok = ok && said(fsync_dir(tmp_dir), "sync", tmp_dir, ".");
    }
    if (!all_ok(b, ok)) {
        if (root) {
            // Where it failed is the warning before this one (on the rank it failed on).
            warn("checkpoint at step %lld failed (see the line naming the file; the previous checkpoints are untouched)",
                 (long long)s->step);
            if (fault_requested("slow_ckpt_cleanup", s->step)) slow_cleanup();
            remove_tree(tmp_dir);
        }
        // The others wait for that: a rank that returned at once could fail() and exit, and a
        // launcher that ends a job at its first failed process (srun --kill-on-bad-exit) then
        // killed rank 0 amid the removal, leaving the tmp for every later save to trip on.
        all_ok(b, true);
        return false;
    }
    return all_ok(b, !root || commit_dir(tmp_dir, final_dir, out_dir));
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

// Whether the file at path, NAME in the messages, hashes to expected; false with the one-line
// reason in why.
static bool file_matches(const char *path, const char *name, uint64_t expected, char *why, size_t why_bytes) {
    uint64_t actual;
    if (!hash_file(path, &actual)) {
        snprintf(why, why_bytes, "cannot read %s: %s", name, strerror(errno));
        return false;
    }
    if (actual != expected) {
        snprintf(why, why_bytes, "%s fails its checksum (corrupt or modified)", name);
        return false;
    }
    return true;
}

// One line of checksums.xxh64 (`xxhsum -H64`: 16 hex digits, two spaces, the name): true with
// the XXH64 in *value and the name in name[256].
static bool parse_checksum_line(const char *line, uint64_t *value, char name[256]) {
    char hex[17];
    int consumed = 0;
    if (sscanf(line, "%16[0-9a-f]  %255s%n", hex, name, &consumed) != 2 || strlen(hex) != 16 || line[consumed] != '\0')
        return false;
    *value = strtoull(hex, NULL, 16);
    return true;
}

// Checks the files of `hash` (a mask of CHECKPOINT_FILES: ALL_FILES, WEIGHTS_AND_STATE) that
// checksums.xxh64 lists, and that it lists the required ones and nothing else; *has_outer and
// *has_reducer (may be NULL) tell whether outer.safetensors and outer_reducer.bin are listed.
static bool verify_checksums(const char *dir, unsigned hash, bool *has_outer, bool *has_reducer, char *why,
                             size_t why_bytes) {
    char path[4200];
    size_t bytes;
    char *text = read_checkpoint_file(dir, "checksums.xxh64", &bytes, why, why_bytes);
    if (!text) return false;
    bool seen[N_CHECKPOINT_FILES] = {false};
    bool ok = true;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); ok && line; line = strtok_r(NULL, "\n", &save)) {
        char name[256];
        uint64_t expected;
        if (!parse_checksum_line(line, &expected, name)) {
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
        snprintf(path, sizeof path, "%s/%s", dir, name);
        if (hash & (1u << which)) ok = file_matches(path, name, expected, why, why_bytes);
    }
    free(text);
    *has_outer = seen[OUTER_FILE];
    if (has_reducer) *has_reducer = seen[REDUCER_FILE];
    for (int i = 0; ok && i < N_REQUIRED_FILES; i++)
        if (!seen[i]) {
            snprintf(why, why_bytes, "checksums.xxh64 does not cover %s", CHECKPOINT_FILES[i]);
            ok = false;
        }
    return ok;
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

// "[a,b,...]": a tensor's shape of any rank as the error lines print it.
static const char *shape_text(char *out, size_t out_bytes, int ndim, const int64_t *shape) {
    size_t at = (size_t)snprintf(out, out_bytes, "[");
    for (int d = 0; d < ndim && at < out_bytes; d++)
        at += (size_t)snprintf(out + at, out_bytes - at, "%s%lld", d ? "," : "", (long long)shape[d]);
    if (at < out_bytes) snprintf(out + at, out_bytes - at, "]");
    return out;
}

// Every tensor of the table from f, named prefix + table name: the values split holds, into
// local (the whole model's flat buffer when split is one rank's).
static bool read_table(const st_file *f, const shard_map *split, const char *prefix, float *local, char *why,
                       size_t why_bytes) {
    const param_table *t = split->table;
    if (split->ranks > 1) memset(local, 0, (size_t)split->local_numel * sizeof(float));  // the padding
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
            char have[200], want[64];
            snprintf(why, why_bytes, "tensor '%s' has shape %s, the config needs %s", name,
                     shape_text(have, sizeof have, e->ndim, e->shape), shape_text(want, sizeof want, p->ndim, p->shape));
            return false;
        }
        read_io io = {f, e, local, p->offset, true};
        shard_visit(split, p->offset, p->offset + p->numel, read_stretch, &io);
        if (!io.ok) {
            snprintf(why, why_bytes, "cannot read tensor '%s': %s", name, strerror(errno));
            return false;
        }
    }
    return true;
}

// After every expected tensor was found by name (names are unique in a file): whether f holds
// no other. A tensor the config does not use would be dropped without a word.
static bool holds_only(const st_file *f, const char *file, int expected, char *why, size_t why_bytes) {
    if (f->count == expected) return true;
    snprintf(why, why_bytes, "%s holds %d tensors, the config needs %d", file, f->count, expected);
    return false;
}

// The checkpoint's architecture must be the config's; other model keys only warn.
// warn_others: warn when a non-shape key differs (a resume; init_from is where a run changes them).
static bool check_model_config(const st_file *f, const model_config *want, bool warn_others, char *why,
                               size_t why_bytes) {
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
    // The keys that differ, named with both values (init_std is left out: it only draws the
    // first weights; it once made this line name six keys, none of which had changed).
    if (warn_others && !model_config_equal(&have, want)) {
        strbuf keys = {0};
        sb_append(&keys, "");
        if (have.seq_len != want->seq_len)
            sb_printf(&keys, ", seq_len %lld -> %lld", (long long)have.seq_len, (long long)want->seq_len);
        if (have.rope_theta != want->rope_theta)
            sb_printf(&keys, ", rope_theta %g -> %g", have.rope_theta, want->rope_theta);
        if (have.nope_every != want->nope_every)
            sb_printf(&keys, ", nope_every %lld -> %lld", (long long)have.nope_every, (long long)want->nope_every);
        if (have.norm_eps != want->norm_eps) sb_printf(&keys, ", norm_eps %g -> %g", have.norm_eps, want->norm_eps);
        if (have.doc_masking != want->doc_masking)
            sb_printf(&keys, ", doc_masking %d -> %d", (int)have.doc_masking, (int)want->doc_masking);
        if (have.doc_token != want->doc_token)
            sb_printf(&keys, ", doc_token %lld -> %lld", (long long)have.doc_token, (long long)want->doc_token);
        if (keys.data[0])
            warn("the checkpoint's model config differs from the config in %s (checkpoint -> config); continuing "
                 "with the config's values",
                 keys.data + 2);
        sb_free(&keys);
    }
    return true;
}

// DIR's state.json, parsed and checked to be this version's; the caller frees doc.
static bool parse_state(const char *dir, json_doc *doc, char *why, size_t why_bytes) {
    size_t bytes;
    char *text = read_checkpoint_file(dir, "state.json", &bytes, why, why_bytes);
    if (!text) return false;
    bool ok = json_parse(text, bytes, doc);
    free(text);
    if (!ok) {
        snprintf(why, why_bytes, "state.json: %s", doc->error);
        return false;
    }
    const json_value *format = json_get(&doc->root, "format"), *version = json_get(&doc->root, "version");
    if (!format || format->type != JSON_STRING || strcmp(format->string, STATE_FORMAT) != 0 || !version ||
        !version->is_integer || version->integer != STATE_VERSION) {
        snprintf(why, why_bytes, "state.json is not a version-%d train_gpt state", STATE_VERSION);
        json_free(doc);
        return false;
    }
    return true;
}

typedef struct {
    const char *key;
    int64_t *field;
} int_field;

// Each field from the integer in [0, 2⁵³] at its key of root (a count no run reaches beyond, and
// far enough from int64's end that the arithmetic on it cannot overflow); false naming the
// first that is not.
static bool read_int_fields(const json_value *root, const int_field *f, size_t n, char *why, size_t why_bytes) {
    for (size_t i = 0; i < n; i++) {
        const json_value *v = json_get(root, f[i].key);
        if (!v || v->type != JSON_NUMBER || !v->is_integer || v->integer < 0 || v->integer > ((int64_t)1 << 53)) {
            snprintf(why, why_bytes, "state.json: bad or missing '%s'", f[i].key);
            return false;
        }
        *f[i].field = v->integer;
    }
    return true;
}

// An optional integer at key of root into *out: absent, dflt; present, an integer in [lo, hi] or
// false naming the key (a value outside what a save writes is a corrupt or hand-edited file, not
// "not recorded": read as absent, it would resume on another data position or fragment).
static bool read_optional_int(const json_value *root, const char *key, int64_t lo, int64_t hi, int64_t dflt,
                              int64_t *out, char *why, size_t why_bytes) {
    const json_value *v = json_get(root, key);
    if (!v) {
        *out = dflt;
        return true;
    }
    if (v->type != JSON_NUMBER || !v->is_integer || v->integer < lo || v->integer > hi) {
        snprintf(why, why_bytes, "state.json: '%s' is not an integer in %lld .. %lld", key, (long long)lo,
                 (long long)hi);
        return false;
    }
    *out = v->integer;
    return true;
}

static bool config_text_value(const char *text, const char *key, char *out, size_t out_bytes);

// The loader's keys a save wrote beside the position; batch_size 0 where they are not all there
// or not all within the config's bounds.
static void read_window(const json_value *root, data_window *w) {
    const char *keys[3] = {"batch_size", "seq_len", "seed"};
    int64_t *fields[3] = {&w->batch_size, &w->seq_len, &w->seed};
    memset(w, 0, sizeof *w);
    for (int i = 0; i < 3; i++) {
        const json_value *v = json_get(root, keys[i]);
        if (!v || v->type != JSON_NUMBER || !v->is_integer) return;
        *fields[i] = v->integer;
    }
    const json_value *shuffle = json_get(root, "shuffle");
    if (!shuffle || shuffle->type != JSON_BOOL || w->batch_size < 1 || w->batch_size > (1 << 20) || w->seq_len < 1 ||
        w->seq_len > (1 << 22) || w->seed < 0) {
        w->batch_size = 0;
        return;
    }
    w->shuffle = shuffle->boolean;
}

// The train data a save recorded (absent in checkpoints from before 2026-12: tokens 0); false
// when present but malformed.
static bool read_data_identity(const json_value *root, data_identity *id) {
    memset(id, 0, sizeof *id);
    const json_value *tokens = json_get(root, "data_tokens"), *shards = json_get(root, "data_shards"),
                     *fingerprint = json_get(root, "data_fingerprint");
    if (!tokens && !shards && !fingerprint) return true;
    if (!tokens || !shards || !fingerprint || tokens->type != JSON_NUMBER || !tokens->is_integer ||
        tokens->integer < 1 || shards->type != JSON_NUMBER || !shards->is_integer || shards->integer < 1 ||
        fingerprint->type != JSON_STRING || strlen(fingerprint->string) != 16 ||
        strspn(fingerprint->string, "0123456789abcdef") != 16)
        return false;
    id->tokens = tokens->integer;
    id->shards = shards->integer;
    id->fingerprint = strtoull(fingerprint->string, NULL, 16);
    return true;
}

static bool state_from_json(const json_value *root, train_state *s, char *why, size_t why_bytes) {
    const int_field fields[] = {{"step", &s->step},         {"adam_step", &s->adam_step},
                                {"data_epoch", &s->data.epoch}, {"data_index", &s->data.index},
                                {"bad_steps", &s->bad_steps}, {"tokens_seen", &s->tokens_seen}};
    if (!read_int_fields(root, fields, sizeof fields / sizeof fields[0], why, why_bytes)) return false;
    if (s->data.epoch > ((int64_t)1 << 31) || s->data.index > ((int64_t)1 << 40)) {  // × batches or rows per epoch
        snprintf(why, why_bytes, "state.json: data_epoch %lld / data_index %lld out of range", (long long)s->data.epoch,
                 (long long)s->data.index);
        return false;
    }
    const int64_t big = (int64_t)1 << 53;
    // Absent in checkpoints written before DiLoCo existed. Only while a streaming DiLoCo fragment
    // has landed and not yet merged: outer_merge_step, and which fragment (absent before 2026-12:
    // diloco.c then takes the schedule's at that step). Only once a DiLoCo replica took a state or
    // rolled back (diloco.h): outer_restart_step. The processes the data was split over: data_world
    // (absent: not recorded).
    if (!read_optional_int(root, "outer_step", 0, big, 0, &s->outer_step, why, why_bytes) ||
        !read_optional_int(root, "outer_merge_step", 0, big, 0, &s->merge_step, why, why_bytes) ||
        !read_optional_int(root, "outer_merge_fragments", 1, 1 << 20, 0, &s->merge_fragments, why, why_bytes) ||
        !read_optional_int(root, "outer_merge_fragment", 0, s->merge_fragments > 0 ? s->merge_fragments - 1 : 0, 0,
                           &s->merge_fragment, why, why_bytes) ||
        !read_optional_int(root, "outer_restart_step", 0, big, 0, &s->restart_step, why, why_bytes) ||
        !read_optional_int(root, "data_world", 1, 1 << 24, 0, &s->data_world, why, why_bytes))
        return false;
    if ((json_get(root, "outer_merge_fragment") != NULL) != (s->merge_fragments > 0) ||
        (s->merge_fragments > 0 && s->merge_step == 0)) {
        snprintf(why, why_bytes,
                 "state.json: outer_merge_fragment and outer_merge_fragments go together, with outer_merge_step");
        return false;
    }
    if (s->restart_step > s->step) {
        snprintf(why, why_bytes, "state.json: outer_restart_step %lld is after step %lld", (long long)s->restart_step,
                 (long long)s->step);
        return false;
    }
    if (!read_data_identity(root, &s->data_id)) {
        snprintf(why, why_bytes, "state.json: bad data_tokens / data_shards / data_fingerprint");
        return false;
    }
    // Counts, absent when none (loss_spikes before 2026-12: not counted).
    if (!read_optional_int(root, "rollbacks", 0, big, 0, &s->rollbacks, why, why_bytes) ||
        !read_optional_int(root, "norm_spikes", 0, big, 0, &s->norm_spikes, why, why_bytes) ||
        !read_optional_int(root, "loss_spikes", 0, big, 0, &s->loss_spikes, why, why_bytes))
        return false;
    if (!read_spike_window(root, &s->spikes)) {
        snprintf(why, why_bytes,
                 "state.json: bad spike_window / spike_count / spike_loss / spike_grad_norm (a window of 1 .. %d, a "
                 "count of 0 .. 2^53, min(count, window) positive finite values in each list)",
                 SPIKE_WINDOW_MAX);
        return false;
    }
    read_window(root, &s->window);
    const json_value *config = json_get(root, "config");
    char max_steps[32] = "0";
    if (config && config->type == JSON_STRING)
        config_text_value(config->string, "max_steps", max_steps, sizeof max_steps);
    s->saved_max_steps = max_i64(strtoll(max_steps, NULL, 10), 0);
    return true;
}

static bool read_state(const char *dir, train_state *s, char *why, size_t why_bytes) {
    json_doc doc;
    if (!parse_state(dir, &doc, why, why_bytes)) return false;
    bool ok = state_from_json(&doc.root, s, why, why_bytes);
    json_free(&doc);
    return ok;
}

// The value of KEY in config_to_text's "key = value" lines, quotes removed; false if absent.
static bool config_text_value(const char *text, const char *key, char *out, size_t out_bytes) {
    size_t n = strlen(key);
    for (const char *line = text; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        if (strncmp(line, key, n) != 0 || strncmp(line + n, " = ", 3) != 0) continue;
        const char *v = line + n + 3, *end = strchr(v, '\n');
        size_t len = end ? (size_t)(end - v) : strlen(v);
        if (len >= 2 && v[0] == '"' && v[len - 1] == '"') {
            v++;
            len -= 2;
        }
        snprintf(out, out_bytes, "%.*s", (int)len, v);
        return true;
    }
    return false;
}

int checkpoint_config_changes(const char *dir, const train_config *cfg, const char *const *keys, int n_keys, char *out,
                              size_t out_bytes) {
    out[0] = '\0';
    json_doc doc;
    char why[256];
    if (!parse_state(dir, &doc, why, sizeof why)) return 0;
    const json_value *saved = json_get(&doc.root, "config");
    int changed = 0;
    if (saved && saved->type == JSON_STRING) {
        char *now = config_to_text(cfg);
        size_t at = 0;
        for (int i = 0; i < n_keys; i++) {
            char was[256], is[256];
            if (!config_text_value(saved->string, keys[i], was, sizeof was) ||
                !config_text_value(now, keys[i], is, sizeof is) || strcmp(was, is) == 0)
                continue;
            if (at < out_bytes) {   // else cut (snprintf's), still counted
                int n = snprintf(out + at, out_bytes - at, "%s%s %s → %s", changed ? "; " : "", keys[i], was, is);
                at += n > 0 ? (size_t)n : 0;
            }
            changed++;
        }
        free(now);
    }
    json_free(&doc);
    return changed;
}

bool checkpoint_config_value(const char *dir, const char *key, char *out, size_t out_bytes) {
    json_doc doc;
    char why[256];
    out[0] = '\0';
    if (!parse_state(dir, &doc, why, sizeof why)) return false;
    const json_value *saved = json_get(&doc.root, "config");
    bool found = saved && saved->type == JSON_STRING && config_text_value(saved->string, key, out, out_bytes);
    json_free(&doc);
    return found;
}

// The step DIR's last component names when it is a save's name (step_%08lld); -1 for any other
// name (a directory the user named for resume).
static int64_t step_of_name(const char *dir) {
    char path[4200];
    snprintf(path, sizeof path, "%s", dir);
    for (size_t n = strlen(path); n > 1 && path[n - 1] == '/'; n--) path[n - 1] = '\0';
    const char *slash = strrchr(path, '/');
    int64_t step;
    return canonical_step(slash ? slash + 1 : path, "step_", &step) ? step : -1;
}

// false (why says so) when DIR's name is a save's name of another step than its state.json's:
// a copy under another step's name, which would be resumed (or taken by init_from) as one step
// and train from another, and ckpt_keep would order by the wrong one.
static bool named_for_step(const char *dir, int64_t step, char *why, size_t why_bytes) {
    int64_t named = step_of_name(dir);
    if (named < 0 || named == step) return true;
    snprintf(why, why_bytes, "its name says step %lld, its state.json says step %lld (a copied or renamed checkpoint)",
             (long long)named, (long long)step);
    return false;
}

// checkpoint_data_origin of one process: the weights and state.json verified, state.json read.
static bool read_data_origin(const char *dir, data_origin *o, char *why, size_t why_bytes) {
    memset(o, 0, sizeof *o);
    bool has_outer;
    json_doc doc;
    if (!verify_checksums(dir, WEIGHTS_AND_STATE, &has_outer, NULL, why, why_bytes) ||
        !parse_state(dir, &doc, why, why_bytes))
        return false;
    train_state s;
    memset(&s, 0, sizeof s);
    bool ok = state_from_json(&doc.root, &s, why, why_bytes);
    o->step = s.step;
    o->data = s.data;
    o->data_world = s.data_world > 0 ? s.data_world : 1;
    o->window = s.window;
    o->data_id = s.data_id;
    if (ok && s.window.batch_size == 0) {
        snprintf(why, why_bytes, "state.json: bad or missing batch_size, seq_len, seed or shuffle");
        ok = false;
    }
    ok = ok && named_for_step(dir, s.step, why, why_bytes);   // as a resume refuses it (load_verified)
    const json_value *config = json_get(&doc.root, "config");
    if (ok && config && config->type == JSON_STRING)
        config_text_value(config->string, "train_data", o->train_data, sizeof o->train_data);
    json_free(&doc);
    return ok;
}

// Rank 0's verdict (ok, and why when not) given to every rank of job (NULL: this process's own).
static bool share_verdict(const comm *job, bool ok, char *why, size_t why_bytes) {
    if (!job) return ok;
    char verdict[513];
    verdict[0] = (char)ok;
    snprintf(verdict + 1, sizeof verdict - 1, "%s", ok ? "" : why);
    comm_broadcast(job, verdict, sizeof verdict, 0);
    if (!verdict[0]) snprintf(why, why_bytes, "%s", verdict + 1);
    return verdict[0] != 0;
}

// Rank 0 reads and verifies, every rank gets its answer: every rank hashing the checkpoint
// read it once per rank (8 × 168-336 GB a node at 14B) before the first step.
bool checkpoint_data_origin(const char *dir, const comm *job, data_origin *o, char *why, size_t why_bytes) {
    bool ok = true;
    memset(o, 0, sizeof *o);
    if (!job || comm_rank(job) == 0) ok = read_data_origin(dir, o, why, why_bytes);
    if (!share_verdict(job, ok, why, why_bytes)) return false;
    if (job) comm_broadcast(job, o, sizeof *o, 0);
    return true;
}

// The line of checksums.xxh64 in DIR for NAME: 1 with its XXH64 in *expected; 0 when there is
// none (no such file, or no line for the name); -1 (errno set) when the file cannot be read; -2
// when the line that names NAME (its end, a CR aside) is not one xxhsum -H64 writes: not
// "unlisted". Lines of other names this parser does not read (a space in the name) are not its.
static int listed_checksum(const char *dir, const char *name, uint64_t *expected) {
    char path[4300];
    size_t bytes;
    snprintf(path, sizeof path, "%s/checksums.xxh64", dir);
    char *text = read_file_or_null(path, &bytes);
    if (!text) return errno == ENOENT ? 0 : -1;
    int found = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line && found == 0; line = strtok_r(NULL, "\n", &save)) {
        char listed[256];
        uint64_t value;
        if (!parse_checksum_line(line, &value, listed)) {
            size_t len = strlen(line), n = strlen(name);
            if (len > 0 && line[len - 1] == '\r') len--;
            if (len > n && strncmp(line + len - n, name, n) == 0 && line[len - n - 1] == ' ') found = -2;
        } else if (strcmp(listed, name) == 0) {
            found = 1;
            *expected = value;
        }
    }
    free(text);
    return found;
}

// checkpoint_verify_weights_file of one process.
static bool verify_weights_file(const char *path, char *why, size_t why_bytes) {
    char *real = realpath(path, NULL);   // a link's target: the checksums lie beside the file itself
    const char *file = real ? real : path;
    char dir[4200];
    snprintf(dir, sizeof dir, "%s", file);
    char *slash = strrchr(dir, '/');
    const char *name = slash ? slash + 1 : dir;
    char here[] = ".", top[] = "/";
    const char *in = slash == dir ? top : slash ? dir : here;
    if (slash) *slash = '\0';
    uint64_t expected;
    int listed = listed_checksum(in, name, &expected);
    if (listed == -1) snprintf(why, why_bytes, "cannot read the checksums.xxh64 beside it: %s", strerror(errno));
    if (listed == -2)
        snprintf(why, why_bytes, "the checksums.xxh64 beside it is malformed (each line: 16 hex digits, two spaces, "
                                 "a name)");
    bool ok = listed == 0 || (listed > 0 && file_matches(file, name, expected, why, why_bytes));
    free(real);
    return ok;
}

bool checkpoint_verify_weights_file(const char *path, const comm *job, char *why, size_t why_bytes) {
    bool ok = job && comm_rank(job) != 0 ? true : verify_weights_file(path, why, why_bytes);
    return share_verdict(job, ok, why, why_bytes);
}

static bool open_in(const char *dir, const char *file, st_file *f, char *why, size_t why_bytes) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    return safetensors_open(path, f, why, why_bytes);
}

// The tensors and state of a verified checkpoint: this process's values (split) of each.
static bool load_verified(const char *dir, const model_buffers *b, const shard_map *split, bool has_outer,
                          bool has_reducer, train_state *s, char *why, size_t why_bytes) {
    st_file f;
    if (!open_in(dir, "model.safetensors", &f, why, why_bytes)) return false;
    bool ok = check_model_config(&f, &b->table->cfg, true, why, why_bytes) && read_table(&f, split, "", b->params, why,
                                                                                  why_bytes);
    ok = ok && holds_only(&f, "model.safetensors", b->table->count, why, why_bytes);
    safetensors_close(&f);
    if (!ok || !open_in(dir, "optimizer.safetensors", &f, why, why_bytes)) return false;
    ok = read_table(&f, split, "exp_avg.", b->exp_avg, why, why_bytes) &&
         read_table(&f, split, "exp_avg_sq.", b->exp_avg_sq, why, why_bytes) &&
         holds_only(&f, "optimizer.safetensors", 2 * b->table->count, why, why_bytes);
    safetensors_close(&f);
    if (!ok || !read_state(dir, s, why, why_bytes)) return false;
    if (!named_for_step(dir, s->step, why, why_bytes)) return false;
    int64_t n = split->local_numel;
    if (!all_finite(b->params, n)) {
        snprintf(why, why_bytes, "the weights hold NaN/Inf");
        return false;
    }
    if (!all_finite(b->exp_avg, n) || !all_finite(b->exp_avg_sq, n)) {
        snprintf(why, why_bytes, "the AdamW moments hold NaN/Inf");
        return false;
    }
    for (int64_t i = 0; i < n; i++)
        if (b->exp_avg_sq[i] < 0.0f) {
            snprintf(why, why_bytes, "the AdamW second moment holds a negative value (%g)", (double)b->exp_avg_sq[i]);
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
        s->merge_fragment = s->merge_fragments = 0;
        s->restart_step = 0;
        return true;
    }
    if (!open_in(dir, "outer.safetensors", &f, why, why_bytes)) return false;
    ok = read_table(&f, split, "outer.theta.", b->outer_theta, why, why_bytes) &&
         read_table(&f, split, "outer.momentum.", b->outer_momentum, why, why_bytes);
    char first[160];
    snprintf(first, sizeof first, "outer.residual.%s", b->table->params[0].name);
    bool has_residual = safetensors_find(&f, first) != NULL;  // written without error feedback: none
    if (ok && b->outer_residual) {
        if (has_residual) ok = read_table(&f, split, "outer.residual.", b->outer_residual, why, why_bytes);
        else memset(b->outer_residual, 0, (size_t)n * sizeof(float));
    } else if (ok && has_residual) {  // not read (error feedback off now): still every one there
        for (int i = 0; ok && i < b->table->count; i++) {
            char name[160];
            snprintf(name, sizeof name, "outer.residual.%s", b->table->params[i].name);
            if (!safetensors_find(&f, name)) {
                snprintf(why, why_bytes, "tensor '%s' is missing", name);
                ok = false;
            }
        }
    }
    ok = ok && holds_only(&f, "outer.safetensors", (has_residual ? 3 : 2) * b->table->count, why, why_bytes);
    safetensors_close(&f);
    if (ok && (!all_finite(b->outer_theta, n) || !all_finite(b->outer_momentum, n))) {
        snprintf(why, why_bytes, "the outer state holds NaN/Inf");
        ok = false;
    }
    if (ok && has_reducer && b->reducer_load) {
        size_t bytes = 0;
        char *raw = read_checkpoint_file(dir, CHECKPOINT_FILES[REDUCER_FILE], &bytes, why, why_bytes);
        ok = raw && b->reducer_load(b->reducer_arg, (const uint8_t *)raw, bytes, why, why_bytes);
        free(raw);
    }
    return ok;
}

// A job: rank 0 reads every byte once against checksums.xxh64 and tells all its verdict;
// every rank reads its own pieces; a rank that failed tells all why (the lowest such rank).
bool checkpoint_load(const char *dir, const model_buffers *b, train_state *s, char *why, size_t why_bytes) {
    bool has_outer = false, has_reducer = false, ok = true;
    if (is_root(b)) ok = verify_checksums(dir, ALL_FILES, &has_outer, &has_reducer, why, why_bytes);
    if (b->job) {
        char verdict[514];
        verdict[0] = (char)ok;
        verdict[1] = (char)((has_outer ? 1 : 0) | (has_reducer ? 2 : 0));
        snprintf(verdict + 2, sizeof verdict - 2, "%s", ok ? "" : why);
        comm_broadcast(b->job, verdict, sizeof verdict, 0);
        ok = verdict[0] != 0;
        has_outer = (verdict[1] & 1) != 0;
        has_reducer = (verdict[1] & 2) != 0;
        if (!ok) snprintf(why, why_bytes, "%s", verdict + 2);
    }
    if (!ok) return false;
    shard_map whole;
    ok = load_verified(dir, b, split_of(b, &whole), has_outer, has_reducer, s, why, why_bytes);
    shard_map_free(&whole);
    if (!b->job) return ok;
    double failed_rank = comm_max(b->job, ok ? -1.0 : (double)(comm_size(b->job) - comm_rank(b->job)));
    if (failed_rank < 0) return true;
    int from = comm_size(b->job) - (int)failed_rank;
    char reason[512];
    snprintf(reason, sizeof reason, "%s", comm_rank(b->job) == from ? why : "");
    comm_broadcast(b->job, reason, sizeof reason, from);
    snprintf(why, why_bytes, "rank %d: %s", from, reason);
    return false;
}

// Checkpoint directories in out_dir, newest first. Names are step_%08lld only (canonical_step):
// one directory per step.
typedef struct {
    int64_t step;
    char path[4200];
} checkpoint_dir;

static int newer_first(const void *a, const void *b) {
    const checkpoint_dir *x = a, *y = b;
    return x->step > y->step ? -1 : x->step < y->step;
}

// The step_N directories of out_dir, newest first; 0 when out_dir does not exist, -1 (errno
// set) when it cannot be read — not "none": resume = auto would then start over beside them.
static int list_checkpoints(const char *out_dir, checkpoint_dir **out) {
    DIR *d = opendir(out_dir);
    *out = NULL;
    if (!d && errno != ENOENT) return -1;
    int count = 0, capacity = 0;
    checkpoint_dir *dirs = NULL;
    for (struct dirent *e; d && (e = readdir(d));) {
        const char *n = e->d_name;
        int64_t step;
        if (!canonical_step(n, "step_", &step)) continue;
        if (count == capacity) {
            capacity = capacity ? capacity * 2 : 16;
            dirs = xrealloc(dirs, (size_t)capacity * sizeof *dirs);
        }
        dirs[count].step = step;
        snprintf(dirs[count].path, sizeof dirs[count].path, "%s/%s", out_dir, n);
        if (dir_exists(dirs[count].path)) count++;
    }
    if (d) closedir(d);
    if (count > 1) qsort(dirs, (size_t)count, sizeof *dirs, newer_first);
    *out = dirs;
    return count;
}

// list_checkpoints for a decision: out_dir that cannot be read is fatal.
static int must_list(const char *out_dir, checkpoint_dir **out) {
    int count = list_checkpoints(out_dir, out);
    if (count < 0) fail("out_dir: cannot list '%s': %s (its checkpoints cannot be found)", out_dir, strerror(errno));
    return count;
}

// must_list for the ranks of a job, which share out_dir: rank 0's listing, given to every rank.
// Each listed its own: a shared file system's caches can show the nodes different directories
// right after a save or a prune (NFS keeps attributes up to a minute), and the ranks then tried
// different checkpoints in the same collective load — pieces of different steps, or one rank
// out of candidates while the others waited for it.
static int agreed_list(const char *out_dir, const comm *job, checkpoint_dir **out) {
    if (!job || comm_size(job) == 1) return must_list(out_dir, out);
    checkpoint_dir *dirs = NULL;
    int64_t count = comm_rank(job) == 0 ? must_list(out_dir, &dirs) : 0;
    comm_broadcast(job, &count, sizeof count, 0);
    int64_t *steps = xcalloc((size_t)(count > 0 ? count : 1), sizeof *steps);
    for (int64_t i = 0; dirs && i < count; i++) steps[i] = dirs[i].step;
    if (count > 0) comm_broadcast(job, steps, count * (int64_t)sizeof *steps, 0);
    if (comm_rank(job) != 0) {
        dirs = xcalloc((size_t)(count > 0 ? count : 1), sizeof *dirs);
        for (int64_t i = 0; i < count; i++) {
            dirs[i].step = steps[i];
            snprintf(dirs[i].path, sizeof dirs[i].path, "%s/step_%08lld", out_dir, (long long)steps[i]);
        }
    }
    free(steps);
    *out = dirs;
    return (int)count;
}

char *checkpoint_load_latest(const char *out_dir, const model_buffers *b, train_state *s) {
    return checkpoint_load_latest_every(out_dir, 0, INT64_MAX, b, s);
}

// The listing's checkpoints at or below max_step, in place, still newest first; their count.
static int at_or_below(checkpoint_dir *dirs, int count, int64_t max_step) {
    int kept = 0;
    for (int i = 0; i < count; i++)
        if (dirs[i].step <= max_step) dirs[kept++] = dirs[i];
    return kept;
}

char *checkpoint_load_latest_every(const char *out_dir, int64_t every, int64_t max_step, const model_buffers *b,
                                   train_state *s) {
    checkpoint_dir *dirs;
    int listed = agreed_list(out_dir, b->job, &dirs);   // sets dirs: a statement of its own, since
    int count = at_or_below(dirs, listed, max_step);    // an argument list has no order
    // Those on the grid first (a stable partition keeps them newest first), then the others.
    int on_grid = 0;
    for (int i = 0; every > 0 && i < count; i++)
        if (dirs[i].step % every == 0) {
            checkpoint_dir d = dirs[i];
            memmove(&dirs[on_grid + 1], &dirs[on_grid], (size_t)(i - on_grid) * sizeof *dirs);
            dirs[on_grid++] = d;
        }
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

int checkpoint_count(const char *out_dir, const comm *job) { return checkpoint_count_upto(out_dir, INT64_MAX, job); }

int checkpoint_count_upto(const char *out_dir, int64_t max_step, const comm *job) {
    checkpoint_dir *dirs;
    int count = agreed_list(out_dir, job, &dirs);
    count = at_or_below(dirs, count, max_step);
    free(dirs);
    return count;
}

void checkpoint_set_aside_after(const char *out_dir, int64_t step, const comm *job) {
    if (job && comm_rank(job) != 0) return;
    checkpoint_dir *dirs;
    int count = list_checkpoints(out_dir, &dirs), moved = 0;
    strbuf names = {0};
    for (int i = count - 1; i >= 0; i--) {   // oldest first, as the warning lists them
        if (dirs[i].step <= step) continue;
        char aside[4300];
        snprintf(aside, sizeof aside, "%s.rolled-back", dirs[i].path);
        for (int k = 2; dir_exists(aside) && k < 1000; k++)   // a second rollback past the same step
            snprintf(aside, sizeof aside, "%s.rolled-back-%d", dirs[i].path, k);
        if (rename(dirs[i].path, aside) != 0) {
            warn("cannot move '%s', written after the rollback's checkpoint, aside: %s (a resume may load it)",
                 dirs[i].path, strerror(errno));
            continue;
        }
        sb_printf(&names, "%s'%s'", moved++ ? ", " : "", aside);
    }
    if (moved > 0 && !fsync_dir(out_dir)) warn("cannot sync '%s': %s", out_dir, strerror(errno));
    if (moved > 0)
        warn("the rollback moved the %d checkpoint(s) written after step %lld aside, as %s: they hold the weights of "
             "the bad steps or lead to them, are no longer loaded, counted or pruned, and can be deleted",
             moved, (long long)step, names.data);
    sb_free(&names);
    free(dirs);
}

bool checkpoint_dir_writable(const char *out_dir, char *why, size_t why_bytes) {
    if (!make_dirs(out_dir)) {
        snprintf(why, why_bytes, "cannot create '%s': %s", out_dir, strerror(errno));
        return false;
    }
    char probe[4200];
    snprintf(probe, sizeof probe, "%s/.tmp-probe-XXXXXX", out_dir);  // unique whatever ranks share
    if (!mkdtemp(probe)) {
        snprintf(why, why_bytes, "cannot create a checkpoint directory in '%s': %s", out_dir, strerror(errno));
        return false;
    }
    rmdir(probe);
    return true;
}

int64_t checkpoint_newest_step(const char *out_dir, const comm *job) {
    checkpoint_dir *dirs;
    int count = agreed_list(out_dir, job, &dirs);
    int64_t step = count > 0 ? dirs[0].step : -1;
    free(dirs);
    return step;
}

void checkpoint_prune(const char *out_dir, int64_t keep, int64_t written) {
    if (keep <= 0) return;
    checkpoint_dir *dirs;
    int count = list_checkpoints(out_dir, &dirs), kept = 0;
    if (count < 0) warn("ckpt_keep: cannot list '%s' to prune it: %s", out_dir, strerror(errno));
    for (int i = 0; i < count; i++) {
        if (dirs[i].step > written) continue;  // not of this run's line: left alone, not counted
        if (kept < keep || dirs[i].step == written) kept++;   // the one just committed stays, whatever else
        else remove_tree(dirs[i].path);
    }
    free(dirs);
}

// ---------------------------------------------------------------- the out_dir lock

// The open description that holds OUT_DIR/.lock: the lock lasts as long as the process (a
// process writes checkpoints of one out_dir; locking another hands the first back).
static int lock_fd = -1;

// What OUT_DIR/.lock says of its holder ("pid N on host H"), into out.
static void lock_holder(int fd, char *out, size_t out_bytes) {
    ssize_t n = pread(fd, out, out_bytes - 1, 0);
    out[n > 0 ? n : 0] = '\0';
    out[strcspn(out, "\n")] = '\0';
    if (!out[0]) snprintf(out, out_bytes, "another process (it has not yet written its pid)");
}

void checkpoint_lock_out_dir(const char *out_dir, comm *job) {
    char why[600] = "";
    bool ok = true;
    if (!job || comm_rank(job) == 0) {
        if (lock_fd >= 0) close(lock_fd);
        lock_fd = -1;
        char path[4200];
        snprintf(path, sizeof path, "%s/.lock", out_dir);
        int fd = make_dirs(out_dir) ? open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644) : -1;
        if (fd < 0) fd = open(path, O_RDONLY | O_CLOEXEC);  // another user's lock file: a read fd locks too
        // fd < 0: out_dir cannot be written, which restore_or_init's check says as the run's error.
        if (fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) != 0) {
            if (errno == EWOULDBLOCK) {
                char holder[256];
                lock_holder(fd, holder, sizeof holder);
                snprintf(why, sizeof why,
                         "out_dir '%s' is in use by %s (another run, or the previous job still alive); stop it or "
                         "choose another out_dir",
                         out_dir, holder);
                ok = false;
            } else {  // a file system without locks (Lustre mounted noflock): the run goes on as before
                warn("out_dir: cannot lock '%s': %s; a second run in this out_dir would not be stopped", path,
                     strerror(errno));
            }
            close(fd);
            fd = -1;
        }
        if (fd >= 0) {
            char host[256] = "", text[400];
            if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "?");
            host[sizeof host - 1] = '\0';
            int n = snprintf(text, sizeof text, "pid %d on host %s\n", (int)getpid(), host);
            // For the next run's error only: the lock holds without it (a read-only lock file).
            bool written = ftruncate(fd, 0) == 0 && pwrite(fd, text, (size_t)n, 0) == n;
            (void)written;
            lock_fd = fd;
        }
    }
    if (job && comm_max(job, ok ? 0.0 : 1.0) != 0.0 && ok)
        fail("out_dir '%s' is in use by another run (rank 0 names it)", out_dir);
    if (!ok) fail("%s", why);
}

bool load_weights_pieces(const char *path, const shard_map *shard, float *local, char *why, size_t why_bytes) {
    st_file f;
    if (!safetensors_open(path, &f, why, why_bytes)) return false;
    // A file from elsewhere may lack model_config; one that has it must be of this architecture,
    // and a tensor the config does not use (an untied lm_head.weight going into a tied run) is
    // refused rather than dropped.
    bool ok = (!safetensors_meta(&f, "model_config") || check_model_config(&f, &shard->table->cfg, false, why,
                                                                             why_bytes)) &&
              read_table(&f, shard, "", local, why, why_bytes) &&
              holds_only(&f, "the file", shard->table->count, why, why_bytes);
    safetensors_close(&f);
    if (ok && !all_finite(local, shard->local_numel)) {
        snprintf(why, why_bytes, "the weights hold NaN/Inf");
        ok = false;
    }
    return ok;
}

bool load_weights(const char *path, const param_table *t, float *params, char *why, size_t why_bytes) {
    shard_map whole;
    shard_map_build(&whole, t, 0, 1);
    bool ok = load_weights_pieces(path, &whole, params, why, why_bytes);
    shard_map_free(&whole);
    return ok;
}
