# quant.mk — blockwise int8 / int4 quantization of DiLoCo's outer gradients, included by
# the Makefile. See docs/quant.md.
LIB_SRC += quant.c
TESTS_C += test/test_quant.c
# quant.c and quant.cu share a stem: pin $(BUILD)/quant.o to the C file, whatever pattern
# rule for .cu files another fragment brings.
$(BUILD)/quant.o: quant.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -I. -c $< -o $@

# This file is included before the Makefile's `all`; keep `all` the default goal.
.DEFAULT_GOAL := all

# Bytes per parameter and encode / decode throughput: `make bench-quant` (not in `make test`).
.PHONY: bench-quant
$(BUILD)/bench_quant_bytes: $(BUILD)/bench/quant_bytes.o $(BUILD)/libtrain_gpt.a
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)
bench-quant: $(BUILD)/bench_quant_bytes
	$(BUILD)/bench_quant_bytes configs/gpt-124m.conf

# The CUDA encoder against quant.c, byte for byte. Built only where nvcc is, and neither by
# `make` nor by `make test`: cuda.mk runs everything in GPU_TESTS from `make test-gpu`.
# The GPUs of cuda.mk's CUDA_ARCH, else sm_80 and sm_90; QUANT_NVCC_ARCH=-arch=native builds
# for the GPU at hand.
ifneq ($(NVCC),)
QUANT_NVCC_ARCH ?= $(or $(CUDA_ARCH),-gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90)
QUANT_NVCC_FLAGS = -std=c++17 -O3 $(QUANT_NVCC_ARCH) -I. -Xcompiler -Wall,-Wextra
GPU_TESTS += $(BUILD)/test_quant_gpu

$(BUILD)/quant_gpu/quant.o: quant.cu llmc/quant_cuda.h llmc/quant.h
	@mkdir -p $(dir $@)
	$(NVCC) $(QUANT_NVCC_FLAGS) -c $< -o $@
$(BUILD)/quant_gpu/test_quant_gpu.o: test/test_quant_gpu.cu llmc/quant_cuda.h llmc/quant.h test/check.h
	@mkdir -p $(dir $@)
	$(NVCC) $(QUANT_NVCC_FLAGS) -c $< -o $@
# libtrain_gpt.a brings quant.c (the reference) and llmc/common.c; it was compiled with -fopenmp.
$(BUILD)/test_quant_gpu: $(BUILD)/quant_gpu/test_quant_gpu.o $(BUILD)/quant_gpu/quant.o $(BUILD)/libtrain_gpt.a
	$(NVCC) $(QUANT_NVCC_FLAGS) $^ -o $@ -Xcompiler -fopenmp -lm
endif
