# Thin wrapper around CMake. `make demo` and `make test` work on a fresh Debian 12.
BUILD ?= build
ASAN_BUILD ?= build-asan
JOBS ?= $(shell nproc)

.PHONY: all deps build test test-fast test-extended test-asan test-asan-slow demo clean bench

all: build

deps:
	@bash scripts/deps.sh

$(BUILD)/Makefile: CMakeLists.txt
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null

build: $(BUILD)/Makefile
	@cmake --build $(BUILD) -j $(JOBS) -- --no-print-directory

# Every test but the extended tier, then again under ASan + UBSan except the slow tier
# (see tests/tests.cmake; `make test-extended` and `make test-asan-slow` add them), without
# the CUDA backend (its code is built, and on a GPU machine tested, in the first pass).
# Three tests at a time on two cores: a third of a multi-rank test's time is waiting.
TEST_JOBS ?= 3
test: deps build
	cd $(BUILD) && ctest --output-on-failure -j $(TEST_JOBS) -LE extended
	$(MAKE) --no-print-directory test-asan

test-fast: build
	cd $(BUILD) && ctest --output-on-failure -j $(TEST_JOBS) -LE extended

# The extended tier (randomized trials, emulated hosts), Release.
test-extended: build
	cd $(BUILD) && ctest --output-on-failure -j 2 -L extended

test-asan:
	@cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DDT_SANITIZE=ON -DDT_CUDA=OFF >/dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS) -- --no-print-directory
	cd $(ASAN_BUILD) && DT_TEST_TIER=asan ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j $(TEST_JOBS) -LE slow

# The slow tier (tests labelled `slow`, the extended tier among them: emulated nodes,
# kill-and-resume, the chaos trial) under ASan + UBSan.
test-asan-slow: test-asan
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j 2 -L slow

demo: deps build
	@bash scripts/demo.sh $(BUILD)/dtrain

# Performance against PyTorch and the data-parallel comparison (minutes; see docs/benchmarks.md).
bench: deps build
	bash bench/bench_train.sh
	bash bench/bench_ddp.sh $(BUILD)/dtrain

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
