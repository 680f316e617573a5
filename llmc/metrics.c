// llmc/metrics.c — metrics.jsonl writer (see llmc/metrics.h).
#include "llmc/metrics.h"
#include "llmc/common.h"
#include "llmc/fault.h"
#include "llmc/json.h"
#include "llmc/tensorboard.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct metrics_log {
    int fd;              // O_APPEND: each line is one write, cut back off when it fails
    char *path;
    tb_writer *tb;       // NULL without TensorBoard
    bool write_failed;   // said once: a full disk would say it at every line
    int64_t lost;        // lines not written since (said when writing works again)
    int64_t lines;       // lines this process wrote or tried to (the test hook's count)
};

// A process that died mid-write leaves a torn last line; a resumed run appends after it, and
// the two would make one line no reader takes. Cut it off (said, with its length), back to the
// last newline.
static void cut_torn_line(const char *path) {
    int fd = open(path, O_RDWR);
    if (fd < 0) return;   // new, or unreadable: fopen says so
    struct stat sb;
    off_t end = fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) ? sb.st_size : 0, keep = end;
    char buf[4096];
    while (keep > 0) {
        size_t n = keep < (off_t)sizeof buf ? (size_t)keep : sizeof buf;
        if (pread(fd, buf, n, keep - (off_t)n) != (ssize_t)n) {
            keep = end;   // unreadable: leave it as it is
            break;
        }
        size_t i = n;
        while (i > 0 && buf[i - 1] != '\n') i--;
        if (i > 0) {
            keep = keep - (off_t)n + (off_t)i;
            break;
        }
        keep -= (off_t)n;
    }
    if (keep < end) {
        if (ftruncate(fd, keep) == 0)
            warn("'%s' ended in a torn line (%lld bytes: a process that died mid-write); cut off before appending",
                 path, (long long)(end - keep));
        else
            warn("'%s' ends in a torn line and cannot be cut off: %s", path, strerror(errno));
    }
    close(fd);
}

metrics_log *metrics_open(const char *out_dir, bool tensorboard) {
    if (!make_dirs(out_dir)) fail("out_dir: cannot create '%s': %s", out_dir, strerror(errno));
    metrics_log *log = xcalloc(1, sizeof *log);
    log->path = xmalloc(strlen(out_dir) + 32);
    sprintf(log->path, "%s/metrics.jsonl", out_dir);
    cut_torn_line(log->path);
    log->fd = open(log->path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (log->fd < 0) fail("out_dir: cannot open '%s' for appending: %s", log->path, strerror(errno));
    if (tensorboard) {
        log->tb = tb_open(out_dir);
        note("tensorboard: writing %s (view with: tensorboard --logdir %s)", tb_path(log->tb), out_dir);
    }
    return log;
}

void metrics_close(metrics_log *log) {
    if (!log) return;
    close(log->fd);
    tb_close(log->tb);
    free(log->path);
    free(log);
}

// The members of a JSON fragment ("\"a\":1,\"b\":[2]") as a parsed object; false if it is not
// valid JSON (then nothing of it goes to TensorBoard).
static bool parse_members(const char *members_json, json_doc *doc) {
    strbuf sb = {0};
    sb_printf(&sb, "{%s}", members_json ? members_json : "");
    bool ok = json_parse(sb.data, sb.length, doc) && doc->root.type == JSON_OBJECT;
    if (!ok) json_free(doc);
    sb_free(&sb);
    return ok;
}

static void put_number(strbuf *sb, const char *key, double v) {
    if (isfinite(v)) sb_printf(sb, ",\"%s\":%.7g", key, v);
    else sb_printf(sb, ",\"%s\":null", key);
}

static void write_line(metrics_log *log, strbuf *sb) {
    if (!log) {  // a simulated replica other than 0 (diloco_transport = local) logs nothing
        sb_free(sb);
        return;
    }
    sb_append(sb, "}\n");
    // A line goes whole or not at all: a part of it written (a full disk) is cut back off, or
    // the rest of a later line would join it — one line in the middle of the file that no
    // reader (train_gpt plot) takes, where a resume only cuts a torn last line.
    // Test hook metrics_enospc:N: lines N, N+1 and N+2 of this process meet a full disk (line
    // N after half its bytes).
    int64_t line = log->lines++;
    size_t fail_after = fault_requested("metrics_enospc", line) ? sb->length / 2
                        : fault_requested("metrics_enospc", line - 1) || fault_requested("metrics_enospc", line - 2)
                            ? 0
                            : SIZE_MAX;
    bool torn;
    int err = append_whole(log->fd, sb->data, sb->length, fail_after, &torn);
    if (torn) warn("'%s': a line was cut short and cannot be cut back off: %s", log->path, strerror(errno));
    if (err) {
        if (!log->write_failed)
            warn("cannot write to '%s': %s (lines are lost until it can: said then)", log->path, strerror(err));
        log->write_failed = true;
        log->lost++;
    } else if (log->write_failed) {
        warn("'%s' is writable again: %lld line(s) could not be written and are missing", log->path,
             (long long)log->lost);
        log->write_failed = false;
        log->lost = 0;
    }
    sb_free(sb);
}

void metrics_step(metrics_log *log, const step_metrics *m) {
    strbuf sb = {0};
    sb_printf(&sb, "{\"step\":%lld", (long long)m->step);
    put_number(&sb, "loss", m->loss);
    put_number(&sb, "z_loss", m->z_loss);
    put_number(&sb, "lr", m->lr);
    put_number(&sb, "grad_norm", m->grad_norm);
    put_number(&sb, "tok_per_s", m->tok_per_s);
    put_number(&sb, "mfu", m->mfu);
    put_number(&sb, "step_ms", m->step_ms);
    sb_printf(&sb, ",\"tokens\":%lld,\"skipped\":%s", (long long)m->tokens, m->skipped ? "true" : "false");
    if (m->has_stall) put_number(&sb, "stall_ms", m->stall_ms);
    if (m->extra_steps) {
        sb_printf(&sb, ",\"extra_steps\":%lld", (long long)m->extra_steps);
        put_number(&sb, "extra_ms", m->extra_ms);
    }
    write_line(log, &sb);
    // A step that ended in a rollback is not drawn: the rollback's restart drops it anyway.
    if (log && log->tb && !m->rolled_back) {
        tb_value v[] = {{"train/loss", m->loss},           {"train/z_loss", m->z_loss},
                        {"train/lr", m->lr},               {"train/grad_norm", m->grad_norm},
                        {"train/tok_per_s", m->tok_per_s}, {"train/mfu", m->mfu},
                        {"train/step_ms", m->step_ms},     {"train/tokens", (double)m->tokens},
                        {"train/stall_ms", m->stall_ms}};
        int count = (int)(sizeof v / sizeof v[0]) - (m->has_stall ? 0 : 1);
        tb_scalars(log->tb, m->step, v, count);
    }
}

void metrics_val(metrics_log *log, int64_t step, double val_loss, int64_t val_tokens) {
    strbuf sb = {0};
    sb_printf(&sb, "{\"step\":%lld", (long long)step);
    put_number(&sb, "val_loss", val_loss);
    sb_printf(&sb, ",\"val_tokens\":%lld", (long long)val_tokens);
    write_line(log, &sb);
    if (log) tb_scalar(log->tb, "val/loss", step, val_loss);
}

// The events TensorBoard shows or needs: a sample's text, and the restarts of a fresh start (at
// step 0: a run that died before its first checkpoint may have left its steps in this
// directory's older files), resume and rollback.
static void tensorboard_event(tb_writer *tb, const char *name, int64_t step, const char *extra_json) {
    bool sample = strcmp(name, "sample") == 0, rollback = strcmp(name, "rollback") == 0;
    if (strcmp(name, "start") == 0) tb_restart(tb, step);
    if (strcmp(name, "resume") == 0) tb_restart(tb, step + 1);
    if (!sample && !rollback) return;
    json_doc doc;
    if (!parse_members(extra_json, &doc)) return;
    const json_value *text = json_get(&doc.root, "text"), *to_step = json_get(&doc.root, "to_step");
    if (sample && text && text->type == JSON_STRING) tb_text(tb, "samples", step, text->string);
    if (rollback && to_step && to_step->type == JSON_NUMBER && to_step->is_integer)
        tb_restart(tb, to_step->integer + 1);
    json_free(&doc);
}

// A DiLoCo outer line: every number but step as diloco/<key>, an array (contributors) as its
// length.
static void tensorboard_outer(tb_writer *tb, const char *members_json) {
    json_doc doc;
    if (!parse_members(members_json, &doc)) return;
    const json_value *root = &doc.root, *step = json_get(root, "step");
    if (json_get(root, "outer_step") && step && step->type == JSON_NUMBER && step->is_integer) {
        tb_value *v = xcalloc(root->count, sizeof *v);
        char(*tags)[64] = xcalloc(root->count, sizeof *tags);
        int n = 0;
        for (size_t i = 0; i < root->count; i++) {
            const json_value *item = &root->items[i];
            if (strcmp(root->keys[i], "step") == 0 || (item->type != JSON_NUMBER && item->type != JSON_ARRAY)) continue;
            snprintf(tags[n], sizeof tags[n], "diloco/%s", root->keys[i]);
            v[n].tag = tags[n];
            v[n].value = item->type == JSON_NUMBER ? item->number : (double)item->count;
            n++;
        }
        tb_scalars(tb, step->integer, v, n);
        free(v);
        free(tags);
    }
    json_free(&doc);
}

void metrics_event(metrics_log *log, const char *name, int64_t step, const char *extra_json) {
    strbuf sb = {0};
    sb_append(&sb, "{\"event\":");
    sb_json_string(&sb, name);
    sb_printf(&sb, ",\"step\":%lld", (long long)step);
    if (extra_json && *extra_json) sb_printf(&sb, ",%s", extra_json);
    write_line(log, &sb);
    if (log && log->tb) tensorboard_event(log->tb, name, step, extra_json);
}

void metrics_object(metrics_log *log, const char *members_json) {
    strbuf sb = {0};
    sb_printf(&sb, "{%s", members_json);
    write_line(log, &sb);
    if (log && log->tb) tensorboard_outer(log->tb, members_json);
}
