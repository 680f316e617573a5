// llmc/config.c — the key table and the parser for config files and command-line overrides.
//
// Each key is one row: name, type, where it lives in train_config, its default (as the text
// a user would write; NULL = required), bounds, and the line of documentation that --help
// prints. Values are parsed strictly: "12abc" is not an integer, "yes" is a boolean only if
// listed below. The source of every value (file:line, --flag, or default) is kept so that
// the later cross-key checks can still say where a bad value came from.
#include "llmc/config.h"
#include "llmc/bytes.h"
#include "llmc/common.h"
#include "llmc/json.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef enum { KEY_INT, KEY_FLOAT, KEY_BOOL, KEY_STRING, KEY_CHOICE } key_type;

typedef struct {
    const char *name;
    key_type type;
    size_t offset;        // into train_config
    const char *fallback; // default as text; NULL = required
    double min, max;      // inclusive bounds for KEY_INT / KEY_FLOAT
    const char *choices;  // KEY_CHOICE: "a|b|c"; KEY_INT / KEY_FLOAT: the one word it also takes ("auto")
    bool is_model;        // part of model_config (written into checkpoints)
    const char *doc;
} key_spec;

#define M(field) offsetof(train_config, model.field)
#define T(field) offsetof(train_config, field)
#define BIG 9.0e18
#define TEXT_OF_(x) #x
#define TEXT_OF(x) TEXT_OF_(x)  // a macro's value as a string literal
#define REQUIRED NULL

static const key_spec KEYS[] = {
    // --- model ---
    {"vocab_size", KEY_INT, M(vocab_size), REQUIRED, 2, 1 << 30, NULL, true, "vocabulary size (token ids are 0..vocab_size-1)"},
    {"n_layer", KEY_INT, M(n_layer), REQUIRED, 1, 1024, NULL, true, "number of transformer blocks"},
    {"d_model", KEY_INT, M(d_model), REQUIRED, 1, 1 << 20, NULL, true, "residual stream width C"},
    {"n_head", KEY_INT, M(n_head), REQUIRED, 1, 4096, NULL, true, "query heads Hq"},
    {"n_kv_head", KEY_INT, M(n_kv_head), "0", 0, 4096, NULL, true, "key/value heads Hkv (GQA); 0 = n_head"},
    {"head_dim", KEY_INT, M(head_dim), "0", 0, 65536, NULL, true, "per-head dim D (even); 0 = d_model / n_head"},
    {"d_ff", KEY_INT, M(d_ff), REQUIRED, 1, 1 << 22, NULL, true, "SwiGLU hidden width F"},
    {"seq_len", KEY_INT, M(seq_len), REQUIRED, 2, 1 << 22, NULL, true, "tokens per sequence T"},
    {"rope_theta", KEY_FLOAT, M(rope_theta), "10000", 1, 1e12, NULL, true, "RoPE base"},
    {"nope_every", KEY_INT, M(nope_every), "4", 0, 1024, NULL, true, "layer l has no RoPE when (l+1) % nope_every == 0; 0 = RoPE everywhere"},
    {"qk_norm", KEY_BOOL, M(qk_norm), "1", 0, 1, NULL, true, "per-head RMSNorm of q and k before RoPE"},
    {"tie_embeddings", KEY_BOOL, M(tie_embeddings), "1", 0, 1, NULL, true, "LM head shares the token embedding"},
    {"norm_eps", KEY_FLOAT, M(norm_eps), "1e-6", 0, 1, NULL, true, "epsilon inside every RMSNorm"},
    {"init_std", KEY_FLOAT, M(init_std), "0.02", 0, 10, NULL, true, "std of the normal init of every matrix"},
    {"doc_masking", KEY_BOOL, M(doc_masking), "1", 0, 1, NULL, true, "attend only within a document; RoPE positions restart per document"},
    {"doc_token", KEY_INT, M(doc_token), "-1", -1, 1 << 30, NULL, true, "token that starts a document; -1 = the train shards' doc_token"},
    // --- optimization ---
    {"device", KEY_CHOICE, T(device), "auto", 0, 0, "auto|cpu|cuda", false, "where to train: auto uses a GPU if there is one"},
    {"batch_size", KEY_INT, T(batch_size), REQUIRED, 1, 1 << 20, NULL, false, "sequences per micro-batch, per process"},
    {"grad_accum", KEY_INT, T(grad_accum), "1", 1, 1 << 20, NULL, false, "micro-batches per optimizer step"},
    {"max_steps", KEY_INT, T(max_steps), REQUIRED, 1, BIG, NULL, false, "optimizer steps in the whole run (the schedule's length)"},
    {"lr", KEY_FLOAT, T(lr), REQUIRED, 0, 10, NULL, false, "peak learning rate"},
    {"min_lr_frac", KEY_FLOAT, T(min_lr_frac), "0.1", 0, 1, NULL, false, "final lr as a fraction of lr"},
    {"warmup_steps", KEY_INT, T(warmup_steps), "0", 0, BIG, NULL, false, "linear warmup steps"},
    {"decay_frac", KEY_FLOAT, T(decay_frac), "0.2", 0, 1, NULL, false, "fraction of max_steps spent in the final decay"},
    {"decay_shape", KEY_CHOICE, T(decay_shape), "linear", 0, 0, "linear|sqrt", false, "shape of the final decay"},
    {"beta1", KEY_FLOAT, T(beta1), "0.9", 0, 0.999999, NULL, false, "AdamW beta1"},
    {"beta2", KEY_FLOAT, T(beta2), "0.95", 0, 0.999999999, NULL, false, "AdamW beta2"},
    {"adam_eps", KEY_FLOAT, T(adam_eps), "1e-8", 1e-30, 1, NULL, false, "AdamW epsilon (> 0: a weight whose gradient is 0 would divide 0 by 0)"},
    {"weight_decay", KEY_FLOAT, T(weight_decay), "0.1", 0, 10, NULL, false, "decoupled weight decay on 2-D weights (never the embedding)"},
    {"grad_clip", KEY_FLOAT, T(grad_clip), "1.0", 0, 1e30, NULL, false, "clip the global gradient norm to this; 0 = off"},
    {"z_loss", KEY_FLOAT, T(z_loss), "1e-4", 0, 10, NULL, false, "weight of mean(logsumexp(logits)^2) in the objective"},
    {"seed", KEY_INT, T(seed), "1337", 0, BIG, NULL, false, "seed of the weight init and the data shuffle"},
    {"max_bad_steps", KEY_INT, T(max_bad_steps), "5", 1, 1 << 30, NULL, false, "after this many skipped steps in a row (NaN/Inf or spikes) roll back (max_rollbacks), then stop"},
    {"spike_z", KEY_FLOAT, T(spike_z), "6", 0, 1e6, NULL, false, "spike guard: skip a step whose loss or gradient norm is this many standard deviations above the last spike_window applied steps; 0 = off"},
    {"spike_window", KEY_INT, T(spike_window), "100", 2, 1024, NULL, false, "spike guard: applied steps whose loss and gradient norm set the limits (it acts once the window is full and the lr warm-up is over)"},
    {"max_rollbacks", KEY_INT, T(max_rollbacks), "3", 0, 1 << 30, NULL, false, "after max_bad_steps skipped steps in a row, go back to the newest checkpoint from before them and skip the data since it, at most this many times in a run; 0 = stop instead"},
    {"walltime_end", KEY_FLOAT, T(walltime_end), "0", 0, 1e12, NULL, false, "unix time at which the job ends; 0 = SLURM_JOB_END_TIME when set, else no walltime guard"},
    {"walltime_safety", KEY_FLOAT, T(walltime_safety), "2", 1, 1000, NULL, false, "checkpoint and stop (exit status 76) once the time left is below (slowest step + slowest validation and sample + checkpoint time) times this, plus stop_before_s"},
    {"stop_before_s", KEY_FLOAT, T(stop_before_s), "60", 0, 1e9, NULL, false, "seconds the walltime guard keeps in hand beyond that (process exit, srun and job script)"},
    {"watchdog_s", KEY_FLOAT, T(watchdog_s), "1800", 0, 1e9, NULL, false, "end the process (exit status 75) when a step, DiLoCo's outer work, validation or a checkpoint makes no progress for this long; 0 = off"},
    {"peak_tflops", KEY_FLOAT, T(peak_tflops), "0", 0, 1e9, NULL, false, "peak dense TFLOP/s for MFU; 0 = unknown (on the CPU: mfu is logged as null)"},
    // --- data, checkpoints, logging ---
    {"train_data", KEY_STRING, T(train_data), REQUIRED, 0, 0, NULL, false, "train shards: a file, a glob, or a comma-separated list"},
    {"val_data", KEY_STRING, T(val_data), "", 0, 0, NULL, false, "validation shards (same forms); empty = no validation"},
    {"shuffle", KEY_BOOL, T(shuffle), "1", 0, 1, NULL, false, "visit sequences in a seeded random order each epoch"},
    {"val_every", KEY_INT, T(val_every), "0", 0, BIG, NULL, false, "validate every N steps (and at the end); 0 = only at the end"},
    {"val_tokens", KEY_INT, T(val_tokens), "1048576", 0, BIG, NULL, false, "tokens each validation covers, from the start of val_data, the same at any batch size; 0 = all of it"},
    {"out_dir", KEY_STRING, T(out_dir), "out", 0, 0, NULL, false, "where metrics.jsonl and checkpoints go"},
    {"ckpt_every", KEY_INT, T(ckpt_every), "0", 0, BIG, NULL, false, "checkpoint every N steps (and at the end); 0 = only at the end"},
    {"stop_at_step", KEY_INT, T(stop_at_step), "0", 0, BIG, NULL, false, "checkpoint and exit cleanly after this step (split a run into jobs); 0 = run to max_steps"},
    {"ckpt_keep", KEY_INT, T(ckpt_keep), "3", 0, 1 << 30, NULL, false, "newest checkpoints to keep; 0 = keep all"},
    {"resume", KEY_STRING, T(resume), "auto", 0, 0, NULL, false, "auto (newest valid checkpoint in out_dir), never, or a checkpoint directory"},
    {"init_from", KEY_STRING, T(init_from), "", 0, 0, NULL, false, "start from these weights (a model.safetensors) instead of a random init; a checkpoint directory also continues its data stream"},
    {"log_every", KEY_INT, T(log_every), "1", 1, BIG, NULL, false, "print a progress line every N steps (metrics.jsonl gets every step)"},
    {"tensorboard", KEY_BOOL, T(tensorboard), "0", 0, 1, NULL, false, "also write the numbers of metrics.jsonl and the samples to a TensorBoard event file in out_dir (tensorboard --logdir out_dir)"},
    {"threads", KEY_INT, T(threads), "0", 0, 4096, NULL, false, "CPU threads; 0 = OMP_NUM_THREADS or all cores"},
    // --- sharding (a job of several ranks) ---
    {"fsdp_size", KEY_INT, T(fsdp_size), "0", 0, 1 << 20, NULL, false, "ranks that shard one copy of the model (FSDP); 0 = the ranks of a node"},
    {"dp_replicate", KEY_INT, T(dp_replicate), "0", 0, 1 << 20, NULL, false, "copies of the sharded model whose gradients are all-reduced every step (HSDP); 0 = ranks / fsdp_size"},
    {"fsdp_prefetch", KEY_BOOL, T(fsdp_prefetch), "1", 0, 1, NULL, false, "start gathering the next layer while the current one computes"},
    {"comm_timeout_s", KEY_FLOAT, T(comm_timeout_s), "600", 1, 86400, NULL, false, "a rank waiting this long for a collective of the job decides another rank died or hangs, and exits with an error (the job can be requeued)"},
    {"fsdp_reshard_after_forward", KEY_BOOL, T(fsdp_reshard_after_forward), "1", 0, 1, NULL, false, "free a layer's gathered weights after its forward (gather again for backward); 0 = keep them until the backward"},
    // --- memory ---
    {"recompute", KEY_CHOICE, T(recompute), "auto", 0, 0, "auto|none|selective|full", false, "activation recomputation: auto picks the least recomputation whose memory plan fits memory_budget_mb; none keeps every activation for the backward; selective recomputes norms, QK-norm, RoPE and SwiGLU's activation (no matmul); full keeps only each layer's input and runs its forward again before its backward"},
    {"recompute_layers", KEY_INT, T(recompute_layers), "1", 1, 1024, NULL, false, "recompute applies to every N-th layer only (layers 0, N, 2N, ...); the others keep every activation; 1 = every layer"},
    {"memory_budget_mb", KEY_INT, T(memory_budget_mb), "0", 0, 1099511627776.0, NULL, false, "MiB a rank's memory plan may use, for recompute = auto; 0 = the device's: a GPU's memory less 2 GiB, or on the CPU the machine's memory (or the cgroup's limit) shared by the node's ranks, less 1 GiB each"},
    // --- samples ---
    {"tokenizer", KEY_STRING, T(tokenizer), "", 0, 0, NULL, false, "tokenizer file (.tiktoken or tokenizer.json) to decode samples; empty = no samples"},
    {"sample_every", KEY_INT, T(sample_every), "0", 0, BIG, NULL, false, "print a sampled continuation every N steps (and at the end); 0 = never"},
    {"sample_prompt", KEY_STRING, T(sample_prompt), "The", 0, 0, NULL, false, "text the samples continue"},
    {"sample_tokens", KEY_INT, T(sample_tokens), "48", 1, 1 << 20, NULL, false, "tokens generated per sample"},
    {"sample_temperature", KEY_FLOAT, T(sample_temperature), "0.8", 0, 100, NULL, false, "sampling temperature; 0 = greedy"},
    // --- DiLoCo (docs/diloco.md) ---
    {"diloco_replicas", KEY_INT, T(diloco_replicas), "0", 0, 256, NULL, false, "DiLoCo replicas M taking part in the run; 0 = DiLoCo off"},
    {"diloco_replica_id", KEY_INT, T(diloco_replica_id), "-1", -1, 255, NULL, false, "this replica's id in [0, M); -1 = the MPI rank (mpi transport)"},
    {"diloco_inner_steps", KEY_INT, T(diloco_inner_steps), "500", 1, BIG, NULL, false, "inner AdamW steps H between outer steps"},
    {"diloco_decay_inner_steps", KEY_INT, T(diloco_decay_inner_steps), "auto", 0, BIG, "auto", false, "inner steps between outer steps once the inner schedule's decay phase has begun (counted from its start); 0 = diloco_inner_steps throughout; auto: diloco_inner_steps / " TEXT_OF(DILOCO_DECAY_SYNC_FACTOR) " with diloco_plain_in_decay, and with the auto outer optimizer over at least " TEXT_OF(DILOCO_MOMENTUM_ROUNDS) " outer steps and 2+ replicas (at least diloco_fragments · (diloco_overlap_steps + 1)), else 0"},
    {"diloco_outer_lr", KEY_FLOAT, T(diloco_outer_lr), "auto", 0, 10, "auto", false, "outer SGD learning rate; auto (with diloco_outer_momentum auto): 0.2 with μ 0.9 for a run of at least " TEXT_OF(DILOCO_MOMENTUM_ROUNDS) " outer steps (max_steps / diloco_inner_steps) with at least " TEXT_OF(DILOCO_MOMENTUM_REPLICAS) " replicas, else 1 with μ 0 (θ = the mean of the replicas); auto beside a set μ: 1. The paper's: 0.7"},
    {"diloco_outer_momentum", KEY_FLOAT, T(diloco_outer_momentum), "auto", 0, 0.999999, "auto", false, "outer momentum μ; auto: see diloco_outer_lr (0 beside a set lr). The paper's: 0.9"},
    {"diloco_nesterov", KEY_BOOL, T(diloco_nesterov), "1", 0, 1, NULL, false, "1: Nesterov outer momentum; 0: heavy-ball"},
    {"diloco_momentum_warmup", KEY_INT, T(diloco_momentum_warmup), "0", 0, BIG, NULL, false, "outer steps over which the outer momentum ramps up linearly to diloco_outer_momentum; 0 = none"},
    {"diloco_plain_in_decay", KEY_INT, T(diloco_plain_in_decay), "auto", 0, 1, "auto", false, "1: outer steps landed in the inner schedule's decay phase are plain averaging (outer lr 1, momentum 0); auto: 1 when the outer momentum is above 0"},
    {"diloco_fragments", KEY_INT, T(diloco_fragments), "1", 1, 1024, NULL, false, "streaming: sync the model in P fragments of whole layers at staggered inner steps; 1 = the whole model at once"},
    {"diloco_overlap_steps", KEY_INT, T(diloco_overlap_steps), "0", 0, BIG, NULL, false, "streaming: inner steps that run while a fragment's exchange is in flight (below diloco_inner_steps / diloco_fragments); 0 = training waits for it"},
    {"diloco_merge_alpha", KEY_FLOAT, T(diloco_merge_alpha), "0.5", 0, 1, NULL, false, "streaming (diloco_overlap_steps > 0): a landed fragment's weights become alpha·local + (1 − alpha)·global"},
    {"diloco_transport", KEY_CHOICE, T(diloco_transport), "tcp", 0, 0, "tcp|mpi|local", false, "tcp: replicas meet at a hub (relay); mpi: replicas are the ranks of one MPI job; local: all replicas simulated in this process, one after another"},
    {"diloco_rendezvous", KEY_STRING, T(diloco_rendezvous), "", 0, 0, NULL, false, "tcp: host:port of the hub (a `train_gpt relay`, or the replica with diloco_serve = 1)"},
    {"diloco_serve", KEY_BOOL, T(diloco_serve), "0", 0, 1, NULL, false, "tcp: this replica also runs the hub, listening on diloco_rendezvous"},
    {"diloco_streams", KEY_INT, T(diloco_streams), "1", 1, 64, NULL, false, "tcp: parallel TCP data connections per replica for outer gradients"},
    {"diloco_quant", KEY_CHOICE, T(diloco_quant), "int8", 0, 0, "none|int8|int4|int2", false, "how outer gradients travel: none (fp32), or blockwise int8 / int4 / int2"},
    {"diloco_quant_block", KEY_INT, T(diloco_quant_block), "128", 2, 1 << 20, NULL, false, "values per quantization block (one fp32 scale each)"},
    {"diloco_error_feedback", KEY_BOOL, T(diloco_error_feedback), "0", 0, 1, NULL, false, "keep what quantization lost and add it to the next outer gradient"},
    {"diloco_topk", KEY_FLOAT, T(diloco_topk), "1", 0.0001, 1, NULL, false, "fraction of each block's outer-gradient values sent (the largest |value|s; 1 = dense); below 1 needs diloco_error_feedback = 1"},
    {"diloco_downlink", KEY_CHOICE, T(diloco_downlink), "same", 0, 0, "same|bf16|fp32", false, "how the hub sends the mean back, always dense: in the uplink's codec (same; without diloco_topk), bf16 or fp32 (diloco_quant = none: always fp32)"},
    {"diloco_bound", KEY_FLOAT, T(diloco_bound), "3", 0, 1e6, NULL, false, "the reducer scales a contribution down to this many times the median norm of the round's contributions (per segment); 0 = no bound"},
    {"diloco_downlink_feedback", KEY_BOOL, T(diloco_downlink_feedback), "1", 0, 1, NULL, false, "the hub keeps what encoding the mean lost and adds it to the next mean (4 bytes per parameter at the hub)"},
    {"diloco_timeout_s", KEY_FLOAT, T(diloco_timeout_s), "60", 0.1, 1e6, NULL, false, "a replica silent or late this long is dropped from the round"},
    {"diloco_connect_timeout_s", KEY_FLOAT, T(diloco_connect_timeout_s), "300", 0.1, 1e6, NULL, false, "how long a replica keeps trying to reach the hub at start"},
    {"diloco_secret_file", KEY_STRING, T(diloco_secret_file), "", 0, 0, NULL, false, "tcp: file holding the shared secret (>= 16 bytes) that authenticates replicas"},
    {"diloco_min_replicas", KEY_INT, T(diloco_min_replicas), "1", 1, 256, NULL, false, "fewer contributors than this: the outer step is skipped"},
    {"diloco_sync_every_s", KEY_FLOAT, T(diloco_sync_every_s), "0", 0, 1e6, NULL, false, "an inner phase lasts at least this many seconds: a replica done with its diloco_inner_steps sooner goes on with extra inner steps (at its last step's learning rate) until then, so that a fast cluster trains instead of waiting; 0 = exactly diloco_inner_steps"},
    {"diloco_carry_late", KEY_BOOL, T(diloco_carry_late), "1", 0, 1, NULL, false, "a replica that takes the group's state after missing rounds keeps its unsent work: local weights = θ − w·(its θ − its weights), w = 1/(1 + outer steps missed per fragment); 0 = local weights = θ (the work is dropped)"},
};
#define N_KEYS ((int)(sizeof KEYS / sizeof KEYS[0]))

// Where each key's current value came from, for error messages.
static char key_source[N_KEYS][512];

static const key_spec *find_key(const char *name, int *index) {
    for (int i = 0; i < N_KEYS; i++)
        if (strcmp(KEYS[i].name, name) == 0) {
            if (index) *index = i;
            return &KEYS[i];
        }
    return NULL;
}

static bool choice_allowed(const char *choices, const char *value) {
    size_t n = strlen(value);
    for (const char *c = choices; *c;) {
        const char *bar = strchr(c, '|');
        size_t len = bar ? (size_t)(bar - c) : strlen(c);
        if (len == n && strncmp(c, value, n) == 0) return true;
        if (!bar) break;
        c = bar + 1;
    }
    return false;
}

// Parses `text` into the key's field; on failure returns a message (static buffer).
static const char *set_value(train_config *cfg, const key_spec *k, const char *text) {
    static char why[256];
    void *field = (char *)cfg + k->offset;
    // A number key that also takes a word ("auto"): NaN or -1 until config_finish resolves it.
    const char *or_word = k->type != KEY_CHOICE && k->choices ? " or " : "";
    const char *word = k->type != KEY_CHOICE && k->choices ? k->choices : "";
    if (*word && strcmp(text, word) == 0) {
        if (k->type == KEY_FLOAT) *(double *)field = NAN;
        else *(int64_t *)field = -1;
        return NULL;
    }
    switch (k->type) {
    case KEY_INT: {
        errno = 0;
        char *end;
        long long v = strtoll(text, &end, 10);
        // Leading zeros stay decimal.
        if (errno || end == text || *end != '\0' || !plain_decimal(text)) {
            snprintf(why, sizeof why, "expected an integer%s%s, got '%s'", or_word, word, text);
            return why;
        }
        if ((double)v < k->min || (double)v > k->max) {
            snprintf(why, sizeof why, "expected an integer in [%.0f, %.0f]%s%s, got '%s'", k->min, k->max, or_word, word,
                     text);
            return why;
        }
        *(int64_t *)field = v;
        return NULL;
    }
    case KEY_FLOAT: {
        errno = 0;
        char *end;
        double v = strtod(text, &end);
        // A subnormal (1e-310) is a number; ERANGE there is only its precision.
        if (errno == ERANGE && v != 0.0 && fabs(v) < 1.0) errno = 0;
        if (errno || end == text || *end != '\0' || !isfinite(v) || !plain_decimal(text)) {
            snprintf(why, sizeof why, "expected a number%s%s, got '%s'", or_word, word, text);
            return why;
        }
        if (v < k->min || v > k->max) {
            snprintf(why, sizeof why, "expected a number in [%g, %g]%s%s, got '%s'", k->min, k->max, or_word, word, text);
            return why;
        }
        *(double *)field = v;
        return NULL;
    }
    case KEY_BOOL:
        if (!strcmp(text, "1") || !strcmp(text, "true")) {
            *(bool *)field = true;
            return NULL;
        }
        if (!strcmp(text, "0") || !strcmp(text, "false")) {
            *(bool *)field = false;
            return NULL;
        }
        snprintf(why, sizeof why, "expected 0, 1, true or false, got '%s'", text);
        return why;
    case KEY_CHOICE:
        if (!choice_allowed(k->choices, text)) {
            snprintf(why, sizeof why, "expected one of %s, got '%s'", k->choices, text);
            return why;
        }
        __attribute__((fallthrough));  // a valid choice is stored as a string
    case KEY_STRING: {
        char **slot = field;
        free(*slot);
        *slot = xstrdup(text);
        return NULL;
    }
    }
    return "unknown key type";
}

static void apply(train_config *cfg, const char *name, const char *value, const char *source) {
    int index;
    const key_spec *k = find_key(name, &index);
    if (!k && strcmp(name, "val_steps") == 0)
        fail("%s: val_steps was replaced by val_tokens (validation covers the same tokens at every batch size and "
             "replica count): val_tokens = val_steps x batch_size x seq_len, or 0 for the whole validation set",
             source);
    if (!k) fail("%s: unknown key '%s' (see ./train_gpt --help)", source, name);
    const char *why = set_value(cfg, k, value);
    // "--lr" already names the key; "file:line" does not.
    if (why && strncmp(source, "--", 2) == 0) fail("%s: %s", source, why);
    if (why) fail("%s: %s: %s", source, name, why);
    snprintf(key_source[index], sizeof key_source[index], "%s", source);
}

static char *trim(char *s) {
    while (*s == ' ' || *s == '\t') s++;
    char *e = s + strlen(s);
    while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r' || e[-1] == '\n')) *--e = '\0';
    return s;
}

// Strips one pair of matching double quotes; a '#' inside quotes is not a comment.
static char *split_comment_and_unquote(char *value, const char *where, const char *name) {
    if (*value == '"') {
        char *close = strchr(value + 1, '"');
        if (!close) fail("%s: %s: unterminated quoted value", where, name);
        char *rest = trim(close + 1);
        if (*rest && *rest != '#')
            fail("%s: %s: text after the closing quote (a quoted value cannot hold a double quote)", where, name);
        *close = '\0';
        return value + 1;
    }
    char *hash = strchr(value, '#');
    if (hash) *hash = '\0';
    return trim(value);
}

// A config is a few KB. A bigger "config" is a mistyped path (`train_gpt data/x_train_000.bin`):
// read whole it cost its size in memory before "not a text file" (a 1.5 GB shard: 1.75 GB
// peak), or "out of memory" without naming the file.
#define CONFIG_MAX_MIB 16
#define CONFIG_MAX_BYTES ((size_t)CONFIG_MAX_MIB << 20)

// What a file that starts with these bytes is, when it is one of ours that is no config.
static const char *binary_file_kind(const uint8_t *head, size_t bytes, uint64_t file_bytes) {
    if (bytes >= 8 && memcmp(head, "TGPTSHRD", 8) == 0) return "a train_gpt token shard: it starts with TGPTSHRD";
    // safetensors: a u64 header length, then the JSON header itself, which opens with '{'
    if (bytes >= 9 && head[8] == '{' && get_u64(head) >= 2 && get_u64(head) <= file_bytes - 8)
        return "a safetensors file";
    return NULL;
}

static void fail_not_a_config(const char *path, const char *size, const char *why) {
    fail("%s: %s bytes: not a config file (%s)", path, size, why);
}

// The file's text, NUL-terminated. Never more than CONFIG_MAX_BYTES + 1 bytes are read, so a
// huge file or an endless stream (a pipe, /dev/zero) costs no more memory than a big config.
static char *read_config_text(const char *path, size_t *bytes_out) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st = {0};
    if (fd < 0 || fstat(fd, &st) != 0) fail("cannot read config file '%s': %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode)) fail("cannot read config file '%s': %s", path, strerror(EISDIR));
    bool regular = S_ISREG(st.st_mode);
    size_t cap = regular && (uint64_t)st.st_size <= CONFIG_MAX_BYTES ? (size_t)st.st_size : (size_t)1 << 16;
    if (cap < 16) cap = 16;
    char *text = xmalloc(cap + 1);
    size_t bytes = 0;
    char size[64];
    if (regular && (uint64_t)st.st_size > CONFIG_MAX_BYTES) {   // only its head, to say what it is
        ssize_t n = pread(fd, text, 16, 0);
        const char *kind = binary_file_kind((const uint8_t *)text, n > 0 ? (size_t)n : 0, (uint64_t)st.st_size);
        snprintf(size, sizeof size, "%lld", (long long)st.st_size);
        fail_not_a_config(path, size, kind ? kind : "a config file has at most " TEXT_OF(CONFIG_MAX_MIB) " MiB");
    }
    for (;;) {
        if (bytes == cap) {
            if (cap > CONFIG_MAX_BYTES) {
                snprintf(size, sizeof size, "more than %zu", CONFIG_MAX_BYTES);
                fail_not_a_config(path, size, "a config file has at most " TEXT_OF(CONFIG_MAX_MIB) " MiB");
            }
            cap = cap * 2 > CONFIG_MAX_BYTES ? CONFIG_MAX_BYTES + 1 : cap * 2;
            text = xrealloc(text, cap + 1);
        }
        ssize_t n = read(fd, text + bytes, cap - bytes);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) fail("cannot read config file '%s': %s", path, strerror(errno));
        if (n == 0) break;
        bytes += (size_t)n;
    }
    close(fd);
    text[bytes] = '\0';
    const char *kind = binary_file_kind((const uint8_t *)text, bytes, bytes);
    if (kind) {
        snprintf(size, sizeof size, "%zu", bytes);
        fail_not_a_config(path, size, kind);
    }
    *bytes_out = bytes;
    return text;
}

static void read_config_file(train_config *cfg, const char *path) {
    size_t bytes;
    char *text = read_config_text(path, &bytes);
    if (memchr(text, '\0', bytes)) fail("%s: not a text file (contains a NUL byte)", path);
    int line_no = 0;
    bool seen[N_KEYS] = {0};
    int seen_line[N_KEYS] = {0};
    // A UTF-8 byte order mark, which some Windows editors write, is no part of the first key.
    char *start = strncmp(text, "\xEF\xBB\xBF", 3) == 0 ? text + 3 : text;
    // Split by hand: strtok would skip empty lines and lose the line count.
    for (char *line = start; line && *line;) {
        char *next = strchr(line, '\n');
        if (next) *next++ = '\0';
        line_no++;
        char where[512];
        snprintf(where, sizeof where, "%s:%d", path, line_no);
        char *s = trim(line);
        if (*s == '\0' || *s == '#') {
            line = next;
            continue;
        }
        char *eq = strchr(s, '=');
        if (!eq) fail("%s: expected 'key = value', got '%s'", where, s);
        *eq = '\0';
        char *name = trim(s);
        if (*name == '\0') fail("%s: missing key before '='", where);
        char *value = split_comment_and_unquote(trim(eq + 1), where, name);
        int index;
        if (find_key(name, &index)) {
            if (seen[index]) fail("%s: %s is set twice (first at line %d)", where, name, seen_line[index]);
            seen[index] = true;
            seen_line[index] = line_no;
        }
        apply(cfg, name, value, where);
        line = next;
    }
    free(text);
}

static void set_defaults(train_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    for (int i = 0; i < N_KEYS; i++) {
        key_source[i][0] = '\0';
        if (KEYS[i].fallback) {
            const char *why = set_value(cfg, &KEYS[i], KEYS[i].fallback);
            CHECK(why == NULL);
            snprintf(key_source[i], sizeof key_source[i], "default");
        }
    }
}

static const char *source_of(const char *name) {
    int index;
    CHECK(find_key(name, &index));
    return key_source[index][0] ? key_source[index] : "config";
}

void config_refuse(const char *key, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const char *src = source_of(key);
    if (strncmp(src, "--", 2) == 0) fail("%s: %s", src, msg);
    if (strcmp(src, "default") == 0) fail("%s (the default): %s", key, msg);
    fail("%s: %s: %s", src, key, msg);
}

// A cross-key rule broke: name the first key and where it was set.
#define RULE(ok, key, ...)                   \
    do {                                     \
        if (!(ok)) config_refuse(key, __VA_ARGS__); \
    } while (0)

// The outer optimizer's auto values. lr and μ both auto: Nesterov μ 0.9 at lr 0.2 for a run
// of at least DILOCO_MOMENTUM_ROUNDS outer steps (counted from step 0, so that a resumed run
// resolves the same) with DILOCO_MOMENTUM_REPLICAS replicas or more, else plain averaging (lr 1,
// μ 0); one of them auto beside a set one: plain averaging's value. diloco_plain_in_decay auto:
// on with momentum. diloco_decay_inner_steps auto: shorter in the decay phase wherever that
// phase is plain averaging after momentum, and for the auto outer optimizer's every run of that
// length with 2+ replicas (plain averaging throughout at M = 2).
static void resolve_outer_auto(train_config *cfg) {
    bool lr_auto = isnan(cfg->diloco_outer_lr), mu_auto = isnan(cfg->diloco_outer_momentum);
    cfg->diloco_outer_auto = lr_auto && mu_auto;
    bool auto_long_run = cfg->diloco_outer_auto && cfg->diloco_replicas >= 2 &&
                         cfg->max_steps / cfg->diloco_inner_steps >= DILOCO_MOMENTUM_ROUNDS;
    bool momentum = auto_long_run && cfg->diloco_replicas >= DILOCO_MOMENTUM_REPLICAS;
    if (lr_auto) cfg->diloco_outer_lr = momentum ? 0.2 : 1.0;
    if (mu_auto) cfg->diloco_outer_momentum = momentum ? 0.9 : 0.0;
    if (cfg->diloco_plain_in_decay < 0) cfg->diloco_plain_in_decay = cfg->diloco_outer_momentum > 0;
    // diloco_decay_inner_steps auto: with plain averaging in the decay (after momentum, or the
    // auto outer optimizer's over a long run), H / DILOCO_DECAY_SYNC_FACTOR there, or the shortest
    // interval a streaming schedule allows (P·(τ + 1)); 0 (= H) where that is not shorter than H,
    // and otherwise.
    cfg->diloco_decay_auto = cfg->diloco_decay_inner_steps < 0;
    if (cfg->diloco_decay_auto) {
        int64_t H = cfg->diloco_inner_steps, Hd = 0;
        // P·(τ + 1) overflowed int64 for a τ near its bound (9e18), before the rule below that
        // refuses τ ≥ H / P. Such a τ gives P·(τ + 1) > H, so no shorter interval: Hd = 0.
        if ((cfg->diloco_plain_in_decay || auto_long_run) && cfg->diloco_overlap_steps < H / cfg->diloco_fragments) {
            int64_t least = cfg->diloco_fragments * (cfg->diloco_overlap_steps + 1);
            Hd = H / DILOCO_DECAY_SYNC_FACTOR > least ? H / DILOCO_DECAY_SYNC_FACTOR : least;
            if (Hd >= H) Hd = 0;
        }
        cfg->diloco_decay_inner_steps = Hd;
    }
}

// Tokens per step and per run, each key within its range but not their product: 2²⁰ ·
// 2²² · 2²⁰ · 4 processes wrapped int64 to "0 tokens/step". A step is at most 2⁴⁰ tokens
// (~1000 times the largest batches trained) and a run at most 2⁵³, the bound state.json puts on
// tokens_seen (a checkpoint beyond it is refused: the run could not resume).
void config_check_tokens(const train_config *cfg, int64_t processes) {
    double per_step = (double)cfg->batch_size * (double)cfg->model.seq_len * (double)cfg->grad_accum * (double)processes;
    char procs[64] = "";
    if (processes > 1) snprintf(procs, sizeof procs, " x %lld processes", (long long)processes);
    RULE(per_step <= 0x1p40, "batch_size", "%lld x %lld tokens x %lld grad_accum%s = %.3g tokens per step: more than "
         "2^40 (lower batch_size, seq_len or grad_accum%s)", (long long)cfg->batch_size, (long long)cfg->model.seq_len,
         (long long)cfg->grad_accum, procs, per_step, processes > 1 ? ", or use fewer processes" : "");
    RULE(per_step * (double)cfg->max_steps <= 0x1p53, "max_steps", "%lld steps of %.3g tokens%s = %.3g tokens: more "
         "than 2^53, the bound of tokens_seen in a checkpoint (lower max_steps)", (long long)cfg->max_steps, per_step,
         processes > 1 ? " (all processes)" : "", per_step * (double)cfg->max_steps);
}

int64_t decay_start_step(const train_config *cfg) {
    return cfg->max_steps - (int64_t)llround(cfg->decay_frac * (double)cfg->max_steps);
}

static bool set_on_command_line(const char *key) { return strncmp(source_of(key), "--", 2) == 0; }

// The warm-up ends by the decay phase's start (DESIGN.md's WSD: warm-up, stable, decay). One
// that ran past it climbed to the peak inside the decay and then dropped onto the decay line in
// one step, and warmup_steps = max_steps never decayed at all. The error blames the key set on
// the command line: a `--max_steps 50` for a short test against a file's warmup_steps 700 is
// fixed by lowering warmup_steps too, which the file's line alone would not say.
static void check_warmup(const train_config *cfg) {
    int64_t W = cfg->warmup_steps, S = cfg->max_steps, Sd = decay_start_step(cfg);
    if (W <= Sd) return;
    const char *key = "warmup_steps";
    if (!set_on_command_line("warmup_steps")) {
        if (set_on_command_line("max_steps")) key = "max_steps";
        else if (W <= S && set_on_command_line("decay_frac")) key = "decay_frac";
    }
    const char *short_test = strcmp(key, "decay_frac") ? "; --warmup_steps 0 for a short test" : "";
    char decay[160];
    snprintf(decay, sizeof decay, "step %lld (max_steps %lld - round(decay_frac %g x %lld))", (long long)Sd,
             (long long)S, cfg->decay_frac, (long long)S);
    if (strcmp(key, "warmup_steps") == 0 && W > S)
        RULE(false, key, "%lld is more than max_steps %lld (lower warmup_steps with max_steps%s)", (long long)W,
             (long long)S, short_test);
    if (strcmp(key, "warmup_steps") == 0)
        RULE(false, key, "%lld runs into the decay phase, which starts at %s: the lr would climb to its peak inside "
             "the decay and then drop at once (lower warmup_steps to at most %lld, or decay_frac)", (long long)W, decay,
             (long long)Sd);
    char value[64];
    if (strcmp(key, "max_steps") == 0) snprintf(value, sizeof value, "%lld", (long long)S);
    else snprintf(value, sizeof value, "%g", cfg->decay_frac);
    if (W > S)
        RULE(false, key, "%s is less than warmup_steps %lld (%s): lower warmup_steps too (at most %lld%s)", value,
             (long long)W, source_of("warmup_steps"), (long long)Sd, short_test);
    RULE(false, key, "%s puts the decay phase's start at %s, before warmup_steps %lld (%s) ends: lower warmup_steps "
         "too (at most %lld%s)", value, decay, (long long)W, source_of("warmup_steps"), (long long)Sd, short_test);
}

void config_finish(train_config *cfg) {
    model_config *m = &cfg->model;
    if (m->n_kv_head == 0) m->n_kv_head = m->n_head;
    RULE(m->n_head % m->n_kv_head == 0, "n_kv_head", "n_head (%lld) must be a multiple of n_kv_head (%lld)",
         (long long)m->n_head, (long long)m->n_kv_head);
    if (m->head_dim == 0) {
        RULE(m->d_model % m->n_head == 0, "head_dim",
             "d_model (%lld) is not divisible by n_head (%lld); set head_dim explicitly", (long long)m->d_model,
             (long long)m->n_head);
        m->head_dim = m->d_model / m->n_head;
    }
    RULE(m->head_dim % 2 == 0, "head_dim", "must be even for RoPE, got %lld", (long long)m->head_dim);
    RULE(m->doc_token < m->vocab_size, "doc_token", "%lld is not below vocab_size %lld", (long long)m->doc_token,
         (long long)m->vocab_size);
    RULE(m->norm_eps > 0, "norm_eps", "must be > 0");
    // Each key is within its range, but their products need not be: bound the model (2⁴⁴
    // parameters, ~70 times the largest dense models trained) and a micro-batch's activations
    // (2⁴⁸ values) so that every size the planner and the backends compute fits int64.
    double C = (double)m->d_model, QD = (double)m->n_head * (double)m->head_dim,
           KD = (double)m->n_kv_head * (double)m->head_dim, F = (double)m->d_ff, L = (double)m->n_layer;
    double params = (double)m->vocab_size * C * 2 + L * (2 * C * QD + 2 * C * KD + 3 * C * F + 2 * C);
    RULE(params <= 0x1p44, "d_model", "the model would have %.3g parameters: more than 2^44 (check d_model, d_ff, "
         "n_layer, vocab_size)", params);
    double rows = (double)cfg->batch_size * (double)m->seq_len;
    double acts = rows * L * (3 * C + 3 * QD + 3 * KD + 3 * F + 2 * (double)m->n_head) + rows * (double)m->vocab_size;
    RULE(acts <= 0x1p48, "batch_size", "a micro-batch of %lld x %lld tokens would hold %.3g activation values: more "
         "than 2^48 (lower batch_size or seq_len)", (long long)cfg->batch_size, (long long)m->seq_len, acts);
    config_check_tokens(cfg, 1);   // again with the processes once they are known
    check_warmup(cfg);
    RULE(cfg->lr > 0, "lr", "must be > 0");
    RULE(cfg->out_dir[0] != '\0', "out_dir", "must not be empty");
    if (strcmp(cfg->resume, "auto") && strcmp(cfg->resume, "never"))
        RULE(cfg->init_from[0] == '\0', "init_from", "cannot be combined with resume = %s", cfg->resume);
    RULE(cfg->recompute_layers == 1 || strcmp(cfg->recompute, "none") != 0, "recompute_layers",
         "%lld has no effect with recompute = none (set recompute = selective or full)",
         (long long)cfg->recompute_layers);
    RULE(cfg->recompute_layers == 1 || strcmp(cfg->recompute, "auto") != 0, "recompute_layers",
         "%lld cannot be combined with recompute = auto, which chooses it (set recompute = selective or full)",
         (long long)cfg->recompute_layers);
    resolve_outer_auto(cfg);
    RULE(cfg->sample_every == 0 || cfg->tokenizer[0], "sample_every", "samples need a tokenizer file (set tokenizer)");
    if (cfg->diloco_replicas > 0) {
        bool tcp = strcmp(cfg->diloco_transport, "tcp") == 0;
        RULE(cfg->diloco_replica_id < cfg->diloco_replicas, "diloco_replica_id", "%lld is not below diloco_replicas %lld",
             (long long)cfg->diloco_replica_id, (long long)cfg->diloco_replicas);
        RULE(!tcp || cfg->diloco_replica_id >= 0, "diloco_replica_id",
             "must be set (0 .. diloco_replicas-1) with diloco_transport = tcp");
        RULE(!tcp || cfg->diloco_rendezvous[0], "diloco_rendezvous", "must be set (host:port of the hub) with "
             "diloco_transport = tcp");
        RULE(!tcp || cfg->diloco_secret_file[0], "diloco_secret_file", "must be set with diloco_transport = tcp: "
             "replicas authenticate with a shared secret");
        RULE(cfg->diloco_fragments <= cfg->model.n_layer, "diloco_fragments",
             "%lld is more than n_layer %lld: a fragment holds whole layers", (long long)cfg->diloco_fragments,
             (long long)cfg->model.n_layer);
        RULE(cfg->diloco_fragments <= cfg->diloco_inner_steps, "diloco_fragments",
             "%lld is more than diloco_inner_steps %lld: each fragment needs its own inner step to sync at",
             (long long)cfg->diloco_fragments, (long long)cfg->diloco_inner_steps);
        int64_t gap = cfg->diloco_inner_steps / cfg->diloco_fragments;
        RULE(cfg->diloco_overlap_steps < gap, "diloco_overlap_steps",
             "%lld must be below diloco_inner_steps / diloco_fragments = %lld, so that a fragment lands before the "
             "next one starts", (long long)cfg->diloco_overlap_steps, (long long)gap);
        if (cfg->diloco_decay_inner_steps > 0) {
            int64_t Hd = cfg->diloco_decay_inner_steps;
            RULE(cfg->diloco_fragments <= Hd, "diloco_decay_inner_steps",
                 "%lld is less than diloco_fragments %lld: each fragment needs its own inner step to sync at",
                 (long long)Hd, (long long)cfg->diloco_fragments);
            RULE(cfg->diloco_fragments > Hd || cfg->diloco_overlap_steps < Hd / cfg->diloco_fragments,
                 "diloco_overlap_steps", "%lld must be below diloco_decay_inner_steps / diloco_fragments = %lld, so "
                 "that a fragment lands before the next one starts", (long long)cfg->diloco_overlap_steps,
                 (long long)(Hd / cfg->diloco_fragments));
        }
        RULE(strcmp(cfg->diloco_quant, "none") != 0 || strcmp(cfg->diloco_downlink, "bf16") != 0, "diloco_downlink",
             "bf16 with diloco_quant = none would send the mean of the weights themselves in bf16; use same or fp32");
        RULE(cfg->diloco_topk == 1 || strcmp(cfg->diloco_quant, "none") != 0, "diloco_topk",
             "%g < 1 needs diloco_quant int8, int4 or int2 (none sends the weights, not a sparse Δ)", cfg->diloco_topk);
        RULE(cfg->diloco_topk == 1 || cfg->diloco_error_feedback, "diloco_topk",
             "%g < 1 needs diloco_error_feedback = 1: the values top-k does not send must wait in the residual",
             cfg->diloco_topk);
        RULE(cfg->diloco_min_replicas <= cfg->diloco_replicas, "diloco_min_replicas", "%lld is more than "
             "diloco_replicas %lld", (long long)cfg->diloco_min_replicas, (long long)cfg->diloco_replicas);
        RULE(cfg->diloco_sync_every_s == 0 || (cfg->diloco_fragments == 1 && cfg->diloco_overlap_steps == 0),
             "diloco_sync_every_s", "%g cannot be combined with streaming (diloco_fragments %lld, "
             "diloco_overlap_steps %lld): a phase on wall time is the whole model's", cfg->diloco_sync_every_s,
             (long long)cfg->diloco_fragments, (long long)cfg->diloco_overlap_steps);
        RULE(strcmp(cfg->diloco_transport, "local") != 0 || (cfg->fsdp_size <= 1 && cfg->dp_replicate <= 1),
             cfg->fsdp_size > 1 ? "fsdp_size" : "dp_replicate",
             "%lld: diloco_transport = local simulates the replicas in this one process, unsharded (it trained so, "
             "saying nothing); set fsdp_size and dp_replicate for the run over tcp, or leave them at 0 here",
             (long long)(cfg->fsdp_size > 1 ? cfg->fsdp_size : cfg->dp_replicate));
        RULE(cfg->diloco_sync_every_s == 0 || strcmp(cfg->diloco_transport, "local") != 0, "diloco_sync_every_s",
             "%g has no meaning with diloco_transport = local (the simulated replicas run one after another)",
             cfg->diloco_sync_every_s);
    }
}

recompute_setting config_recompute(const train_config *cfg) {
    recompute_setting r = {RECOMPUTE_NONE, cfg->recompute_layers};
    if (strcmp(cfg->recompute, "selective") == 0) r.mode = RECOMPUTE_SELECTIVE;
    else if (strcmp(cfg->recompute, "full") == 0) r.mode = RECOMPUTE_FULL;
    return r;
}

bool config_recompute_auto(const train_config *cfg) { return strcmp(cfg->recompute, "auto") == 0; }

void config_set_recompute(train_config *cfg, recompute_setting r) {
    free(cfg->recompute);
    cfg->recompute = xstrdup(recompute_name(r.mode));
    cfg->recompute_layers = r.every;
}

const char *recompute_name(recompute_mode mode) {
    return mode == RECOMPUTE_FULL ? "full" : mode == RECOMPUTE_SELECTIVE ? "selective" : "none";
}

void config_check_files(const train_config *cfg) {
    if (strcmp(cfg->resume, "auto") && strcmp(cfg->resume, "never"))
        RULE(dir_exists(cfg->resume), "resume", "'%s' is not auto, never, or an existing checkpoint directory",
             cfg->resume);
    // init_from is checked where it is read (restore_or_init): a resume does not need it.
    if (cfg->tokenizer[0]) RULE(file_exists(cfg->tokenizer), "tokenizer", "no such file '%s'", cfg->tokenizer);
    if (cfg->diloco_replicas > 0 && cfg->diloco_secret_file[0] && strcmp(cfg->diloco_transport, "tcp") == 0)
        RULE(file_exists(cfg->diloco_secret_file), "diloco_secret_file", "no such file '%s'", cfg->diloco_secret_file);
}

static void check_required(void) {
    for (int i = 0; i < N_KEYS; i++)
        if (!KEYS[i].fallback && key_source[i][0] == '\0')
            fail("missing required key '%s' (%s); set it in the config or with --%s", KEYS[i].name, KEYS[i].doc,
                 KEYS[i].name);
}

void config_load(train_config *cfg, const char *path, int argc, char **argv) {
    set_defaults(cfg);
    if (path) read_config_file(cfg, path);
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        if (strncmp(arg, "--", 2) != 0 || arg[2] == '\0')
            fail("command line: expected --key value or --key=value, got '%s'", arg);
        char name[256];
        const char *value;
        const char *eq = strchr(arg, '=');
        if (eq) {
            snprintf(name, sizeof name, "%.*s", (int)(eq - arg - 2), arg + 2);
            value = eq + 1;
        } else {
            snprintf(name, sizeof name, "%s", arg + 2);
            if (i + 1 >= argc) fail("--%s: missing value", name);
            value = argv[++i];
        }
        char where[300];
        snprintf(where, sizeof where, "--%s", name);
        // A value is one line: the config a checkpoint saves (config_to_text), which a resume
        // reads line by line, could not hold it. A double quote is fine there (an out_dir, a
        // sample_prompt may hold one: that reader takes the text between the outer quotes).
        if (strpbrk(value, "\n\r"))
            fail("%s: a value cannot hold a line break (the config a checkpoint saves is one value per line)", where);
        apply(cfg, name, value, where);
    }
    check_required();
    config_finish(cfg);
}

void config_free(train_config *cfg) {
    for (int i = 0; i < N_KEYS; i++)
        if (KEYS[i].type == KEY_STRING || KEYS[i].type == KEY_CHOICE) {
            char **slot = (char **)((char *)cfg + KEYS[i].offset);
            free(*slot);
            *slot = NULL;
        }
}

static void append_value(strbuf *sb, const train_config *cfg, const key_spec *k, bool json) {
    const void *field = (const char *)cfg + k->offset;
    switch (k->type) {
    case KEY_INT: sb_printf(sb, "%lld", (long long)*(const int64_t *)field); break;
    case KEY_FLOAT: sb_json_number(sb, *(const double *)field); break;
    case KEY_BOOL: sb_append(sb, *(const bool *)field ? (json ? "true" : "1") : (json ? "false" : "0")); break;
    case KEY_STRING:
    case KEY_CHOICE: {
        const char *s = *(char *const *)field;
        if (json) sb_json_string(sb, s ? s : "");
        else sb_printf(sb, "\"%s\"", s ? s : "");
        break;
    }
    }
}

char *model_config_to_json(const model_config *m) {
    train_config wrapper;
    memset(&wrapper, 0, sizeof wrapper);
    wrapper.model = *m;
    strbuf sb = {0};
    sb_append(&sb, "{");
    bool first = true;
    for (int i = 0; i < N_KEYS; i++) {
        if (!KEYS[i].is_model) continue;
        sb_printf(&sb, "%s\"%s\":", first ? "" : ",", KEYS[i].name);
        append_value(&sb, &wrapper, &KEYS[i], true);
        first = false;
    }
    sb_append(&sb, "}");
    return sb.data;
}

bool model_config_from_json(const char *json, model_config *m, const char **why) {
    static char msg[256];
    json_doc doc;
    if (!json_parse(json, strlen(json), &doc)) {
        snprintf(msg, sizeof msg, "model config JSON: %s", doc.error);
        *why = msg;
        return false;
    }
    train_config wrapper;
    memset(&wrapper, 0, sizeof wrapper);
    bool ok = doc.root.type == JSON_OBJECT;
    if (!ok) snprintf(msg, sizeof msg, "model config is not a JSON object");
    for (int i = 0; ok && i < N_KEYS; i++) {
        const key_spec *k = &KEYS[i];
        if (!k->is_model) continue;
        const json_value *v = json_get(&doc.root, k->name);
        void *field = (char *)&wrapper + k->offset;
        if (!v) {
            snprintf(msg, sizeof msg, "model config lacks '%s'", k->name);
            ok = false;
        } else if (k->type == KEY_INT && v->type == JSON_NUMBER && v->is_integer && v->integer >= k->min &&
                   v->integer <= k->max) {
            *(int64_t *)field = v->integer;
        } else if (k->type == KEY_FLOAT && v->type == JSON_NUMBER && v->number >= k->min && v->number <= k->max) {
            *(double *)field = v->number;
        } else if (k->type == KEY_BOOL && v->type == JSON_BOOL) {
            *(bool *)field = v->boolean;
        } else {
            // Out of the key's range too (a non-finite rope_theta once read back as inf and wrote as null).
            snprintf(msg, sizeof msg, "model config has a bad value for '%s'", k->name);
            ok = false;
        }
    }
    json_free(&doc);
    // The rules between keys too (config_finish's): each value must be one a config file could
    // give its key, 0 for n_kv_head and head_dim meaning what it means there.
    model_config *w = &wrapper.model;
    if (ok && w->n_kv_head == 0) w->n_kv_head = w->n_head;
    if (ok && w->head_dim == 0 && w->d_model % w->n_head == 0) w->head_dim = w->d_model / w->n_head;
    const char *rule = !ok                                   ? NULL
                       : w->n_head % w->n_kv_head != 0      ? "n_kv_head (n_head must be a multiple of it)"
                       : w->head_dim == 0 || w->head_dim % 2 ? "head_dim (d_model not divisible by n_head, or odd)"
                       : w->doc_token >= w->vocab_size       ? "doc_token (not below vocab_size)"
                       : !(w->norm_eps > 0)                  ? "norm_eps (must be > 0)"
                                                             : NULL;
    if (rule) {
        snprintf(msg, sizeof msg, "model config has a bad value for %s", rule);
        ok = false;
    }
    if (ok) *m = wrapper.model;
    else *why = msg;
    return ok;
}

bool model_config_equal(const model_config *a, const model_config *b) {
    return a->vocab_size == b->vocab_size && a->n_layer == b->n_layer && a->d_model == b->d_model &&
           a->n_head == b->n_head && a->n_kv_head == b->n_kv_head && a->head_dim == b->head_dim &&
           a->d_ff == b->d_ff && a->seq_len == b->seq_len && a->rope_theta == b->rope_theta &&
           a->nope_every == b->nope_every && a->qk_norm == b->qk_norm && a->tie_embeddings == b->tie_embeddings &&
           a->norm_eps == b->norm_eps && a->init_std == b->init_std && a->doc_masking == b->doc_masking &&
           a->doc_token == b->doc_token;
}

char *config_to_text(const train_config *cfg) {
    strbuf sb = {0};
    sb_append(&sb, "");
    for (int i = 0; i < N_KEYS; i++) {
        sb_printf(&sb, "%s = ", KEYS[i].name);
        append_value(&sb, cfg, &KEYS[i], false);
        sb_append(&sb, "\n");
    }
    return sb.data;
}

void config_print_help(void) {
    printf("usage: train_gpt CONFIG [--key value | --key=value]...      train (docs/config.md)\n"
           "       train_gpt plan CONFIG [--world N] [--gpu NAME] [--link_mbps X] [--key value]...\n"
           "                                                           memory per rank (docs/fsdp.md)\n"
           "       train_gpt prepare ...                               text to token shards (docs/data.md)\n"
           "       train_gpt relay --listen HOST:PORT --secret_file F ...  a DiLoCo hub (docs/protocol.md)\n"
           "       train_gpt diloco-tune CONFIG --replicas M --inner_steps H ...  outer lr (docs/diloco.md)\n"
           "       train_gpt plot OUT_DIR... [-o FILE.svg]             the dashboard (docs/plot.md)\n"
           "       train_gpt shards upgrade PATH...                    version 1 shards to version 2 (docs/data.md)\n"
           "       train_gpt --help | --version\n\n"
           "keys (default in brackets; 'required' has none):\n");
    for (int i = 0; i < N_KEYS; i++) {
        const key_spec *k = &KEYS[i];
        char def[64];
        if (!k->fallback) snprintf(def, sizeof def, "required");
        else snprintf(def, sizeof def, "%s", k->fallback[0] ? k->fallback : "\"\"");
        printf("  %-18s [%s]  %s\n", k->name, def, k->doc);
    }
}
