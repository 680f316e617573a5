# The build follows its configuration (Makefile: BUILD_CONFIG): what make detected and was
# given is written to BUILD/config.txt, every object depends on it, and it changes only when
# the configuration does. In a scratch build folder, one object (CPU-only, to stay fast):
#   1. built once; 2. `make` again compiles nothing; 3. NATIVE=0 recompiles it (and says
#   so in config.txt); 4. again nothing; 5. NO_BLAS=1 recompiles it; 6. `make info` and
#   `make -n` with other knobs leave config.txt alone.
. "$(dirname "$0")/lib.sh"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
obj="$tmp/b/llmc/guard.o"
# The defaults are given, not taken from the environment: `make test NATIVE=0` puts NATIVE=0 there
# (the baseline was then NATIVE=0 and "NATIVE=0: the object is rebuilt" failed).
defaults=(NATIVE=1 NO_BLAS=)
compiles() {  # compiles [VAR=value]...: how many compiler commands a make of the object ran
    make --no-print-directory BUILD="$tmp/b" NO_CUDA=1 "${defaults[@]}" "$@" "$obj" 2>&1 | grep -cE '^(cc|gcc|clang)[^ ]* ' || true
}
check "a first build compiles the object" test "$(compiles)" -eq 1
check "make again: nothing to compile" test "$(compiles)" -eq 0
check "NATIVE=0: the object is rebuilt" test "$(compiles NATIVE=0)" -eq 1
check "... and config.txt says it (no -march=native)" sh -c "! grep -q -- '-march=native' '$tmp/b/config.txt'"
check "NATIVE=0 again: nothing to compile" test "$(compiles NATIVE=0)" -eq 0
check "NO_BLAS=1: the object is rebuilt" test "$(compiles NATIVE=0 NO_BLAS=1)" -eq 1
check "back to the defaults: rebuilt once, then nothing" sh -c "[ $(compiles) -eq 1 ] && [ $(compiles) -eq 0 ]"
# Goals that build nothing leave the configuration alone: `make info NO_BLAS=1` and a dry run
# (`make -n NO_BLAS=1`) rewrote config.txt, and the next plain make rebuilt everything.
cp "$tmp/b/config.txt" "$tmp/config.before"
make --no-print-directory BUILD="$tmp/b" NO_CUDA=1 "${defaults[@]}" NO_BLAS=1 info > /dev/null 2>&1
check "make info NO_BLAS=1 leaves config.txt as it was" cmp -s "$tmp/config.before" "$tmp/b/config.txt"
make --no-print-directory -n BUILD="$tmp/b" NO_CUDA=1 "${defaults[@]}" NO_BLAS=1 "$obj" > /dev/null 2>&1
check "make -n NO_BLAS=1 leaves config.txt as it was" cmp -s "$tmp/config.before" "$tmp/b/config.txt"
check "... and the next make compiles nothing" test "$(compiles)" -eq 0
check "a dry run in a fresh build folder lists the build (no config.txt yet)" \
    sh -c "make --no-print-directory -n BUILD='$tmp/fresh' NO_CUDA=1 '$tmp/fresh/llmc/guard.o' | grep -q 'guard.c'"
finish test_build
