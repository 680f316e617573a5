# The build without any BLAS (NO_BLAS=1: the built-in gemm, what a machine without
# OpenBLAS gets) computes the same model: the PyTorch reference on the tied variant.
. "$(dirname "$0")/lib.sh"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$PYTHON" -c "import torch" 2>/dev/null || die "PyTorch is not importable by $PYTHON (install python3-torch)"
# NO_CUDA=1: the CPU code alone (the reference dump needs no GPU section; with nvcc the build
# compiled every kernel again: 99 s on 2 cores, against 20 s without).
make -s NO_BLAS=1 NO_CUDA=1 BUILD="$BUILD/noblas" "$BUILD/noblas/reference_dump" >/dev/null
"$BUILD/noblas/reference_dump" test/configs/reference.conf "$tmp/ref" >/dev/null
"$PYTHON" test/torch_reference.py "$tmp/ref" | tail -n 1
say "test_builtin_gemm: all checks passed"
