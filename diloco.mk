# diloco.mk — the DiLoCo outer loop and the MPI transport, included by the Makefile.
# See docs/diloco.md. MPI is optional: without it `diloco_transport = mpi` is a clear error.
LIB_SRC += diloco.c net/transport.c net/transport_mpi.c
TESTS_SH += test/test_diloco.sh

# MPI: the compile and link flags of the MPI compiler wrapper (Open MPI: --showme, MPICH: -show).
ifneq ($(MPICC),)
  ifneq ($(NO_MPI),1)
    MPI_CFLAGS := $(shell $(MPICC) --showme:compile 2>/dev/null || $(MPICC) -compile_info 2>/dev/null | cut -d' ' -f2-)
    MPI_LIBS := $(shell $(MPICC) --showme:link 2>/dev/null || $(MPICC) -link_info 2>/dev/null | cut -d' ' -f2-)
    HAVE_MPI := 1
    MSG_MPI := ✓ MPI ($(MPICC)): diloco_transport = mpi
    LDLIBS += $(MPI_LIBS)
    $(BUILD)/net/transport_mpi.o: CFLAGS += -DHAVE_MPI $(MPI_CFLAGS)
  endif
endif
ifneq ($(HAVE_MPI),1)
  MSG_MPI := ✗ MPI (diloco_transport = mpi unavailable: install libopenmpi-dev)
endif
MPIRUN := $(shell command -v mpirun 2>/dev/null)

