# cuda/cuda.mk — the GPU backend (docs/cuda.md), included by the Makefile: CUDA with nvcc,
# or HIP with hipcc for AMD GPUs, from the same sources (cuda/portable.cuh).
#
# Detected and printed (✓ / ✗) through MSG_NVCC, MSG_HIP and MSG_CUDNN:
#   nvcc       /usr/local/cuda/bin/nvcc or nvcc on PATH; without it: a CPU-only build
#   cuBLASLt   header and library next to nvcc (or the distribution's); required with nvcc
#   cuDNN      cudnn.h + libcudnn (detected only: this version's attention is its own kernel)
#   hipcc      hipcc on PATH or $(ROCM_PATH)/bin/hipcc; used when nvcc is not found, or with HIP=1
#   hipBLASLt  hipblaslt/hipblaslt.h + libhipblaslt next to hipcc (ROCm 6.2 or newer);
#              required with hipcc (Debian's ROCm 5 has none: `make check-hip` links a stand-in)
# With nvcc and cuBLASLt the kernels under cuda/ go into the library, nvcc compiles
# train_gpt.cu with its GPU section and quant.cu with its kernels, and
# train_gpt links the CUDA runtime statically (cudart_static: the binary starts, and
# device = auto falls back to the CPU, on machines without an NVIDIA driver) and cuBLASLt
# dynamically with an rpath. Never -lcuda: the toolkit's stub would make the binary
# unloadable on GPU nodes' real drivers and on machines without one.
# With hipcc and hipBLASLt the same files are compiled by hipcc and train_gpt links the HIP
# runtime (libamdhip64) and hipBLASLt dynamically with an rpath: the binary needs ROCm's
# libraries to start (a login node with the rocm module has them).
#
#   make NO_CUDA=1                      the CPU-only build (train_gpt.cu without its GPU section),
#                                       even where nvcc or hipcc is found
#   make CUDA_ARCH="-gencode ..."       other GPUs (default: sm_80 + sm_90, and compute_90
#                                       PTX so that newer GPUs can JIT-compile it)
#   make CUDA_WERROR=1                  nvcc warnings (host and device) become errors
#   make HIP=1                          the HIP backend even where nvcc is found
#   make HIP_ARCH="--offload-arch=..."  other AMD GPUs (default: gfx90a = MI250X, gfx942 =
#                                       MI300X); HIP_WERROR=1: hipcc warnings become errors
#   make check-hip                      test/hip.mk: the HIP build checked without an AMD GPU
#   make test-gpu                       the GPU tests (on a machine with a GPU; not in `make test`)
#
# Other fragments add GPU test programs with `GPU_TESTS += $(BUILD)/test_x` (built by their
# own rules, run by test-gpu in order).

.DEFAULT_GOAL := all
TESTS_C += test/test_device.c
GPU_TESTS += $(BUILD)/test_gpu_kernels $(BUILD)/test_gpu_step
GPU_TESTS_SH += test/test_gpu_train.sh test/test_fsdp_gpu.sh

# hipcc: on PATH (the rocm module puts it there) or under ROCM_PATH.
comma := ,
ROCM_PATH ?= /opt/rocm
HIPCC := $(shell command -v hipcc 2>/dev/null || (test -x $(ROCM_PATH)/bin/hipcc && echo $(ROCM_PATH)/bin/hipcc))
HIP_ARCH ?= --offload-arch=gfx90a --offload-arch=gfx942

# Which GPU toolchain: none with NO_CUDA=1; hipcc with HIP=1; else nvcc when found, else hipcc.
ifeq ($(NO_CUDA),1)
  NVCC :=
  HIPCC_USED :=
else ifeq ($(HIP),1)
  NVCC :=
  HIPCC_USED := $(HIPCC)
else ifeq ($(NVCC),)
  HIPCC_USED := $(HIPCC)
else
  HIPCC_USED :=
endif

CUDA_ARCH ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=[sm_90,compute_90]

HAVE_CUDA :=
HAVE_HIP :=
ifneq ($(NVCC),)
  CUDA_HOME ?= $(abspath $(dir $(realpath $(NVCC)))..)
  CUDA_INC := $(firstword $(wildcard $(CUDA_HOME)/include/cublasLt.h /usr/include/cublasLt.h))
  CUDA_LIB := $(firstword $(wildcard $(CUDA_HOME)/lib64/libcublasLt.so $(CUDA_HOME)/lib/libcublasLt.so \
                                     /usr/lib/x86_64-linux-gnu/libcublasLt.so /usr/lib/aarch64-linux-gnu/libcublasLt.so))
  CUDART_STATIC := $(firstword $(wildcard $(CUDA_HOME)/lib64/libcudart_static.a $(CUDA_HOME)/lib/libcudart_static.a \
                                          /usr/lib/x86_64-linux-gnu/libcudart_static.a))
  CUDA_VERSION := $(shell $(NVCC) --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')
  ifeq ($(CUDA_INC),)
    MSG_NVCC := ✗ nvcc $(NVCC) found, but no cublasLt.h (CPU-only build; install the CUDA toolkit's cuBLAS)
  else ifeq ($(CUDA_LIB),)
    MSG_NVCC := ✗ nvcc $(NVCC) found, but no libcublasLt.so (CPU-only build)
  else ifeq ($(CUDART_STATIC),)
    MSG_NVCC := ✗ nvcc $(NVCC) found, but no libcudart_static.a (CPU-only build)
  else
    HAVE_CUDA := 1
    CUDA_LIB_DIR := $(dir $(CUDA_LIB))
    CUDA_ARCH_NAMES := $(shell echo '$(CUDA_ARCH)' | grep -o 'code=[^ ]*' | grep -o '\(sm\|compute\)_[0-9a-z]*' | sort -u | tr '\n' ' ')
    MSG_NVCC := ✓ nvcc $(NVCC) (CUDA $(CUDA_VERSION)) + cuBLASLt: the CUDA backend for $(strip $(CUDA_ARCH_NAMES))
  endif
else ifeq ($(NO_CUDA),1)
  MSG_NVCC := ✗ nvcc (NO_CUDA=1: CPU-only build)
else ifeq ($(HIP),1)
  MSG_NVCC := ✗ nvcc (not used: HIP=1)
endif

# HIP: hipcc with hipBLASLt and the HIP runtime next to it (ROCM_PATH, or the directory
# above hipcc's); the build then compiles the GPU backend with hipcc and HAVE_CUDA means "a
# GPU backend", whichever toolchain built it.
ifneq ($(HIPCC_USED),)
  HIP_HOME := $(abspath $(dir $(realpath $(HIPCC_USED)))..)
  HIP_BLASLT_INC := $(firstword $(wildcard $(ROCM_PATH)/include/hipblaslt/hipblaslt.h \
                                           $(HIP_HOME)/include/hipblaslt/hipblaslt.h))
  HIP_BLASLT_LIB := $(firstword $(wildcard $(ROCM_PATH)/lib/libhipblaslt.so $(HIP_HOME)/lib/libhipblaslt.so \
                                           /usr/lib/x86_64-linux-gnu/libhipblaslt.so))
  HIP_RUNTIME_LIB := $(firstword $(wildcard $(ROCM_PATH)/lib/libamdhip64.so $(HIP_HOME)/lib/libamdhip64.so \
                                            /usr/lib/x86_64-linux-gnu/libamdhip64.so))
  HIPCC_VERSION := $(shell $(dir $(HIPCC_USED))hipconfig --version 2>/dev/null | grep -o '^[0-9][0-9.]*')
  HIP_ARCH_NAMES := $(patsubst --offload-arch=%,%,$(HIP_ARCH))
  ifeq ($(HIP_CHECK)$(if $(HIP_BLASLT_INC),,no-blaslt),1no-blaslt)
    # make check-hip (test/hip.mk) where ROCm has no hipBLASLt (Debian's ROCm 5): the HIP
    # build with a stand-in for cuda/matmul.cu that fails when called (test/hip_matmul_stub.cu),
    # so that train_gpt links and starts; it cannot train on an AMD GPU.
    HAVE_CUDA := 1
    HAVE_HIP := 1
    HIP_LIB_DIR := $(dir $(HIP_RUNTIME_LIB))
    MSG_HIP := ✓ hipcc $(HIPCC_USED) (HIP $(HIPCC_VERSION)), no hipBLASLt: HIP_CHECK=1 build for $(HIP_ARCH_NAMES), \
               matmuls stubbed (not for training)
  else ifeq ($(HIP_BLASLT_INC),)
    MSG_HIP := ✗ hipcc $(HIPCC_USED) (HIP $(HIPCC_VERSION)) found, but no hipblaslt/hipblaslt.h (CPU-only build; \
               hipBLASLt comes with ROCm 6.2 or newer)
  else ifeq ($(HIP_BLASLT_LIB),)
    MSG_HIP := ✗ hipcc $(HIPCC_USED) found, but no libhipblaslt.so (CPU-only build)
  else ifeq ($(HIP_RUNTIME_LIB),)
    MSG_HIP := ✗ hipcc $(HIPCC_USED) found, but no libamdhip64.so (CPU-only build)
  else
    HAVE_CUDA := 1
    HAVE_HIP := 1
    HIP_LIB_DIR := $(sort $(dir $(HIP_BLASLT_LIB)) $(dir $(HIP_RUNTIME_LIB)))
    MSG_HIP := ✓ hipcc $(HIPCC_USED) (HIP $(HIPCC_VERSION)) + hipBLASLt: the HIP backend for $(HIP_ARCH_NAMES)
  endif
  # nvcc absent, hipcc chosen for that (with HIP=1 nvcc's line says so above: "not used").
  ifneq ($(HIP),1)
    ifeq ($(HAVE_HIP),1)
      MSG_NVCC := ✗ nvcc (not found: hipcc builds the GPU backend)
    endif
  endif
else ifneq ($(HIPCC),)
  MSG_HIP := ✗ hipcc $(HIPCC) (not used: $(if $(NVCC),nvcc builds the GPU backend; HIP=1 would use it,NO_CUDA=1))
else ifeq ($(HIP),1)
  MSG_HIP := ✗ hipcc: HIP=1, but no hipcc on PATH or in $(ROCM_PATH)/bin (CPU-only build; module load rocm)
else
  MSG_HIP := ✗ hipcc
endif

# NCCL (CUDA builds) or RCCL (HIP builds): a job of several GPU ranks shards the model over
# them (cuda/collective.cu). The library is opened at run time (libnccl.so.2, librccl.so.1) and
# declared by cuda/nccl_abi.h, so the build needs no NCCL headers and every GPU build has the
# path; a binary on a machine without the library trains on one GPU per job.
ifeq ($(HAVE_HIP),1)
  MSG_NCCL := ✓ RCCL: FSDP / HSDP over several GPUs (librccl.so.1 loaded at run time; no header needed)
  $(BUILD)/cuda/collective.o: NVCC_FLAGS += -DTRAIN_GPT_NCCL
else ifeq ($(HAVE_CUDA),1)
  MSG_NCCL := ✓ NCCL: FSDP / HSDP over several GPUs (libnccl.so.2 loaded at run time; no header needed)
  $(BUILD)/cuda/collective.o: NVCC_FLAGS += -DTRAIN_GPT_NCCL
  # Where this machine has NCCL (header and library), make test checks cuda/nccl_abi.h and the
  # loader against them (test/test_nccl_abi.cu; no GPU needed).
  NCCL_H := $(firstword $(wildcard $(CUDA_HOME)/include/nccl.h /usr/include/nccl.h))
  NCCL_SO := $(firstword $(wildcard $(CUDA_LIB_DIR)libnccl.so.2 /usr/lib/*-linux-gnu/libnccl.so.2))
  ifneq ($(and $(NCCL_H),$(NCCL_SO)),)
    NCCL_ABI_TEST := $(BUILD)/test_nccl_abi
    $(BUILD)/test/test_nccl_abi.o: NVCC_FLAGS += -I$(dir $(NCCL_H))
    MSG_NCCL += ; make test checks it against $(NCCL_H) and $(NCCL_SO)
  endif
else
  MSG_NCCL := ✗ NCCL (no GPU backend in this build)
endif

# cuDNN: detected and reported; not linked (attention uses cuda/attention.cu).
CUDNN_H := $(firstword $(wildcard $(CUDA_HOME)/include/cudnn.h /usr/include/cudnn.h /usr/include/*-linux-gnu/cudnn.h))
CUDNN_SO := $(firstword $(wildcard $(CUDA_HOME)/lib64/libcudnn.so $(CUDA_HOME)/lib/libcudnn.so \
                                   /usr/lib/*-linux-gnu/libcudnn.so))
ifeq ($(HAVE_CUDA),)
  MSG_CUDNN := ✗ cuDNN (no CUDA backend in this build)
else ifneq ($(and $(CUDNN_H),$(CUDNN_SO)),)
  MSG_CUDNN := ✓ cuDNN $(CUDNN_H) (found; not used: attention runs on train_gpt's own kernels)
else
  MSG_CUDNN := ✗ cuDNN (not needed: attention runs on train_gpt's own kernels)
endif

# The build mode as an object file in the library: switching between NO_CUDA=1, a CUDA and
# a HIP build in the same build directory rewrites it, which makes the library rebuild with
# the right objects (the GPU kernels or none).
CUDA_MODE := $(if $(HAVE_HIP),hip $(HIP_ARCH),$(if $(HAVE_CUDA),cuda $(CUDA_ARCH),cpu-only))
CUDA_MODE_STALE := $(shell mkdir -p $(BUILD) && \
    (test "`cat $(BUILD)/cuda_mode.txt 2>/dev/null`" = "$(CUDA_MODE)" || echo "$(CUDA_MODE)" > $(BUILD)/cuda_mode.txt))
$(BUILD)/cuda_mode.o: $(BUILD)/cuda_mode.txt $(BUILD_CONFIG)
	@printf '// generated by cuda/cuda.mk from cuda_mode.txt\nconst char train_gpt_cuda_mode[] = "%s";\n' "$(CUDA_MODE)" > $(BUILD)/cuda_mode.c
	$(CC) $(CFLAGS) -c $(BUILD)/cuda_mode.c -o $@
$(BUILD)/libtrain_gpt.a: $(BUILD)/cuda_mode.o

ifeq ($(HAVE_CUDA),1)
  # One concern per file (docs/cuda.md); train_gpt.cu's GPU section assembles them into the model.
  CUDA_SRC := cuda/matmul.cu cuda/embedding.cu cuda/rmsnorm.cu cuda/qknorm_rope.cu cuda/swiglu.cu \
              cuda/attention.cu cuda/attention_simple.cu cuda/classifier.cu cuda/adamw.cu cuda/collective.cu
  ifeq ($(HAVE_HIP),1)
    ifeq ($(HIP_BLASLT_INC),)
      CUDA_SRC := $(filter-out cuda/matmul.cu,$(CUDA_SRC)) test/hip_matmul_stub.cu  # HIP_CHECK=1 only
    endif
  endif
  CUDA_OBJ := $(CUDA_SRC:%.cu=$(BUILD)/%.o)
endif

ifeq ($(HAVE_HIP),1)
  # hipcc compiles every .cu file, the device code for each HIP_ARCH. -ffp-contract=off holds
  # for the device code too (quant.cu's exact arithmetic; nvcc's device code is governed by
  # its explicit _rn intrinsics instead). HIP marks hipError_t [[nodiscard]]: the teardown
  # paths ignore it as the CUDA build does.
  HIP_WARN := -Wall -Wextra -Wno-unused-parameter -Wno-unused-result
  ifeq ($(HIP_WERROR),1)
    HIP_WARN += -Werror
  endif
  NVCC := $(HIPCC_USED)
  # ROCm's clang leaves an empty directory in TMPDIR for every file it compiles for the GPU
  # (ROCm 5.2: /tmp/adamw-1a2b3c/, one per object and build, never removed): hipcc runs with
  # TMPDIR in the build directory instead, which `make clean` removes.
  HIP_TMPDIR := $(abspath $(BUILD))/hip-tmp
  NVCC_ENV := env TMPDIR=$(HIP_TMPDIR)
  $(shell mkdir -p $(HIP_TMPDIR))
  NVCC_FLAGS := -x hip -O3 -std=c++17 $(HIP_ARCH) $(HIP_WARN) -ffp-contract=off -D_GNU_SOURCE -MMD -MP
  # OpenMP: hipcc's clang and the C compiler bring different OpenMP runtimes, which do not
  # mix, so hipcc gets no -fopenmp (quant.cu's host loops run on one thread there). What
  # train_gpt.cu asks of OpenMP (setting and reading the thread count) still reaches the C
  # library's runtime where hipcc has an omp.h of its own (ROCm's does): _OPENMP as the C
  # compiler defines it; the API's functions are the same in both runtimes.
  ifeq ($(HAVE_OPENMP),1)
    CC_OPENMP := $(filter 2%,$(shell echo _OPENMP | $(CC) -fopenmp -E -P -x c - 2>/dev/null))
    HIPCC_OMP_H := $(shell mkdir -p $(BUILD) && printf '\043include <omp.h>\n' >$(BUILD)/omp_probe.cu && \
                           $(NVCC_ENV) $(HIPCC_USED) -x hip $(firstword $(HIP_ARCH)) -E $(BUILD)/omp_probe.cu -o /dev/null \
                           >/dev/null 2>&1 && echo 1)
    ifneq ($(and $(CC_OPENMP),$(HIPCC_OMP_H)),)
      NVCC_FLAGS += -D_OPENMP=$(CC_OPENMP)
    endif
  endif
  LDLIBS += $(addprefix -L,$(HIP_LIB_DIR)) $(addprefix -Wl$(comma)-rpath$(comma),$(HIP_LIB_DIR)) \
            $(if $(HIP_BLASLT_LIB),-lhipblaslt) -lamdhip64 -lstdc++ -ldl -lrt -lpthread
else ifeq ($(HAVE_CUDA),1)
  NVCC_WARN := -Xcompiler -Wall,-Wextra,-Wno-unused-parameter
  ifeq ($(CUDA_WERROR),1)
    NVCC_WARN += -Werror all-warnings
  endif
  NVCC_FLAGS := -O3 -std=c++17 -lineinfo $(CUDA_ARCH) $(NVCC_WARN) -Xcompiler -ffp-contract=off -D_GNU_SOURCE -MMD -MP
  ifeq ($(HAVE_OPENMP),1)
    NVCC_FLAGS += -Xcompiler -fopenmp   # the host sections' loops (quant.cu's C reference)
  endif
  LDLIBS += -L$(CUDA_LIB_DIR) -Wl,-rpath,$(CUDA_LIB_DIR) -lcublasLt $(CUDART_STATIC) -lstdc++ -ldl -lrt -lpthread
endif

ifeq ($(HAVE_CUDA),1)
# NVCC is nvcc, or hipcc in a HIP build.
$(BUILD)/%.o: %.cu $(BUILD_CONFIG)
	@mkdir -p $(dir $@)
	$(NVCC_ENV) $(NVCC) $(NVCC_FLAGS) -I. -c $< -o $@

$(BUILD)/libtrain_gpt.a: $(CUDA_OBJ)
endif
# The .cu files of the library and train_gpt.cu are compiled by nvcc, hipcc or the host C++
# compiler: a change of mode recompiles them (CUDA_MODE is in the Makefile's BUILD_CONFIG).

# `make test-gpu` (the Makefile, after every fragment has added to GPU_TESTS) runs them.

# ---------------------------------------------------------------- make bench-gpu, bench-kernels
# bench-gpu: one row of train_gpt against PyTorch 2 (gpt-1b, seq 4096, causal; other rows:
# bench/gpu/README.md). bench-kernels: the per-kernel time table of the same configuration.
.PHONY: bench-gpu bench-kernels bench-attention
# Attention alone: the WMMA and fa2 kernels against PyTorch's SDPA / FlexAttention.
$(BUILD)/bench_attention: $(BUILD)/bench/gpu/attention.o $(BUILD)/libtrain_gpt.a
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)
bench-attention:
	bash bench/gpu/attention.sh
bench-gpu:
	bash bench/gpu/run.sh
bench-kernels:
	bash bench/gpu/kernels.sh
