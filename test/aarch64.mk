# test/aarch64.mk — `make check-aarch64`: the CPU build cross-compiled for aarch64 (the
# Grace CPUs of GH200 nodes) and run under qemu-user, included by the Makefile. See
# docs/build.md.
#
# test/test_aarch64.sh does the work, so that `make test` runs it too: it cross-compiles the
# CPU-only library, the C unit tests and train_gpt twice, for armv8-a into $(BUILD)/aarch64
# and for armv9-a (Grace: SVE2) into $(BUILD)/aarch64-sve2, statically linked (qemu then
# needs no arm64 sysroot) and without BLAS (the built-in gemm), PCRE2, zlib, libzstd, MPI or
# OpenSSL (none of their arm64 libraries comes with the cross toolchain); runs the unit
# tests under qemu; and trains test/configs/tiny_test.conf on both architectures, comparing
# the losses step by step. Without the cross compiler or qemu it prints one
# "skipped: ..." line and passes.
#
#   make check-aarch64 AARCH64_CC=... AARCH64_CXX=... QEMU_AARCH64=...   other tools
#     (defaults: aarch64-linux-gnu-gcc, aarch64-linux-gnu-g++, qemu-aarch64-static)

TESTS_SH += test/test_aarch64.sh

# This file is included before the Makefile's `all`; keep `all` the default goal.
.DEFAULT_GOAL := all

# train_gpt linked inside a build folder (the root's ./train_gpt is the host's): how the
# cross builds make their train_gpt.
$(BUILD)/train_gpt: $(BUILD)/train_gpt.o $(BUILD)/libtrain_gpt.a
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

.PHONY: check-aarch64
check-aarch64: all $(BUILD)/test_tool
	TRAIN_GPT=$(CURDIR)/train_gpt BUILD=$(CURDIR)/$(BUILD) PYTHON=$(PYTHON) bash test/test_aarch64.sh
