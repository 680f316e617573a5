// tok/sample.c — samples of generated text during training (see tok/sample.h).
#include "tok/sample.h"
#include "llmc/comm.h"
#include "llmc/common.h"
#include "llmc/json.h"
#include "llmc/rng.h"
#include "tok/tokenizer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct sampler {
    comm *job;               // FSDP: every rank runs the forward; rank 0's token choice rules
    tokenizer *tok;
    uint32_t *prompt;        // doc token + encoded prompt
    size_t prompt_len;
    int64_t new_tokens, max_context, vocab;
    int64_t doc_token;
    double temperature;
    uint64_t seed;
    int32_t *context;        // (max_context)
    float *logits;           // (vocab)
};

void sampler_set_job(sampler *s, comm *job) { s->job = job; }

char *sample_printable(const char *bytes, size_t n) {
    char *out = xmalloc(3 * n + 1), *q = out;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)bytes[i];
        if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7f) {
            memcpy(q, "\xEF\xBF\xBD", 3);   // U+FFFD
            q += 3;
        } else {
            *q++ = (char)c;
        }
    }
    *q = '\0';
    return out;
}

sampler *sampler_create(const train_config *cfg, const param_table *t) {
    char why[512];
    sampler *s = xcalloc(1, sizeof *s);
    s->tok = tokenizer_load(cfg->tokenizer, NULL, why, sizeof why);
    if (!s->tok) fail("tokenizer: %s", why);
    if ((int64_t)tokenizer_vocab_size(s->tok) > t->cfg.vocab_size)
        fail("tokenizer: '%s' has %u tokens, more than vocab_size %lld", cfg->tokenizer, tokenizer_vocab_size(s->tok),
             (long long)t->cfg.vocab_size);
    uint32_t *ids = NULL;
    size_t count = 0;
    size_t prompt_bytes = strlen(cfg->sample_prompt);
    bool encoded;
    if (tokenizer_can_split()) {
        encoded = tokenizer_encode(s->tok, cfg->sample_prompt, prompt_bytes, false, &ids, &count, why, sizeof why);
    } else {
        // Without PCRE2 the split regex cannot run: BPE over the whole prompt still gives
        // valid ids (decoding to the prompt), only not always the ones `prepare` would have
        // written. The samples are for reading; a run that samples must not fail for it.
        warn("sample_prompt: this train_gpt was built without PCRE2, so the prompt is encoded without the split "
             "regex (valid tokens, not always the ones prepare writes) ---> HINT: apt-get install libpcre2-dev and "
             "rebuild with make for the exact tokens");
        encoded = tokenizer_encode_unsplit(s->tok, cfg->sample_prompt, prompt_bytes, &ids, &count, why, sizeof why);
    }
    if (!encoded) fail("sample_prompt: cannot encode it: %s", why);
    s->doc_token = t->cfg.doc_token;
    s->prompt = xmalloc((count + 1) * sizeof *s->prompt);
    s->prompt_len = 0;
    if (s->doc_token >= 0) s->prompt[s->prompt_len++] = (uint32_t)s->doc_token;
    memcpy(s->prompt + s->prompt_len, ids, count * sizeof *ids);
    s->prompt_len += count;
    free(ids);
    if (s->prompt_len == 0)   // nothing to continue: the model's first position needs a token
        fail("sample_prompt: it is empty and the data has no doc_token to begin with ---> HINT: give a prompt, or "
             "sample_every = 0");
    s->max_context = t->cfg.seq_len;
    if ((int64_t)s->prompt_len >= s->max_context)
        fail("sample_prompt: %zu tokens do not fit in seq_len %lld", s->prompt_len, (long long)s->max_context);
    s->new_tokens = cfg->sample_tokens;
    s->vocab = t->cfg.vocab_size;
    s->temperature = cfg->sample_temperature;
    s->seed = (uint64_t)cfg->seed;
    s->context = xmalloc((size_t)s->max_context * sizeof *s->context);
    s->logits = alloc_floats((size_t)s->vocab);
    return s;
}

void sampler_free(sampler *s) {
    if (!s) return;
    tokenizer_free(s->tok);
    free(s->prompt);
    free(s->context);
    free(s->logits);
    free(s);
}

static int32_t pick_token(const float *logits, int64_t V, double temperature, rng_state *r) {
    int64_t best = 0;
    for (int64_t i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    if (temperature <= 0) return (int32_t)best;
    double total = 0;
    for (int64_t i = 0; i < V; i++) total += exp((logits[i] - logits[best]) / temperature);
    double u = rng_uniform(r) * total;
    for (int64_t i = 0; i < V; i++) {
        u -= exp((logits[i] - logits[best]) / temperature);
        if (u <= 0) return (int32_t)i;
    }
    return (int32_t)best;
}

void sampler_run(sampler *s, backend *b, int64_t step, metrics_log *log) {
    rng_state r;
    rng_seed(&r, s->seed, 0x5A4D504CULL + (uint64_t)step);
    int64_t len = (int64_t)s->prompt_len;
    for (int64_t i = 0; i < len; i++) s->context[i] = (int32_t)s->prompt[i];
    uint32_t *generated = xmalloc((size_t)(s->new_tokens + 1) * sizeof *generated);
    int64_t n = 0;
    for (; n < s->new_tokens; n++) {
        // Slide the window when the context is full: the newest seq_len - 1 tokens.
        if (len == s->max_context) {
            memmove(s->context, s->context + 1, (size_t)(len - 1) * sizeof *s->context);
            len--;
        }
        backend_forward_last_logits(b, s->context, len, s->logits);
        int32_t next = pick_token(s->logits, s->vocab, s->temperature, &r);
        if (s->job) comm_broadcast(s->job, &next, sizeof next, 0);  // the ranks stay in step
        if (next == s->doc_token) break;  // the document ended
        generated[n] = (uint32_t)next;
        s->context[len++] = next;
    }
    size_t prompt_bytes, gen_bytes;
    size_t skip = s->doc_token >= 0 ? 1 : 0;
    char *prompt = tokenizer_decode(s->tok, s->prompt + skip, s->prompt_len - skip, &prompt_bytes);
    char *text = tokenizer_decode(s->tok, generated, (size_t)n, &gen_bytes);
    char *whole = xmalloc(prompt_bytes + gen_bytes + 1);
    memcpy(whole, prompt, prompt_bytes);
    memcpy(whole + prompt_bytes, text, gen_bytes);
    char *shown = sample_printable(whole, prompt_bytes + gen_bytes);
    printf("%sstep %6lld | sample: %s\n", console_tag(), (long long)step, shown);
    fflush(stdout);
    strbuf extra = {0};
    sb_append(&extra, "\"text\":");
    sb_json_string(&extra, shown);
    metrics_event(log, "sample", step, extra.data);
    sb_free(&extra);
    free(shown);
    free(whole);
    free(prompt);
    free(text);
    free(generated);
}
