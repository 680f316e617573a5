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
finish test_docs
