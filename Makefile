# ferry — build, demo, test.   `make`, `make demo`, `make test` (README).
# PYTHON: the interpreter for the Python package and tests. The default is the
# project's .venv, which `make` creates and fills (tools/setup.sh); pass
# PYTHON=python3 to use an existing interpreter (no registry needed).
PYTHON ?= .venv/bin/python
CC ?= cc
NVCC ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
DEPS ?= .deps
OPT ?= -O2

CFLAGS_COMMON := -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter -Wshadow \
                 -Iinclude -Isrc -I$(DEPS)/include -fPIC -pthread
CFLAGS ?= $(OPT) -g
# WERROR=1 (what `make test`, and so CI, builds with): warnings are errors.
# Local builds stay lenient.
ifeq ($(WERROR),1)
CFLAGS_COMMON += -Werror
endif
# The library's objects hide every symbol ferry.h does not declare (ferry.h
# gives its own default visibility; src/libferry.map is the version script).
VISIBILITY := -fvisibility=hidden
LDLIBS := -L$(DEPS)/lib -lzstd -llz4 -lz -ldl -lpthread -lm
# Optional libraries (tools/optional-libs.sh lists them; setup.py reads the
# same list): each is linked, and its FERRY_HAVE_* defined, where its header
# is installed (/usr/include, the multiarch include folder or $(DEPS)/include).
MULTIARCH_INC := /usr/include/$(shell $(CC) -print-multiarch 2>/dev/null)
define optional_lib
ifneq ($$(wildcard /usr/include/$(1) $(MULTIARCH_INC)/$(1) $(DEPS)/include/$(1)),)
CFLAGS_COMMON += -D$(2)
LDLIBS += -l$(3)
endif
endef
$(foreach l,$(shell tools/optional-libs.sh | tr ' ' ':'),$(eval $(call optional_lib,$(word 1,$(subst :, ,$(l))),$(word 2,$(subst :, ,$(l))),$(word 3,$(subst :, ,$(l))))))

# the library's folders (src/cli is the command, linked apart)
LIB_DIRS := base engine cuda formats formats/hdf5 codecs sources
LIB_SRCS := $(sort $(wildcard $(LIB_DIRS:%=src/%/*.c)))
CLI_SRCS := $(sort $(wildcard src/cli/*.c))
TEST_SRCS := $(sort $(wildcard tests/c/test_*.c))
FUZZ_SRCS := $(sort $(wildcard tests/fuzz/fuzz_*.c))

B := build
LIB_OBJS := $(LIB_SRCS:%.c=$(B)/%.o) $(B)/kernels_fatbin.o $(B)/kernels_cu.o
CLI_OBJS := $(CLI_SRCS:%.c=$(B)/%.o)
TESTS := $(TEST_SRCS:tests/c/%.c=$(B)/tests/%)

BA := build-asan
ASAN_FLAGS := -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
ASAN_LIB_OBJS := $(LIB_SRCS:%.c=$(BA)/%.o) $(BA)/kernels_fatbin.o $(BA)/kernels_cu.o
ASAN_TESTS := $(TEST_SRCS:tests/c/%.c=$(BA)/tests/%)

EXT_SUFFIX = $(shell [ -x $(PYTHON) ] || command -v $(PYTHON) >/dev/null && $(PYTHON) -c "import sysconfig;print(sysconfig.get_config_var('EXT_SUFFIX'))")
PY_INC = $(shell $(PYTHON) -c "import sysconfig;print(sysconfig.get_paths()['include'])")
PY_EXT = python/ferry/_ferry$(EXT_SUFFIX)
# the extension's sources: one file per type behind one internal header
EXT_SRCS := $(sort $(wildcard python/ferry/ext/*.c))
EXT_HDRS := $(wildcard python/ferry/ext/*.h)

.PHONY: all setup lib cli python test test-c test-asan test-python test-gpu test-cudasim test-install test-asan-python demo bench fuzz clean
# setup first, then a fresh make: the Python extension's file name comes from
# the interpreter, which setup may have just created
all: setup
	@$(MAKE) --no-print-directory lib cli python PYTHON=$(PYTHON)

setup:
	@tools/setup.sh $(PYTHON)

lib: $(B)/libferry.a $(B)/libferry.so
cli: $(B)/ferry
python: $(PY_EXT)

$(B)/%.o: %.c $(wildcard include/*.h src/*/*.h src/*/*/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_COMMON) $(VISIBILITY) $(CFLAGS) -c $< -o $@

# GPU kernels: compiled by nvcc to a fatbin and embedded as bytes; loaded at
# run time with cuModuleLoadData. Without nvcc the blob is empty and ferry
# does those steps on the CPU.
$(B)/kernels.fatbin: src/cuda/kernels.cu
	@mkdir -p $(B)
	@if [ -n "$(NVCC)" ]; then \
	  echo "nvcc $<"; \
	  $(NVCC) -fatbin -O3 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_80,code=sm_80 \
	    -gencode arch=compute_75,code=compute_75 -o $@ $< ; \
	elif [ -s $@ ]; then echo "no nvcc: keeping the existing $@"; touch $@; \
	else echo "no nvcc: GPU kernels not embedded"; : > $@; fi
$(B)/kernels_fatbin.c: $(B)/kernels.fatbin tools/embed.sh
	tools/embed.sh ferry_kernels_fatbin $< > $@
$(B)/kernels_fatbin.o: $(B)/kernels_fatbin.c
	$(CC) $(CFLAGS_COMMON) $(VISIBILITY) $(CFLAGS) -c $< -o $@
# the kernels' source as text, for NVRTC when no fatbin was embedded (src/cuda/nvrtc.c)
$(B)/kernels_cu.c: src/cuda/kernels.cu tools/embed.sh
	@mkdir -p $(B)
	tools/embed.sh ferry_kernels_cu $< > $@
$(B)/kernels_cu.o: $(B)/kernels_cu.c
	$(CC) $(CFLAGS_COMMON) $(VISIBILITY) $(CFLAGS) -c $< -o $@

$(B)/libferry.a: $(LIB_OBJS)
	@rm -f $@
	ar rcs $@ $^
	@echo "$(subst -L$(DEPS)/lib,-L$(abspath $(DEPS))/lib,$(LDLIBS))" > $(B)/libferry.libs   # what a program linking the archive adds (README)
$(B)/libferry.so: $(LIB_OBJS) src/libferry.map
	$(CC) -shared -Wl,--version-script=src/libferry.map -o $@ $(LIB_OBJS) $(LDLIBS)
$(B)/ferry: $(CLI_OBJS) $(B)/libferry.a
	$(CC) -o $@ $(CLI_OBJS) $(B)/libferry.a $(LDLIBS)

$(PY_EXT): $(EXT_SRCS) $(EXT_HDRS) $(B)/libferry.a
	$(CC) $(CFLAGS_COMMON) $(CFLAGS) -I$(PY_INC) -shared -o $@ $(EXT_SRCS) $(B)/libferry.a $(LDLIBS)

# test_cuda_abi checks src/cuda's declarations against the toolkit's cuda.h and
# cufile.h where they are installed (else it reports a skip)
ABI_INC := $(patsubst %/cuda.h,-isystem %,$(firstword $(wildcard /usr/local/cuda/include/cuda.h))) \
           $(patsubst %/cufile.h,-idirafter %,$(firstword $(wildcard /usr/local/cuda/include/cufile.h \
             .venv/lib/python3*/site-packages/nvidia/cu*/include/cufile.h)))
NVCOMP_INC := $(patsubst %/nvcomp/zstd.h,-idirafter %,$(firstword $(wildcard \
             .venv/lib/python3*/site-packages/nvidia/libnvcomp/include/nvcomp/zstd.h \
             $(dir $(PYTHON))../lib/python3*/site-packages/nvidia/libnvcomp/include/nvcomp/zstd.h)))
NVJPEG_INC := $(patsubst %/nvjpeg.h,-idirafter %,$(firstword $(wildcard /usr/local/cuda/include/nvjpeg.h \
             .venv/lib/python3*/site-packages/nvidia/cu*/include/nvjpeg.h \
             $(dir $(PYTHON))../lib/python3*/site-packages/nvidia/cu*/include/nvjpeg.h)))
$(B)/tests/test_cuda_abi $(BA)/tests/test_cuda_abi: CFLAGS_COMMON += $(ABI_INC) $(NVCOMP_INC) $(NVJPEG_INC)
$(B)/tests/%: tests/c/%.c $(wildcard tests/c/*.h) $(B)/libferry.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_COMMON) $(CFLAGS) -Itests/c -o $@ $< $(B)/libferry.a $(LDLIBS)

$(B)/tests/gpu/%: tests/gpu/%.c tests/c/check.h $(B)/libferry.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_COMMON) $(CFLAGS) -Itests/c -o $@ $< $(B)/libferry.a $(LDLIBS)

# A stand-in CUDA driver (tests/cudasim/cudasim.c says what it checks): the GPU
# engine tests run on it where there is no GPU, LD_LIBRARY_PATH=$(B)/cudasim.
$(B)/cudasim/libcuda.so.1: tests/cudasim/cudasim.c src/cuda/cuda.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_COMMON) $(CFLAGS) -shared -Wl,-soname,libcuda.so.1 -o $@ $< -lpthread

$(B)/cudasim/cufile/libcufile.so.0: tests/cudasim/cufilesim.c src/cuda/cuda.h src/cuda/cufile.h $(B)/cudasim/libcuda.so.1
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_COMMON) $(CFLAGS) -shared -Wl,-soname,libcufile.so.0 -o $@ $< -L$(B)/cudasim -l:libcuda.so.1

# A stand-in nvCOMP (tests/cudasim/nvcompsim.c: the batched decompressors on
# the CPU, queued on the stand-in driver's streams); FERRY_NVCOMP names it.
$(B)/cudasim/nvcomp/libnvcomp.so.6: tests/cudasim/nvcompsim.c src/cuda/cuda.h $(B)/cudasim/libcuda.so.1
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_COMMON) $(CFLAGS) -shared -Wl,-soname,libnvcomp.so.6 -o $@ $< -L$(B)/cudasim -l:libcuda.so.1 $(LDLIBS)

# A stand-in nvJPEG (tests/cudasim/nvjpegsim.c: single-image decoding with
# libjpeg-turbo, written on the stand-in driver's streams); FERRY_NVJPEG names
# it. Built where libturbojpeg is.
$(B)/cudasim/nvjpeg/libnvjpeg.so.12: tests/cudasim/nvjpegsim.c src/cuda/cuda.h $(B)/cudasim/libcuda.so.1
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_COMMON) $(CFLAGS) -shared -Wl,-soname,libnvjpeg.so.12 -o $@ $< -L$(B)/cudasim -l:libcuda.so.1 -lturbojpeg

# AddressSanitizer + UndefinedBehaviorSanitizer build of the library and C tests
$(BA)/%.o: %.c $(wildcard include/*.h src/*/*.h src/*/*/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_COMMON) $(VISIBILITY) $(ASAN_FLAGS) -c $< -o $@
$(BA)/kernels_fatbin.o: $(B)/kernels_fatbin.c
	@mkdir -p $(BA)
	$(CC) $(CFLAGS_COMMON) $(VISIBILITY) $(ASAN_FLAGS) -c $< -o $@
$(BA)/kernels_cu.o: $(B)/kernels_cu.c
	@mkdir -p $(BA)
	$(CC) $(CFLAGS_COMMON) $(VISIBILITY) $(ASAN_FLAGS) -c $< -o $@
$(BA)/libferry.a: $(ASAN_LIB_OBJS)
	@rm -f $@
	ar rcs $@ $^
$(BA)/tests/gpu/%: tests/gpu/%.c tests/c/check.h $(BA)/libferry.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_COMMON) $(ASAN_FLAGS) -Itests/c -o $@ $< $(BA)/libferry.a $(LDLIBS)
$(BA)/tests/%: tests/c/%.c $(wildcard tests/c/*.h) $(BA)/libferry.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_COMMON) $(ASAN_FLAGS) -Itests/c -o $@ $< $(BA)/libferry.a $(LDLIBS)
# every fuzz_*.c registers itself with the replay driver (tests/fuzz/replay.c says how)
$(BA)/fuzz_replay: tests/fuzz/replay.c tests/fuzz/fuzz.h $(FUZZ_SRCS) $(BA)/libferry.a
	@mkdir -p $(BA)
	$(CC) $(CFLAGS_COMMON) $(ASAN_FLAGS) -Itests/fuzz -o $@ tests/fuzz/replay.c $(FUZZ_SRCS) $(BA)/libferry.a $(LDLIBS)

# The Python extension under ASan+UBSan: its own copy of the package in
# $(BA)/py (the .py files linked, _ferry built from $(BA)/libferry.a), run by a
# focused pytest subset with libasan preloaded (Python itself is not
# instrumented; leaks are CPython's business: detect_leaks=0).
ASAN_PY_EXT = $(BA)/py/ferry/_ferry$(EXT_SUFFIX)
$(ASAN_PY_EXT): $(EXT_SRCS) $(EXT_HDRS) $(BA)/libferry.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_COMMON) $(ASAN_FLAGS) -I$(PY_INC) -shared -o $@ $(EXT_SRCS) $(BA)/libferry.a $(LDLIBS)
test-asan-python: $(ASAN_PY_EXT)
	@find $(BA)/py/ferry -type l -delete
	@cd python && find ferry -name '*.py' -o -name '*.pyi' | while read -r f; do \
	    mkdir -p $(abspath $(BA))/py/$$(dirname $$f) && ln -sf $(abspath .)/python/$$f $(abspath $(BA))/py/$$f; done
	@tools/asan-pytest.sh $(PYTHON) $(BA)/py

# first: libferry.so exports exactly ferry.h and ferry_experimental.h (src/common.h says why),
# and no two of the library's files call each other round (tools/circles.py: 0 circles)
test-c: $(TESTS) $(B)/libferry.so
	@tools/check-exports.sh $(B)/libferry.so include/ferry.h include/ferry_experimental.h
	@python3 tools/circles.py --quiet $(B)
	@tools/run-c-tests.sh $(TESTS)
test-asan: $(ASAN_TESTS) $(if $(FUZZ_SRCS),$(BA)/fuzz_replay)
	@ASAN_OPTIONS=detect_leaks=1 tools/run-c-tests.sh $(ASAN_TESTS)
	@if [ -x $(BA)/fuzz_replay ]; then ASAN_OPTIONS=detect_leaks=1 $(BA)/fuzz_replay tests/fuzz/corpus; fi
# pip install . into a temporary --target, then run its `ferry` and import ferry from there
test-install:
	@tools/test-install.sh $(PYTHON)
test-python: all
	@PYTHONPATH=python $(PYTHON) -m pytest -q tests/python
test-gpu: all
	@PYTHONPATH=python FERRY_BIN=$(B)/ferry tests/gpu/run.sh $(PYTHON)
# The GPU tests again on the simulated driver (tests/cudasim), also under ASan:
# the device paths are checked on machines without a GPU too.
# The C tests also get the stand-in cuFile (its own directory: torch, imported
# by pytest, must not find it); pytest runs with cuFile off.
SIM_NVCOMP := FERRY_NVCOMP=$(abspath $(B)/cudasim/nvcomp/libnvcomp.so.6)
ifneq ($(filter -DFERRY_HAVE_TURBOJPEG,$(CFLAGS_COMMON)),)
SIM_NVJPEG_LIB := $(B)/cudasim/nvjpeg/libnvjpeg.so.12
SIM_NVJPEG := FERRY_NVJPEG=$(abspath $(SIM_NVJPEG_LIB))
endif
SIM_ENV := LD_LIBRARY_PATH=$(abspath $(B)/cudasim) FERRY_CUFILE=off FERRY_GPU_BIG=0 $(SIM_NVCOMP) $(SIM_NVJPEG)
SIM_C_ENV := LD_LIBRARY_PATH=$(abspath $(B)/cudasim):$(abspath $(B)/cudasim/cufile) FERRY_GPU_BIG=0 $(SIM_NVCOMP) $(SIM_NVJPEG)
GPU_C_TESTS := $(patsubst tests/gpu/%.c,$(BA)/tests/gpu/%,$(wildcard tests/gpu/test_*.c))
test-cudasim: all $(B)/cudasim/libcuda.so.1 $(B)/cudasim/cufile/libcufile.so.0 $(B)/cudasim/nvcomp/libnvcomp.so.6 $(SIM_NVJPEG_LIB) $(GPU_C_TESTS) $(B)/tests/gpu/test_gpu_engine
	@$(SIM_C_ENV) ASAN_OPTIONS=detect_leaks=1 tools/run-c-tests.sh $(GPU_C_TESTS)
	@echo "  again with 3 workers, 2 staging buffers of 64 KiB, 1 MiB tasks (more hand-offs per byte), allocations that touch:"
	@$(SIM_C_ENV) FERRY_THREADS=3 FERRY_STAGING_COUNT=2 FERRY_STAGING_SIZE=64K FERRY_TASK_SIZE=1M FERRY_CUDASIM_ADJACENT=1 \
	    tools/run-c-tests.sh $(B)/tests/gpu/test_gpu_engine
	@echo "  the GPU decode tests again with FERRY_GPU_CHECK=one (one feeder checks a job's calls):"
	@$(SIM_C_ENV) FERRY_GPU_CHECK=one ASAN_OPTIONS=detect_leaks=1 tools/run-c-tests.sh $(filter %/test_gpu_decode,$(GPU_C_TESTS))
	@echo "  the image batch again on a device without the JPEG engine (nvJPEG's CUDA backend only):"
	@$(SIM_C_ENV) NVJPEGSIM_NO_HW=1 ASAN_OPTIONS=detect_leaks=1 tools/run-c-tests.sh $(filter %/test_gpu_imagebatch,$(GPU_C_TESTS))
	@echo "  ferry bench on the stand-in driver (every path's bytes verified):"
	@$(SIM_C_ENV) $(B)/ferry bench --size 16M --reps 1 --no-cold --no-latency --file $(B)/cudasim-bench.bin \
	    > $(B)/cudasim-bench.log 2>&1 && echo "  1 passed, 0 failed" || { cat $(B)/cudasim-bench.log; echo "  0 passed, 1 failed"; exit 1; }
	@$(SIM_ENV) PYTHONPATH=python FERRY_BIN=$(B)/ferry tests/gpu/run.sh $(PYTHON)

# The whole suite: C tests, the same under ASan+UBSan, the fuzz corpus, pytest,
# and the GPU tests (which skip with a reason where there is no GPU).
test: export WERROR := 1
test: all
	@PYTHON=$(PYTHON) tools/test-all.sh

demo: all
	@PYTHONPATH=python $(PYTHON) tools/demo.py

# Benchmarks (numbers for BENCHMARKS.md come from the GPU machine: tools/gpu-run.sh).
# BENCH_ARGS=--smoke runs each Python benchmark small and quick.
bench: all
	$(B)/ferry bench --size $(or $(BENCH_SIZE),1G)
	@for b in bench/bench_*.py; do echo "== $$b"; PYTHONPATH=python $(PYTHON) $$b $(BENCH_ARGS) || exit 1; done

fuzz: lib
	@tools/fuzz.sh

clean:
	rm -rf $(B) $(BA) python/ferry/_ferry*.so
