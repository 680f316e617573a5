# test/hip.mk — `make check-hip`: the GPU backend compiled for AMD's gfx90a (MI250X) with
# hipcc, warnings as errors, included by the Makefile. See docs/build.md (LUMI).
#
# test/test_hip.sh does the work, so that `make test` runs it too: it calls make with
# HIP=1 HIP_CHECK=1 HIP_WERROR=1 HIP_ARCH=--offload-arch=gfx90a into $(BUILD)/hip for every
# kernel file (cuda/*.cu, quant.cu), train_gpt.cu and the GPU tests' sources, through the
# same rule and flags a ROCm build uses, links $(BUILD)/hip/train_gpt, and checks that each
# object holds gfx90a code, that the NVIDIA-only kernels stayed out, and what the binary
# does without an AMD GPU (plan, the CPU fallback). cuda/matmul.cu (hipBLASLt) is compiled
# only where hipblaslt/hipblaslt.h is installed (ROCm 6.2 or newer); Debian's ROCm 5 has
# none, and HIP_CHECK=1 links test/hip_matmul_stub.cu instead. No AMD code runs here.
# Without hipcc it prints one "skipped: ..." line and passes.

TESTS_SH += test/test_hip.sh

# This file is included before the Makefile's `all`; keep `all` the default goal.
.DEFAULT_GOAL := all

.PHONY: check-hip
check-hip: all $(BUILD)/test_tool
	TRAIN_GPT=$(CURDIR)/train_gpt BUILD=$(CURDIR)/$(BUILD) PYTHON=$(PYTHON) bash test/test_hip.sh
