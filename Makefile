# train_gpt — build. `make` builds ./train_gpt; `make test` runs the whole CPU suite.
#
# What the build can use is detected, printed (✓ / ✗), and used:
#   OpenMP    required for threads (a build without it runs on one core)
#   BLAS      OpenBLAS (the OpenMP flavour preferred), else any CBLAS, else a slow built-in gemm
#   PCRE2     the tokenizer's split regex (without it: no `train_gpt prepare`; samples during
#             training encode their prompt without the split, docs/tokenizer.md)
#   nvcc      the CUDA backend (hipcc: the same backend for AMD GPUs, where nvcc is not found or HIP=1)
#   MPI       multi-process runs
# Override any guess: make BLAS_LIBS="-lmkl_rt" BLAS_CFLAGS="-DUSE_CBLAS", make NO_BLAS=1, NO_PCRE2=1,
# make NATIVE=0 (no -march=native, or -mcpu=native on aarch64: for a binary that must run on
# older CPUs), BUILD=dir.
# What was detected and given goes to BUILD/config.txt; a change there rebuilds everything it
# touches (a library installed since the last build, NATIVE=0, ...), no `make clean` needed.

CC      ?= gcc
NATIVE  ?= 1
BUILD   := build
PYTHON  ?= /usr/bin/python3
# What this build detected and was given (compilers, flags, libraries, backends), written at
# the end of this file; every object and binary depends on it, so a change (a library
# installed, NATIVE=0, NO_BLAS=1, nvcc found) rebuilds, and an unchanged `make` compiles
# nothing.
BUILD_CONFIG := $(BUILD)/config.txt

CFLAGS_BASE := -std=c11 -O3 -g -Wall -Wextra -Wno-unused-parameter -D_GNU_SOURCE -MMD -MP
ifeq ($(NATIVE),1)
  ifneq ($(shell $(CC) -march=native -E -x c /dev/null >/dev/null 2>&1 && echo ok),)
    CFLAGS_BASE += -march=native
  else ifneq ($(shell $(CC) -mcpu=native -E -x c /dev/null >/dev/null 2>&1 && echo ok),)
    # aarch64 compilers that refuse -march=native spell it -mcpu=native (docs/build.md)
    CFLAGS_BASE += -mcpu=native
  endif
endif
LDLIBS := -lm

# ---------------------------------------------------------------- OpenMP
HAVE_OPENMP := $(shell echo 'int main(void){return 0;}' | $(CC) -fopenmp -x c - -o /dev/null 2>/dev/null && echo 1)
ifeq ($(HAVE_OPENMP),1)
  CFLAGS_BASE += -fopenmp
  LDLIBS += -fopenmp
  MSG_OPENMP := ✓ OpenMP
else
  CFLAGS_BASE += -Wno-unknown-pragmas
  MSG_OPENMP := ✗ OpenMP (single-threaded build)
endif

# ---------------------------------------------------------------- BLAS
# Debian's OpenMP OpenBLAS: its library (libopenblas0-openmp) and its headers (-dev) both, or
# neither is used (the library alone left "-I" with no directory, which ate the "-I." after it).
OPENBLAS_OMP_INC := $(firstword $(wildcard /usr/include/*-linux-gnu/openblas-openmp))
OPENBLAS_OMP_DIR := $(if $(OPENBLAS_OMP_INC),$(firstword $(wildcard /usr/lib/*-linux-gnu/openblas-openmp)))
ifeq ($(NO_BLAS),1)
  BLAS_CFLAGS :=
  BLAS_LIBS :=
  MSG_BLAS := ✗ BLAS (NO_BLAS=1: the slow built-in gemm)
else ifndef BLAS_LIBS
  ifneq ($(OPENBLAS_OMP_DIR),)
    BLAS_CFLAGS := -DUSE_CBLAS -DUSE_OPENBLAS -I$(OPENBLAS_OMP_INC)
    BLAS_LIBS := -L$(OPENBLAS_OMP_DIR) -Wl,-rpath,$(OPENBLAS_OMP_DIR) -lopenblas
    MSG_BLAS := ✓ BLAS: OpenBLAS (OpenMP) in $(OPENBLAS_OMP_DIR)
  else ifneq ($(shell pkg-config --exists openblas 2>/dev/null && echo 1),)
    BLAS_CFLAGS := -DUSE_CBLAS -DUSE_OPENBLAS $(shell pkg-config --cflags openblas)
    BLAS_LIBS := $(shell pkg-config --libs openblas)
    MSG_BLAS := ✓ BLAS: OpenBLAS (pkg-config)
  else ifneq ($(shell echo 'int main(void){return 0;}' | $(CC) -x c - -lopenblas -o /dev/null 2>/dev/null && echo 1),)
    BLAS_CFLAGS := -DUSE_CBLAS -DUSE_OPENBLAS
    BLAS_LIBS := -lopenblas
    MSG_BLAS := ✓ BLAS: -lopenblas
  else ifneq ($(shell echo 'int main(void){return 0;}' | $(CC) -x c - -lcblas -o /dev/null 2>/dev/null && echo 1),)
    BLAS_CFLAGS := -DUSE_CBLAS
    BLAS_LIBS := -lcblas
    MSG_BLAS := ✓ BLAS: -lcblas
  else
    BLAS_CFLAGS :=
    BLAS_LIBS :=
    MSG_BLAS := ✗ BLAS (using the slow built-in gemm; install libopenblas-openmp-dev)
  endif
else
  # BLAS_LIBS alone: the CBLAS calls are what it is for (without -DUSE_CBLAS the built-in gemm
  # was compiled while the line said ✓).
  BLAS_CFLAGS ?= -DUSE_CBLAS
  ifneq ($(findstring -DUSE_CBLAS,$(BLAS_CFLAGS)),)
    MSG_BLAS := ✓ BLAS: $(BLAS_LIBS) (from the command line)
  else
    MSG_BLAS := ✗ BLAS: BLAS_LIBS given, but BLAS_CFLAGS lacks -DUSE_CBLAS (the slow built-in gemm)
  endif
endif
CFLAGS_BASE += $(BLAS_CFLAGS)
LDLIBS += $(BLAS_LIBS)

# ---------------------------------------------------------------- pkg-config
# PCRE2, zlib, libzstd and OpenSSL are found with it: without it each was reported missing
# ("install ...-dev") though installed.
ifeq ($(shell pkg-config --version >/dev/null 2>&1 && echo 1),)
  MSG_PKG_CONFIG := ✗ pkg-config (not found: PCRE2, zlib, libzstd and OpenSSL are looked for with it; install pkg-config)
endif

# ---------------------------------------------------------------- PCRE2
ifeq ($(NO_PCRE2),1)
  MSG_PCRE2 := ✗ PCRE2 (NO_PCRE2=1: no train_gpt prepare)
else ifneq ($(shell pkg-config --exists libpcre2-8 2>/dev/null && echo 1),)
  HAVE_PCRE2 := 1
  CFLAGS_BASE += -DHAVE_PCRE2 $(shell pkg-config --cflags libpcre2-8)
  LDLIBS += $(shell pkg-config --libs libpcre2-8)
  MSG_PCRE2 := ✓ PCRE2 (tokenizer)
else
  MSG_PCRE2 := ✗ PCRE2 (no train_gpt prepare: install libpcre2-dev)
endif

# ---------------------------------------------------------------- nvcc, MPI
NVCC := $(shell command -v nvcc 2>/dev/null || (test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc))
ifneq ($(NVCC),)
  MSG_NVCC := ✓ nvcc $(NVCC)
else
  MSG_NVCC := ✗ nvcc (CPU-only build)
endif
MPICC := $(shell command -v mpicc 2>/dev/null)
ifneq ($(MPICC),)
  MSG_MPI := ✓ MPI $(MPICC) (not used by this version yet)
else
  MSG_MPI := ✗ MPI
endif

CFLAGS := $(CFLAGS_BASE) $(CFLAGS)
# .cu files (train_gpt.cu, quant.cu) are C-style C++17: nvcc compiles them when the CUDA
# backend is built (cuda/cuda.mk), else the host C++ compiler, with their GPU sections
# (#ifdef __CUDACC__) left out, so CI compiles the same host code a cluster's nvcc sees.
# -ffp-contract=off: g++ contracts a*b+c into an FMA by default even in ISO mode (gcc's C
# does not, with -std=c11); quant.cu's C reference must round like the GPU and like C.
CXXFLAGS := $(filter-out -std=c11,$(CFLAGS_BASE)) -std=c++17 -fno-exceptions -fno-rtti -ffp-contract=off $(CXXFLAGS)

# ---------------------------------------------------------------- sources
# LIB_SRC: everything but main(); linked into train_gpt and every test binary.
# llmc/: the host library (imports nothing above it); cpu/: the fp32 CPU backend.
# The root's diloco.c (the outer loop) and quant.cu (its quantization: the C reference, and
# with nvcc the kernels; HOST_CU_SRC are .cu files of the library).
LIB_SRC := llmc/common.c llmc/checksum.c llmc/json.c llmc/config.c llmc/params.c llmc/safetensors.c \
           llmc/optim.c llmc/checkpoint.c llmc/metrics.c llmc/device.c llmc/guard.c llmc/watchdog.c \
           llmc/tensorboard.c llmc/plot.c llmc/shard.c llmc/comm.c llmc/plan.c \
           cpu/gemm.c cpu/ops.c cpu/model.c cpu/backend.c \
           tok/sample.c diloco.c
HOST_CU_SRC := quant.cu
# train_gpt.cu (main, the training loop, the GPU model) is compiled on its own, not into
# the library: the tests that need it include it with -DTESTING.
# C test programs: each test/NAME.c becomes $(BUILD)/NAME and runs in `make test`.
TESTS_C := test/test_units.c test/test_ops.c test/test_quant.c test/test_fsdp.c test/test_recompute.c
# C++ test programs: test/NAME.cc, built with the host C++ compiler (no GPU needed).
#   test_attention_fa2_emu  the GPU's register-resident attention kernels run on the CPU by
#                           test/warp_emu.h, against the CPU reference
#   test_attention_mfma_emu the same for AMD's MFMA kernels, on 64-wide wavefronts
TESTS_CXX := test/test_attention_fa2_emu.cc test/test_attention_mfma_emu.cc
# Shell tests run after the C ones, with TRAIN_GPT and BUILD set.
TESTS_SH := test/test_torch_reference.sh test/test_learning.sh test/test_resume.sh test/test_ckpt_space.sh test/test_bad_input.sh test/test_data_verify.sh test/test_shards_upgrade.sh \
            test/test_configs.sh test/test_builtin_gemm.sh test/test_diloco.sh test/test_diloco_hetero.sh test/test_diloco_late.sh test/test_diloco_refound.sh test/test_diloco_told.sh test/test_diloco_stop_one.sh test/test_diloco_sparse.sh test/test_diloco_scale.sh test/test_diloco_pays.sh test/test_guards.sh test/test_slurm.sh \
            test/test_tensorboard.sh test/test_plot.sh test/test_build.sh test/test_fsdp.sh test/test_fsdp_faults.sh test/test_fsdp_plan.sh \
            test/test_fsdp_diloco.sh test/test_hsdp_diloco.sh test/test_diloco_over.sh test/test_recompute.sh test/test_diloco_warm.sh test/test_plan.sh \
            test/test_docs.sh test/test_layout.sh test/test_gpu_session.sh test/test_gpu_train_emu.sh test/test_fsdp_gpu_emu.sh
# Helper programs the shell tests call (train_gpt_emu: the trainer on the CPU emulator of the GPU).
TOOLS := $(BUILD)/test_tool $(BUILD)/reference_dump $(BUILD)/train_gpt_emu

# Each folder adds its own sources, tests and detection in a fragment beside its code:
#   cuda/cuda.mk  the CUDA backend (nvcc, cuBLASLt, cuDNN) and GPU_TESTS (first: the others
#                 ask HAVE_CUDA)
#   tok/tok.mk    the tokenizer and `train_gpt prepare`
#   net/net.mk    the transports (MPI, TCP), the relay, MPI and OpenSSL detection
#   test/fuzz.mk  the libFuzzer targets (the frame parser, the file readers): after net.mk
#   test/aarch64.mk  `make check-aarch64`: the CPU build cross-compiled for aarch64, tested under qemu
#   test/hip.mk   `make check-hip`: the GPU backend compiled with hipcc for AMD's gfx90a, warnings as errors
#   bench/diloco/bench.mk  `make bench-diloco`: the TCP transport's goodput on a shaped link;
#                          `make bench-streaming`: classic vs streaming DiLoCo's compute utilization
-include cuda/cuda.mk tok/tok.mk net/net.mk test/fuzz.mk bench/diloco/bench.mk test/aarch64.mk test/hip.mk

# The GPU encoder against the C reference, byte for byte: a GPU test (CUDA and HIP).
ifeq ($(HAVE_CUDA),1)
  GPU_TESTS += $(BUILD)/test_quant_gpu
endif

# dataloader.h is a single header: its implementation section is compiled once, here.
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/%.o) $(HOST_CU_SRC:%.cu=$(BUILD)/%.o) $(BUILD)/dataloader_impl.o
TEST_BINS := $(TESTS_C:test/%.c=$(BUILD)/%) $(TESTS_CXX:test/%.cc=$(BUILD)/%) $(BUILD)/test_gpu_kernels_emu \
             $(BUILD)/test_gpu_kernels_emu64 $(BUILD)/test_gpu_step_emu $(BUILD)/test_quant_gpu_emu \
             $(NCCL_ABI_TEST)

.PHONY: all test clean info bench
.SECONDARY:
all: info train_gpt

info:
	@echo "train_gpt build:"
	$(if $(MSG_PKG_CONFIG),@echo "  $(MSG_PKG_CONFIG)")
	@echo "  $(MSG_OPENMP)"
	@echo "  $(MSG_BLAS)"
	@echo "  $(MSG_PCRE2)"
	@echo "  $(MSG_ZLIB)"
	@echo "  $(MSG_ZSTD)"
	@echo "  $(MSG_NVCC)"
	@echo "  $(MSG_HIP)"
	@echo "  $(MSG_CUDNN)"
	@echo "  $(MSG_NCCL)"
	@echo "  $(MSG_MPI)"
	@echo "  $(MSG_OPENSSL)"
	@echo "  $(MSG_LIBFUZZER)"

$(BUILD)/%.o: %.c $(BUILD_CONFIG)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -I. -c $< -o $@

ifneq ($(HAVE_CUDA),1)
$(BUILD)/%.o: %.cu $(BUILD_CONFIG)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -I. -x c++ -c $< -o $@
LDLIBS += -lstdc++
endif

$(BUILD)/dataloader_impl.o: dataloader.h $(BUILD_CONFIG)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -I. -x c -DDATALOADER_IMPLEMENTATION -c $< -o $@

$(BUILD)/libtrain_gpt.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

train_gpt: $(BUILD)/train_gpt.o $(BUILD)/libtrain_gpt.a
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/test_%: $(BUILD)/test/test_%.o $(BUILD)/libtrain_gpt.a
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/test_%: test/test_%.cc $(BUILD)/libtrain_gpt.a $(BUILD_CONFIG)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -Wno-unknown-pragmas -I. -MMD -MP -MF $@.d $< $(BUILD)/libtrain_gpt.a -o $@ $(LDLIBS)

# Emulated GPU tests: test/test_gpu_kernels.cu and the kernel files of cuda/ (not matmul.cu,
# which is cuBLASLt) built by the host C++ compiler against test/warp_emu.h and run on the
# CPU: every kernel checked against the CPU reference in `make test`, without a GPU. The
# launch syntax k<<<...>>>(args) becomes emu::launcher(k, ...)(args) on the way.
EMU_CU := cuda/embedding.cu cuda/rmsnorm.cu cuda/qknorm_rope.cu cuda/swiglu.cu cuda/attention.cu \
          cuda/attention_simple.cu cuda/classifier.cu cuda/adamw.cu test/test_gpu_kernels.cu
# -Wno-uninitialized: GCC 12 at -O3 calls rmsnorm's backward's float4 arrays, zeroed before a
# block barrier, uninitialized (a false positive: the test checks what the kernel computes).
EMU_FLAGS := -include test/warp_emu.h -include test/cublaslt_emu.h -Wno-unknown-pragmas -Wno-unused-function \
             -Wno-uninitialized
$(BUILD)/emu/%.cc: %.cu
	@mkdir -p $(dir $@)
	perl -pe 's/([A-Za-z_][\w:]*(?:<\w+>)?)<<<(.*?)>>>\(/emu::launcher($$1, $$2)(/g' $< >$@
$(BUILD)/emu/%.o: $(BUILD)/emu/%.cc test/warp_emu.h test/cublaslt_emu.h $(BUILD_CONFIG)
	$(CXX) $(CXXFLAGS) $(EMU_FLAGS) $(EMU_EXTRA) -I. -c $< -o $@
$(BUILD)/test_gpu_kernels_emu: $(EMU_CU:%.cu=$(BUILD)/emu/%.o) $(BUILD)/libtrain_gpt.a
	$(CXX) $(CXXFLAGS) $^ -o $@ $(LDLIBS)
# The GPU model itself: test/test_gpu_step.cu (which includes train_gpt.cu with TESTING defined)
# on the emulated kernels and the emulated cuBLASLt (test/cublaslt_emu.h), against the CPU model.
EMU_MODEL_CU := $(filter-out test/test_gpu_kernels.cu,$(EMU_CU)) cuda/matmul.cu cuda/collective.cu
# The GPU collectives on the emulator: NCCL's calls over MPI (test/nccl_emu.h), when the build has MPI.
ifeq ($(HAVE_MPI),1)
$(BUILD)/emu/cuda/collective.o: EMU_EXTRA := -include test/nccl_emu.h $(MPI_CFLAGS)
$(BUILD)/emu/cuda/collective.o: test/nccl_emu.h
endif
$(BUILD)/test_gpu_step_emu: $(BUILD)/emu/test/test_gpu_step.o $(EMU_MODEL_CU:%.cu=$(BUILD)/emu/%.o) \
                            $(BUILD)/libtrain_gpt.a
	$(CXX) $(CXXFLAGS) $^ -o $@ $(LDLIBS)
# The kernels again with 64-wide warps (AMD CDNA's wavefronts, no mma.sync: the paths the HIP
# build compiles), from the same rewritten sources.
$(BUILD)/emu64/%.o: $(BUILD)/emu/%.cc test/warp_emu.h test/cublaslt_emu.h $(BUILD_CONFIG)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) $(EMU_FLAGS) -DTRAIN_GPT_EMU_WARP=64 -I. -c $< -o $@
$(BUILD)/test_gpu_kernels_emu64: $(EMU_CU:%.cu=$(BUILD)/emu64/%.o) $(BUILD)/libtrain_gpt.a
	$(CXX) $(CXXFLAGS) $^ -o $@ $(LDLIBS)
# quant.cu's GPU encoder and decoder against its C reference, byte for byte, on the emulator.
$(BUILD)/test_quant_gpu_emu: $(BUILD)/emu/test/test_quant_gpu.o $(BUILD)/emu/quant.o $(BUILD)/libtrain_gpt.a
	$(CXX) $(CXXFLAGS) $^ -o $@ $(LDLIBS)
# `make check-emu-asan`: the emulated kernel and attention tests again under AddressSanitizer
# (device memory is host memory there: a kernel that reads or writes past an allocation is
# reported), and the trainer on the emulated GPU with FSDP under both deferred-stream
# schedules (test/emu_asan_fsdp.sh: an op run after what it reads was freed). Not in `make
# test`: about 10 minutes on 2 cores, plus the build. (The codec test is left out: over 10
# minutes under ASan.)
.PHONY: check-emu-asan
check-emu-asan:
	CFLAGS="-fsanitize=address -fno-omit-frame-pointer" CXXFLAGS="-fsanitize=address -fno-omit-frame-pointer" \
	    $(MAKE) BUILD=$(BUILD)/asan NO_CUDA=1 $(BUILD)/asan/test_gpu_kernels_emu $(BUILD)/asan/test_attention_fa2_emu \
	    $(BUILD)/asan/test_gpu_kernels_emu64 $(BUILD)/asan/test_attention_mfma_emu $(BUILD)/asan/train_gpt_emu \
	    $(BUILD)/asan/test_tool
	@set -e; for t in test_attention_fa2_emu test_attention_mfma_emu test_gpu_kernels_emu test_gpu_kernels_emu64; do \
	    echo "== $$t (AddressSanitizer)"; \
	    if ! $(BUILD)/asan/$$t >$(BUILD)/asan/$$t.log 2>&1; then tail -n 30 $(BUILD)/asan/$$t.log; exit 1; fi; \
	    tail -n 1 $(BUILD)/asan/$$t.log; done
	@echo "== the trainer on the emulated GPU, FSDP with deferred streams (AddressSanitizer)"
	@bash test/emu_asan_fsdp.sh $(BUILD)/asan $(BUILD)/asan/test_tool
	@echo "make check-emu-asan: all passed"
# The trainer itself on the emulated GPU (device = cuda runs on the CPU, slowly): what
# test/test_gpu_train.sh runs in `make test` with GPU_TRAIN_EMULATED=1.
$(BUILD)/train_gpt_emu: $(BUILD)/emu/train_gpt.o $(EMU_MODEL_CU:%.cu=$(BUILD)/emu/%.o) $(BUILD)/libtrain_gpt.a
	$(CXX) $(CXXFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/test_tool: $(BUILD)/test/tool.o $(BUILD)/libtrain_gpt.a
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/reference_dump: $(BUILD)/test/reference_dump.o $(BUILD)/libtrain_gpt.a
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

# Bytes per parameter and encode / decode throughput of the quantizer (not in `make test`).
# Step time and activation memory of each recompute mode on the CPU (not in `make test`;
# bench/recompute/cpu.sh runs it on the 124M config).
$(BUILD)/bench_recompute: $(BUILD)/bench/recompute_cpu.o $(BUILD)/libtrain_gpt.a
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

.PHONY: bench-quant
$(BUILD)/bench_quant_bytes: $(BUILD)/bench/quant_bytes.o $(BUILD)/libtrain_gpt.a
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)
bench-quant: $(BUILD)/bench_quant_bytes
	$(BUILD)/bench_quant_bytes configs/gpt-124m.conf

# test/run_tests.sh runs them one at a time (TEST_JOBS=N: up to N at once, docs/build.md), each
# followed by "== NAME: N s", and the total at the end, so that the slow ones are known (CI must
# stay well under 30 minutes). TESTS_FIRST: the slowest (measured on 2 cores), started first so
# that with TEST_JOBS > 1 none starts last and runs alone; the rest in the order of the lists above.
TESTS_FIRST := test/test_diloco_late.sh test/test_fsdp_gpu_emu.sh $(BUILD)/test_transport test/test_aarch64.sh \
               test/test_diloco_hubs.sh test/test_fsdp_diloco.sh test/test_diloco_scale.sh test/test_diloco.sh \
               test/test_gpu_train_emu.sh $(BUILD)/test_gpu_step_emu test/test_hip.sh
TESTS_ALL := $(TEST_BINS) $(TESTS_SH)
TEST_ORDER = $(if $(filter-out 0 1,$(TEST_JOBS)),$(filter $(TESTS_ALL),$(TESTS_FIRST)) $(filter-out $(TESTS_FIRST),$(TESTS_ALL)),$(filter $(TESTS_ALL),$(TESTS_NICE)) $(filter-out $(TESTS_NICE),$(TESTS_ALL)))
# TESTS_NICE: the tests with no deadline, timeout or network of their own (pure computation,
# builds, qemu), which at TEST_JOBS=1 run in a second lane beside the others at nice 19 (10
# when not root: only root can renice it back to 0 once the first lane ends)
# (test/run_tests.sh says why that is safe); the slowest first. The MPI ones wait for their
# collectives up to comm_timeout_s (600 s), not for a time. Not the fuzzers: their limit of 10 s
# per input is wall time, and at nice 19 beside a busy first-lane test an input of a second
# could take that long; nor test_plot (chromium within 120 s).
TESTS_NICE := test/test_aarch64.sh $(BUILD)/test_gpu_step_emu test/test_hip.sh test/test_gpu_train_emu.sh \
              test/test_prepare.sh test/test_prepare_compressed.sh test/test_fsdp.sh test/test_plan.sh \
              test/test_recompute.sh test/test_gpu_session.sh test/test_fsdp_plan.sh test/test_tensorboard.sh \
              test/test_builtin_gemm.sh test/test_no_pcre2.sh $(BUILD)/test_quant_gpu_emu $(BUILD)/test_gpu_kernels_emu64 \
              $(BUILD)/test_gpu_kernels_emu test/test_torch_reference.sh test/test_tokenizer_vectors.sh \
              test/test_learning.sh test/test_configs.sh test/test_docs.sh test/test_layout.sh test/test_build.sh
test: all $(TEST_BINS) $(TOOLS)
	@TRAIN_GPT=$(CURDIR)/train_gpt BUILD=$(CURDIR)/$(BUILD) PYTHON=$(PYTHON) \
	    TESTS_NICE="$(filter $(TESTS_ALL),$(TESTS_NICE))" bash test/run_tests.sh $(TEST_ORDER)

# Every kernel against the CPU reference, the full step against the CPU step, then the
# training-level checks (loss curve, resume, GPU → CPU checkpoint). Prints PASS / FAIL
# lines with the measured errors; run on a machine with a GPU (docs/cuda.md).
.PHONY: test-gpu
ifeq ($(HAVE_CUDA),1)
test-gpu: all $(GPU_TESTS) $(TOOLS)
	@set -e; for t in $(GPU_TESTS); do echo "== $$t"; $$t; done
	@set -e; for t in $(GPU_TESTS_SH); do echo "== $$t"; TRAIN_GPT=$(CURDIR)/train_gpt BUILD=$(CURDIR)/$(BUILD) PYTHON=$(PYTHON) bash $$t; done
	@echo "make test-gpu: all passed"
else
test-gpu:
	@echo "make test-gpu: this build has no GPU backend ($(MSG_NVCC); $(MSG_HIP))"; exit 1
endif

clean:
	rm -rf $(BUILD) train_gpt

-include $(wildcard $(BUILD)/*.d $(BUILD)/*/*.d $(BUILD)/*/*/*.d)

# ---------------------------------------------------------------- the build's configuration
# Last, when every fragment has added its flags: $(BUILD)/config.txt holds them, and is
# rewritten only when they change (BUILD_CONFIG at the top says why).
BUILD_CONFIG_TEXT := CC=$(CC) | CFLAGS=$(CFLAGS) | CXX=$(CXX) | CXXFLAGS=$(CXXFLAGS) | LDLIBS=$(LDLIBS) | \
    NVCC=$(NVCC) | NVCC_FLAGS=$(NVCC_FLAGS) | CUDA_MODE=$(CUDA_MODE) | NCCL=$(MSG_NCCL) | MPI=$(MSG_MPI) | OPENSSL=$(MSG_OPENSSL) | \
    PCRE2=$(MSG_PCRE2) | BLAS=$(MSG_BLAS) | ZLIB=$(MSG_ZLIB) | ZSTD=$(MSG_ZSTD)
# Not written by a dry run (make -n) or by goals that build nothing (make info, make clean): a
# `make info NO_BLAS=1` would otherwise leave the next plain `make` to rebuild everything.
BUILD_CONFIG_QUIET := $(and $(MAKECMDGOALS),$(if $(filter-out info clean,$(MAKECMDGOALS)),,1))
ifeq ($(findstring n,$(firstword -$(MAKEFLAGS)))$(BUILD_CONFIG_QUIET),)
BUILD_CONFIG_WRITTEN := $(shell mkdir -p $(BUILD) && \
    printf '%s\n' '$(subst ','"'"',$(BUILD_CONFIG_TEXT))' | sed 's/ *| */\n/g' > $(BUILD_CONFIG).new && \
    { cmp -s $(BUILD_CONFIG).new $(BUILD_CONFIG) && rm -f $(BUILD_CONFIG).new || mv $(BUILD_CONFIG).new $(BUILD_CONFIG); })
endif
# (a dry run in a fresh BUILD has none yet: this rule lets it list the build)
$(BUILD_CONFIG): ;
