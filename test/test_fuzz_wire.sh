# The frame parser under libFuzzer (test/fuzz_wire.c) for FUZZ_SECONDS (default 30), from a
# seed corpus of valid frames of every type that test_wire writes. Any crash, leak,
# sanitizer report or timeout fails. Skipped, with a line saying so, when clang has no
# libFuzzer (test/fuzz.mk builds $BUILD/fuzz_wire only then, and only with OpenSSL).
. "$(dirname "$0")/fuzz_lib.sh"
fuzz_run fuzz_wire "the frame parser" 70000 "$BUILD/test_wire" --corpus
