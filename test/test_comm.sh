# llmc/comm.h's collectives on 2 and 4 MPI ranks (oversubscribed: 2 cores): every rank checks
# the all-gather, the reduce-scatter (the fp32 sum in rank order, bit for bit), the sum of a
# double, their non-blocking forms, and the same inside even / odd groups (test/test_comm.c;
# make test also runs it as one rank). Without MPI in the build: skipped, and said so.
. "$(dirname "$0")/lib.sh"
require_mpi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for np in 2 4; do check_ranks "$np" "$BUILD/test_comm" "$tmp/np$np.log"; done
finish test_comm
