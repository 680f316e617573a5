# Documentation keeps up with the code: every config key (from the binary's own key
# table) is documented in docs/config.md, and README.md starts with the two commands.
. "$(dirname "$0")/lib.sh"
missing=0
for key in $("$TRAIN_GPT" --help | awk '/^  [a-z_0-9]+ +\[/ {print $1}'); do
    if ! grep -q "^| \`$key\`" docs/config.md; then
        say "  FAIL config key '$key' is not documented in docs/config.md"
        missing=$((missing + 1))
    fi
done
check "every config key is documented ($missing missing)" test "$missing" -eq 0
for f in docs/formats.md docs/model.md docs/config.md docs/performance.md docs/data.md docs/tokenizer.md \
    docs/diloco.md docs/protocol.md docs/quant.md docs/cuda.md docs/architecture.md docs/slurm.md docs/plot.md docs/build.md; do check "$f exists" test -s "$f"; done
check "README.md opens with the quick-start command" sh -c "grep -m1 -A3 '^\`\`\`' README.md | grep -q 'scripts/quickstart.sh'"
check "README.md gives make test" grep -q '^make test' README.md
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
