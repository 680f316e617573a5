// llmc/plot.c — `train_gpt plot`: the runs' metrics.jsonl files in, one SVG dashboard out.
//
// Reading. A metrics.jsonl is a log, not a table (docs/formats.md): a run resumed after a
// crash appends to it, and a rollback goes back to a checkpoint and writes the steps after
// it again. The reader keeps one timeline per run: an event that restarts it ("start" at
// step 0, "resume" at its step, "rollback" at its to_step) drops what was recorded past
// that step, and a line whose step (outer step) is not past the last one kept replaces the
// ones it repeats, so the last value written for a step is the one drawn and every list
// stays sorted by step without a sort.
//
// Drawing. The SVG is a header with a legend (one colour per run), then one panel per
// quantity: loss against tokens across the top, the others against the step in two
// columns. A panel maps its values to pixels and draws one path per series and run. A
// series with more points than the panel is wide in pixels is reduced column by column to
// the first, lowest, highest and last point (the envelope, drawn faint) and the mean (drawn
// solid): a 1M-step run gives paths of a few thousand points like a 2,000-step one, and a
// spike still shows. A value that is null (not finite) or that a log axis cannot show
// breaks the line. The output is deterministic: the same files give the same bytes.
#include "llmc/plot.h"
#include "llmc/common.h"
#include "llmc/json.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#define PLOT_USAGE "usage: train_gpt plot OUT_DIR [OUT_DIR...] [-o|--out FILE.svg]"

// A growing array: PUSH(v, value) appends.
#define VEC(T)       \
    struct {         \
        T *at;       \
        size_t n;    \
        size_t cap;  \
    }
#define PUSH(v, value)                                                      \
    do {                                                                    \
        if ((v).n == (v).cap) {                                             \
            (v).cap = (v).cap ? 2 * (v).cap : 64;                           \
            (v).at = xrealloc((v).at, (v).cap * sizeof *(v).at);            \
        }                                                                   \
        (v).at[(v).n++] = (value);                                          \
    } while (0)

// ================================================================ one run's lines

typedef struct {
    int64_t step;
    double tokens;  // NaN when the line has none
    float loss, lr, grad_norm, tok_per_s, mfu, stall_ms;  // NaN: null or missing
    bool skipped;
} step_row;

typedef struct {
    int64_t step;
    float val_loss;
} val_row;

typedef struct {
    int64_t outer_step, step;
    float bytes_sent, bytes_recv, sync_s, wait_s;
    int contributors;  // -1: not given
} outer_row;

// A resume or a rollback, drawn as a vertical line where it happened.
typedef struct {
    int64_t step, to_step;
    bool rollback;
} restart_row;

typedef struct {
    char *name;  // the directory as given, without trailing slashes
    char *path;  // name/metrics.jsonl
    VEC(step_row) steps;
    VEC(val_row) vals;
    VEC(outer_row) outers;
    VEC(restart_row) restarts;
} run_log;

static double member_number(const json_value *o, const char *key) {
    const json_value *v = json_get(o, key);
    return v && v->type == JSON_NUMBER ? v->number : NAN;
}

static bool member_integer(const json_value *o, const char *key, int64_t *out) {
    const json_value *v = json_get(o, key);
    if (!v || v->type != JSON_NUMBER || !v->is_integer) return false;
    *out = v->integer;
    return true;
}

// The timeline goes on from `step`: what was recorded after it belongs to a dead branch.
static void restart_timeline_at(run_log *r, int64_t step) {
    while (r->steps.n && r->steps.at[r->steps.n - 1].step > step) r->steps.n--;
    while (r->vals.n && r->vals.at[r->vals.n - 1].step > step) r->vals.n--;
    while (r->outers.n && r->outers.at[r->outers.n - 1].step > step) r->outers.n--;
}

static void read_event(run_log *r, const json_value *o, const char *name, int64_t step) {
    if (strcmp(name, "start") == 0) {  // a fresh run in the same directory: only it counts
        restart_timeline_at(r, -1);
        r->restarts.n = 0;
    } else if (strcmp(name, "resume") == 0) {
        restart_timeline_at(r, step);
        PUSH(r->restarts, ((restart_row){step, step, false}));
    } else if (strcmp(name, "rollback") == 0) {
        int64_t to = step;
        member_integer(o, "to_step", &to);
        restart_timeline_at(r, to);
        PUSH(r->restarts, ((restart_row){step, to, true}));
    }
}

static void read_outer(run_log *r, const json_value *o, int64_t outer_step, int64_t step) {
    while (r->outers.n && r->outers.at[r->outers.n - 1].outer_step >= outer_step) r->outers.n--;
    const json_value *who = json_get(o, "contributors");
    outer_row row = {outer_step,
                     step,
                     (float)member_number(o, "bytes_sent"),
                     (float)member_number(o, "bytes_recv"),
                     (float)member_number(o, "sync_s"),
                     (float)member_number(o, "wait_s"),
                     who && who->type == JSON_ARRAY ? (int)who->count : -1};
    PUSH(r->outers, row);
}

static void read_step(run_log *r, const json_value *o, int64_t step) {
    while (r->steps.n && r->steps.at[r->steps.n - 1].step >= step) r->steps.n--;
    const json_value *skipped = json_get(o, "skipped");
    step_row row = {step,
                    member_number(o, "tokens"),
                    (float)member_number(o, "loss"),
                    (float)member_number(o, "lr"),
                    (float)member_number(o, "grad_norm"),
                    (float)member_number(o, "tok_per_s"),
                    (float)member_number(o, "mfu"),
                    (float)member_number(o, "stall_ms"),
                    skipped && skipped->type == JSON_BOOL && skipped->boolean};
    PUSH(r->steps, row);
}

// One line of the file, already parsed. Lines of kinds this version does not know are
// left alone: a newer trainer may write more.
static void read_line(run_log *r, const json_value *o) {
    int64_t step, outer_step;
    if (!member_integer(o, "step", &step) || step < 0) return;
    const json_value *event = json_get(o, "event");
    if (event) {
        if (event->type == JSON_STRING) read_event(r, o, event->string, step);
    } else if (member_integer(o, "outer_step", &outer_step)) {
        read_outer(r, o, outer_step, step);
    } else if (json_get(o, "val_loss")) {
        while (r->vals.n && r->vals.at[r->vals.n - 1].step >= step) r->vals.n--;
        PUSH(r->vals, ((val_row){step, (float)member_number(o, "val_loss")}));
    } else if (json_get(o, "loss")) {
        read_step(r, o, step);
    }
}

static bool blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n') return false;
    return true;
}

// Reads r->path; every way it can be unusable ends in one line naming the file.
static void read_run(run_log *r) {
    if (!dir_exists(r->name)) fail("plot: '%s' is not a directory (give a run's out_dir)", r->name);
    FILE *f = fopen(r->path, "rb");
    if (!f) fail("plot: cannot read '%s': %s", r->path, strerror(errno));
    char *line = NULL;
    size_t capacity = 0;
    ssize_t got;
    long long line_no = 0;
    bool any = false;
    while ((got = getline(&line, &capacity, f)) != -1) {
        line_no++;
        size_t n = (size_t)got;
        bool complete = n > 0 && line[n - 1] == '\n';
        if (blank(line, n)) continue;
        any = true;
        json_doc doc;
        if (!json_parse(line, n, &doc)) {
            // A run killed mid-write leaves its last line cut short: everything before it stands.
            if (!complete) {
                warn("plot: %s:%lld: ignoring the last line, written only in part", r->path, line_no);
                break;
            }
            fail("plot: %s:%lld is not a metrics.jsonl line: %s", r->path, line_no, doc.error);
        }
        if (doc.root.type != JSON_OBJECT) fail("plot: %s:%lld is not a JSON object", r->path, line_no);
        read_line(r, &doc.root);
        json_free(&doc);
    }
    bool failed = ferror(f) != 0;
    int err = errno;
    free(line);
    fclose(f);
    if (failed) fail("plot: cannot read '%s': %s", r->path, strerror(err));
    if (!any) fail("plot: '%s' is empty: the run has logged nothing yet", r->path);
    if (r->steps.n == 0) fail("plot: '%s' has no training step lines", r->path);
}

static void run_free(run_log *r) {
    free(r->name);
    free(r->path);
    free(r->steps.at);
    free(r->vals.at);
    free(r->outers.at);
    free(r->restarts.at);
}

// The tokens trained at a step: from its step line, else estimated from the nearest ones
// (a validation line can name a step whose line a rollback or a crash took away).
static double tokens_at(const run_log *r, int64_t step) {
    size_t lo = 0, hi = r->steps.n;  // first row with .step >= step
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (r->steps.at[mid].step < step) lo = mid + 1;
        else hi = mid;
    }
    if (lo < r->steps.n && r->steps.at[lo].step == step) return r->steps.at[lo].tokens;
    const step_row *before = lo > 0 ? &r->steps.at[lo - 1] : NULL;
    const step_row *after = lo < r->steps.n ? &r->steps.at[lo] : NULL;
    if (before && after)
        return before->tokens + (after->tokens - before->tokens) * (double)(step - before->step) /
                                    (double)(after->step - before->step);
    const step_row *near = before ? before : after;
    return near->step > 0 ? near->tokens * (double)step / (double)near->step : NAN;
}

// ================================================================ panels and series

typedef struct {
    double x, y;
} point;

enum { DRAW_LINE = 1, DRAW_DASHED = 2, DRAW_DOTS = 4 };

typedef struct {
    int run;
    const char *id;     // data-series="..." in the SVG
    const char *label;  // the key in the panel's corner
    int draw;           // DRAW_* flags
    VEC(point) points;  // y NaN: a gap
} series;

// A mark on the x axis of the loss panel: a skipped step (a tick) or a resume or a rollback
// (a vertical line with its story as a tooltip).
typedef struct {
    int run;
    double x;
    bool vertical;
    char text[96];
} x_mark;

typedef struct {
    const char *id, *title, *x_label;
    bool log_y, y_from_zero, integer_y, full_width;
    VEC(series) series;
    VEC(x_mark) marks;
} panel;

static series *panel_series(panel *p, int run, const char *id, const char *label, int draw) {
    series s = {run, id, label, draw, {0}};
    PUSH(p->series, s);
    return &p->series.at[p->series.n - 1];
}

static void add_point(series *s, double x, double y) { PUSH(s->points, ((point){x, y})); }

static void panel_free(panel *p) {
    for (size_t i = 0; i < p->series.n; i++) free(p->series.at[i].points.at);
    free(p->series.at);
    free(p->marks.at);
}

static double value_or_nan(float v) { return isfinite(v) ? (double)v : NAN; }

// What a panel draws of a line: NaN where there is nothing to draw.
typedef double (*step_value)(const step_row *row);
typedef double (*outer_value)(const outer_row *row);
static double step_lr(const step_row *row) { return value_or_nan(row->lr); }
static double step_grad_norm(const step_row *row) { return value_or_nan(row->grad_norm); }
static double step_tok_per_s(const step_row *row) { return value_or_nan(row->tok_per_s); }
static double step_mfu_percent(const step_row *row) { return 100 * value_or_nan(row->mfu); }
static double outer_bytes_sent(const outer_row *row) { return value_or_nan(row->bytes_sent); }
static double outer_bytes_recv(const outer_row *row) { return value_or_nan(row->bytes_recv); }
static double outer_sync_s(const outer_row *row) { return value_or_nan(row->sync_s); }
static double outer_wait_s(const outer_row *row) { return value_or_nan(row->wait_s); }
static double outer_contributors(const outer_row *row) { return row->contributors >= 0 ? row->contributors : NAN; }

static bool any_finite(const run_log *runs, int n_runs, step_value value) {
    for (int k = 0; k < n_runs; k++)
        for (size_t i = 0; i < runs[k].steps.n; i++)
            if (isfinite(value(&runs[k].steps.at[i]))) return true;
    return false;
}

// ================================================================ axes

typedef struct {
    double lo, hi;
    bool log;
    double px_lo, px_hi;  // pixels of lo and hi
} axis;

static bool axis_shows(const axis *a, double v) { return isfinite(v) && (!a->log || v > 0); }

static double axis_pixel(const axis *a, double v) {
    double t = a->log ? (log10(v) - log10(a->lo)) / (log10(a->hi) - log10(a->lo)) : (v - a->lo) / (a->hi - a->lo);
    return a->px_lo + t * (a->px_hi - a->px_lo);
}

// The data's extent along x (want_y false) or y, counting points whose y the axis can show.
static bool data_extent(const panel *p, bool want_y, bool log_y, double *lo, double *hi) {
    *lo = INFINITY;
    *hi = -INFINITY;
    for (size_t i = 0; i < p->series.n; i++) {
        const series *s = &p->series.at[i];
        for (size_t j = 0; j < s->points.n; j++) {
            point q = s->points.at[j];
            if (!isfinite(q.x) || !isfinite(q.y) || (log_y && q.y <= 0)) continue;
            double v = want_y ? q.y : q.x;
            if (v < *lo) *lo = v;
            if (v > *hi) *hi = v;
        }
    }
    return *lo <= *hi;
}

static void x_range(double *lo, double *hi) {
    if (*lo > 0 && *lo < 0.2 * *hi) *lo = 0;  // a run that starts at the start: show the origin
    if (*hi <= *lo) {   // one x: widen by its size (±0.5 vanished at 1e16 tokens: x="-nan" in the SVG)
        double half = fmax(0.5, 0.1 * fabs(*lo));
        *lo -= half;
        *hi += half;
        if (!isfinite(*hi)) *hi = DBL_MAX;
        if (!isfinite(*lo)) *lo = -DBL_MAX;
    }
}

static void y_range(const panel *p, double *lo, double *hi) {
    if (p->log_y) {
        if (*hi / *lo < 1.001) {
            *lo /= 2;
            *hi *= 2;
        }
        double pad = pow(*hi / *lo, 0.05);
        *lo /= pad;
        *hi *= pad;
        return;
    }
    bool nonnegative = *lo >= 0;
    if (p->y_from_zero && *lo > 0) *lo = 0;
    if (*hi <= *lo) {
        double half = *hi != 0 ? fabs(*hi) * 0.1 : 0.5;
        *lo -= half;
        *hi += half;
    }
    double pad = 0.05 * (*hi - *lo);
    if (!(p->y_from_zero && *lo == 0)) *lo -= pad;
    if (nonnegative && *lo < 0) *lo = 0;
    *hi += pad;
}

typedef struct {
    double v;
    char label[48];
} tick;

enum { MAX_TICKS = 24 };

static void trim_zeros(char *s) {
    if (!strchr(s, '.')) return;
    char *end = s + strlen(s) - 1;
    while (*end == '0') *end-- = '\0';
    if (*end == '.') *end = '\0';
}

// A tick label: suffixes from 1000 up (2.5K, 1.2M, 3B), an exponent below 0.01 (3e-4) and from
// 1e21 (a diverged loss: 3e38; a suffix gave 50000000000000000000E), plain
// decimals between; `step` sets the precision, `big` (the largest |tick|) the form, so one
// axis reads alike.
static void format_tick(char *buf, size_t size, double v, double step, double big) {
    if (v == 0) {
        snprintf(buf, size, "0");
        return;
    }
    if (!(step > 0)) step = fabs(v);
    if (big >= 1000 && big < 1e21) {   // beyond E (1e18) × 1000, an exponent as below
        static const char suffix[] = "KMBTPE";  // as format_count writes token counts
        int e = 0;
        double scale = 1;
        while (big / scale >= 1000 && e < 6) {
            scale *= 1000;
            e++;
        }
        int decimals = step / scale >= 1 ? 0 : (int)ceil(-log10(step / scale) - 1e-9);
        if (decimals > 3) decimals = 3;
        snprintf(buf, size, "%.*f", decimals, v / scale);
        trim_zeros(buf);
        size_t n = strlen(buf);
        if (n + 1 < size) buf[n] = suffix[e - 1], buf[n + 1] = '\0';
    } else if (big < 0.01 || big >= 1e21) {
        int digits = (int)floor(log10(fabs(v))) - (int)floor(log10(step)) + 1;
        digits = digits < 1 ? 1 : digits > 4 ? 4 : digits;
        char raw[32], mantissa[16];
        snprintf(raw, sizeof raw, "%.*e", digits - 1, v);
        char *e = strchr(raw, 'e');
        if (!e) {
            snprintf(buf, size, "%s", raw);
            return;
        }
        snprintf(mantissa, sizeof mantissa, "%.*s", (int)(e - raw), raw);
        trim_zeros(mantissa);
        snprintf(buf, size, "%se%d", mantissa, atoi(e + 1));
    } else {
        int decimals = step >= 1 ? 0 : (int)ceil(-log10(step) - 1e-9);
        if (decimals > 6) decimals = 6;
        snprintf(buf, size, "%.*f", decimals, v);
        trim_zeros(buf);
    }
}

// 1, 2 or 5 times a power of ten, near span / target.
static double nice_step(double span, int target) {
    double raw = span / target;
    double magnitude = pow(10, floor(log10(raw)));
    double f = raw / magnitude;
    return (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * magnitude;
}

static int linear_ticks(double lo, double hi, int target, bool integer, tick *out) {
    double step = nice_step(hi - lo, target);
    if (integer && step < 1) step = 1;
    double first = ceil(lo / step - 1e-9);
    int n = 0;
    for (int k = 0; n < MAX_TICKS; k++) {
        double v = (first + k) * step;
        if (!isfinite(v) || v > hi + step * 1e-9) break;   // (past DBL_MAX: inf)
        if (fabs(v) < step * 1e-9) v = 0;
        out[n++].v = v;
    }
    double big = 0;
    for (int i = 0; i < n; i++) big = fmax(big, fabs(out[i].v));
    for (int i = 0; i < n; i++) format_tick(out[i].label, sizeof out[i].label, out[i].v, step, big);
    return n;
}

// 1-2-5 per decade over a short range, every decade (or every few) over a long one, and
// linear ticks when the range lies inside one decade's gap.
static int log_ticks(double lo, double hi, tick *out) {
    int d0 = (int)floor(log10(lo)), d1 = (int)ceil(log10(hi));
    int decades = d1 - d0, n = 0;
    if (decades <= 2) {
        static const double multiples[3] = {1, 2, 5};
        for (int d = d0; d <= d1; d++)
            for (int m = 0; m < 3 && n < MAX_TICKS; m++) {
                double v = multiples[m] * pow(10, d);
                if (v >= lo && v <= hi) out[n++].v = v;
            }
    } else {
        int stride = (decades + 5) / 6;
        for (int d = d0; d <= d1 && n < MAX_TICKS; d++)
            if (d % stride == 0 && pow(10, d) >= lo && pow(10, d) <= hi) out[n++].v = pow(10, d);
    }
    if (n < 2) return linear_ticks(lo, hi, 4, false, out);
    for (int i = 0; i < n; i++) {
        double big = out[i].v;  // each label on its own: 1-2-5 ticks share no step
        format_tick(out[i].label, sizeof out[i].label, out[i].v, out[i].v, big);
    }
    return n;
}

// ================================================================ SVG text

// Text as XML character data or an attribute value: markup characters escaped, and what
// XML cannot hold (control characters, bytes that are not UTF-8) as U+FFFD.
static void sb_xml(strbuf *sb, const char *text) {
    const unsigned char *p = (const unsigned char *)text;
    while (*p) {
        unsigned c = *p;
        const char *entity = c == '&' ? "&amp;" : c == '<' ? "&lt;" : c == '>' ? "&gt;" : c == '"' ? "&quot;"
                             : c == '\'' ? "&#39;" : NULL;
        if (entity) {
            sb_append(sb, entity);
            p++;
            continue;
        }
        int bad = 0, n = utf8_char_length(p, &bad);
        // Well-formed UTF-8 that XML still cannot hold: control characters, U+FFFE and U+FFFF.
        if (n == 1 && c < 0x20) bad = 1, n = 0;
        if (n == 3 && c == 0xEF && p[1] == 0xBF && p[2] >= 0xBE) bad = 3, n = 0;
        if (n == 0) {
            sb_append(sb, "\xEF\xBF\xBD");
            p += bad;
            continue;
        }
        char bytes[5] = {0};
        memcpy(bytes, p, (size_t)n);
        sb_append(sb, bytes);
        p += n;
    }
}

static const char *const PALETTE[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                      "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
static const char *run_colour(int run) { return PALETTE[run % (int)(sizeof PALETTE / sizeof *PALETTE)]; }

// A path's "d": points rounded to 0.1 px, repeats left out, implicit line-tos.
typedef struct {
    strbuf *sb;
    bool down;
    long x10, y10;
} pen;

static void pen_to(pen *p, double x, double y) {
    long x10 = lround(x * 10), y10 = lround(y * 10);
    if (p->down && x10 == p->x10 && y10 == p->y10) return;
    sb_printf(p->sb, "%s%.1f %.1f", p->down ? " " : "M", x10 / 10.0, y10 / 10.0);
    p->down = true;
    p->x10 = x10;
    p->y10 = y10;
}

static void pen_dot(pen *p, double x, double y) {
    long x10 = lround(x * 10), y10 = lround(y * 10);
    if (p->down && labs(x10 - p->x10) < 10 && labs(y10 - p->y10) < 10) return;  // within a pixel of the last
    sb_printf(p->sb, "M%.1f %.1fh0", x10 / 10.0, y10 / 10.0);
    p->down = true;
    p->x10 = x10;
    p->y10 = y10;
}

// The points of one pixel column, reduced.
typedef struct {
    long column;
    size_t count;
    point first, last, low, high;
    size_t low_at, high_at;
    double sum_x, sum_y;
} column;

static void column_flush(column *c, pen *envelope, pen *mean) {
    if (c->count == 0) return;
    pen_to(envelope, c->first.x, c->first.y);
    bool low_first = c->low_at <= c->high_at;
    pen_to(envelope, low_first ? c->low.x : c->high.x, low_first ? c->low.y : c->high.y);
    pen_to(envelope, low_first ? c->high.x : c->low.x, low_first ? c->high.y : c->low.y);
    pen_to(envelope, c->last.x, c->last.y);
    pen_to(mean, c->sum_x / (double)c->count, c->sum_y / (double)c->count);
    c->count = 0;
}

static void column_add(column *c, point q, size_t index) {
    if (c->count == 0) {
        c->first = c->low = c->high = q;
        c->low_at = c->high_at = index;
        c->sum_x = c->sum_y = 0;
    }
    if (q.y > c->low.y) {  // pixel y grows downwards: the lowest value has the largest y
        c->low = q;
        c->low_at = index;
    }
    if (q.y < c->high.y) {
        c->high = q;
        c->high_at = index;
    }
    c->last = q;
    c->sum_x += q.x;
    c->sum_y += q.y;
    c->count++;
}

static void path_open(strbuf *svg, const series *s, const char *what, const char *attributes) {
    sb_printf(svg, "<path data-run=\"%d\" data-series=\"%s\" class=\"%s\" stroke=\"%s\" %sd=\"", s->run, s->id, what,
              run_colour(s->run), attributes);
}

static void draw_series(strbuf *svg, const series *s, const axis *ax, const axis *ay) {
    size_t shown = 0;
    for (size_t i = 0; i < s->points.n; i++)
        if (axis_shows(ax, s->points.at[i].x) && axis_shows(ay, s->points.at[i].y)) shown++;
    if (shown == 0) return;
    const char *dash = s->draw & DRAW_DASHED ? "stroke-dasharray=\"5 3\" " : "";
    bool dense = (double)shown > fabs(ax->px_hi - ax->px_lo);
    if (s->draw & (DRAW_LINE | DRAW_DASHED)) {
        strbuf envelope = {0}, mean = {0};
        pen e = {&envelope, false, 0, 0}, m = {&mean, false, 0, 0};
        column c = {0};
        for (size_t i = 0; i < s->points.n; i++) {
            point q = s->points.at[i];
            if (!axis_shows(ax, q.x) || !axis_shows(ay, q.y)) {  // a gap
                column_flush(&c, &e, &m);
                e.down = m.down = false;
                continue;
            }
            point px = {axis_pixel(ax, q.x), axis_pixel(ay, q.y)};
            long col = dense ? (long)floor(px.x) : (long)i;
            if (c.count && col != c.column) column_flush(&c, &e, &m);
            c.column = col;
            column_add(&c, px, i);
        }
        column_flush(&c, &e, &m);
        if (dense) {
            path_open(svg, s, "envelope", "stroke-opacity=\"0.3\" ");
            sb_append(svg, envelope.data);
            sb_append(svg, "\"/>\n");
            path_open(svg, s, "line", dash);
            sb_append(svg, mean.data);
        } else {
            path_open(svg, s, "line", dash);
            sb_append(svg, envelope.data);
        }
        sb_append(svg, "\"/>\n");
        sb_free(&envelope);
        sb_free(&mean);
    }
    if (s->draw & DRAW_DOTS) {
        path_open(svg, s, "dots", "");
        pen d = {svg, false, 0, 0};
        for (size_t i = 0; i < s->points.n; i++) {
            point q = s->points.at[i];
            if (axis_shows(ax, q.x) && axis_shows(ay, q.y)) pen_dot(&d, axis_pixel(ax, q.x), axis_pixel(ay, q.y));
        }
        sb_append(svg, "\"/>\n");
    }
}

// The keys in a panel's top right corner, one per label, drawn in grey.
static void draw_keys(strbuf *svg, const panel *p, double right, double y) {
    const char *labels[8];
    int draws[8], n = 0;
    for (size_t i = 0; i < p->series.n && n < 8; i++) {
        bool seen = false;
        for (int k = 0; k < n; k++) seen |= strcmp(labels[k], p->series.at[i].label) == 0;
        if (!seen) labels[n] = p->series.at[i].label, draws[n++] = p->series.at[i].draw;
    }
    bool ticks = false, lines = false;
    for (size_t i = 0; i < p->marks.n; i++) {
        if (p->marks.at[i].vertical) lines = true;
        else ticks = true;
    }
    if (n < 2 && !ticks && !lines) return;
    double x = right;
    if (lines) {
        x -= 6.5 * (double)strlen("resume, rollback") + 4;
        sb_printf(svg, "<text class=\"key\" x=\"%.1f\" y=\"%.1f\">resume, rollback</text>\n", x, y);
        x -= 14;
        sb_printf(svg, "<path class=\"keyline\" stroke-dasharray=\"2 2\" d=\"M%.1f %.1fv-10\"/>\n", x + 4, y + 1);
    }
    if (ticks) {
        x -= 6.5 * (double)strlen("skipped") + 14;
        sb_printf(svg, "<text class=\"key\" x=\"%.1f\" y=\"%.1f\">skipped</text>\n", x, y);
        x -= 12;
        sb_printf(svg, "<path class=\"keyline\" d=\"M%.1f %.1fv-6\"/>\n", x + 4, y + 1);
    }
    for (int k = n - 1; k >= 0 && n >= 2; k--) {
        x -= 6.5 * (double)strlen(labels[k]) + 14;
        sb_printf(svg, "<text class=\"key\" x=\"%.1f\" y=\"%.1f\">", x, y);
        sb_xml(svg, labels[k]);
        sb_append(svg, "</text>\n");
        x -= 24;
        if (draws[k] & (DRAW_LINE | DRAW_DASHED))
            sb_printf(svg, "<path class=\"keyline\" %sd=\"M%.1f %.1fh18\"/>\n",
                      draws[k] & DRAW_DASHED ? "stroke-dasharray=\"5 3\" " : "", x, y - 4);
        if (draws[k] & DRAW_DOTS)
            sb_printf(svg, "<path class=\"keydot\" d=\"M%.1f %.1fh0\"/>\n", x + 9, y - 4);
    }
}

typedef struct {
    double x, y, w, h;
} box;

static void draw_frame(strbuf *svg, double left, double top, double right, double bottom) {
    sb_printf(svg, "<rect class=\"frame\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\"/>\n", left, top,
              right - left, bottom - top);
}

static void draw_panel(strbuf *svg, const panel *p, box cell) {
    double left = cell.x + 64, right = cell.x + cell.w - 12, top = cell.y + 30, bottom = cell.y + cell.h - 38;
    sb_printf(svg, "<g id=\"panel-%s\" class=\"panel\">\n", p->id);
    sb_printf(svg, "<text class=\"title\" x=\"%.1f\" y=\"%.1f\">", left, cell.y + 18);
    sb_xml(svg, p->title);
    sb_append(svg, "</text>\n");
    draw_keys(svg, p, right, cell.y + 18);
    sb_printf(svg, "<text class=\"axis\" x=\"%.1f\" y=\"%.1f\">", right, bottom + 32);
    sb_xml(svg, p->x_label);
    sb_append(svg, "</text>\n");
    double xlo, xhi, ylo, yhi;
    if (!data_extent(p, false, p->log_y, &xlo, &xhi) || !data_extent(p, true, p->log_y, &ylo, &yhi)) {
        draw_frame(svg, left, top, right, bottom);
        sb_printf(svg, "<text class=\"nodata\" x=\"%.1f\" y=\"%.1f\">no data</text>\n</g>\n", (left + right) / 2,
                  (top + bottom) / 2);
        return;
    }
    x_range(&xlo, &xhi);
    y_range(p, &ylo, &yhi);
    axis ax = {xlo, xhi, false, left, right}, ay = {ylo, yhi, p->log_y, bottom, top};
    tick ticks[MAX_TICKS];
    int n = p->log_y ? log_ticks(ylo, yhi, ticks) : linear_ticks(ylo, yhi, 5, p->integer_y, ticks);
    for (int i = 0; i < n; i++) {
        double y = axis_pixel(&ay, ticks[i].v);
        sb_printf(svg, "<path class=\"grid\" d=\"M%.1f %.1fH%.1f\"/>\n", left, y, right);
        sb_printf(svg, "<text class=\"ytick\" x=\"%.1f\" y=\"%.1f\">%s</text>\n", left - 6, y + 4, ticks[i].label);
    }
    n = linear_ticks(xlo, xhi, p->full_width ? 10 : 5, true, ticks);
    for (int i = 0; i < n; i++) {
        double x = axis_pixel(&ax, ticks[i].v);
        sb_printf(svg, "<path class=\"grid\" d=\"M%.1f %.1fV%.1f\"/>\n", x, top, bottom);
        sb_printf(svg, "<text class=\"xtick\" x=\"%.1f\" y=\"%.1f\">%s</text>\n", x, bottom + 16, ticks[i].label);
    }
    draw_frame(svg, left, top, right, bottom);
    sb_printf(svg, "<clipPath id=\"clip-%s\"><rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\"/></clipPath>\n",
              p->id, left - 3, top - 3, right - left + 6, bottom - top + 6);
    sb_printf(svg, "<g clip-path=\"url(#clip-%s)\">\n", p->id);
    for (size_t i = 0; i < p->series.n; i++) draw_series(svg, &p->series.at[i], &ax, &ay);
    for (size_t i = 0; i < p->marks.n; i++) {
        const x_mark *m = &p->marks.at[i];
        if (!axis_shows(&ax, m->x) || m->x < xlo || m->x > xhi) continue;
        double x = axis_pixel(&ax, m->x);
        sb_printf(svg, "<path data-run=\"%d\" class=\"%s\" stroke=\"%s\" d=\"M%.1f %.1fV%.1f\"><title>", m->run,
                  m->vertical ? "restart" : "skip", run_colour(m->run), x, m->vertical ? top : bottom - 8,
                  bottom);
        sb_xml(svg, m->text);
        sb_append(svg, "</title></path>\n");
    }
    sb_append(svg, "</g>\n</g>\n");
}

// ================================================================ the dashboard

enum { LIMIT_MARKS = 200 };  // per run: a run that skipped more is broken anyway

static void build_loss_panel(panel *p, const run_log *runs, int n_runs) {
    bool have_tokens = true;
    for (int k = 0; k < n_runs; k++)
        for (size_t i = 0; i < runs[k].steps.n && have_tokens; i++) have_tokens = isfinite(runs[k].steps.at[i].tokens);
    // Runs of different batch sizes compare by tokens; without them (an old file), by step.
    p->x_label = have_tokens ? "tokens" : "step";
    for (int k = 0; k < n_runs; k++) {
        const run_log *r = &runs[k];
        series *train = panel_series(p, k, "train_loss", "train", DRAW_LINE);
        int marks = 0;
        for (size_t i = 0; i < r->steps.n; i++) {
            const step_row *s = &r->steps.at[i];
            double x = have_tokens ? s->tokens : (double)s->step;
            if (s->skipped) {  // its loss is the outlier that got it skipped: a tick, not a point
                if (marks++ < LIMIT_MARKS) {
                    x_mark m = {k, x, false, ""};
                    snprintf(m.text, sizeof m.text, "step %lld skipped", (long long)s->step);
                    PUSH(p->marks, m);
                }
                continue;
            }
            add_point(train, x, value_or_nan(s->loss));
        }
        if (r->vals.n) {
            series *val = panel_series(p, k, "val_loss", "val", DRAW_DASHED | (r->vals.n <= 400 ? DRAW_DOTS : 0));
            for (size_t i = 0; i < r->vals.n; i++) {
                int64_t step = r->vals.at[i].step;
                add_point(val, have_tokens ? tokens_at(r, step) : (double)step, value_or_nan(r->vals.at[i].val_loss));
            }
        }
        for (size_t i = 0; i < r->restarts.n && i < LIMIT_MARKS; i++) {
            const restart_row *e = &r->restarts.at[i];
            x_mark m = {k, have_tokens ? tokens_at(r, e->to_step) : (double)e->to_step, true, ""};
            if (e->rollback)
                snprintf(m.text, sizeof m.text, "step %lld: rolled back to step %lld", (long long)e->step,
                         (long long)e->to_step);
            else
                snprintf(m.text, sizeof m.text, "resumed at step %lld", (long long)e->step);
            PUSH(p->marks, m);
        }
    }
}

// A panel of one value of the step lines against the step.
static void build_step_panel(panel *p, const run_log *runs, int n_runs, step_value value) {
    for (int k = 0; k < n_runs; k++) {
        series *s = panel_series(p, k, p->id, p->id, DRAW_LINE);
        for (size_t i = 0; i < runs[k].steps.n; i++) {
            const step_row *row = &runs[k].steps.at[i];
            add_point(s, (double)row->step, value(row));
        }
    }
}

typedef struct {
    const char *id, *label;
    outer_value value;
    int draw;
} outer_field;

static void build_outer_panel(panel *p, const run_log *runs, int n_runs, const outer_field *fields, int n_fields) {
    for (int k = 0; k < n_runs; k++) {
        if (runs[k].outers.n == 0) continue;
        for (int f = 0; f < n_fields; f++) {
            int draw = fields[f].draw;
            if (runs[k].outers.n > 400) draw &= ~DRAW_DOTS;  // a line is clearer than thousands of dots
            series *s = panel_series(p, k, fields[f].id, fields[f].label, draw);
            for (size_t i = 0; i < runs[k].outers.n; i++) {
                const outer_row *o = &runs[k].outers.at[i];
                add_point(s, (double)o->step, fields[f].value(o));
            }
        }
    }
}

static void build_stall_panel(panel *p, const run_log *runs, int n_runs) {
    for (int k = 0; k < n_runs; k++) {
        series *s = NULL;
        for (size_t i = 0; i < runs[k].steps.n; i++) {
            const step_row *row = &runs[k].steps.at[i];
            if (!(row->stall_ms > 0)) continue;  // the steps after which outer work ran
            if (!s) s = panel_series(p, k, "stall_ms", "stall", DRAW_LINE | DRAW_DOTS);
            add_point(s, (double)row->step, row->stall_ms);
        }
        if (s && s->points.n > 400) s->draw &= ~DRAW_DOTS;
    }
}

static int build_panels(panel *panels, const run_log *runs, int n_runs) {
    int n = 0;
    panel *p = &panels[n++];
    *p = (panel){.id = "loss", .title = "loss (nats): train per step, validation dashed", .full_width = true};
    build_loss_panel(p, runs, n_runs);

    p = &panels[n++];
    *p = (panel){.id = "lr", .title = "learning rate", .x_label = "step", .y_from_zero = true};
    build_step_panel(p, runs, n_runs, step_lr);
    p = &panels[n++];
    *p = (panel){.id = "grad_norm", .title = "gradient norm before clipping (log)", .x_label = "step", .log_y = true};
    build_step_panel(p, runs, n_runs, step_grad_norm);
    p = &panels[n++];
    *p = (panel){.id = "tok_per_s", .title = "throughput (tokens/s)", .x_label = "step", .y_from_zero = true};
    build_step_panel(p, runs, n_runs, step_tok_per_s);
    if (any_finite(runs, n_runs, step_mfu_percent)) {  // null throughout on the CPU
        p = &panels[n++];
        *p = (panel){.id = "mfu", .title = "MFU (% of peak_tflops)", .x_label = "step", .y_from_zero = true};
        build_step_panel(p, runs, n_runs, step_mfu_percent);
    }

    bool diloco = false;
    for (int k = 0; k < n_runs; k++) diloco |= runs[k].outers.n > 0;
    if (!diloco) return n;
    static const outer_field bytes[] = {{"bytes_sent", "sent", outer_bytes_sent, DRAW_LINE},
                                        {"bytes_recv", "received", outer_bytes_recv, DRAW_DASHED}};
    static const outer_field seconds[] = {{"sync_s", "sync", outer_sync_s, DRAW_LINE},
                                          {"wait_s", "wait", outer_wait_s, DRAW_DASHED}};
    static const outer_field who[] = {{"contributors", "contributors", outer_contributors, DRAW_LINE | DRAW_DOTS}};
    p = &panels[n++];
    *p = (panel){.id = "outer_bytes", .title = "DiLoCo: bytes per outer step", .x_label = "step", .y_from_zero = true};
    build_outer_panel(p, runs, n_runs, bytes, 2);
    p = &panels[n++];
    *p = (panel){.id = "outer_seconds", .title = "DiLoCo: outer step time (s)", .x_label = "step", .y_from_zero = true};
    build_outer_panel(p, runs, n_runs, seconds, 2);
    p = &panels[n++];
    *p = (panel){.id = "contributors",
                 .title = "DiLoCo: contributors per outer step",
                 .x_label = "step",
                 .y_from_zero = true,
                 .integer_y = true};
    build_outer_panel(p, runs, n_runs, who, 1);
    p = &panels[n++];
    *p = (panel){.id = "stall_ms",
                 .title = "DiLoCo: stall after a step (ms, steps with outer work)",
                 .x_label = "step",
                 .y_from_zero = true};
    build_stall_panel(p, runs, n_runs);
    return n;
}

// "step 600 · 1.23M tokens · loss 3.912 · val 5.021 · 120 outer steps"
static void run_summary(const run_log *r, char *buf, size_t size) {
    const step_row *last = &r->steps.at[r->steps.n - 1];
    char tokens[32] = "";
    if (isfinite(last->tokens)) {
        format_count(last->tokens, tokens, sizeof tokens);
        strncat(tokens, " tokens · ", sizeof tokens - strlen(tokens) - 1);
    }
    double loss = NAN;
    for (size_t i = r->steps.n; i-- > 0 && !isfinite(loss);)
        if (!r->steps.at[i].skipped) loss = r->steps.at[i].loss;
    int n = snprintf(buf, size, "step %lld · %sloss %.4g", (long long)last->step, tokens, loss);
    if (r->vals.n && n >= 0 && (size_t)n < size)
        n += snprintf(buf + n, size - (size_t)n, " · val %.4g", (double)r->vals.at[r->vals.n - 1].val_loss);
    if (r->outers.n && n >= 0 && (size_t)n < size)
        snprintf(buf + n, size - (size_t)n, " · %lld outer steps",
                 (long long)r->outers.at[r->outers.n - 1].outer_step);
}

enum { WIDTH = 1200, MARGIN = 10, LEGEND_LINE = 18, FULL_HEIGHT = 330, HALF_HEIGHT = 250 };

static void write_svg(strbuf *svg, const run_log *runs, int n_runs, const panel *panels, int n_panels) {
    double header = 40 + LEGEND_LINE * n_runs + 6;
    int rows = (n_panels - 1 + 1) / 2;
    double height = header + FULL_HEIGHT + rows * HALF_HEIGHT + MARGIN;
    sb_printf(svg,
              "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
              "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%.0f\" viewBox=\"0 0 %d %.0f\">\n",
              WIDTH, height, WIDTH, height);
    sb_append(svg, "<title>train_gpt dashboard: ");
    for (int k = 0; k < n_runs; k++) {
        if (k) sb_append(svg, ", ");
        sb_xml(svg, runs[k].name);
    }
    sb_append(svg, "</title>\n");
    sb_append(svg,
              "<style>\n"
              "text { font-family: 'DejaVu Sans', Helvetica, Arial, sans-serif; font-size: 11px; fill: #333; }\n"
              ".heading { font-size: 17px; font-weight: bold; }\n"
              ".title { font-size: 13px; font-weight: bold; }\n"
              ".summary, .key, .axis { fill: #666; }\n"
              ".ytick { text-anchor: end; } .xtick { text-anchor: middle; } .axis { text-anchor: end; }\n"
              ".nodata { text-anchor: middle; fill: #999; font-size: 13px; }\n"
              ".frame { fill: none; stroke: #999; } .grid { stroke: #e6e6e6; fill: none; }\n"
              ".line, .envelope { fill: none; stroke-width: 1.5; stroke-linejoin: round; }\n"
              ".envelope { stroke-width: 1; }\n"
              ".dots { fill: none; stroke-width: 5; stroke-linecap: round; }\n"
              ".skip { stroke-width: 1.5; } .restart { stroke-width: 1; stroke-dasharray: 2 2; }\n"
              ".keyline { stroke: #666; stroke-width: 1.5; fill: none; }\n"
              ".keydot { stroke: #666; stroke-width: 5; stroke-linecap: round; }\n"
              "</style>\n");
    sb_printf(svg, "<rect width=\"%d\" height=\"%.0f\" fill=\"#fff\"/>\n", WIDTH, height);
    sb_printf(svg, "<text class=\"heading\" x=\"%d\" y=\"26\">train_gpt</text>\n", MARGIN + 4);
    for (int k = 0; k < n_runs; k++) {
        double y = 40 + LEGEND_LINE * (k + 1) - 4;
        char summary[200];
        run_summary(&runs[k], summary, sizeof summary);
        sb_printf(svg, "<g class=\"legend\" data-run=\"%d\">", k);
        sb_printf(svg, "<rect x=\"%d\" y=\"%.1f\" width=\"22\" height=\"4\" fill=\"%s\"/>", MARGIN + 4, y - 6,
                  run_colour(k));
        sb_printf(svg, "<text x=\"%d\" y=\"%.1f\">", MARGIN + 32, y);
        sb_xml(svg, runs[k].name);
        sb_append(svg, "<tspan class=\"summary\">  ");
        sb_xml(svg, summary);
        sb_append(svg, "</tspan></text></g>\n");
    }
    double half = (WIDTH - 2.0 * MARGIN) / 2;
    draw_panel(svg, &panels[0], (box){MARGIN, header, WIDTH - 2.0 * MARGIN, FULL_HEIGHT});
    for (int i = 1; i < n_panels; i++) {
        int row = (i - 1) / 2, col = (i - 1) % 2;
        box cell = {MARGIN + col * half, header + FULL_HEIGHT + row * HALF_HEIGHT, half, HALF_HEIGHT};
        draw_panel(svg, &panels[i], cell);
    }
    sb_append(svg, "</svg>\n");
}

// Written beside the target and renamed over it: a browser that reloads it never sees half.
static void write_file(const char *path, const strbuf *svg) {
    size_t n = strlen(path) + 8;
    char *tmp = xmalloc(n);
    snprintf(tmp, n, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) fail("plot: cannot write '%s': %s", path, strerror(errno));
    bool ok = fwrite(svg->data, 1, svg->length, f) == svg->length;
    ok &= fclose(f) == 0;
    if (!ok) {
        int err = errno;
        unlink(tmp);
        fail("plot: cannot write '%s': %s", path, strerror(err));
    }
    if (rename(tmp, path) != 0) {
        int err = errno;
        unlink(tmp);
        fail("plot: cannot write '%s': %s", path, strerror(err));
    }
    free(tmp);
}

int plot_main(int argc, char **argv) {
    const char *out = NULL;
    int n_runs = 0;
    run_log *runs = xcalloc((size_t)(argc > 1 ? argc : 1), sizeof *runs);
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
            printf("%s\n  writes one SVG dashboard of the runs' metrics.jsonl (default: the first OUT_DIR's "
                   "dashboard.svg); docs/plot.md\n",
                   PLOT_USAGE);
            free(runs);
            return 0;
        }
        if (strcmp(arg, "-o") == 0 || strcmp(arg, "--out") == 0) {
            if (i + 1 >= argc) fail("plot: %s needs a file name; %s", arg, PLOT_USAGE);
            out = argv[++i];
            continue;
        }
        if (arg[0] == '-' && arg[1]) fail("plot: unknown option '%s'; %s", arg, PLOT_USAGE);
        if (!arg[0]) fail("plot: an empty directory name; %s", PLOT_USAGE);
        run_log *r = &runs[n_runs++];
        size_t len = strlen(arg);
        while (len > 1 && arg[len - 1] == '/') len--;
        r->name = xmalloc(len + 1);
        memcpy(r->name, arg, len);
        r->name[len] = '\0';
        r->path = xmalloc(len + 16);
        snprintf(r->path, len + 16, "%s/metrics.jsonl", r->name);
    }
    if (n_runs == 0) fail("plot: no run directory given; %s", PLOT_USAGE);
    for (int k = 0; k < n_runs; k++) read_run(&runs[k]);

    panel panels[12];
    int n_panels = build_panels(panels, runs, n_runs);
    strbuf svg = {0};
    write_svg(&svg, runs, n_runs, panels, n_panels);
    char *default_out = NULL;
    if (!out) {
        size_t n = strlen(runs[0].name) + 16;
        default_out = xmalloc(n);
        snprintf(default_out, n, "%s/dashboard.svg", runs[0].name);
        out = default_out;
    }
    // The SVG must not replace what it was drawn from (`-o RUN/metrics.jsonl`: the run's log gone).
    struct stat os, rs;
    if (stat(out, &os) == 0)
        for (int k = 0; k < n_runs; k++)
            if (stat(runs[k].path, &rs) == 0 && os.st_dev == rs.st_dev && os.st_ino == rs.st_ino)
                fail("plot: -o '%s' is the metrics.jsonl of run '%s'; name another output file", out, runs[k].name);
    write_file(out, &svg);
    note("plot: wrote '%s' (%d run%s, %d panels, %zu bytes)", out, n_runs, n_runs == 1 ? "" : "s", n_panels,
         svg.length);
    free(default_out);
    sb_free(&svg);
    for (int i = 0; i < n_panels; i++) panel_free(&panels[i]);
    for (int k = 0; k < n_runs; k++) run_free(&runs[k]);
    free(runs);
    return 0;
}
