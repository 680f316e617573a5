# TensorBoard event files (llmc/tensorboard.h, docs/formats.md#tensorboard-event-files), read
# back by an independent reader, test/tb_reader.py (its own CRC32C and protobuf parser, strict
# about every field):
#   1. tensorboard = 1 with validation and samples: one file with TensorBoard's name, the
#      file_version record first, every record's two CRCs good; every number of metrics.jsonl
#      is a scalar at its step (train/*, val/loss), equal to float32 precision, and nothing
#      else; nulls (mfu on the CPU) are left out; each sample is a text record with the same
#      text, ill-formed UTF-8 replaced by U+FFFD in both (the prompt holds some; metrics.jsonl is
#      read as strict UTF-8); wall times within
#      the run.
#   2. A flipped byte in a record's data or in its length, or a cut file: the reader says so.
#   3. tensorboard = 0 (the default), and diloco_transport = local: no event file; the simulated
#      run's metrics.jsonl ends with its end line, after a stop event when SIGTERM stopped it.
#   4. Resume after losing the newest checkpoint (steps 11-12 run twice): a second file with a
#      restart at step 11; TensorBoard's view of the two files equals metrics.jsonl's. A fresh
#      start over a run that died before its first checkpoint: its restart at step 0 drops the
#      dead run's points.
#   5. Rollback (bad data at steps 34-36, back to step 30): a restart at step 31; the views equal.
#   6. DiLoCo (M = 1 over TCP): diloco/* at each outer step, equal to the outer lines; and
#      train/stall_ms.
#   7. A full disk for a while (hooks metrics_enospc, tb_enospc: a line and a record cut after
#      half their bytes): metrics.jsonl holds whole lines only (3 fewer, said when writable
#      again) and train_gpt plot reads it; the event file ends at its last whole record.
. "$(dirname "$0")/lib.sh"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
READER=(env PYTHONDONTWRITEBYTECODE=1 "$PYTHON" test/tb_reader.py)
"$TOOL" shard "$tmp/train.bin" 64 0 60000 11
"$TOOL" shard "$tmp/val.bin" 64 0 5000 12
common=(test/configs/tiny_test.conf --train_data "$tmp/train.bin" --val_data "$tmp/val.bin" --val_every 5
    --val_tokens 256 --threads 1 --log_every 1000 --ckpt_keep 0)
run() {  # run OUT_DIR [--key value]...: prints nothing, returns the exit status
    local out=$1; shift
    "$TRAIN_GPT" "${common[@]}" --out_dir "$out" "$@" >"$out.log" 2>&1
}
event_files() { find "$1" -maxdepth 1 -name 'events.out.tfevents.*' | sort; }
count_files() { event_files "$1" | grep -c . || true; }

# The run's numbers in TensorBoard (tb_reader --merged) against metrics.jsonl, read with the
# same rule: a later line for a step replaces the earlier one, and resuming at N or rolling
# back to N drops what was logged for steps > N. Values equal to float32 precision (and the 7
# digits metrics.jsonl keeps). Prints the differences; with TAG... also requires those tags.
same_as_metrics() {  # same_as_metrics RUN_DIR [TAG...]
    PYTHONDONTWRITEBYTECODE=1 "$PYTHON" - "$@" <<'PY'
import json, sys
sys.path.insert(0, "test")
import tb_reader
run, required = sys.argv[1], sys.argv[2:]
lines = {}  # (kind, step) -> {tag: value}: the last line of each kind for each step
def drop_after(n):
    for key in [k for k in lines if k[1] > n]:
        del lines[key]
text = open(f"{run}/metrics.jsonl", "rb").read().decode("utf-8")  # strict: JSON is UTF-8
for line in text.splitlines():
    d = json.loads(line)
    numbers = {k: v for k, v in d.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    if "event" in d:
        if d["event"] == "start":  # a fresh run in this directory: only it counts
            drop_after(-1)
        elif d["event"] == "resume":
            drop_after(d["step"])
        elif d["event"] == "rollback":
            drop_after(d["to_step"])
        elif d["event"] == "sample":
            # Ill-formed UTF-8 became U+FFFD in both (it went into metrics.jsonl as it was, which
            # no strict JSON reader takes).
            lines[("sample", d["step"])] = {"samples": d["text"].encode("utf-8")}
    elif "outer_step" in d:
        v = {"diloco/" + k: x for k, x in numbers.items() if k != "step"}
        v.update({"diloco/" + k: len(x) for k, x in d.items() if isinstance(x, list)})
        lines[("outer", d["step"])] = v
    elif "val_loss" in d:
        lines[("val", d["step"])] = {"val/loss": d["val_loss"]} if d["val_loss"] is not None else {}
    elif "loss" in d:
        fields = ("loss", "z_loss", "lr", "grad_norm", "tok_per_s", "mfu", "step_ms", "tokens", "stall_ms")
        lines[("train", d["step"])] = {"train/" + f: numbers[f] for f in fields if f in numbers}
want = {"scalars": {}, "texts": {}}
for (kind, step), values in lines.items():
    for tag, v in values.items():
        want["texts" if kind == "sample" else "scalars"].setdefault(tag, {})[step] = v
got = tb_reader.merged(run)
bad = []
for kind in ("scalars", "texts"):
    for tag in sorted(set(want[kind]) | set(got[kind])):
        w, g = want[kind].get(tag, {}), got[kind].get(tag, {})
        for step in sorted(set(w) | set(g)):
            if step not in g:
                bad.append(f"{tag} at step {step}: in metrics.jsonl ({w[step]!r}), not in the event file")
            elif step not in w:
                bad.append(f"{tag} at step {step}: in the event file ({g[step]!r}), not in metrics.jsonl")
            elif kind == "texts" and w[step] != g[step]:
                bad.append(f"{tag} at step {step}: text {g[step]!r} != {w[step]!r}")
            elif kind == "scalars" and abs(g[step] - w[step]) > 1e-6 * abs(w[step]):
                bad.append(f"{tag} at step {step}: {g[step]!r} != {w[step]!r}")
bad += [f"no {tag} in the event file" for tag in required if tag not in got["scalars"] and tag not in got["texts"]]
n = sum(len(v) for k in got for v in got[k].values())
for b in bad[:8]:
    print("    " + b)
print(f"    {n} points compared, {len(bad)} differences")
sys.exit(1 if bad or n == 0 else 0)
PY
}

# ---------------------------------------------------------------- 1. a run with samples
# Samples need a tokenizer: one token per byte (a byte-level BPE tokenizer.json without
# merges), so the model's vocabulary grows to 256.
bytes_tokenizer "$tmp/bytes.json"
# The prompt: a cut 3-byte character, a surrogate, an emoji, é and a byte that is never UTF-8.
prompt=$(printf 'ab\342\202!\355\240\200!\360\237\230\200!\303\251\377')
t0=$(date +%s.%N)
run "$tmp/a" --tensorboard 1 --vocab_size 256 --tokenizer "$tmp/bytes.json" --sample_every 10 --sample_prompt "$prompt" \
    || cat "$tmp/a.log"
t1=$(date +%s.%N)
file=$(event_files "$tmp/a" | head -n 1)
name=$(basename "$file")
check "one event file, named events.out.tfevents.<10-digit unix time>.<host> ($name)" \
    sh -c "[ $(count_files "$tmp/a") -eq 1 ] && echo '$name' | grep -Eq '^events\.out\.tfevents\.[0-9]{10}\.[A-Za-z0-9._-]+$'"
check "... said where it is on stderr" grep -q "tensorboard: writing $file" "$tmp/a.log"
"${READER[@]}" "$file" >"$tmp/a.events" 2>"$tmp/a.err" || true
check "all 28 records (file_version, the start's restart, 20 steps, 4 validations, 2 samples): CRCs good, messages as documented ($(cat "$tmp/a.err"))" \
    sh -c "[ ! -s '$tmp/a.err' ] && [ \$(wc -l <'$tmp/a.events') -eq 28 ]"
check "the first record (only) is file_version brain.Event:2, the second a restart at step 0" \
    sh -c "head -n 1 '$tmp/a.events' | grep -q '\"file_version\": \"brain.Event:2\"' &&
           [ \$(grep -c file_version '$tmp/a.events') -eq 1 ] &&
           sed -n 2p '$tmp/a.events' | grep -q '\"kind\": \"restart\".*\"step\": 0,'"
check "every scalar and text = metrics.jsonl (train/*, val/loss, samples at the same steps)" \
    same_as_metrics "$tmp/a" train/loss train/z_loss train/lr train/grad_norm train/tok_per_s train/step_ms \
    train/tokens val/loss samples
check "mfu is null in metrics.jsonl (CPU) and absent from the event file" \
    sh -c "grep -q '\"mfu\":null' '$tmp/a/metrics.jsonl' && ! grep -q 'train/mfu' '$tmp/a.events'"
check "two samples (steps 10 and 20) as text records, the prompt's ill-formed UTF-8 as U+FFFD" \
    "$PYTHON" -c "
import json, sys
texts = [e['text'] for e in map(json.loads, open('$tmp/a.events')) if e['kind'] == 'text' and e['tag'] == 'samples']
want = 'ab\ufffd!\ufffd\ufffd\ufffd!\U0001f600!\u00e9\ufffd'
sys.exit(0 if len(texts) == 2 and all(t.startswith(want) for t in texts) else 1)"
check "wall times: seconds since 1970, within the run, never going back" \
    "$PYTHON" -c "
import json, sys
t = [json.loads(l)['wall_time'] for l in open('$tmp/a.events')]
sys.exit(0 if $t0 - 1 <= t[0] and t[-1] <= $t1 + 1 and t == sorted(t) else 1)"

# ---------------------------------------------------------------- 2. the reader's checks can fail
corrupt() {  # corrupt IN OUT HOW: HOW = data | length | cut, on the third record
    "$PYTHON" - "$@" "$tmp/a.events" <<'PY'
import json, sys
src, dst, how, events = sys.argv[1:5]
data = bytearray(open(src, "rb").read())
third = [json.loads(l) for l in open(events)][2]
if how == "data":
    data[third["offset"] + 12 + third["length"] // 2] ^= 0x01
elif how == "length":
    data[third["offset"]] ^= 0x01
else:
    data = data[:-7]
open(dst, "wb").write(data)
PY
}
for how in data length cut; do
    corrupt "$file" "$tmp/bad_$how" "$how"
    rc=0; "${READER[@]}" "$tmp/bad_$how" >/dev/null 2>"$tmp/bad_$how.err" || rc=$?
    case $how in data) want="record 2 at offset [0-9]*: data CRC mismatch" ;;
                 length) want="record 2 at offset [0-9]*: length CRC mismatch" ;;
                 cut) want="truncated data" ;; esac
    check "a flipped bit / cut file ($how): the reader fails with '$want' (rc $rc: $(cat "$tmp/bad_$how.err"))" \
        sh -c "[ $rc -eq 1 ] && grep -q '$want' '$tmp/bad_$how.err'"
done

# ---------------------------------------------------------------- 3. off
run "$tmp/off" --max_steps 4 || cat "$tmp/off.log"
check "tensorboard = 0 (the default): no event file" \
    sh -c "[ -s '$tmp/off/metrics.jsonl' ] && [ $(count_files "$tmp/off") -eq 0 ]"
run "$tmp/local" --max_steps 4 --tensorboard 1 --diloco_replicas 2 --diloco_inner_steps 2 --diloco_transport local \
    || cat "$tmp/local.log"
check "diloco_transport = local: no event file" \
    sh -c "[ -s '$tmp/local/metrics.jsonl' ] && [ $(count_files "$tmp/local") -eq 0 ]"
# ... and metrics.jsonl's events as any run's: an end line last, and a signal's stop (before, a
# simulated run wrote neither).
check "... its metrics.jsonl ends with an end line (peak_rss_mb, state_mb)" \
    sh -c "tail -n 1 '$tmp/local/metrics.jsonl' | grep -q '^{\"event\":\"end\",\"step\":4,\"peak_rss_mb\":[0-9.]*,\"state_mb\":[0-9.]*}$'"
"$TRAIN_GPT" "${common[@]}" --out_dir "$tmp/local_sig" --max_steps 100000 --diloco_replicas 2 --diloco_inner_steps 2 \
    --diloco_transport local >"$tmp/local_sig.log" 2>&1 &
pid=$!
wait_until "a step line of the simulated run" grep -q '"loss"' "$tmp/local_sig/metrics.jsonl" 2>/dev/null
kill -TERM "$pid"
rc=0; wait "$pid" || rc=$?
check "... stopped by SIGTERM (rc $rc): a stop event with reason signal, then the end line" \
    sh -c "[ $rc -eq 0 ] && tail -n 2 '$tmp/local_sig/metrics.jsonl' | head -n 1 | grep -q '\"event\":\"stop\".*\"reason\":\"signal\"' &&
           tail -n 1 '$tmp/local_sig/metrics.jsonl' | grep -q '\"event\":\"end\"'"

# ---------------------------------------------------------------- 4. resume
run "$tmp/resumed" --tensorboard 1 --ckpt_every 5 --stop_at_step 12 || cat "$tmp/resumed.log"
rm -rf "$tmp/resumed/step_00000012"  # as if the run had died before writing it
run "$tmp/resumed" --tensorboard 1 --ckpt_every 5 || cat "$tmp/resumed.log"
"${READER[@]}" "$(event_files "$tmp/resumed" | tail -n 1)" >"$tmp/resumed.events" 2>&1 || true
check "resumed: a second event file ($(event_files "$tmp/resumed" | xargs -n1 basename | tr '\n' ' '))" \
    test "$(count_files "$tmp/resumed")" -eq 2
check "... which restarts at step 11 (resumed from step 10): file_version, then SessionLog START at 11" \
    sh -c "sed -n 2p '$tmp/resumed.events' | grep -q '\"kind\": \"restart\".*\"step\": 11,'"
check "... steps 11 and 12 logged twice; TensorBoard's view of both files = metrics.jsonl's" \
    same_as_metrics "$tmp/resumed" train/loss val/loss

# A run that died before its first checkpoint, then a fresh start in the same directory (resume
# = auto finds nothing): the dead run's steps 9-20 must not stay in TensorBoard's view (before,
# they did: only resume and rollback wrote a restart).
run "$tmp/fresh" --tensorboard 1 --ckpt_every 0 --max_steps 20 || cat "$tmp/fresh.log"
rm -rf "$tmp/fresh"/step_*  # as if the run had died before writing one
run "$tmp/fresh" --tensorboard 1 --ckpt_every 0 --max_steps 8 || cat "$tmp/fresh.log"
check "fresh start over a dead run: two files, metrics.jsonl's two starts" \
    sh -c "[ $(count_files "$tmp/fresh") -eq 2 ] && [ \$(grep -c '\"event\":\"start\"' '$tmp/fresh/metrics.jsonl') -eq 2 ]"
check "... TensorBoard's view = the second run's alone (steps 1-8)" same_as_metrics "$tmp/fresh" train/loss val/loss

# ---------------------------------------------------------------- 5. rollback
TRAIN_GPT_FAULT=nan_batch:33,nan_batch:34,nan_batch:35 run "$tmp/roll" --tensorboard 1 --ckpt_every 10 \
    --max_steps 60 --max_bad_steps 3 || cat "$tmp/roll.log"
"${READER[@]}" $(event_files "$tmp/roll") >"$tmp/roll.events" 2>&1 || true
check "rolled back to step 30: one file, with a restart at step 31" \
    sh -c "grep -q '\"event\":\"rollback\",\"step\":36,\"to_step\":30' '$tmp/roll/metrics.jsonl' &&
           [ $(count_files "$tmp/roll") -eq 1 ] && grep -q '\"kind\": \"restart\".*\"step\": 31,' '$tmp/roll.events'"
check "... TensorBoard's view = metrics.jsonl's (steps 31-36 as run again)" same_as_metrics "$tmp/roll" train/loss

# ---------------------------------------------------------------- 6. DiLoCo
make_secret "$tmp/secret"
port=$(free_port)
run "$tmp/diloco" --tensorboard 1 --diloco_replicas 1 --diloco_inner_steps 5 --diloco_transport tcp --diloco_serve 1 \
    --diloco_rendezvous "127.0.0.1:$port" --diloco_secret_file "$tmp/secret" --diloco_replica_id 0 || cat "$tmp/diloco.log"
check "DiLoCo: 4 outer lines in metrics.jsonl" test "$(grep -c '"outer_step"' "$tmp/diloco/metrics.jsonl")" -ge 4
check "... diloco/* at each outer step and train/stall_ms = metrics.jsonl" \
    same_as_metrics "$tmp/diloco" diloco/outer_step diloco/sync_s diloco/wait_s diloco/bytes_sent diloco/bytes_recv \
    diloco/quant_rel_err diloco/contributors train/stall_ms
# ---------------------------------------------------------------- 7. a full disk for a while
# A line or record cut short was left in the file: the rest of a later line joined the front of
# a metrics line (train_gpt plot refused the whole file), and the event file ended in a
# truncated record.
run "$tmp/plain" --tensorboard 1 --max_steps 30 || cat "$tmp/plain.log"
TRAIN_GPT_FAULT=metrics_enospc:12,tb_enospc:20 run "$tmp/full" --tensorboard 1 --max_steps 30 || cat "$tmp/full.log"
check "full disk: metrics.jsonl has 3 lines fewer than the same run's, each line whole JSON" \
    sh -c "[ \$(wc -l <'$tmp/full/metrics.jsonl') -eq \$(( \$(wc -l <'$tmp/plain/metrics.jsonl') - 3 )) ] &&
           '$PYTHON' -c 'import json,sys; [json.loads(l) for l in open(sys.argv[1])]' '$tmp/full/metrics.jsonl'"
check "... said once when it failed, once with the count when writable again" \
    sh -c "[ \$(grep -c 'warning: cannot write to .*metrics.jsonl' '$tmp/full.log') -eq 1 ] &&
           grep -q 'metrics.jsonl. is writable again: 3 line(s) could not be written' '$tmp/full.log'"
check "... train_gpt plot reads it" "$TRAIN_GPT" plot "$tmp/full" -o "$tmp/full.svg"
check "... the event file: 20 whole records, no truncated one" \
    sh -c "'${READER[0]}' '${READER[1]}' '${READER[2]}' test/tb_reader.py \$(find '$tmp/full' -name 'events.out.tfevents.*') >'$tmp/full.events' &&
           [ \$(wc -l <'$tmp/full.events') -eq 20 ] && grep -q 'tensorboard: cannot write to' '$tmp/full.log'"
finish test_tensorboard
