# test/fuzz.mk — the libFuzzer targets, included by the Makefile after net/net.mk (it asks
# HAVE_OPENSSL):
#   fuzz_wire   the frame parser and the payload decoders (test/fuzz_wire.c; needs OpenSSL)
#   fuzz_files  the readers of outside files: JSON, a corpus's JSONL line, safetensors,
#               tokenizer.json (test/fuzz_files.c)
# Each links only the sources it fuzzes, with ASan + UBSan; any finding is fatal.
#
# Detected and printed (MSG_LIBFUZZER): clang with libFuzzer. `make test` runs each target for
# FUZZ_SECONDS (default 30) from a seed corpus its test writes; `make fuzz FUZZ_SECONDS=600`
# fuzzes longer (findings land in $(BUILD)/fuzz-*). Without libFuzzer the two tests say
# so and pass.
FUZZ_SECONDS ?= 30
export FUZZ_SECONDS   # make test FUZZ_SECONDS=10 reaches test/test_fuzz_*.sh
CLANG ?= clang

# A throwaway link proves clang has libFuzzer (its runtime is a separate package on some systems).
HAVE_LIBFUZZER := $(shell f=$$(mktemp) && printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { return d && n; }\n' | \
    $(CLANG) -fsanitize=fuzzer,address -x c - -o $$f >/dev/null 2>&1 && echo 1; rm -f $$f)
FUZZERS :=
ifeq ($(HAVE_LIBFUZZER),1)
  ifeq ($(HAVE_OPENSSL),1)
    FUZZERS += $(BUILD)/fuzz_wire
  endif
  FUZZERS += $(BUILD)/fuzz_files
  MSG_LIBFUZZER := ✓ libFuzzer ($(CLANG)): make test fuzzes $(notdir $(FUZZERS)) for $(FUZZ_SECONDS) s each
  TOOLS += $(FUZZERS)
else
  MSG_LIBFUZZER := ✗ libFuzzer (no fuzzing of the frame parser and the file readers: install clang)
endif
TESTS_SH += test/test_fuzz_wire.sh test/test_fuzz_files.sh

# This file is included before the Makefile's `all`; keep `all` the default goal.
.DEFAULT_GOAL := all

FUZZ_FLAGS := -std=c11 -g -O1 -D_GNU_SOURCE -I. -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined

# The frame fuzzer links net/wire.c alone (no sockets, no library).
$(BUILD)/fuzz_wire: test/fuzz_wire.c net/wire.c net/wire.h
	@mkdir -p $(BUILD)
	$(CLANG) $(FUZZ_FLAGS) $(OPENSSL_CFLAGS) test/fuzz_wire.c net/wire.c -o $@ $(OPENSSL_LIBS)

# The file fuzzer links the readers and what they call: JSON, safetensors, the model config,
# the tokenizer (with PCRE2 when the build has it: then it also checks encoding) and prepare's
# input side.
FUZZ_FILES_SRC := llmc/json.c llmc/safetensors.c llmc/checksum.c llmc/common.c llmc/config.c tok/tokenizer.c \
                  tok/bpe.c tok/tiktoken.c tok/hf.c tok/prepare_input.c tok/prepare_stream.c
ifeq ($(HAVE_PCRE2),1)
  FUZZ_PCRE2 := -DHAVE_PCRE2 $(shell pkg-config --cflags libpcre2-8)
  FUZZ_PCRE2_LIBS := $(shell pkg-config --libs libpcre2-8)
endif
$(BUILD)/fuzz_files: test/fuzz_files.c $(FUZZ_FILES_SRC) $(wildcard llmc/*.h tok/*.h) $(BUILD_CONFIG)
	@mkdir -p $(BUILD)
	$(CLANG) $(FUZZ_FLAGS) $(FUZZ_PCRE2) test/fuzz_files.c $(FUZZ_FILES_SRC) -o $@ $(FUZZ_PCRE2_LIBS) -lm

.PHONY: fuzz
fuzz: $(FUZZERS) $(if $(filter $(BUILD)/fuzz_wire,$(FUZZERS)),$(BUILD)/test_wire)
	@set -e; for t in test/test_fuzz_wire.sh test/test_fuzz_files.sh; do \
	    BUILD=$(CURDIR)/$(BUILD) PYTHON=$(PYTHON) FUZZ_SECONDS=$(FUZZ_SECONDS) bash $$t; done
