# net/net.mk — how replicas talk, included by the Makefile: the transport interface
# (net/transport.c), the MPI transport (net/transport_mpi.c; MPI is detected here, for it
# and for llmc/comm.c, the collectives among the ranks of one job) and the tcp one (net/wire.c: frames,
# net/conn.c: framed connections, socket.c: sockets, net/relay.c: the hub and `train_gpt relay`,
# net/transport_tcp.c: a replica's side). See docs/protocol.md.
#
# Detected and printed (MSG_OPENSSL):
#   OpenSSL libcrypto  HMAC-SHA256 and random nonces; without it the tcp transport compiles
#                      out and `diloco_transport = tcp` / `train_gpt relay` fail with a line
#                      saying what to install
# The frame parser's fuzzer is built by test/fuzz.mk.
LIB_SRC += net/transport.c net/transport_mpi.c
TESTS_C += test/test_comm.c
TESTS_SH += test/test_comm.sh

# MPI, optional (without it `diloco_transport = mpi` is a clear error): the compile and link
# flags of the MPI compiler wrapper (Open MPI: --showme, MPICH: -show).
ifneq ($(MPICC),)
  ifneq ($(NO_MPI),1)
    MPI_CFLAGS := $(shell $(MPICC) --showme:compile 2>/dev/null || $(MPICC) -compile_info 2>/dev/null | cut -d' ' -f2-)
    MPI_LIBS := $(shell $(MPICC) --showme:link 2>/dev/null || $(MPICC) -link_info 2>/dev/null | cut -d' ' -f2-)
    HAVE_MPI := 1
    MSG_MPI := ✓ MPI ($(MPICC)): diloco_transport = mpi
    LDLIBS += $(MPI_LIBS)
    $(BUILD)/net/transport_mpi.o $(BUILD)/llmc/comm.o $(BUILD)/test/test_comm.o: CFLAGS += -DHAVE_MPI $(MPI_CFLAGS)
  endif
endif
ifneq ($(HAVE_MPI),1)
  MSG_MPI := ✗ MPI (diloco_transport = mpi unavailable: $(if $(filter 1,$(NO_MPI)),NO_MPI=1,install libopenmpi-dev))
endif
MPIRUN := $(shell command -v mpirun 2>/dev/null)

ifneq ($(NO_OPENSSL),1)
  HAVE_OPENSSL := $(shell pkg-config --exists libcrypto 2>/dev/null && echo 1)
endif
ifeq ($(HAVE_OPENSSL),1)
  OPENSSL_CFLAGS := $(shell pkg-config --cflags libcrypto)
  OPENSSL_LIBS := $(shell pkg-config --libs libcrypto)
  CFLAGS += $(OPENSSL_CFLAGS)
  LDLIBS += $(OPENSSL_LIBS) -lpthread
  LIB_SRC += net/wire.c net/conn.c net/socket.c net/relay.c net/transport_tcp.c net/transport_hubs.c
  TESTS_C += test/test_wire.c test/test_transport.c
  TESTS_SH += test/test_diloco_hubs.sh test/test_relay_peers.sh test/test_replica_peers.sh
  MSG_OPENSSL := ✓ OpenSSL libcrypto $(shell pkg-config --modversion libcrypto) (diloco_transport = tcp, train_gpt relay)
else
  LIB_SRC += net/transport_tcp_none.c
  MSG_OPENSSL := ✗ OpenSSL libcrypto (no tcp transport, no relay: $(if $(filter 1,$(NO_OPENSSL)),NO_OPENSSL=1,install libssl-dev))
endif

# This file is included before the Makefile's `all`; keep `all` the default goal.
.DEFAULT_GOAL := all
