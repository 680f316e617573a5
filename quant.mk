# quant.mk — blockwise int8 / int4 quantization of DiLoCo's outer gradients (quant.cu: the C
# reference, and with nvcc its CUDA kernels), included by the Makefile. See docs/quant.md.
HOST_CU_SRC += quant.cu
TESTS_C += test/test_quant.c

# This file is included before the Makefile's `all`; keep `all` the default goal.
.DEFAULT_GOAL := all

# Bytes per parameter and encode / decode throughput: `make bench-quant` (not in `make test`).
.PHONY: bench-quant
$(BUILD)/bench_quant_bytes: $(BUILD)/bench/quant_bytes.o $(BUILD)/libtrain_gpt.a
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)
bench-quant: $(BUILD)/bench_quant_bytes
	$(BUILD)/bench_quant_bytes configs/gpt-124m.conf

# The CUDA encoder against the C reference, byte for byte (test/test_quant_gpu.cu). Built
# only with the CUDA backend, and neither by `make` nor by `make test`: cuda/cuda.mk runs
# everything in GPU_TESTS from `make test-gpu`.
ifeq ($(HAVE_CUDA),1)
GPU_TESTS += $(BUILD)/test_quant_gpu
endif
