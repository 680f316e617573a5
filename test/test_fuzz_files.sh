# The readers of outside files under libFuzzer (test/fuzz_files.c: JSON and a corpus's JSONL
# line against each other, safetensors, tokenizer.json) for FUZZ_SECONDS (default 30), from the
# seed corpus test/fuzz_files_seeds.py writes. Any crash, leak, sanitizer report, broken
# invariant or timeout fails. Skipped, with a line saying so, when clang has no libFuzzer
# (test/fuzz.mk builds $BUILD/fuzz_files only then).
. "$(dirname "$0")/fuzz_lib.sh"
fuzz_run fuzz_files "the file readers" 16384 "${PYTHON:-python3}" "$(dirname "$0")/fuzz_files_seeds.py"
