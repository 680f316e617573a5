# `train_gpt shards upgrade` (docs/data.md, "Upgrading version 1 shards"): version 1 shards
# written again as version 2 in place, the same tokens under the same header fields. A corpus of
# 8 train shards of 20,000 tokens and a val shard of 5,000, written as version 1 (test_tool
# rechunk 0):
#   1. A run on the version 1 corpus (12 shuffled steps, validation at 4, 8 and 12) is the
#      reference. The same run stopped in step 5 (TRAIN_GPT_FAULT=stop_in_step:5) while
#      `shards upgrade --config` rewrites its train_data and val_data under it, then continued,
#      trains the same losses and val_losses bit for bit, from the new files (it hashed more than the
#      reference: it verified them again when it opened them); so does a run stopped at step 6
#      (stop_at_step), upgraded and resumed, without the warning that the data changed, and with
#      the data fingerprint of before in its state.json.
#   2. After it every shard is version 2 (64 + 40,000 + 8 · 3 bytes; val 64 + 10,000 + 8), holds
#      the same tokens, and header bytes 12..39 (token width, n_tokens, payload checksum,
#      vocab_size, doc_token) are the old ones; a second upgrade leaves every file as it is
#      (inode, mtime, bytes) and says they are version 2 already.
#   3. A corrupt version 1 shard (a payload byte changed, its token still below vocab_size), one
#      with a token beyond vocab_size under valid checksums (test_tool forge_token) and a
#      truncated one are refused, one warning each naming it, and left byte for byte; the others
#      are upgraded; exit 1 with one error line counting the refused.
#   4. A failing rename (shard_rename_eio) or write (shard_write_enospc) stops the upgrade with
#      one line naming the shard: it is byte for byte the version 1 file, no .tmp is left, the
#      shard before it is upgraded and those after it untouched.
#   5. A shard whose lock another process holds (flock(1)) is left to it; a symbolic link's
#      target is upgraded and the link stays a link; a shard's permission bits are kept; a shard
#      named several times (a directory, a path, a pattern, a link) is upgraded and counted once;
#      of hard links only the name given takes the version 2 file, and a note says so; one whose
#      other name another upgrade holds waits for it.
#   6. A NAME.tmp link is not followed; a file put under the name before the rename is left as it
#      is; as root, owner and group are kept.
. "$(dirname "$0")/lib.sh"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/v1"
for k in 0 1 2 3 4 5 6 7; do
    "$TOOL" shard "$tmp/v1/train_$k.bin" 64 0 20000 $((40 + k))
    "$TOOL" rechunk "$tmp/v1/train_$k.bin" 0
done
"$TOOL" shard "$tmp/v1/val_0.bin" 64 0 5000 99
"$TOOL" rechunk "$tmp/v1/val_0.bin" 0
corpus() {  # corpus NAME: a fresh copy of the version 1 corpus in $tmp/NAME
    rm -rf "${tmp:?}/$1" && mkdir -p "$tmp/$1" && cp -p "$tmp"/v1/*.bin "$tmp/$1/"
}
version_of() { od -An -tu4 -j8 -N4 "$1" | tr -d ' '; }
is_v1() { [ "$(version_of "$1")" = 1 ] && cmp -s "$1" "$tmp/v1/$(basename "$1")"; }   # the version 1 file, byte for byte
is_v2() {  # is_v2 FILE: version 2, of the version 2 size for its tokens, which are those of v1/
    local want=$((64 + 40000 + 8 * 3))
    case $1 in *val_*) want=$((64 + 10000 + 8 * 1)) ;; esac
    [ "$(version_of "$1")" = 2 ] && [ "$(stat -c %s "$1")" = "$want" ]
}
all_v2() {  # all_v2 DIR: every shard of DIR is version 2
    local f
    for f in "$1"/*.bin; do is_v2 "$f" || return 1; done
}
same_identity() {  # same_identity DIR: each shard's tokens and header bytes 12..39 as in v1/
    local f name
    for f in "$tmp"/v1/*.bin; do
        name=$(basename "$f")
        cmp -s <(head -c 40 "$f" | tail -c 28) <(head -c 40 "$1/$name" | tail -c 28) || return 1
        cmp -s <("$TOOL" tokens "$f") <("$TOOL" tokens "$1/$name") || return 1
    done
}
no_tmp() { ! ls "$1" | grep -q '\.tmp$'; }
# curve METRICS [FROM]: "step loss" and "step val val_loss" lines from step FROM on, the values
# as Python's repr (exact).
curve() {
    "$PYTHON" - "$1" "${2:-0}" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    d = json.loads(line)
    if d.get("step", -1) < int(sys.argv[2]):
        continue
    if "loss" in d and "step" in d:
        print(d["step"], repr(d["loss"]))
    if "val_loss" in d:
        print(d["step"], "val", repr(d["val_loss"]))
PY
}
hashed() {  # hashed METRICS: the end line's data_hashed_mb, in bytes
    "$PYTHON" -c 'import json,sys; e=[json.loads(l) for l in open(sys.argv[1]) if "\"end\"" in l]; print(round(e[-1]["data_hashed_mb"]*1048576) if e else -1)' "$1"
}
fingerprint() { "$PYTHON" -c 'import json,sys; print(json.load(open(sys.argv[1]))["data_fingerprint"])' "$1"; }
count() { grep -c -- "$1" "$2" || true; }
run=(test/configs/tiny_test.conf --max_steps 12 --log_every 1 --shuffle 1 --val_every 4 --val_tokens 256)
data() { shards=(--train_data "$tmp/$1/train_*.bin" --val_data "$tmp/$1/val_*.bin"); }  # data NAME: $tmp/NAME's, in ${shards[@]}
upgrade() {  # upgrade NAME ARGS...: shards upgrade ARGS, its stdout and stderr in $tmp/NAME.out, .err; rc in $urc
    urc=0
    "$TRAIN_GPT" shards upgrade "${@:2}" >"$tmp/$1.out" 2>"$tmp/$1.err" || urc=$?
}

# 1. The reference, on the version 1 corpus straight through.
corpus ref
rc=0
data ref
"$TRAIN_GPT" "${run[@]}" "${shards[@]}" --out_dir "$tmp/o_ref" >"$tmp/ref.log" 2>&1 || rc=$?
curve "$tmp/o_ref/metrics.jsonl" >"$tmp/ref.curve"
check "the reference on version 1 shards trains (rc $rc, $(count ' val ' "$tmp/ref.curve") validations, the note)" \
    sh -c "[ $rc -eq 0 ] && [ $(count ' val ' "$tmp/ref.curve") -eq 3 ] && grep -q 'train_data: 8 of the 8 shards are version 1' '$tmp/ref.log'"

# Under a running job: it stops itself in step 5, the config's shards are upgraded, it goes on.
corpus live
{ cat test/configs/tiny_test.conf; echo "train_data = $tmp/live/train_*.bin"; echo "val_data = $tmp/live/val_*.bin"; } \
    >"$tmp/live.conf"
data live
TRAIN_GPT_FAULT=stop_in_step:5 "$TRAIN_GPT" "${run[@]}" "${shards[@]}" --out_dir "$tmp/o_live" >"$tmp/live.log" 2>&1 &
job=$!
wait_until "the job stopped itself in step 5" stopped "$job" || true
upgrade live --config "$tmp/live.conf"
was_stopped=0
stopped "$job" && was_stopped=1
kill -CONT "$job" 2>/dev/null || true
jrc=0
wait "$job" || jrc=$?
check "upgrade --config while the job is stopped (stopped $was_stopped): rc $urc, $(cat "$tmp/live.out")" \
    sh -c "[ $urc -eq 0 ] && [ $was_stopped -eq 1 ] && grep -q '^shards upgrade: 9 shards written again as version 2' '$tmp/live.out'"
check "... its start line: 9 of version 1, 0 of version 2" grep -q 'shards upgrade: 9 shards: 9 of version 1 .*, 0 of version 2 already' "$tmp/live.err"
check "... every shard version 2 by its version and size" all_v2 "$tmp/live"
check "... with the tokens and header bytes 12..39 of the version 1 file" same_identity "$tmp/live"
check "... and no .tmp left" no_tmp "$tmp/live"
curve "$tmp/o_live/metrics.jsonl" >"$tmp/live.curve" 2>/dev/null || true
check "the job read on (rc $jrc, no error): its $(wc -l <"$tmp/live.curve") losses and val_losses bit for bit the reference's" \
    sh -c "[ $jrc -eq 0 ] && [ $(count 'error:' "$tmp/live.log") -eq 0 ] && cmp -s '$tmp/ref.curve' '$tmp/live.curve'"
# The reference verified each of the 8 shards whole once (320,000 bytes); the job verified the
# new files again before it read from them (their chunks), so it hashed more.
h_ref=$(hashed "$tmp/o_ref/metrics.jsonl") h_live=$(hashed "$tmp/o_live/metrics.jsonl")
check "... from the new files, verified again: it hashed $h_live bytes, the reference $h_ref" \
    sh -c "[ $h_ref -ge 320000 ] && [ $h_live -gt $((h_ref + 40000)) ]"

# Stopped at step 6, upgraded, resumed.
corpus res
rc=0
data res
"$TRAIN_GPT" "${run[@]}" "${shards[@]}" --out_dir "$tmp/o_res" --stop_at_step 6 >"$tmp/res1.log" 2>&1 || rc=$?
upgrade res "$tmp/res"
data res
"$TRAIN_GPT" "${run[@]}" "${shards[@]}" --out_dir "$tmp/o_res" >"$tmp/res2.log" 2>&1 || rc=$?
curve "$tmp/o_res/metrics.jsonl" 7 >"$tmp/res.curve"
curve "$tmp/o_ref/metrics.jsonl" 7 >"$tmp/ref7.curve"
check "stopped at 6, upgraded (rc $urc), resumed: rc $rc, steps 7..12 bit for bit the reference's" \
    sh -c "[ $rc -eq 0 ] && [ $urc -eq 0 ] && [ -s '$tmp/res.curve' ] && cmp -s '$tmp/ref7.curve' '$tmp/res.curve'"
check "... the resume found the same data (no warning that it changed; the version 1 note gone)" \
    sh -c "[ $(count 'read train data of' "$tmp/res2.log") -eq 0 ] && [ $(count 'are version 1' "$tmp/res2.log") -eq 0 ] && [ -f '$tmp/o_res/step_00000012/state.json' ]"
check "... and the data fingerprint of step 6's state.json in step 12's" \
    test "$(fingerprint "$tmp/o_res/step_00000006/state.json")" = "$(fingerprint "$tmp/o_res/step_00000012/state.json")"

# 2. Again over upgraded shards: nothing written.
stat -c '%n %i %Y %s' "$tmp"/res/*.bin >"$tmp/res.stat"
cat "$tmp"/res/*.bin | cksum >"$tmp/res.sum"
upgrade again "$tmp/res/"
check "a second upgrade (rc $urc): $(cat "$tmp/again.out")" \
    sh -c "[ $urc -eq 0 ] && grep -q '^shards upgrade: 0 shards written again as version 2 .*, 9 of version 2 already, 0 refused' '$tmp/again.out'"
check "... every file as it was: inode, mtime, size and bytes" \
    sh -c "stat -c '%n %i %Y %s' '$tmp'/res/*.bin | cmp -s - '$tmp/res.stat' && cat '$tmp'/res/*.bin | cksum | cmp -s - '$tmp/res.sum'"

# 3. Bad shards are refused and left as they are; the others are upgraded.
corpus bad
# A token changed to another below vocab_size (test_tool flip would take it out of range, which
# the range check would find): only the payload checksum tells.
"$PYTHON" - "$tmp/bad/train_3.bin" $((64 + 30000)) <<'PY'
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(int(sys.argv[2]))
    b = f.read(1)[0]
    f.seek(int(sys.argv[2]))
    f.write(bytes([(b + 1) % 64]))
PY
"$TOOL" forge_token "$tmp/bad/train_5.bin" 12345 70
"$TOOL" truncate "$tmp/bad/train_6.bin" -2
cp -p "$tmp/bad/train_3.bin" "$tmp/bad3" && cp -p "$tmp/bad/train_5.bin" "$tmp/bad5" && cp -p "$tmp/bad/train_6.bin" "$tmp/bad6"
upgrade bad --quiet "$tmp/bad/train_*.bin"
check "bad shards: exit 1 (rc $urc), one error line: $(grep 'error:' "$tmp/bad.err")" \
    sh -c "[ $urc -eq 1 ] && [ $(count 'error:' "$tmp/bad.err") -eq 1 ] && grep -q 'error: shards upgrade: 3 of the 8 shards were refused' '$tmp/bad.err'"
check "... a changed payload byte: one warning naming it ($(grep "train_3" "$tmp/bad.err" | head -1))" \
    sh -c "[ $(count "train_3.bin" "$tmp/bad.err") -eq 1 ] && grep -q \"warning: shards upgrade: refused '$tmp/bad/train_3.bin': payload checksum mismatch (corrupt data); left as it is\" '$tmp/bad.err'"
check "... a token beyond vocab_size: one warning naming it and the token" \
    sh -c "[ $(count "train_5.bin" "$tmp/bad.err") -eq 1 ] && grep -q \"refused '$tmp/bad/train_5.bin': token 70 at index 12345 is not below its vocab_size 64\" '$tmp/bad.err'"
check "... a truncated shard: one warning naming it" \
    sh -c "[ $(count "train_6.bin" "$tmp/bad.err") -eq 1 ] && grep -q \"refused '$tmp/bad/train_6.bin': truncated shard\" '$tmp/bad.err'"
check "... the three byte for byte as they were, no .tmp left" \
    sh -c "cmp -s '$tmp/bad3' '$tmp/bad/train_3.bin' && cmp -s '$tmp/bad5' '$tmp/bad/train_5.bin' && cmp -s '$tmp/bad6' '$tmp/bad/train_6.bin' && ! ls '$tmp/bad' | grep -q tmp"
good=0
for k in 0 1 2 4 7; do is_v2 "$tmp/bad/train_$k.bin" && good=$((good + 1)); done
check "... the other 5 upgraded ($good)" test "$good" -eq 5

# 4. A failing rename, and a failing write: the shard stays the version 1 file, and the run
# stops there.
for fault in shard_rename_eio:1:"Input/output error" shard_write_enospc:1:"No space left on device"; do
    kind=${fault%%:*}
    msg=${fault##*:}
    corpus "f_$kind"
    TRAIN_GPT_FAULT=${fault%:*} upgrade "f_$kind" --quiet "$tmp/f_$kind"
    check "$kind on the second shard: exit 1 (rc $urc), one line: $(grep 'error:' "$tmp/f_$kind.err")" \
        sh -c "[ $urc -eq 1 ] && [ $(count 'train_gpt:' "$tmp/f_$kind.err") -eq 2 ] && [ $(count 'error:' "$tmp/f_$kind.err") -eq 1 ] && grep -q \"error: shards upgrade: '$tmp/f_$kind/train_1.bin': .*$msg; it is as it was (version 1); 1 of the 9 version 1 shards were written again before it, none after it\" '$tmp/f_$kind.err'"
    check "... train_1.bin byte for byte the version 1 file, no .tmp left" \
        sh -c "cmp -s '$tmp/v1/train_1.bin' '$tmp/f_$kind/train_1.bin' && ! ls '$tmp/f_$kind' | grep -q tmp"
    after=0
    for k in 2 3 4 5 6 7; do is_v1 "$tmp/f_$kind/train_$k.bin" && after=$((after + 1)); done
    check "... train_0.bin upgraded, the 6 after train_1.bin and val_0.bin untouched ($after)" \
        sh -c "[ $after -eq 6 ] && [ \$(od -An -tu4 -j8 -N4 '$tmp/f_$kind/train_0.bin' | tr -d ' ') = 2 ] && cmp -s '$tmp/v1/val_0.bin' '$tmp/f_$kind/val_0.bin'"
done

# 5. A shard another process holds the lock of is left to it; links; permissions.
corpus lock
rc=0
flock "$tmp/lock/train_2.bin" "$TRAIN_GPT" shards upgrade --quiet "$tmp/lock" >"$tmp/lock.out" 2>"$tmp/lock.err" || rc=$?
others=0
for f in "$tmp"/lock/*.bin; do [ "$f" != "$tmp/lock/train_2.bin" ] && is_v2 "$f" && others=$((others + 1)); done
check "a shard whose lock another process holds: left to it (rc $rc, $(grep train_2 "$tmp/lock.err"))" \
    sh -c "[ $rc -eq 0 ] && cmp -s '$tmp/v1/train_2.bin' '$tmp/lock/train_2.bin' && grep -q \"'$tmp/lock/train_2.bin': another process is upgrading it; left to it\" '$tmp/lock.err'"
check "... the 8 others upgraded ($others), the last line says so" \
    sh -c "[ $others -eq 8 ] && grep -q '8 shards written again .*, the rest being upgraded by another process' '$tmp/lock.out'"

corpus link
mkdir -p "$tmp/links"
ln -s "$tmp/link/train_4.bin" "$tmp/links/train_4.bin"
chmod 640 "$tmp/link/train_4.bin"
upgrade link "$tmp/links/train_4.bin"
check "through a symbolic link (rc $urc): the target upgraded, the link still a link to it" \
    sh -c "[ $urc -eq 0 ] && [ -L '$tmp/links/train_4.bin' ] && [ \"\$(readlink '$tmp/links/train_4.bin')\" = '$tmp/link/train_4.bin' ] && [ \$(od -An -tu4 -j8 -N4 '$tmp/link/train_4.bin' | tr -d ' ') = 2 ]"
check "... with its permission bits ($(stat -c %a "$tmp/link/train_4.bin"))" test "$(stat -c %a "$tmp/link/train_4.bin")" = 640

# A shard named several times — its directory, its own path, a pattern and a link to it — is
# upgraded once and counted once; hard links are each upgraded under their own name, with a note
# that the version 2 file takes that name only.
corpus twice
upgrade twice "$tmp/twice" "$tmp/twice/train_3.bin" "$tmp/twice/train_[3].bin" "$tmp/links/train_4.bin" "$tmp/link/train_4.bin"
check "named twice (rc $urc): each shard once, the names left out counted: $(grep -o '[0-9]* shards ([^)]*)' "$tmp/twice.err")" \
    sh -c "[ $urc -eq 0 ] && grep -q 'shards upgrade: 10 shards (3 names of a shard listed before, or a link to one, left out): 9 of version 1' '$tmp/twice.err' &&
           grep -q '^shards upgrade: 9 shards written again as version 2 (.*), 1 of version 2 already, 0 refused' '$tmp/twice.out'"
check "... every shard of the directory version 2" all_v2 "$tmp/twice"
corpus hard
ln "$tmp/hard/train_5.bin" "$tmp/hard/other_5.bin"
upgrade hard "$tmp/hard/train_5.bin"
check "a hard link (rc $urc): the name given version 2, the other name still the version 1 file, a note says so" \
    sh -c "[ $urc -eq 0 ] && [ $(version_of "$tmp/hard/train_5.bin") = 2 ] && cmp -s '$tmp/v1/train_5.bin' '$tmp/hard/other_5.bin' &&
           grep -q \"'$tmp/hard/train_5.bin' has 2 names (hard links): the version 2 file takes this one\" '$tmp/hard.err'"

# ... and a hard link whose other name another upgrade holds (two array jobs, one per name): it
# waits for that one and is upgraded after it. It was left "to the other process", exit 0, and
# stayed version 1. (The holder here: flock(1) on the other name, released once the upgrade
# waits for the lock, or has left without waiting.)
corpus hard2
ln "$tmp/hard2/train_5.bin" "$tmp/hard2/other_5.bin"
flock "$tmp/hard2/train_5.bin" sh -c "touch '$tmp/hard2.held'; while [ ! -e '$tmp/hard2.release' ]; do sleep 0.05; done" &
holder=$!
wait_until "the holder has the lock" test -e "$tmp/hard2.held"
"$TRAIN_GPT" shards upgrade --quiet "$tmp/hard2/other_5.bin" >"$tmp/hard2.out" 2>"$tmp/hard2.err" &
up=$!
waits_or_left() { ! kill -0 "$up" 2>/dev/null || ! [ -r "/proc/$up/wchan" ] || grep -q lock "/proc/$up/wchan"; }
wait_until "the upgrade waits for the lock" waits_or_left
touch "$tmp/hard2.release"
wait "$holder"
urc=0
wait "$up" || urc=$?
check "a hard link whose other name is locked (rc $urc): upgraded once the lock is free" \
    sh -c "[ $urc -eq 0 ] && [ $(version_of "$tmp/hard2/other_5.bin") = 2 ]"

# 6. What the upgrade writes and renames: a NAME.tmp that is a symbolic link is removed, not
# followed (its target was overwritten with the new shard: any file, were root to run it in a
# shared directory); a file another program puts under the shard's name between the new file's
# fsync and the rename (TRAIN_GPT_FAULT=stop_before_rename) is left as it is, the shard refused
# (it was replaced by the old data's copy, exit 0); run as root, the owner and group are kept
# (root's copy locked the owner out of a 0640 shard).
corpus tmpl
echo "precious" >"$tmp/victim.txt"
ln -s "$tmp/victim.txt" "$tmp/tmpl/train_0.bin.tmp"
upgrade tmpl "$tmp/tmpl/train_0.bin"
check "a NAME.tmp link (rc $urc): its target left alone, the shard a version 2 file, no .tmp" \
    sh -c "[ $urc -eq 0 ] && [ \"\$(cat '$tmp/victim.txt')\" = precious ] && [ ! -L '$tmp/tmpl/train_0.bin' ] &&
           [ $(version_of "$tmp/tmpl/train_0.bin") = 2 ] && ! [ -e '$tmp/tmpl/train_0.bin.tmp' ]"
corpus race
TRAIN_GPT_FAULT=stop_before_rename:0 "$TRAIN_GPT" shards upgrade --quiet "$tmp/race/train_0.bin" \
    >"$tmp/race.out" 2>"$tmp/race.err" &
up=$!
stopped_or_gone() { stopped "$up" || ! kill -0 "$up" 2>/dev/null; }
wait_until "the upgrade stopped before its rename" stopped_or_gone
cp "$tmp/v1/train_7.bin" "$tmp/race/new.bin" && mv "$tmp/race/new.bin" "$tmp/race/train_0.bin"
kill -CONT "$up" 2>/dev/null || true
urc=0
wait "$up" || urc=$?
check "a new file under the name before the rename (rc $urc): refused, that file left as it is" \
    sh -c "[ $urc -eq 1 ] && cmp -s '$tmp/v1/train_7.bin' '$tmp/race/train_0.bin' && ! ls '$tmp/race' | grep -q '\.tmp\$' &&
           grep -q 'another program wrote a new file under its name' '$tmp/race.err'"
if [ "$(id -u)" -eq 0 ]; then
    corpus own
    chown 1234:2345 "$tmp/own/train_0.bin" && chmod 640 "$tmp/own/train_0.bin"
    upgrade own "$tmp/own/train_0.bin"
    check "as root (rc $urc): owner, group and bits kept ($(stat -c '%u:%g %a' "$tmp/own/train_0.bin"))" \
        sh -c "[ $urc -eq 0 ] && [ \"\$(stat -c '%u:%g %a' '$tmp/own/train_0.bin')\" = '1234:2345 640' ] &&
               [ $(version_of "$tmp/own/train_0.bin") = 2 ]"
fi

upgrade none "$tmp/nothing_*.bin"
check "a pattern that matches nothing: exit 1, one line" \
    sh -c "[ $urc -eq 1 ] && [ $(count 'error:' "$tmp/none.err") -eq 1 ] && grep -q \"no file matches '$tmp/nothing_\\*.bin'\" '$tmp/none.err'"
# --help names the command (README and docs/data.md use it; it was left out of the usage).
check "train_gpt --help lists shards upgrade" sh -c "'$TRAIN_GPT' --help | grep -q '^ *train_gpt shards upgrade PATH'"
finish test_shards_upgrade
