# Fuyou build. Targets: all (default), deps, test, test-gpu, bench, clean. SANITIZE=address,undefined
# and WERROR=1: below; tests/sanitize.sh runs the sanitized tests (docs/architecture.md).
# Libraries are found through pkg-config; CUDA parts build when nvcc is on PATH or in /usr/local/cuda.

# SANITIZE=address,undefined (or thread, ...) builds everything with -fsanitize=$(SANITIZE) into a
# build directory of its own (build-asan, build-tsan, ...), never mixed with the normal build's
# objects. A sanitized tree is built WITHOUT THE CUDA BACKEND (NVCC is emptied): the CUDA runtime
# does not run under the sanitizers' memory layout, and the CPU backend is what the sanitized tests
# exercise. WERROR=1 adds -Werror (CI's normal build); local builds keep warnings as warnings.
SANITIZE ?=
comma    := ,
ifneq ($(SANITIZE),)
SAN_TAG  := $(if $(findstring thread,$(SANITIZE)),tsan,$(if $(findstring address,$(SANITIZE)),asan,$(subst $(comma),-,$(SANITIZE))))
BUILD    ?= build-$(SAN_TAG)
NVCC     :=
SAN_FLAGS := -fsanitize=$(SANITIZE) -fno-omit-frame-pointer -fno-sanitize-recover=all
endif
BUILD    ?= build
CC       ?= cc
NVCC     ?= $(shell command -v nvcc 2>/dev/null || { test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc; })
PKG_CONFIG ?= pkg-config

# Debian package that provides each pkg-config module.
DEB_liburing := liburing-dev
DEB_libzmq   := libzmq3-dev
DEB_hwloc    := libhwloc-dev
DEB_libcjson := libcjson-dev
DEPS_RUNTIME := liburing libzmq hwloc libcjson
DEPS_TEST    := cmocka
DEB_PACKAGES := build-essential pkg-config liburing-dev libzmq3-dev libhwloc-dev libcjson-dev \
                libxxhash-dev libcmocka-dev fio gnuplot-nox python3 python3-numpy clang-format
# The tests against PyTorch and transformers (Hugging Face import and export, the Llama reference,
# the tokenizer tests, the GPU tests) need these from PyPI: Debian does not package them.
PYTHON       ?= python3
PIP_PACKAGES := numpy==2.2.6 torch==2.5.1 transformers==5.17.0 pyarrow==18.1.0

found   = $(shell $(PKG_CONFIG) --exists $(1) && echo yes)
MISSING := $(strip $(foreach p,$(DEPS_RUNTIME),$(if $(call found,$(p)),,$(p))))
# xxhash is used header-only (common/digest.c): no pkg-config module, no library to link.
HAVE_XXHASH := $(shell printf '\043include <xxhash.h>\n' | $(CC) -E -x c - >/dev/null 2>&1 && echo yes)
MISSING += $(if $(HAVE_XXHASH),,xxhash)
DEB_xxhash := libxxhash-dev
MISSING_TEST := $(strip $(foreach p,$(DEPS_TEST),$(if $(call found,$(p)),,$(p))))

CFLAGS_BASE := -std=c11 -D_GNU_SOURCE -O2 -g -pthread -fopenmp -Wall -Wextra -Wno-unused-parameter \
               -Wshadow -Wstrict-prototypes -Wno-format-truncation -ffp-contract=off -fno-strict-aliasing -I.
PKG_CFLAGS  := $(if $(MISSING),,$(shell $(PKG_CONFIG) --cflags $(DEPS_RUNTIME)))
PKG_LIBS    := $(if $(MISSING),,$(shell $(PKG_CONFIG) --libs $(DEPS_RUNTIME)))
TEST_CFLAGS := $(if $(MISSING_TEST),,$(shell $(PKG_CONFIG) --cflags cmocka))
TEST_LIBS   := $(if $(MISSING_TEST),,$(shell $(PKG_CONFIG) --libs cmocka))

ifneq ($(NVCC),)
CUDA_HOME   ?= $(patsubst %/bin/nvcc,%,$(NVCC))
CUDA_CFLAGS := -DFY_HAVE_CUDA=1 -I$(CUDA_HOME)/include
CUDA_LIBS   := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lcudart_static -ldl -lrt
# sm_90 machine code for the H200, plus PTX so newer GPUs can JIT it.
NVCC_ARCH   ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
NVCCFLAGS   := -O2 -g -std=c++17 $(NVCC_ARCH) -I. -Xcompiler -fno-strict-aliasing,-ffp-contract=off
# NCCL, optional: with it the CUDA backend sums the gradients of --gpus N workers on the devices
# (gpu_worker/cuda/cu_ranks). The first of: pkg-config nccl; $(NCCL_HOME); the CUDA toolkit's own;
# the system's (Debian's libnccl-dev); the nvidia-nccl-cu12/-cu13 wheel of $(PYTHON), which has no
# libnccl.so link, so every library is linked by its soname (-l:libnccl.so.2), with an rpath.
# NCCL=off builds without it.
nccl_lib = $(patsubst %/,%,$(firstword $(dir $(wildcard $(addsuffix /libnccl.so.2,$(1))))))
nccl_use = $(eval NCCL_FROM := $(1))$(eval NCCL_H := $(2)/nccl.h)$(eval NCCL_CFLAGS := -I$(2)) \
           $(eval NCCL_LIBS := -L$(3) -Wl,-rpath,$(3) -l:libnccl.so.2)
ifeq ($(NCCL),off)
else ifeq ($(shell $(PKG_CONFIG) --exists nccl && echo yes),yes)
NCCL_FROM   := pkg-config nccl $(shell $(PKG_CONFIG) --modversion nccl)
NCCL_CFLAGS := $(shell $(PKG_CONFIG) --cflags nccl)
NCCL_LIBS   := $(shell $(PKG_CONFIG) --libs nccl)
else ifneq ($(and $(NCCL_HOME),$(wildcard $(NCCL_HOME)/include/nccl.h),$(call nccl_lib,$(NCCL_HOME)/lib)),)
$(call nccl_use,NCCL_HOME $(NCCL_HOME),$(NCCL_HOME)/include,$(call nccl_lib,$(NCCL_HOME)/lib))
else ifneq ($(and $(wildcard $(CUDA_HOME)/include/nccl.h),$(call nccl_lib,$(CUDA_HOME)/lib64 $(CUDA_HOME)/lib)),)
$(call nccl_use,the CUDA toolkit's,$(CUDA_HOME)/include,$(call nccl_lib,$(CUDA_HOME)/lib64 $(CUDA_HOME)/lib))
else ifneq ($(and $(wildcard /usr/include/nccl.h),$(call nccl_lib,/usr/lib/$(shell $(CC) -print-multiarch 2>/dev/null) /usr/lib64 /usr/lib)),)
$(call nccl_use,the system's,/usr/include,$(call nccl_lib,/usr/lib/$(shell $(CC) -print-multiarch 2>/dev/null) /usr/lib64 /usr/lib))
else
NCCL_WHEEL := $(shell $(PYTHON) -c 'import nvidia.nccl, os; print(nvidia.nccl.__path__[0])' 2>/dev/null)
ifneq ($(and $(NCCL_WHEEL),$(wildcard $(NCCL_WHEEL)/include/nccl.h),$(call nccl_lib,$(NCCL_WHEEL)/lib)),)
$(call nccl_use,the Python wheel nvidia-nccl of $(PYTHON),$(NCCL_WHEEL)/include,$(call nccl_lib,$(NCCL_WHEEL)/lib))
endif
endif
ifneq ($(NCCL_FROM),)
NVCCFLAGS   += -DFY_HAVE_NCCL=1 $(NCCL_CFLAGS)
CUDA_LIBS   += $(NCCL_LIBS)
endif
endif

CFLAGS  ?=
CFLAGS  += $(CFLAGS_BASE) $(SAN_FLAGS) $(if $(filter 1,$(WERROR)),-Werror) $(PKG_CFLAGS) $(CUDA_CFLAGS)
LDLIBS  := $(PKG_LIBS) $(CUDA_LIBS) -lgomp -lm -lpthread

MAIN_SRCS := launcher/cmd/main.c gpu_worker/main.c io_worker/main.c opt_worker/main.c
LIB_SRCS  := $(filter-out $(MAIN_SRCS),$(wildcard common/*.c common/arch/*.c launcher/*/*.c gpu_worker/*.c \
               gpu_worker/cpu/*.c io_worker/*.c opt_worker/*.c))
CU_SRCS   := $(if $(NVCC),$(wildcard gpu_worker/cuda/*.cu))
LIB_OBJS  := $(LIB_SRCS:%.c=$(BUILD)/obj/%.o) $(CU_SRCS:%.cu=$(BUILD)/obj/%.o)
LIB       := $(BUILD)/libfuyou.a

BINS := $(BUILD)/bin/fuyou-launch $(BUILD)/bin/fuyou-gpu-worker $(BUILD)/bin/fuyou-io-worker \
        $(BUILD)/bin/fuyou-opt-worker

TEST_SRCS  := $(wildcard tests/test_*.c tests/integration/test_*.c)
TEST_BINS  := $(TEST_SRCS:tests/%.c=$(BUILD)/tests/%)
GPU_TEST_SRCS := $(wildcard tests/gpu/test_*.c) $(if $(NVCC),$(wildcard tests/gpu/test_*.cu))
GPU_TEST_BINS := $(patsubst tests/%.cu,$(BUILD)/tests/%,$(GPU_TEST_SRCS:tests/%.c=$(BUILD)/tests/%))
BENCH_SRCS := $(wildcard tests/bench/bench_*.c)
BENCH_BINS := $(BENCH_SRCS:tests/bench/%.c=$(BUILD)/bench/%)
GPU_BENCH_BINS := $(if $(NVCC),$(patsubst tests/bench/%.cu,$(BUILD)/bench/%,$(wildcard tests/bench/bench_*.cu)))
# cu_flash's kernels emulated on the CPU (tests/test_cu_flash_emu.cc): a test with or without nvcc.
EMU_TEST   := $(BUILD)/tests/test_cu_flash_emu
TEST_BINS  += $(EMU_TEST)
TEST_HELPERS := $(BUILD)/obj/tests/testutil.o $(BUILD)/obj/tests/refmodel.o
# Helpers that assert with cmocka: linked into the test programs, not the benchmarks.
TEST_CMOCKA_HELPERS := $(BUILD)/obj/tests/trainutil.o $(BUILD)/obj/tests/chaos.o

.PHONY: all deps deps-python check-deps results test test-gpu bench bench-gpu bench-pipeline bench-affinity bench-quality tests benches demo clean
all: check-deps $(BINS)

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
deps:
	$(SUDO) apt-get update
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y $(DEB_PACKAGES)

# Into the python3 the tests run (a virtual environment's, where one is active).
deps-python:
	$(PYTHON) -m pip install --quiet --disable-pip-version-check $(PIP_PACKAGES)

check-deps:
	@for p in $(DEPS_RUNTIME) $(DEPS_TEST); do \
	  if $(PKG_CONFIG) --exists $$p; then echo "found   $$p $$($(PKG_CONFIG) --modversion $$p)"; \
	  else case $$p in liburing) d=liburing-dev;; libzmq) d=libzmq3-dev;; hwloc) d=libhwloc-dev;; libcjson) d=libcjson-dev;; cmocka) d=libcmocka-dev;; esac; \
	       echo "MISSING $$p: install the Debian package $$d (or run: make deps)"; fi; done
	@$(if $(HAVE_XXHASH),echo "found   xxhash.h",echo "MISSING xxhash.h: install the Debian package libxxhash-dev (or run: make deps)")
	@if command -v fio >/dev/null; then echo "found   fio (for make bench)"; else echo "MISSING fio: needed by make bench only; Debian package fio"; fi
	@$(if $(NVCC),echo "found   nvcc $(NVCC): building the CUDA backend",echo "no nvcc: building without the CUDA backend")
	@$(if $(NVCC),$(if $(NCCL_FROM),echo "found   nccl $(if $(NCCL_H),$$(sed -n 's/^#define NCCL_\(MAJOR\|MINOR\|PATCH\) *\([0-9]*\).*/\2/p' $(NCCL_H) | paste -sd.) )($(NCCL_FROM)): --gpus N sums gradients on the devices",echo "no NCCL: --gpus N > 1 on the CUDA backend is disabled; install libnccl-dev (Debian) or pip install nvidia-nccl-cu12, or set NCCL_HOME"),true)
	@$(if $(MISSING),echo "error: missing $(MISSING); install the Debian packages $(foreach p,$(MISSING),$(DEB_$(p))) (or run: make deps)"; exit 1,true)

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/obj/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/obj/tests/%.o: tests/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(TEST_CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/obj/tests/%.o: tests/%.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $(TEST_CFLAGS) -MMD -MP -c $< -o $@

$(LIB): $(LIB_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/bin/fuyou-launch: $(BUILD)/obj/launcher/cmd/main.o $(LIB)
$(BUILD)/bin/fuyou-gpu-worker: $(BUILD)/obj/gpu_worker/main.o $(LIB)
$(BUILD)/bin/fuyou-io-worker: $(BUILD)/obj/io_worker/main.o $(LIB)
$(BUILD)/bin/fuyou-opt-worker: $(BUILD)/obj/opt_worker/main.o $(LIB)
$(BINS):
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS) $(if $(CU_SRCS),-lstdc++)

$(BUILD)/tests/%: $(BUILD)/obj/tests/%.o $(TEST_HELPERS) $(TEST_CMOCKA_HELPERS) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $^ -o $@ $(TEST_LIBS) $(LDLIBS) $(if $(CU_SRCS),-lstdc++)

# The kernels of cu_flash.cu (between its "EMU BEGIN" mark and its host part), compiled by the C++
# compiler into the emulating test.
$(BUILD)/obj/tests/cu_flash_kernels.inc: gpu_worker/cuda/cu_flash.cu
	@mkdir -p $(dir $@)
	sed -n '/EMU BEGIN/,/---- host ----/p' $< | grep -v 'extern __shared__' > $@

$(EMU_TEST): tests/test_cu_flash_emu.cc $(BUILD)/obj/tests/cu_flash_kernels.inc
	@mkdir -p $(dir $@)
	$(CXX) -std=c++17 -O2 -g -Wall -Wno-unknown-pragmas -Wno-unused-function $(SAN_FLAGS) \
	  -fno-strict-aliasing -ffp-contract=off -I$(BUILD)/obj/tests $(TEST_CFLAGS) $< -o $@ $(TEST_LIBS)

$(BUILD)/bench/%: $(BUILD)/obj/tests/bench/%.o $(TEST_HELPERS) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS) $(if $(CU_SRCS),-lstdc++)

# Keep objects that pattern chains would otherwise delete as intermediates.
.SECONDARY:

tests: all $(TEST_BINS) $(GPU_TEST_BINS)
benches: all $(BENCH_BINS) $(GPU_BENCH_BINS)

test: tests
	@$(if $(MISSING_TEST),echo "error: missing cmocka; install the Debian package libcmocka-dev (or run: make deps)"; exit 1,true)
	BUILD=$(BUILD) tests/run_tests.sh $(TEST_BINS) $(GPU_TEST_BINS)

test-gpu: all $(GPU_TEST_BINS)
	BUILD=$(BUILD) tests/run_tests.sh $(GPU_TEST_BINS)

bench: benches
	BUILD=$(BUILD) tests/bench/run_bench.sh

bench-gpu: benches
	@$(if $(NVCC),true,echo "bench-gpu needs nvcc and an NVIDIA GPU"; exit 1)
	BUILD=$(BUILD) tests/bench/bench_gpu.sh

# Whole training steps through the workers on GPT-3-style models (PIPELINE_* in the script).
bench-pipeline: all
	@$(if $(NVCC),true,echo "bench-pipeline needs nvcc and an NVIDIA GPU"; exit 1)
	BUILD=$(BUILD) tests/bench/bench_pipeline.sh

# The workers' CPU placement (--affinity) against the optimizer's rate and the step.
bench-affinity: all
	@$(if $(NVCC),true,echo "bench-affinity needs nvcc and an NVIDIA GPU"; exit 1)
	BUILD=$(BUILD) tests/bench/bench_affinity.sh

# The optimizer state formats' held-out loss after the same fine-tuning (QUALITY_* in the script);
# on the GPU where there is one, else on the CPU backend.
bench-quality: all
	BUILD=$(BUILD) tests/bench/bench_optim_quality.sh

# One line of results (losses, the export's digest) per run of a fixed set, to diff before and
# after a change that must leave results unchanged (tests/results.sh).
results: all
	BUILD=$(BUILD) tests/results.sh

# The main job on a fresh machine: prepare the bundled sample text (the project's own docs and
# sources) and fine-tune a small byte-level GPT through the three worker processes on the CPU.
DEMO := $(BUILD)/demo
DEMO_TEXT := tests/fixtures/sample.txt README.md docs/*.md common/*.[ch] launcher/*/*.[ch] \
             gpu_worker/*.[ch] io_worker/*.[ch] opt_worker/*.[ch]
demo: all
	rm -rf $(DEMO) && mkdir -p $(DEMO)
	$(BUILD)/bin/fuyou-launch prepare --out $(DEMO)/sample.tok $(DEMO_TEXT)
	$(BUILD)/bin/fuyou-launch init --run-dir $(DEMO)/run --layers 3 --heads 4 --embd 64 --ctx 64
	$(BUILD)/bin/fuyou-launch train --run-dir $(DEMO)/run --data $(DEMO)/sample.tok --steps 300 \
	  --batch 8 --seq 64 --lr 3e-3 --warmup 20 --eval-every 100 --eval-batches 8 --backend cpu \
	  --export $(DEMO)/model.fywt

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
