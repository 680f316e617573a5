# Shard verification costs what a run reads, not what the corpus holds (docs/formats.md,
# "How shards are verified"). A corpus of 8 shards of 20,000 tokens (40,000 payload bytes each),
# written again as version 2 with 256-byte chunks (test_tool rechunk: the same tokens and
# fingerprint) and as version 1:
#   - A shuffled run of 30 steps of 4 rows of 33 tokens (120 rows of 66 bytes) hashes at most
#     the chunks each row reads: its bytes and at most 255 on either side, 69,120 bytes in all,
#     a fifth of the corpus (the metrics' end line, data_hashed_mb). Version 1 shards are
#     verified whole the first time a process reads from them: the same run hashes at least 6
#     of the 8 shards (3.5 times the bound; 120 rows miss a given shard with probability
#     (7/8)^120 ≈ 1e-7), as every run did until 2026-12; its losses are the version 2 run's
#     (the same tokens), and one note says the shards are version 1.
#   - A flipped byte in a chunk the run reads stops it with one line naming the shard, the
#     chunk and its bytes in the file: chunk 0, read by the first micro-batch (shuffle = 0),
#     before any step; chunk 10 (payload bytes 2560..2815: micro-batch k reads bytes
#     256·k .. 256·k + 257, so micro-batch 9 reads it first), after 9 steps and not at the
#     start; a flipped chunk table entry likewise. A byte in a
#     chunk no row reads does not stop the run (it is found when a row reads it).
#   - A flipped byte in a version 1 shard stops the run at its first read, as before.
. "$(dirname "$0")/lib.sh"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/v2" "$tmp/v1"
for k in 0 1 2 3 4 5 6 7; do
    "$TOOL" shard "$tmp/v2/s$k.bin" 64 0 20000 $((40 + k))
    cp "$tmp/v2/s$k.bin" "$tmp/v1/s$k.bin"
    "$TOOL" rechunk "$tmp/v2/s$k.bin" 256
    "$TOOL" rechunk "$tmp/v1/s$k.bin" 0
done
corpus=$((8 * 40000))
base=(test/configs/tiny_test.conf --max_steps 30 --log_every 1 --shuffle 1)

end_field() {  # end_field METRICS FIELD: the end line's FIELD (MB) in bytes
    "$PYTHON" - "$1" "$2" <<'PY'
import json, sys
end = [json.loads(l) for l in open(sys.argv[1]) if '"event":"end"' in l.replace(" ", "")]
print(round(end[-1][sys.argv[2]] * 1048576) if end else -1)
PY
}

rc=0
"$TRAIN_GPT" "${base[@]}" --train_data "$tmp/v2/s*.bin" --out_dir "$tmp/o2" >"$tmp/o2.log" 2>&1 || rc=$?
hashed2=$(end_field "$tmp/o2/metrics.jsonl" data_hashed_mb)
read2=$(end_field "$tmp/o2/metrics.jsonl" data_read_mb)
bound=$((120 * (66 + 2 * 255)))
check "version 2: 120 shuffled rows hash $hashed2 bytes (read $read2 with the table entries), at most $bound of the corpus's $corpus (rc $rc)" \
    sh -c "[ $rc -eq 0 ] && [ $hashed2 -gt 0 ] && [ $hashed2 -le $bound ] && [ $read2 -ge $hashed2 ]"
rc=0
"$TRAIN_GPT" "${base[@]}" --train_data "$tmp/v1/s*.bin" --out_dir "$tmp/o1" >"$tmp/o1.log" 2>&1 || rc=$?
hashed1=$(end_field "$tmp/o1/metrics.jsonl" data_hashed_mb)
check "version 1: the same run trains (rc $rc) and hashes whole shards: $hashed1 bytes, at least 6 of the 8" \
    sh -c "[ $rc -eq 0 ] && [ $hashed1 -ge $((6 * 40000)) ]"
loss_table "$tmp/o1/metrics.jsonl" >"$tmp/loss1"
loss_table "$tmp/o2/metrics.jsonl" >"$tmp/loss2"
check "... with the version 2 run's $(wc -l <"$tmp/loss2") losses (the same tokens)" sh -c "[ -s '$tmp/loss1' ] && cmp -s '$tmp/loss1' '$tmp/loss2'"
check "... and one note that the shards are version 1" \
    sh -c "[ \$(grep -c 'train_data: 8 of the 8 shards are version 1' '$tmp/o1.log') -eq 1 ] && ! grep -q 'are version 1' '$tmp/o2.log'"

expect_one_error() {  # expect_one_error DESCRIPTION PATTERN OUT_DIR ARGS...
    local what=$1 pattern=$2 out=$3; shift 3
    local rc=0
    "$TRAIN_GPT" "$@" --out_dir "$out" >"$tmp/out.txt" 2>"$tmp/err.txt" || rc=$?
    local errors
    errors=$(grep -c '^train_gpt: error:' "$tmp/err.txt" || true)
    if [ "$rc" -ne 0 ] && [ "$rc" -lt 128 ] && [ "$errors" -eq 1 ] && grep -q -- "$pattern" "$tmp/err.txt"; then
        say "  ok   $what: $(grep '^train_gpt: error:' "$tmp/err.txt")"
    else
        say "  FAIL $what (rc $rc, $errors error lines):"; sed 's/^/       /' "$tmp/err.txt"
        TESTS_FAILED=$((TESTS_FAILED + 1))
    fi
}
steps_done() {  # steps_done METRICS: training steps logged
    if [ -e "$1" ]; then grep -c '"loss"' "$1" || true; else echo 0; fi
}
seq0=(test/configs/tiny_test.conf --max_steps 30 --log_every 1 --shuffle 0)

mkdir -p "$tmp/c0" && cp "$tmp"/v2/s*.bin "$tmp/c0/" && "$TOOL" flip "$tmp/c0/s0.bin" $((64 + 100))
expect_one_error "a flipped byte in chunk 0, read first" \
    "train_data: shard '$tmp/c0/s0.bin': payload checksum mismatch in chunk 0 (file bytes 64..319" \
    "$tmp/oc0" "${seq0[@]}" --train_data "$tmp/c0/s*.bin"
check "... before any step ($(steps_done "$tmp/oc0/metrics.jsonl") logged)" sh -c "[ $(steps_done "$tmp/oc0/metrics.jsonl") -eq 0 ]"

mkdir -p "$tmp/c10" && cp "$tmp"/v2/s*.bin "$tmp/c10/" && "$TOOL" flip "$tmp/c10/s0.bin" $((64 + 10 * 256 + 50))
expect_one_error "a flipped byte in chunk 10, first read by micro-batch 9" \
    "train_data: shard '$tmp/c10/s0.bin': payload checksum mismatch in chunk 10 (file bytes 2624..2879" \
    "$tmp/oc10" "${seq0[@]}" --train_data "$tmp/c10/s*.bin"
check "... after the 9 steps before it ($(steps_done "$tmp/oc10/metrics.jsonl") logged), not at the start" \
    sh -c "[ $(steps_done "$tmp/oc10/metrics.jsonl") -eq 9 ]"

mkdir -p "$tmp/ct" && cp "$tmp"/v2/s*.bin "$tmp/ct/" && "$TOOL" flip "$tmp/ct/s0.bin" $((64 + 40000 + 8 * 3 + 2))
expect_one_error "a flipped byte in chunk 3's table entry" \
    "train_data: shard '$tmp/ct/s0.bin': payload checksum mismatch in chunk 3 " \
    "$tmp/oct" "${seq0[@]}" --train_data "$tmp/ct/s*.bin"

mkdir -p "$tmp/cu" && cp "$tmp"/v2/s*.bin "$tmp/cu/" && "$TOOL" flip "$tmp/cu/s7.bin" $((64 + 30000))
rc=0
"$TRAIN_GPT" "${seq0[@]}" --train_data "$tmp/cu/s*.bin" --out_dir "$tmp/ocu" >"$tmp/ocu.log" 2>&1 || rc=$?
check "a flipped byte in a chunk no row reads (shard 7, shuffle = 0): the run trains (rc $rc)" sh -c "[ $rc -eq 0 ]"

mkdir -p "$tmp/c1" && cp "$tmp"/v1/s*.bin "$tmp/c1/" && "$TOOL" flip "$tmp/c1/s0.bin" $((64 + 30000))
expect_one_error "version 1: a flipped byte anywhere in a shard it reads, at its first read" \
    "train_data: shard '$tmp/c1/s0.bin': payload checksum mismatch (corrupt data)" \
    "$tmp/oc1" "${seq0[@]}" --train_data "$tmp/c1/s*.bin"
check "... before any step" sh -c "[ $(steps_done "$tmp/oc1/metrics.jsonl") -eq 0 ]"
finish test_data_verify
