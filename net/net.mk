# net/net.mk — how replicas talk, included by the Makefile: the transport interface
# (net/transport.c), the MPI transport (net/transport_mpi.c; MPI is detected here, for it
# and for llmc/comm.c, the collectives among the ranks of one job) and the tcp one (net/wire.c: frames,
# net/conn.c: framed connections, socket.c: sockets, net/relay.c: the hub and `train_gpt relay`,
# net/transport_tcp.c: a replica's side). See docs/protocol.md.
#
# Detected and printed (MSG_OPENSSL, MSG_LIBFUZZER):
#   OpenSSL libcrypto  HMAC-SHA256 and random nonces; without it the tcp transport compiles
#                      out and `diloco_transport = tcp` / `train_gpt relay` fail with a line
#                      saying what to install
#   clang + libFuzzer  `make fuzz`, and `make test` fuzzes the frame parser for FUZZ_SECONDS
#
# `make fuzz FUZZ_SECONDS=600` fuzzes longer (findings land in $(BUILD)/fuzz-*).
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
  MSG_MPI := ✗ MPI (diloco_transport = mpi unavailable: install libopenmpi-dev)
endif
MPIRUN := $(shell command -v mpirun 2>/dev/null)

FUZZ_SECONDS ?= 60
export FUZZ_SECONDS   # make test FUZZ_SECONDS=10 reaches test/test_fuzz_wire.sh
CLANG ?= clang

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
  TESTS_SH += test/test_diloco_hubs.sh test/test_relay_peers.sh
  MSG_OPENSSL := ✓ OpenSSL libcrypto $(shell pkg-config --modversion libcrypto) (diloco_transport = tcp, train_gpt relay)
else
  LIB_SRC += net/transport_tcp_none.c
  MSG_OPENSSL := ✗ OpenSSL libcrypto (no tcp transport, no relay: install libssl-dev)
endif

# libFuzzer: a throwaway link proves clang has it (the fuzzer runtime is a separate package
# on some systems).
ifeq ($(HAVE_OPENSSL),1)
  HAVE_LIBFUZZER := $(shell f=$$(mktemp) && printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { return d && n; }\n' | \
      $(CLANG) -fsanitize=fuzzer,address -x c - -o $$f >/dev/null 2>&1 && echo 1; rm -f $$f)
endif
ifeq ($(HAVE_LIBFUZZER),1)
  MSG_LIBFUZZER := ✓ libFuzzer ($(CLANG)): make test fuzzes the frame parser for $(FUZZ_SECONDS) s
  TOOLS += $(BUILD)/fuzz_wire
else
  MSG_LIBFUZZER := ✗ libFuzzer (no frame fuzzing: install clang)
endif
TESTS_SH += test/test_fuzz_wire.sh

# This file is included before the Makefile's `all`; keep `all` the default goal.
.DEFAULT_GOAL := all

# The fuzzer links net/wire.c alone (no sockets, no library): ASan + UBSan, any finding fatal.
$(BUILD)/fuzz_wire: test/fuzz_wire.c net/wire.c net/wire.h
	@mkdir -p $(BUILD)
	$(CLANG) -std=c11 -g -O1 -D_GNU_SOURCE -I. -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
	    $(OPENSSL_CFLAGS) test/fuzz_wire.c net/wire.c -o $@ $(OPENSSL_LIBS)

.PHONY: fuzz
fuzz: $(BUILD)/fuzz_wire $(BUILD)/test_wire
	BUILD=$(CURDIR)/$(BUILD) FUZZ_SECONDS=$(FUZZ_SECONDS) bash test/test_fuzz_wire.sh
