# kvroute build. `make` builds the three programs into build/; `make asan` into build-asan/ with
# ASan+UBSan; `make test` runs the cmocka unit tests and the pytest end-to-end suite.
CC      ?= gcc
BUILD   ?= build
PKGS    := libuv libcurl jansson yaml-0.1 libzmq msgpack libxxhash hiredis
CFLAGS  ?= -O2 -g
# Link-time optimisation for the programs (issue 18: ~8 % less CPU per proxied request, as the
# hot path crosses many small functions in other files). Objects carry both LTO bytecode and
# ordinary code (fat), so unit tests link them as usual; the ASan and fuzz builds turn it off.
# `make LTO=` builds without it.
LTO     ?= -flto=auto -ffat-lto-objects
LTO_LINK = $(if $(LTO),-flto=auto)
ifneq ($(LTO),)
AR      := gcc-ar
endif
KVR_CFLAGS := -std=c17 -D_GNU_SOURCE -Wall -Wextra -Werror -Isrc $(shell pkg-config --cflags $(PKGS))
LDLIBS  := $(shell pkg-config --libs $(PKGS)) -lhttp_parser -lm -lpthread

# The admin status page (web/) is embedded as a generated C source (scripts/embed_web.sh).
WEB_FILES  := $(sort $(wildcard web/*))
WEB_C      := $(BUILD)/gen/web_assets.c
LIB_SRCS   := $(filter-out src/main.c,$(shell find src -name '*.c' | sort)) $(WEB_C)
SIM_SRCS   := $(shell find sim -name '*.c' 2>/dev/null | sort)
BENCH_SRCS := $(shell find bench -name '*.c' 2>/dev/null | sort)
UNIT_SRCS  := $(shell find tests/unit -name 'test_*.c' 2>/dev/null | sort)

LIB_OBJS   := $(LIB_SRCS:%.c=$(BUILD)/obj/%.o)
SIM_OBJS   := $(SIM_SRCS:%.c=$(BUILD)/obj/%.o)
BENCH_OBJS := $(BENCH_SRCS:%.c=$(BUILD)/obj/%.o)
UNIT_BINS  := $(UNIT_SRCS:tests/unit/%.c=$(BUILD)/tests/%)
PROGS      := $(BUILD)/kvroute $(if $(SIM_SRCS),$(BUILD)/kvroute-sim) $(if $(BENCH_SRCS),$(BUILD)/kvroute-bench)

.PHONY: all asan unit e2e e2e-curl test check clean demo deps fuzz fuzz-build chaos bench-scan \
	image image-test
all: $(PROGS) $(UNIT_BINS)

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(KVR_CFLAGS) $(CFLAGS) $(LTO) -MMD -MP -c $< -o $@

$(WEB_C): $(WEB_FILES) scripts/embed_web.sh
	@mkdir -p $(dir $@)
	sh scripts/embed_web.sh $(WEB_FILES) > $@.tmp && mv $@.tmp $@

$(BUILD)/libkvr.a: $(LIB_OBJS)
	@rm -f $@
	$(AR) rcs $@ $^

$(BUILD)/kvroute: $(BUILD)/obj/src/main.o $(BUILD)/libkvr.a
	$(CC) $(KVR_CFLAGS) $(CFLAGS) $(LTO_LINK) -o $@ $^ $(LDLIBS)
$(BUILD)/kvroute-sim: $(SIM_OBJS) $(BUILD)/libkvr.a
	$(CC) $(KVR_CFLAGS) $(CFLAGS) $(LTO_LINK) -o $@ $^ $(LDLIBS)
$(BUILD)/kvroute-bench: $(BENCH_OBJS) $(BUILD)/libkvr.a
	$(CC) $(KVR_CFLAGS) $(CFLAGS) $(LTO_LINK) -o $@ $^ $(LDLIBS)

# Unit tests: one binary per tests/unit/test_<module>.c, linked with the library (and, for
# tests/unit/test_sim_*.c, the simulator's objects except its main).
$(BUILD)/tests/test_sim_%: tests/unit/test_sim_%.c $(filter-out $(BUILD)/obj/sim/main.o,$(SIM_OBJS)) $(BUILD)/libkvr.a
	@mkdir -p $(dir $@)
	$(CC) $(KVR_CFLAGS) $(CFLAGS) -Isim -o $@ $(filter-out %.h,$^) $(LDLIBS) -lcmocka
$(BUILD)/tests/test_bench_%: tests/unit/test_bench_%.c $(filter-out $(BUILD)/obj/bench/main.o,$(BENCH_OBJS)) $(BUILD)/libkvr.a
	@mkdir -p $(dir $@)
	$(CC) $(KVR_CFLAGS) $(CFLAGS) -Ibench -o $@ $(filter-out %.h,$^) $(LDLIBS) -lcmocka
$(BUILD)/tests/%: tests/unit/%.c $(BUILD)/libkvr.a
	@mkdir -p $(dir $@)
	$(CC) $(KVR_CFLAGS) $(CFLAGS) -o $@ $(filter-out %.h,$^) $(LDLIBS) -lcmocka

# The unit tests' shared helpers (tests/unit/*.h) are headers: a change rebuilds them all.
$(UNIT_BINS): $(wildcard tests/unit/*.h)

unit: $(UNIT_BINS)
	@set -e; for t in $(UNIT_BINS); do echo "== $$t"; $$t; done

e2e: $(PROGS)
	KVROUTE_BUILD=$(abspath $(BUILD)) timeout 1200 /usr/bin/python3 -m pytest -q -p no:cacheprovider tests/e2e $(E2E_ARGS)

# Left out of the ASan+UBSan pass of `make check` (they run in the normal pass): the long
# replays that measure hit rates and sweeps (~2 min natively, twice that under ASan), whose
# code paths the rest of the suite runs under ASan too; `make chaos` replays under ASan itself.
# Also the two longest tests of timing (queue fairness over ~15 s, a replay waiting out a 10 s
# fallback): the other admission-queue and precise-fallback tests run those paths under ASan.
E2E_ASAN_SKIP := $(addprefix --deselect tests/e2e/,\
  test_replicas.py::test_three_replicas_sharing_redis_keep_the_cache_aware_gain \
  test_chaos.py::test_chaos_replay_loses_nothing \
  test_dp.py::test_tau_bench_rank_aware_matches_four_separate_sims \
  test_bench_sweep.py::test_compare_sweep_writes_pngs_and_json \
  test_security.py::test_queue_is_fair_across_keys \
  test_precise.py::test_unanswered_replay_falls_back_within_10s_and_recovers)

# The e2e suite runs against the native upstream client (the default); this second, cheaper
# pass runs the files about proxying and upstream failures against libcurl
# (--upstream-client curl, through KVROUTE_UPSTREAM_CLIENT in tests/e2e/conftest.py).
E2E_CURL_FILES := $(addprefix tests/e2e/,test_proxy.py test_failures.py \
	test_upstream_failures.py test_resilience.py test_openai_client.py test_anthropic.py)
e2e-curl: $(PROGS)
	KVROUTE_UPSTREAM_CLIENT=curl KVROUTE_BUILD=$(abspath $(BUILD)) timeout 900 \
	  /usr/bin/python3 -m pytest -q -p no:cacheprovider $(E2E_CURL_FILES)

test: all
	$(MAKE) unit
	$(MAKE) e2e
	$(MAKE) e2e-curl

# What CI runs: the normal build's unit + e2e suites, then both again under ASan+UBSan, then
# every fuzz harness for 6 s (`make fuzz FUZZ_SECONDS=N` for longer runs), then the container
# image built and proved without a registry (scripts/image-test.sh: root, podman, debootstrap;
# under 3 minutes cold on 2 cores, 30 s with its caches).
# The three builds run on every core (CHECK_JOBS); the suites themselves run one at a time.
CHECK_JOBS ?= $(shell nproc 2>/dev/null || echo 2)
check:
	$(MAKE) -j$(CHECK_JOBS) all
	$(MAKE) test
	$(MAKE) -j$(CHECK_JOBS) asan
	$(MAKE) BUILD=build-asan CFLAGS="$(ASAN_CFLAGS)" LTO= unit e2e E2E_ARGS="$(E2E_ASAN_SKIP)"
	$(MAKE) -j$(CHECK_JOBS) fuzz-build
	$(MAKE) fuzz FUZZ_SECONDS=6
	$(MAKE) image-test

ASAN_CFLAGS := -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined

asan:
	$(MAKE) BUILD=build-asan CFLAGS="$(ASAN_CFLAGS)" LTO= all

# libFuzzer harnesses (fuzz/fuzz_<target>.c, one per parser of outside bytes), built with
# clang under ASan+UBSan into build-fuzz/ and run for FUZZ_SECONDS each from the seeds in
# fuzz/corpus/<target>/ (the working corpus grows in build-fuzz/corpus/<target>/).
FUZZ_SECONDS ?= 30
FUZZ_CFLAGS := -g -O1 -fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer
FUZZ_SRCS   := $(wildcard fuzz/fuzz_*.c)
FUZZ_BINS   := $(FUZZ_SRCS:fuzz/%.c=build-fuzz/%)

ifeq ($(BUILD),build-fuzz)
$(BUILD)/fuzz_%: fuzz/fuzz_%.c $(BUILD)/libkvr.a
	$(CC) $(KVR_CFLAGS) -g -O1 -fsanitize=fuzzer,address,undefined -o $@ $^ $(LDLIBS)
# fuzz/fuzz_sim_<target>.c: a parser of kvroute-sim's, linked with the simulator's objects
$(BUILD)/fuzz_sim_%: fuzz/fuzz_sim_%.c $(filter-out $(BUILD)/obj/sim/main.o,$(SIM_OBJS)) $(BUILD)/libkvr.a
	$(CC) $(KVR_CFLAGS) -Isim -g -O1 -fsanitize=fuzzer,address,undefined -o $@ $^ $(LDLIBS)
endif

fuzz-build:
	$(MAKE) BUILD=build-fuzz CC=clang CFLAGS="$(FUZZ_CFLAGS)" LTO= $(FUZZ_BINS)

fuzz: fuzz-build
	@set -e; for b in $(FUZZ_BINS); do t=$${b#build-fuzz/fuzz_}; \
	  mkdir -p build-fuzz/corpus/$$t; echo "== $$b ($(FUZZ_SECONDS) s)"; \
	  $$b -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 build-fuzz/corpus/$$t fuzz/corpus/$$t; done

# Chaos replay (docs/operations.md): the tau-bench trace through kvroute over 4 kvroute-sim
# workers while a seeded schedule kills, stops and breaks them; CHAOS_SECONDS (300) against
# $(BUILD), then CHAOS_ASAN_SECONDS (120) against build-asan/ (brought up to date) when it exists.
# CHAOS_SEED (1) seeds the schedule. Fails when a request is lost or a check fails; each run's
# JSON summary is left in <build dir>/chaos.json.
chaos: $(PROGS)
	/usr/bin/python3 scripts/chaos.py --duration $(or $(CHAOS_SECONDS),300) \
	  --seed $(or $(CHAOS_SEED),1) --build $(abspath $(BUILD)) --json $(BUILD)/chaos.json
ifneq ($(wildcard build-asan/kvroute),)
	$(MAKE) asan
	/usr/bin/python3 scripts/chaos.py --duration $(or $(CHAOS_ASAN_SECONDS),120) \
	  --seed $(or $(CHAOS_SEED),1) --build $(abspath build-asan) --json build-asan/chaos.json
else
	@echo "chaos: no build-asan/ (make asan first): the ASan run is skipped"
endif

# Request-body reading micro-benchmark (issue 18): the scanner's bytes/s against the tree's on
# 8 KB, 64 KB and a tau-bench body; figures in docs/performance.md. Never a test.
$(BUILD)/bench-scan: tests/bench/bench_scan.c $(BUILD)/libkvr.a
	$(CC) $(KVR_CFLAGS) $(CFLAGS) -o $@ $^ $(LDLIBS)

bench-scan: $(BUILD)/bench-scan
	$(BUILD)/bench-scan data/tau-bench-airline-gpt4o/trajectories.jsonl

# The container image (Dockerfile), with docker or podman, whichever is present (podman when
# both are); IMAGE names it. scripts/image-test.sh builds and proves it without a registry.
IMAGE ?= kvroute:latest
image:
	@if command -v podman >/dev/null 2>&1; then \
	  podman build -t $(IMAGE) . ; \
	elif command -v docker >/dev/null 2>&1; then \
	  docker build -t $(IMAGE) . ; \
	else echo "make image: neither podman nor docker is installed" >&2; exit 1; fi

image-test:
	bash scripts/image-test.sh

deps:
	bash scripts/install-deps.sh

demo: deps $(PROGS)
	bash scripts/demo.sh

clean:
	rm -rf build build-asan build-fuzz

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
