#!/usr/bin/env bash
# Writes data/markov/train.bin (12 M tokens) and val.bin (64 Ki tokens) for bench/diloco/markov.conf:
# the same order-2 Markov language (seed 7), different samples. Needs build/test_tool (make test
# builds it, or: make build/test_tool).
set -euo pipefail
cd "$(dirname "$0")/../.."
tool=${BUILD:-build}/test_tool
[ -x "$tool" ] || make "$tool"
mkdir -p data/markov
"$tool" markov data/markov/train.bin 128 0 12000000 7 1
"$tool" markov data/markov/val.bin 128 0 65536 7 2
