# Documentation keeps up with the code: every config key (from the binary's own key
# table) is documented in docs/config.md with its default, no documented key is gone from the
# code, and README.md starts with the two commands. (Until 2026-12 the key check took the
# keys from --help and passed with none: a help in another shape, or a binary that printed
# nothing, checked nothing; defaults were not compared.)
. "$(dirname "$0")/lib.sh"
# The binary's key table (--help: "  key  [default]  text"), against docs/config.md's rows
# ("| `key` | `default` ... |" or "| `key` | required |"): every key has a row with the same
# default, and every row of a lower-case name is a key (the upper-case rows are environment
# variables). A --help that lists fewer than 90 keys is a broken help, not a small table: the
# check once passed with none at all.
"$TRAIN_GPT" --help >"$BUILD/help.txt" 2>&1 || true
mismatches=$("$PYTHON" - "$BUILD/help.txt" docs/config.md <<'PY'
import re, sys
keys = {}
for line in open(sys.argv[1], encoding="utf-8"):
    m = re.match(r"  ([a-z_0-9]+) +\[([^\]]*)\]", line)
    if m:
        keys[m.group(1)] = m.group(2)
rows = {}
for line in open(sys.argv[2], encoding="utf-8"):
    m = re.match(r"\| `([A-Za-z_0-9]+)` \| *([^|]*?) *\|", line)
    if m:
        rows[m.group(1)] = m.group(2)
bad = []
if len(keys) < 90:
    bad.append("--help lists %d keys" % len(keys))
for k, default in keys.items():
    if k not in rows:
        bad.append("%s: no row" % k)
        continue
    cell = rows[k]
    doc = "required" if cell.startswith("required") else (re.match(r"`([^`]*)`", cell) or [None, None])[1]
    if doc != default:
        bad.append("%s: --help says [%s], docs/config.md '%s'" % (k, default, cell))
for k in rows:
    if k.islower() and k not in keys:
        bad.append("%s: documented, but no such key" % k)
print("; ".join(bad))
PY
)
check "every config key is documented with its default, and every documented key exists${mismatches:+ ($mismatches)}" \
    test -z "$mismatches"
for f in docs/formats.md docs/model.md docs/config.md docs/performance.md docs/data.md docs/tokenizer.md \
    docs/diloco.md docs/protocol.md docs/quant.md docs/cuda.md docs/architecture.md docs/slurm.md docs/plot.md docs/build.md; do check "$f exists" test -s "$f"; done
# Every command answers --help with its usage on stdout and status 0 (plan, diloco-tune and a
# config followed by --help once answered "--help: missing value" or "--replicas M is required").
check "train_gpt plan --help: plan's options" sh -c "'$TRAIN_GPT' plan --help | grep -q -- '--world N'"
check "train_gpt plan CONFIG --help: plan's options" sh -c "'$TRAIN_GPT' plan configs/tiny.conf --help | grep -q -- '--link_mbps X'"
check "train_gpt CONFIG --help: the keys" sh -c "'$TRAIN_GPT' configs/tiny.conf --help | grep -q '^  seq_len '"
check "train_gpt diloco-tune --help: its options" sh -c "'$TRAIN_GPT' diloco-tune --help | grep -q -- '--inner_steps H'"
check "train_gpt prepare / relay / plot --help answer too" \
    sh -c "'$TRAIN_GPT' prepare --help >/dev/null && '$TRAIN_GPT' relay --help >/dev/null && '$TRAIN_GPT' plot --help >/dev/null"
check "train_gpt shards upgrade --help: its options" sh -c "'$TRAIN_GPT' shards upgrade --help | grep -q -- '--config CONFIG'"
# Every documented command that sets max_steps on a shipped config (the smoke tests of
# docs/build.md, a config's own comment) passes the config's schedule rules: `train_gpt plan`
# with the command's max_steps, warmup_steps and decay_frac. The first-hour checklist's
# `--max_steps 50` against gpt-124m.conf's warmup_steps 700 once stopped at its first line.
"$PYTHON" - README.md docs/*.md configs/*.conf >"$BUILD/doc_schedules.txt" <<'PY'
import os, re, sys
SCHEDULE = ("max_steps", "warmup_steps", "decay_frac")
def flags(text):  # the --key value pairs that follow, up to the command's end
    out, words = [], text.split()
    i = 0
    while i < len(words):
        w = words[i]
        if w == "\\":
            i += 1
            continue
        if not w.startswith("--"):
            break
        end = w.endswith("`")
        key, _, value = w.strip("`")[2:].partition("=")
        if not value and not end and i + 1 < len(words) and not words[i + 1].startswith("--"):
            i += 1
            value = words[i]
            end = value.endswith("`")
        out.append((key, value.strip("`")))
        i += 1
        if end:
            break
    return out
for doc in sys.argv[1:]:
    text = open(doc, encoding="utf-8").read()
    found = [(m.group(1), text[m.end():m.end() + 400]) for m in re.finditer(r"train_gpt\s+(configs/[\w.-]+\.conf)", text)]
    if doc.startswith("configs/"):  # a config's comment: `--max_steps 1 ...` means this config
        found += [(doc, m.group(1)) for m in re.finditer(r"`(--[^`]*)`", text)]
    for conf, rest in found:
        pairs = [(k, v) for k, v in flags(rest) if k in SCHEDULE]
        if os.path.exists(conf) and any(k == "max_steps" for k, _ in pairs):
            print(doc, conf, " ".join("--%s %s" % kv for kv in pairs))
PY
n=0 bad=""
while read -r doc conf args; do
    n=$((n + 1))
    # shellcheck disable=SC2086
    "$TRAIN_GPT" plan "$conf" $args >/dev/null 2>"$BUILD/doc_schedule.err" ||
        bad="${bad:+$bad; }$doc: train_gpt $conf $args: $(grep 'error:' "$BUILD/doc_schedule.err")"
done <"$BUILD/doc_schedules.txt"
check "the $n documented commands that set max_steps on a shipped config pass its schedule rules${bad:+ ($bad)}" \
    test "$n" -ge 5 -a -z "$bad"
# README.md's first two commands (lines of its first code blocks), in order: the quick start
# (set up and train the default) first, then make test.
readme_command() {  # readme_command N: the N-th command line in README.md's code blocks
    awk -v want="$1" '/^```/ { inside = !inside; next } inside && NF && $1 != "#" { if (++n == want) { print; exit } }' README.md
}
check "README.md's first command is the quick start ($(readme_command 1))" test "$(readme_command 1)" = "bash scripts/quickstart.sh"
check "README.md's second command is make test ($(readme_command 2))" test "$(readme_command 2)" = "make test"
# Every relative link in README.md and docs/*.md names a file that exists and, with #anchor, a
# heading of it (GitHub's anchors: lower case, punctuation but - and _ dropped, spaces to -)
# or an <a id=…> in it.
broken=$("$PYTHON" - README.md docs/*.md <<'PY'
import os, re, sys
def anchors(path):
    out, seen = set(), {}
    fence = False
    for line in open(path, encoding="utf-8"):
        out.update(re.findall(r'<a (?:id|name)="([^"]+)"', line))
        if line.startswith("```"):
            fence = not fence
        m = None if fence else re.match(r"#+ +(.*?)\s*$", line)
        if not m:
            continue
        a = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower().replace("`", "")).replace(" ", "-")
        n = seen.get(a, 0)
        seen[a] = n + 1
        out.add(a if n == 0 else "%s-%d" % (a, n))
    return out
bad = []
for doc in sys.argv[1:]:
    text = re.sub(r"```.*?```", "", open(doc, encoding="utf-8").read(), flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        full = os.path.normpath(os.path.join(os.path.dirname(doc), path)) if path else doc
        if not os.path.exists(full):
            bad.append("%s -> %s (no such file)" % (doc, target))
        elif anchor and full.endswith(".md") and anchor not in anchors(full):
            bad.append("%s -> %s (no such heading)" % (doc, target))
print("; ".join(bad))
PY
)
check "every relative link and anchor in README.md and docs/ resolves${broken:+ ($broken)}" test -z "$broken"
finish test_docs
