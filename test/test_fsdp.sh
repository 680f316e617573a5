# The CPU backend sharded over 2 and 4 MPI ranks (oversubscribed: 2 cores) against the
# whole-model backend, HSDP 2 × 2 against it too (test/test_fsdp.c; make test also runs it as
# one rank, where it must equal the whole backend bit for bit). Without MPI: skipped, said so.
. "$(dirname "$0")/lib.sh"
detect_mpi
if [ "$HAVE_MPI" = 0 ]; then
    say "  skip (no MPI in this build)"
    exit 0
fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for np in 2 4; do
    rc=0
    "${MPIRUN[@]}" "$np" "$BUILD/test_fsdp" >"$tmp/np$np.log" 2>&1 || rc=$?
    check "np $np: every rank passes ($(grep -c ', 0 failed' "$tmp/np$np.log") of $np; rc $rc)" \
        sh -c "[ $rc -eq 0 ] && [ \$(grep -c ', 0 failed' '$tmp/np$np.log') -eq $np ]"
    grep '(rank 0)' "$tmp/np$np.log" || true
    [ "$rc" -eq 0 ] || cat "$tmp/np$np.log"
done
finish test_fsdp
