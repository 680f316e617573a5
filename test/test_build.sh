# The build follows its configuration (Makefile: BUILD_CONFIG): what make detected and was
# given is written to BUILD/config.txt, every object depends on it, and it changes only when
# the configuration does. In a scratch build folder, one object (CPU-only, to stay fast):
#   1. built once; 2. `make` again compiles nothing; 3. NATIVE=0 recompiles it (and says
#   so in config.txt); 4. again nothing; 5. NO_BLAS=1 recompiles it.
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
finish test_build
