# bench/diloco/bench.mk — the DiLoCo benchmarks on a shaped link, included by the Makefile.
# As root (they create network namespaces): `make bench-diloco` builds the three programs
# and runs bench/diloco/goodput.sh (the transport's goodput); `make bench-streaming` runs
# bench/diloco/streaming.sh (compute utilization, classic against streaming DiLoCo). See
# bench/diloco/README.md. Not part of `make test`.
.PHONY: bench-diloco bench-diloco-tools bench-streaming bench-hubs

# This file is included before the Makefile's `all`; keep `all` the default goal.
.DEFAULT_GOAL := all

$(BUILD)/delay_proxy: $(BUILD)/bench/diloco/delay_proxy.o $(BUILD)/bench/diloco/sock.o
	$(CC) $(CFLAGS) $^ -o $@
$(BUILD)/delay_tun: $(BUILD)/bench/diloco/delay_tun.o $(BUILD)/bench/diloco/sock.o
	$(CC) $(CFLAGS) $^ -o $@
$(BUILD)/goodput_client: $(BUILD)/bench/diloco/goodput_client.o $(BUILD)/bench/diloco/sock.o $(BUILD)/libtrain_gpt.a
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS) -pthread

$(BUILD)/hub_bench: $(BUILD)/bench/diloco/hub_bench.o $(BUILD)/libtrain_gpt.a
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS) -pthread
# `make bench-hubs`: the relays' throughput with 1, 2 and 3 hubs (bench/diloco/hub_throughput.sh).
bench-hubs: all $(BUILD)/hub_bench
	BUILD=$(CURDIR)/$(BUILD) TRAIN_GPT=$(CURDIR)/train_gpt bash bench/diloco/hub_throughput.sh

bench-diloco-tools: $(BUILD)/delay_proxy $(BUILD)/delay_tun $(BUILD)/goodput_client
bench-diloco: bench-diloco-tools
	BUILD=$(CURDIR)/$(BUILD) bash bench/diloco/goodput.sh
bench-streaming: all $(BUILD)/delay_proxy $(BUILD)/test_tool
	BUILD=$(CURDIR)/$(BUILD) TRAIN_GPT=$(CURDIR)/train_gpt bash bench/diloco/streaming.sh
