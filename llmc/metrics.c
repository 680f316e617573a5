// llmc/metrics.c — metrics.jsonl writer (see llmc/metrics.h).
#include "llmc/metrics.h"
#include "llmc/common.h"
#include "llmc/json.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct metrics_log {
    FILE *file;
    char *path;
};

metrics_log *metrics_open(const char *out_dir) {
    if (!make_dirs(out_dir)) fail("out_dir: cannot create '%s': %s", out_dir, strerror(errno));
    metrics_log *log = xcalloc(1, sizeof *log);
    log->path = xmalloc(strlen(out_dir) + 32);
    sprintf(log->path, "%s/metrics.jsonl", out_dir);
    log->file = fopen(log->path, "a");
    if (!log->file) fail("out_dir: cannot open '%s' for appending: %s", log->path, strerror(errno));
    return log;
}

void metrics_close(metrics_log *log) {
    if (!log) return;
    fclose(log->file);
    free(log->path);
    free(log);
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
    if (fputs(sb->data, log->file) < 0 || fflush(log->file) != 0)
        warn("cannot write to '%s': %s", log->path, strerror(errno));
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
    write_line(log, &sb);
}

void metrics_val(metrics_log *log, int64_t step, double val_loss, int64_t val_tokens) {
    strbuf sb = {0};
    sb_printf(&sb, "{\"step\":%lld", (long long)step);
    put_number(&sb, "val_loss", val_loss);
    sb_printf(&sb, ",\"val_tokens\":%lld", (long long)val_tokens);
    write_line(log, &sb);
}

void metrics_event(metrics_log *log, const char *name, int64_t step, const char *extra_json) {
    strbuf sb = {0};
    sb_append(&sb, "{\"event\":");
    sb_json_string(&sb, name);
    sb_printf(&sb, ",\"step\":%lld", (long long)step);
    if (extra_json && *extra_json) sb_printf(&sb, ",%s", extra_json);
    write_line(log, &sb);
}

void metrics_object(metrics_log *log, const char *members_json) {
    strbuf sb = {0};
    sb_printf(&sb, "{%s", members_json);
    write_line(log, &sb);
}
