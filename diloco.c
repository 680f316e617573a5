// diloco.c — the DiLoCo outer loop (see diloco.h and docs/diloco.md).
#include "diloco.h"
#include "llmc/bytes.h"
#include "llmc/checksum.h"
#include "llmc/common.h"
#include "llmc/fault.h"
#include "llmc/json.h"
#include "llmc/optim.h"
#include "llmc/quant.h"
#include "net/transport.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// The state a donor sends to a joining replica, little-endian:
//   "TGDLSTAT" (8 bytes), u32 version = 1, u32 reserved = 0,
//   i64 outer_step, i64 step, i64 tokens_seen, i64 numel,
//   f32 θ[numel], f32 m[numel]
#define STATE_MAGIC "TGDLSTAT"
#define STATE_VERSION 1
#define STATE_HEADER_BYTES 48

struct diloco {
    const train_config *cfg;
    const param_table *table;
    int64_t numel;
    metrics_log *log;
    transport *net;
    quant_kind quant;
    int64_t block;
    float *theta, *momentum, *residual;   // residual: NULL without error feedback
    float *delta;                          // this replica's Δᵢ (quantized kinds)
    uint8_t *payload;
    size_t payload_bytes;
    // diloco_transport = local (all M replicas in this process): one payload and one
    // error-feedback residual per replica; `payload` and `residual` are replica 0's.
    uint8_t **local_payload;
    float **local_residual;
    bool quiet;                            // no progress line per outer step (diloco-tune)
    double *acc;                           // the average, per element
    uint8_t *state;                        // join / donor state buffer
    size_t state_bytes;
    const char *dump_dir;                  // TRAIN_GPT_DILOCO_DUMP: tensors of each outer step, for tests
};

uint64_t diloco_hash(const float *x, int64_t n) { return xxh64(x, (size_t)n * sizeof(float), 0); }

int diloco_replica_id(const diloco *d) { return (int)d->cfg->diloco_replica_id; }
int diloco_replicas(const diloco *d) { return (int)d->cfg->diloco_replicas; }

// What every replica of one run must agree on: the model, M, H, the outer optimizer and
// how Δ is encoded. A replica with a different fingerprint is refused when it joins.
static uint64_t run_fingerprint(const train_config *cfg, const param_table *t) {
    char *model = model_config_to_json(&t->cfg);
    strbuf sb = {0};
    sb_printf(&sb, "%s|numel %lld|M %lld|H %lld|lr %.17g|mu %.17g|nesterov %d|mu warmup %lld|quant %s|block %lld|ef %d",
              model, (long long)t->numel, (long long)cfg->diloco_replicas, (long long)cfg->diloco_inner_steps,
              cfg->diloco_outer_lr, cfg->diloco_outer_momentum, (int)cfg->diloco_nesterov,
              (long long)cfg->diloco_momentum_warmup, cfg->diloco_quant, (long long)cfg->diloco_quant_block,
              (int)cfg->diloco_error_feedback);
    uint64_t h = xxh64(sb.data, sb.length, 0);
    sb_free(&sb);
    free(model);
    return h;
}

diloco *diloco_open(const train_config *cfg, const param_table *t, metrics_log *log) {
    if (cfg->diloco_replicas <= 0) return NULL;
    diloco *d = xcalloc(1, sizeof *d);
    d->cfg = cfg;
    d->table = t;
    d->numel = t->numel;
    d->log = log;
    d->quant = (quant_kind)quant_kind_from_name(cfg->diloco_quant);
    d->block = cfg->diloco_quant_block;
    size_t n = (size_t)t->numel;
    d->theta = alloc_floats(n);
    d->momentum = alloc_floats(n);
    if (cfg->diloco_error_feedback && d->quant != QUANT_NONE) d->residual = alloc_floats(n);
    if (d->quant != QUANT_NONE) d->delta = alloc_floats(n);
    d->payload_bytes = quant_encoded_bytes(d->quant, t->numel, d->block);
    d->payload = xmalloc(d->payload_bytes);
    d->acc = xmalloc(n * sizeof *d->acc);
    const char *dump = getenv("TRAIN_GPT_DILOCO_DUMP");
    d->dump_dir = dump && *dump ? dump : NULL;
    if (strcmp(cfg->diloco_transport, "local") == 0) {
        int m = (int)cfg->diloco_replicas;
        d->local_payload = xcalloc((size_t)m, sizeof *d->local_payload);
        d->local_residual = xcalloc((size_t)m, sizeof *d->local_residual);
        d->local_payload[0] = d->payload;
        d->local_residual[0] = d->residual;
        for (int i = 1; i < m; i++) {
            d->local_payload[i] = xmalloc(d->payload_bytes);
            if (d->residual) d->local_residual[i] = alloc_floats(n);
        }
        return d;  // no transport: diloco_outer_step_local exchanges in memory, nobody joins late
    }
    d->state_bytes = STATE_HEADER_BYTES + 2 * n * sizeof(float);
    d->state = xmalloc(d->state_bytes);

    transport_options o = {0};
    o.replica_id = (int)cfg->diloco_replica_id;
    o.replicas = (int)cfg->diloco_replicas;
    o.min_replicas = (int)cfg->diloco_min_replicas;
    o.timeout_s = cfg->diloco_timeout_s;
    o.connect_timeout_s = cfg->diloco_connect_timeout_s;
    o.run_fingerprint = run_fingerprint(cfg, t);
    uint8_t *secret = NULL;
    if (strcmp(cfg->diloco_transport, "mpi") == 0) {
        d->net = transport_mpi_open(&o);
    } else {
        secret = read_secret_file(cfg->diloco_secret_file, "diloco_secret_file", &o.secret_bytes);
        o.secret = secret;
        o.rendezvous = cfg->diloco_rendezvous;
        o.serve = cfg->diloco_serve;
        o.streams = (int)cfg->diloco_streams;
        d->net = transport_tcp_open(&o);
    }
    if (secret) {
        memset(secret, 0, o.secret_bytes);
        free(secret);
    }
    return d;
}

void diloco_attach_buffers(diloco *d, model_buffers *b) {
    b->outer_theta = d->theta;
    b->outer_momentum = d->momentum;
    b->outer_residual = d->residual;
}

// ---------------------------------------------------------------- state transfer


static size_t pack_state(diloco *d, const train_state *st) {
    uint8_t *p = d->state;
    memcpy(p, STATE_MAGIC, 8);
    put_u64(p + 8, STATE_VERSION);  // u32 version + u32 reserved = 0
    put_u64(p + 16, (uint64_t)st->outer_step);
    put_u64(p + 24, (uint64_t)st->step);
    put_u64(p + 32, (uint64_t)st->tokens_seen);
    put_u64(p + 40, (uint64_t)d->numel);
    size_t bytes = (size_t)d->numel * sizeof(float);
    memcpy(p + STATE_HEADER_BYTES, d->theta, bytes);
    memcpy(p + STATE_HEADER_BYTES + bytes, d->momentum, bytes);
    return d->state_bytes;
}

// Takes over the group's state: θ, m, step counters, data position; params ← θ.
static void adopt_state(diloco *d, size_t got, float *params, train_state *st, dataloader *train) {
    const uint8_t *p = d->state;
    if (got != d->state_bytes || memcmp(p, STATE_MAGIC, 8) != 0 || (int64_t)get_u64(p + 8) != STATE_VERSION ||
        (int64_t)get_u64(p + 40) != d->numel)
        fail("diloco: the state received from the donor replica is malformed (%zu bytes, expected %zu)", got,
             d->state_bytes);
    int64_t outer_step = (int64_t)get_u64(p + 16), step = (int64_t)get_u64(p + 24), tokens = (int64_t)get_u64(p + 32);
    if (outer_step < 0 || step < 0 || step > d->cfg->max_steps || tokens < 0)
        fail("diloco: the donor's state has impossible counters (outer step %lld, step %lld)", (long long)outer_step,
             (long long)step);
    size_t bytes = (size_t)d->numel * sizeof(float);
    memcpy(d->theta, p + STATE_HEADER_BYTES, bytes);
    memcpy(d->momentum, p + STATE_HEADER_BYTES + bytes, bytes);
    if (!all_finite(d->theta, d->numel) || !all_finite(d->momentum, d->numel))
        fail("diloco: the donor's state holds NaN/Inf");
    memcpy(params, d->theta, bytes);
    if (d->residual) memset(d->residual, 0, bytes);
    // This replica's data continues where a replica that had trained all along would be.
    int64_t batches = step * d->cfg->grad_accum, per_epoch = dataloader_batches_per_epoch(train);
    dataloader_seek(train, (data_position){batches / per_epoch, batches % per_epoch});
    int64_t was = st->step;
    st->step = step;
    st->outer_step = outer_step;
    st->tokens_seen = tokens;
    st->bad_steps = 0;
    st->data = dataloader_position(train);
    char extra[256];
    snprintf(extra, sizeof extra, "\"outer_step\":%lld,\"from_step\":%lld,\"param_hash\":\"%016llx\"",
             (long long)outer_step, (long long)was, (unsigned long long)diloco_hash(d->theta, d->numel));
    metrics_event(d->log, "diloco_join", step, extra);
    note("diloco: replica %d took the group's state: outer step %lld, step %lld (was at step %lld)",
         diloco_replica_id(d), (long long)outer_step, (long long)step, (long long)was);
}

void diloco_join(diloco *d, float *params, train_state *st, dataloader *train, bool fresh) {
    size_t bytes = (size_t)d->numel * sizeof(float);
    if (fresh) {
        memcpy(d->theta, params, bytes);
        memset(d->momentum, 0, bytes);
        if (d->residual) memset(d->residual, 0, bytes);
        st->outer_step = 0;
    }
    replica_status s = {st->outer_step, diloco_hash(d->theta, d->numel)};
    size_t got = 0;
    join_result r = transport_join(d->net, &s, d->state, d->state_bytes, &got);
    if (r == JOIN_GOT_STATE) {
        adopt_state(d, got, params, st, train);
    } else {
        char extra[128];
        snprintf(extra, sizeof extra, "\"outer_step\":%lld,\"param_hash\":\"%016llx\"", (long long)st->outer_step,
                 (unsigned long long)s.param_hash);
        metrics_event(d->log, "diloco_member", st->step, extra);
        note("diloco: replica %d of %d joined at outer step %lld (%s transport, %s outer gradients)",
             diloco_replica_id(d), diloco_replicas(d), (long long)st->outer_step, d->cfg->diloco_transport,
             quant_kind_name(d->quant));
    }
}

bool diloco_outer_step_due(const diloco *d, int64_t step, int64_t max_steps) {
    return step % d->cfg->diloco_inner_steps == 0 || step == max_steps;
}

// ---------------------------------------------------------------- the outer step

// What this replica sends: θᵢ itself (none) or its quantized Δᵢ. Returns the relative L2
// error of what is sent against the true Δᵢ (0 for none).
static double encode_contribution(diloco *d, const float *params, float *residual, uint8_t *payload) {
    int64_t n = d->numel;
    if (d->quant == QUANT_NONE) {
        quant_encode(QUANT_NONE, params, n, d->block, payload);
        return 0.0;
    }
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) d->delta[i] = d->theta[i] - params[i];
    return quant_encode_feedback(d->quant, d->delta, residual, n, d->block, payload);
}

// Whether every float a payload decodes from is finite: the values themselves (none) or the
// block scales (int8 / int4: a block with a NaN or Inf input has a NaN scale, llmc/quant.h).
static bool payload_is_finite(const diloco *d, const uint8_t *payload) {
    int64_t floats = d->quant == QUANT_NONE ? d->numel : (d->numel + d->block - 1) / d->block;
    bool finite = true;
#pragma omp parallel for schedule(static) reduction(&& : finite)
    for (int64_t i = 0; i < floats; i++) {
        float v;
        memcpy(&v, payload + (size_t)i * sizeof v, sizeof v);
        finite = finite && isfinite(v);
    }
    return finite;
}

// Drops contributions that cannot be averaged: the wrong size (a replica with another model
// or quantization got past the handshake) or non-finite values (a diverged replica). Every
// replica sees the same bytes, so every replica drops the same ones and θ stays identical.
static void screen_contributions(diloco *d, round_result *r) {
    int kept = 0;
    for (int c = 0; c < r->n; c++) {
        const char *why = r->bytes[c] != d->payload_bytes ? "the wrong number of bytes"
                          : !payload_is_finite(d, r->payload[c]) ? "NaN/Inf values"
                                                                  : NULL;
        if (why) {
            warn("diloco: outer step %lld: replica %d's outer gradient has %s; it is left out of the average",
                 (long long)r->outer_step + 1, r->ids[c], why);
            continue;
        }
        r->ids[kept] = r->ids[c];
        r->payload[kept] = r->payload[c];
        r->bytes[kept] = r->bytes[c];
        kept++;
    }
    r->n = kept;
}

// acc ← the averaged Δ of the contributors, in double.
static void average_delta(diloco *d, const round_result *r) {
    int64_t n = d->numel;
    memset(d->acc, 0, (size_t)n * sizeof *d->acc);
    for (int c = 0; c < r->n; c++) {  // ascending replica id: the same order on every replica
        quant_decode_accumulate(d->quant, r->payload[c], n, d->block, 1.0, d->acc);
    }
    double inv = 1.0 / (double)r->n;
    if (d->quant == QUANT_NONE) {
        // acc holds Σθᵢ: Δ = θ − mean θᵢ.
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; i++) d->acc[i] = (double)d->theta[i] - d->acc[i] * inv;
    } else {
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; i++) d->acc[i] *= inv;
    }
}

// The outer momentum of outer step k (1-based): μ, ramped linearly from μ/W over the first W =
// diloco_momentum_warmup outer steps (0 = no ramp).
static double outer_momentum(const diloco *d, int64_t k) {
    double mu = d->cfg->diloco_outer_momentum;
    int64_t w = d->cfg->diloco_momentum_warmup;
    return w > 0 && k < w ? mu * (double)k / (double)w : mu;
}

// Outer step k: SGD with momentum μ as torch.optim.SGD(dampening=0) with Δ as the gradient —
// Nesterov (the default) or heavy-ball (diloco_nesterov = 0).
static void apply_outer_step(diloco *d, float *params, int64_t k) {
    int64_t n = d->numel;
    double lr = d->cfg->diloco_outer_lr, mu = outer_momentum(d, k);
    bool nesterov = d->cfg->diloco_nesterov;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        double delta = d->acc[i];
        double m = mu * (double)d->momentum[i] + delta;
        double update = nesterov ? delta + mu * m : m;
        d->momentum[i] = (float)m;
        d->theta[i] = (float)((double)d->theta[i] - lr * update);
        params[i] = d->theta[i];
    }
}

static void dump_tensor(FILE *f, const float *x, int64_t n) {
    if (fwrite(x, sizeof(float), (size_t)n, f) != (size_t)n) fail("TRAIN_GPT_DILOCO_DUMP: write failed");
}

// Test hook: DIR/outer_<replica>_<k>.f32 holds θ before, θᵢ (local weights), Δ (as fp32),
// m before, m after, θ after, each numel fp32 values.
static void dump_path(const diloco *d, int64_t outer_step, char *path, size_t bytes) {
    snprintf(path, bytes, "%s/outer_%d_%05lld.f32", d->dump_dir, diloco_replica_id(d), (long long)outer_step);
}

// A round that applied nothing leaves no dump.
static void dump_discard(diloco *d, FILE *f, int64_t outer_step) {
    if (!f) return;
    fclose(f);
    char path[4200];
    dump_path(d, outer_step, path, sizeof path);
    unlink(path);
}

static FILE *dump_begin(diloco *d, int64_t outer_step, const float *params) {
    if (!d->dump_dir) return NULL;
    char path[4200];
    dump_path(d, outer_step, path, sizeof path);
    FILE *f = fopen(path, "wb");
    if (!f) fail("TRAIN_GPT_DILOCO_DUMP: cannot create '%s': %s", path, strerror(errno));
    dump_tensor(f, d->theta, d->numel);
    dump_tensor(f, params, d->numel);
    return f;
}

static void dump_end(diloco *d, FILE *f, const float *momentum_before) {
    if (!f) return;
    float *delta = alloc_floats((size_t)d->numel);
    for (int64_t i = 0; i < d->numel; i++) delta[i] = (float)d->acc[i];
    dump_tensor(f, delta, d->numel);
    dump_tensor(f, momentum_before, d->numel);
    dump_tensor(f, d->momentum, d->numel);
    dump_tensor(f, d->theta, d->numel);
    free(delta);
    if (fclose(f) != 0) fail("TRAIN_GPT_DILOCO_DUMP: write failed");
}

static void log_outer_step(diloco *d, const train_state *st, const round_result *r, bool applied,
                           const char *reason, double quant_err) {
    uint64_t theta_hash = diloco_hash(d->theta, d->numel), m_hash = diloco_hash(d->momentum, d->numel);
    strbuf ids = {0};
    sb_append(&ids, "");
    for (int c = 0; c < r->n; c++) sb_printf(&ids, "%s%d", c ? "," : "", r->ids[c]);
    strbuf sb = {0};
    sb_printf(&sb, "\"outer_step\":%lld,\"step\":%lld,\"contributors\":[%s", (long long)st->outer_step,
              (long long)st->step, ids.data);
    sb_printf(&sb, "],\"applied\":%s,\"bytes_sent\":%llu,\"bytes_recv\":%llu,\"sync_s\":%.4f,\"wait_s\":%.4f,",
              applied ? "true" : "false", (unsigned long long)r->bytes_sent, (unsigned long long)r->bytes_recv,
              r->sync_s, r->wait_s);
    sb_printf(&sb, "\"param_hash\":\"%016llx\",\"momentum_hash\":\"%016llx\",\"quant\":\"%s\",\"quant_rel_err\":%.6g",
              (unsigned long long)theta_hash, (unsigned long long)m_hash, quant_kind_name(d->quant), quant_err);
    if (reason) {
        sb_append(&sb, ",\"skipped\":");
        sb_json_string(&sb, reason);
    }
    metrics_object(d->log, sb.data);
    sb_free(&sb);
    if (d->quiet) {
        sb_free(&ids);
        return;
    }
    char sent[32], recv[32];
    format_count((double)r->bytes_sent, sent, sizeof sent);
    format_count((double)r->bytes_recv, recv, sizeof recv);
    printf("outer %4lld | step %6lld | replicas [%s] | sent %sB recv %sB | sync %.2f s (wait %.2f s) | quant err %.2e | "
           "hash %016llx%s%s\n",
           (long long)st->outer_step, (long long)st->step, ids.data, sent, recv, r->sync_s, r->wait_s,
           quant_err, (unsigned long long)theta_hash, reason ? " | SKIPPED: " : "", reason ? reason : "");
    fflush(stdout);
    sb_free(&ids);
}

void diloco_outer_step(diloco *d, float *params, train_state *st, dataloader *train) {
    int64_t k = st->outer_step;  // this exchange makes outer step k + 1
    if (!all_finite(params, d->numel))
        fail("diloco: this replica's weights hold NaN/Inf at step %lld; not sending them to the others",
             (long long)st->step);
    FILE *dump = dump_begin(d, k + 1, params);
    double quant_err = encode_contribution(d, params, d->residual, d->payload);
    if (fault_requested("diloco_nan_payload", k)) {
        float nan = NAN;
        memcpy(d->payload, &nan, sizeof nan);
    }
    round_result r;
    memset(&r, 0, sizeof r);
    if (!transport_exchange(d->net, k, d->payload, d->payload_bytes, &r)) {
        // Never apply our own Δ as if it were the average: keep training locally, and the next
        // exchange carries the work of both rounds.
        dump_discard(d, dump, k + 1);
        warn("diloco: the exchange for outer step %lld failed (the hub is unreachable); outer step skipped",
             (long long)k + 1);
        log_outer_step(d, st, &r, false, "exchange failed", quant_err);
        return;
    }
    if (r.evicted) {
        dump_discard(d, dump, k + 1);
        warn("diloco: replica %d was dropped from outer step %lld (too late); rejoining", diloco_replica_id(d),
             (long long)k + 1);
        replica_status s = {st->outer_step, diloco_hash(d->theta, d->numel)};
        size_t got = 0;
        if (transport_rejoin(d->net, &s, d->state, d->state_bytes, &got) == JOIN_GOT_STATE)
            adopt_state(d, got, params, st, train);
        return;
    }
    screen_contributions(d, &r);
    if (!r.apply || r.n < d->cfg->diloco_min_replicas || r.n == 0) {
        dump_discard(d, dump, k + 1);
        char why[96];
        snprintf(why, sizeof why, "%d contributor(s), diloco_min_replicas is %lld", r.n,
                 (long long)d->cfg->diloco_min_replicas);
        // The round is over for everyone: θ stays, the count moves on (rounds keep unique numbers).
        st->outer_step = k + 1;
        log_outer_step(d, st, &r, false, why, quant_err);
        if (r.send_state) transport_send_state(d->net, d->state, pack_state(d, st));
        return;
    }
    float *momentum_before = NULL;
    if (dump) {
        momentum_before = alloc_floats((size_t)d->numel);
        memcpy(momentum_before, d->momentum, (size_t)d->numel * sizeof(float));
    }
    average_delta(d, &r);
    apply_outer_step(d, params, k + 1);
    st->outer_step = k + 1;
    dump_end(d, dump, momentum_before);
    free(momentum_before);
    log_outer_step(d, st, &r, true, NULL, quant_err);
    if (r.send_state) transport_send_state(d->net, d->state, pack_state(d, st));
}

void diloco_set_quiet(diloco *d, bool quiet) { d->quiet = quiet; }

void diloco_start_local(diloco *d, const float *params) {
    size_t bytes = (size_t)d->numel * sizeof(float);
    memcpy(d->theta, params, bytes);
    memset(d->momentum, 0, bytes);
    for (int i = 0; i < diloco_replicas(d); i++)
        if (d->local_residual[i]) memset(d->local_residual[i], 0, bytes);
}

// The outer step of diloco_transport = local: every replica's contribution is encoded exactly
// as a transport would carry it, then averaged and applied by the same code as
// diloco_outer_step, so θ is the bits that M processes would compute.
void diloco_outer_step_local(diloco *d, float *const *params, train_state *st) {
    int64_t k = st->outer_step;
    int m = diloco_replicas(d);
    double t0 = wall_seconds(), quant_err = 0.0;
    round_result r;
    memset(&r, 0, sizeof r);
    r.outer_step = k;
    r.apply = true;
    for (int i = 0; i < m; i++) {
        if (!all_finite(params[i], d->numel))
            fail("diloco: simulated replica %d's weights hold NaN/Inf at step %lld", i, (long long)st->step);
        quant_err += encode_contribution(d, params[i], d->local_residual[i], d->local_payload[i]) / m;
        r.ids[r.n] = i;
        r.payload[r.n] = d->local_payload[i];
        r.bytes[r.n] = d->payload_bytes;
        r.n++;
    }
    r.bytes_sent = d->payload_bytes;  // what each replica would send
    screen_contributions(d, &r);
    average_delta(d, &r);
    apply_outer_step(d, params[0], k + 1);
    for (int i = 1; i < m; i++) memcpy(params[i], d->theta, (size_t)d->numel * sizeof(float));
    st->outer_step = k + 1;
    r.sync_s = wall_seconds() - t0;
    log_outer_step(d, st, &r, true, NULL, quant_err);
}

bool diloco_agree_stop(diloco *d, bool local_stop) { return transport_agree_stop(d->net, local_stop); }

void diloco_leave(diloco *d) {
    if (!d || !d->net) return;
    transport_leave(d->net);
    d->net = NULL;
}

void diloco_close(diloco *d) {
    if (!d) return;
    if (d->net) transport_close(d->net);
    free(d->theta);
    free(d->momentum);
    if (d->local_payload)
        for (int i = 1; i < diloco_replicas(d); i++) {
            free(d->local_payload[i]);
            free(d->local_residual[i]);
        }
    free(d->local_payload);
    free(d->local_residual);
    free(d->residual);
    free(d->delta);
    free(d->payload);
    free(d->acc);
    free(d->state);
    free(d);
}
