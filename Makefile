# salafw - one Makefile.
#   make                 build/libsalafw.a and build/salafw (CPU only)
#   make CUDA=1          also kernels/*.cu and *_cuda.c, in build-cuda/ (CUDA_ARCH="sm_80 sm_86 sm_89 sm_90 sm_120")
#   make test            unit, interop and golden tests; closing line "N passed, N failed"
#   make check           test, plus test-ops when CUDA=1
#   make bench | fuzz | format | clean ; SAN=1 for ASan/UBSan
.DEFAULT_GOAL := all
.SUFFIXES:

CC      ?= cc
CXX     ?= c++
NVCC    ?= nvcc
CUDA_HOME ?= /usr/local/cuda
CUDA_ARCH ?= sm_80 sm_86 sm_89 sm_90 sm_120
FUZZ_SECONDS ?= 20

# Each flavour builds in its own tree: objects do not depend on the flags, so
# a CUDA and a CPU build sharing one would link each other's forward.o.
BUILD := build
ifeq ($(CUDA),1)
BUILD := build-cuda
endif
ifeq ($(SAN),1)
BUILD := build-san$(if $(filter 1,$(CUDA)),-cuda)
SANFLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
endif

OPT      ?= -O2
WARN     := -Wall -Wextra -Werror -Wno-format-truncation
INCLUDES := -I. -Icore
DEFS     := -D_GNU_SOURCE
ifeq ($(CUDA),1)
DEFS     += -DSFW_HAVE_CUDA=1
endif
CFLAGS   := -std=c11 $(OPT) -g $(WARN) $(DEFS) $(INCLUDES) -MMD -MP -pthread $(SANFLAGS) $(EXTRA_CFLAGS)
CXXFLAGS := -std=c++17 $(OPT) -g $(WARN) $(DEFS) $(INCLUDES) -MMD -MP -pthread $(SANFLAGS)
NVFLAGS  := -O3 -lineinfo -std=c++17 $(DEFS) $(INCLUDES) -Xcompiler -Wall,-Wextra,-Werror \
            $(foreach a,$(CUDA_ARCH),-gencode arch=compute_$(subst sm_,,$(a)),code=$(a))

# libsodium is linked statically so the binary runs where libsodium.so.23 is absent.
SODIUM_A := $(wildcard /usr/lib/x86_64-linux-gnu/libsodium.a)
ifneq ($(SODIUM_A),)
SODIUM_LIB := $(SODIUM_A)
else
SODIUM_LIB := -lsodium
endif
LDLIBS := -lmicrohttpd -lcurl $(SODIUM_LIB) -lcrypto -lcjson -lunistring -lsentencepiece -lstdc++ -lpthread -lm
# The SentencePiece trainer: only tools/spm_train.cpp uses it, so only links
# whose modules include tools get it (the CLI, benches, tests that link tools).
SPM_TRAIN_LIB := -lsentencepiece_train
ifeq ($(CUDA),1)
LDLIBS += -L$(CUDA_HOME)/lib64 -lcublasLt -lcublas -lcudart -ldl -lrt
endif
LDFLAGS := -pthread $(SANFLAGS)

# Modules, in link order (a module may use only those after it): serve drives
# the engine; tools (mkmodel, bench, score, tokenizer training) use quant and
# the engine; quant drives the engine (AWQ calibration); runner is the engine
# (forward, model, backends, batch, generate, sampler); formats reads and
# writes the files (safetensors, config, tokenizer, eos); kernels are the ops;
# num holds the number formats every layer shares (dtype enum, bf16/f16,
# the int8 layout; header-only). tests/run.sh checks that no include points
# back up from runner, formats, kernels or num to quant or tools.
MODULES := serve tools quant runner formats kernels num fetch verify core
# Files named *_cuda.c are host code that needs the CUDA runtime: CUDA=1 only.
srcs_c   = $(if $(filter 1,$(CUDA)),$(wildcard $(1)/*.c),$(filter-out %_cuda.c,$(wildcard $(1)/*.c)))
srcs_cxx = $(wildcard $(1)/*.cpp)
srcs_cu  = $(if $(filter 1,$(CUDA)),$(wildcard $(1)/*.cu))
objs     = $(patsubst %.c,$(BUILD)/%.o,$(call srcs_c,$(1))) \
           $(patsubst %.cpp,$(BUILD)/%.o,$(call srcs_cxx,$(1))) \
           $(patsubst %.cu,$(BUILD)/%.cu.o,$(call srcs_cu,$(1)))

$(foreach m,$(MODULES),$(eval OBJS_$(m) := $(call objs,$(m))))
MODULE_LIBS := $(foreach m,$(MODULES),$(BUILD)/libsfw_$(m).a)
ALL_OBJS := $(foreach m,$(MODULES),$(OBJS_$(m)))
CLI_OBJS := $(patsubst %.c,$(BUILD)/%.o,$(wildcard cli/*.c))

# GPU tests (tests/gpu_*.c) need a GPU to run: built with CUDA=1 only.
TEST_SRCS := $(wildcard tests/test_*.c) $(if $(filter 1,$(CUDA)),$(wildcard tests/gpu_*.c))
TEST_BINS := $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRCS))
# A test may name the modules it links in a line "/* modules: verify core */";
# the default is all of them. This keeps a test buildable while an unrelated
# module is mid-change, and documents the dependency.
test_modules = $(or $(shell sed -n 's|^/\* modules: \(.*\) \*/$$|\1|p' $(1) | head -n 1),$(MODULES))
test_libs = $(foreach m,$(call test_modules,$(1)),$(BUILD)/libsfw_$(m).a)
# Only a test that links tools needs the SentencePiece trainer.
test_spm = $(if $(filter tools,$(call test_modules,$(1))),$(SPM_TRAIN_LIB))
TEST_HELPERS := $(patsubst %.c,$(BUILD)/%.o,$(wildcard tests/lib/*.c))
BENCH_SRCS := $(wildcard bench/*.c)
BENCH_BINS := $(patsubst bench/%.c,$(BUILD)/bench/%,$(BENCH_SRCS))

.PHONY: all test check test-ops bench fuzz format clean deps setup demo install cupti-trace
# Keep object files of tests and benches (make would delete them as intermediates).
.SECONDARY:
all: deps $(BUILD)/libsalafw.a $(BUILD)/salafw $(TEST_BINS) $(BENCH_BINS)

deps:
	@for p in libcurl libsodium openssl libcjson sentencepiece libmicrohttpd; do \
	  if pkg-config --exists $$p; then echo "✓ $$p $$(pkg-config --modversion $$p)"; \
	  else echo "✗ $$p missing: run scripts/setup.sh"; fi; done
	@if [ "$(CUDA)" = 1 ]; then command -v $(NVCC) >/dev/null && echo "✓ nvcc ($(CUDA_ARCH))" || echo "✗ nvcc missing"; fi

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@
$(BUILD)/%.o: %.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -c $< -o $@
# The CUDA objects depend on a stamp that holds CUDA_ARCH, rewritten (so made
# newer) whenever a build asks for other architectures: they are rebuilt (and
# what uses them relinked). It is written while the Makefile is read (make -n
# too), not by a rule: under .SECONDARY a missing stamp made by a rule would
# not force the objects' rebuild.
CUDA_ARCH_STAMP := $(BUILD)/.cuda-arch
ifeq ($(CUDA),1)
_ := $(shell mkdir -p $(BUILD) && rm -f $(BUILD)/.cuda-arch.* && \
	{ [ "$$(cat $(CUDA_ARCH_STAMP) 2>/dev/null)" = "$(strip $(CUDA_ARCH))" ] || \
	  echo "$(strip $(CUDA_ARCH))" >$(CUDA_ARCH_STAMP); })
endif
$(BUILD)/%.cu.o: %.cu $(CUDA_ARCH_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -MMD -MP -c $< -o $@

# A CUPTI injection library for kernel timelines on machines without Nsight
# Systems (bench/cupti/trace.c; scripts/gpu-run.sh trace). CUDA=1 only.
cupti-trace: $(BUILD)/bench/libsfw_cupti_trace.so
$(BUILD)/bench/libsfw_cupti_trace.so: bench/cupti/trace.c
	@mkdir -p $(dir $@)
	$(CC) -std=c11 $(OPT) $(WARN) -fPIC -shared -I$(CUDA_HOME)/include $< -L$(CUDA_HOME)/lib64 -lcupti \
		-Wl,-rpath,'$$ORIGIN' -o $@

define module_rule
$(BUILD)/libsfw_$(1).a: $(OBJS_$(1))
	@mkdir -p $$(dir $$@)
	@rm -f $$@
	ar rcs $$@ $$^ $$(if $$^,,$$(BUILD)/empty.o)
endef
$(BUILD)/empty.o:
	@mkdir -p $(dir $@)
	echo 'typedef int sfw_empty_unit;' | $(CC) -x c -c - -o $@
$(foreach m,$(MODULES),$(eval $(call module_rule,$(m))))
$(foreach m,$(MODULES),$(if $(OBJS_$(m)),,$(eval $(BUILD)/libsfw_$(m).a: $(BUILD)/empty.o)))

$(BUILD)/libsalafw.a: $(ALL_OBJS)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/salafw: $(CLI_OBJS) $(MODULE_LIBS)
	$(CXX) $(LDFLAGS) -o $@ $(CLI_OBJS) $(MODULE_LIBS) $(SPM_TRAIN_LIB) $(LDLIBS)

# A test links the module archives; tests/lib/*.c are shared test helpers,
# one archive, so a test links only the helpers it calls (and their modules).
$(BUILD)/tests/libhelpers.a: $(TEST_HELPERS)
	@rm -f $@
	ar rcs $@ $^
.SECONDEXPANSION:
$(BUILD)/tests/%: $(BUILD)/tests/%.o $(BUILD)/tests/libhelpers.a $$(call test_libs,tests/%.c)
	$(CXX) $(LDFLAGS) -o $@ $< $(BUILD)/tests/libhelpers.a $(call test_libs,tests/$*.c) $(call test_spm,tests/$*.c) $(LDLIBS)
$(BUILD)/bench/%: $(BUILD)/bench/%.o $(MODULE_LIBS)
	$(CXX) $(LDFLAGS) -o $@ $< $(MODULE_LIBS) $(SPM_TRAIN_LIB) $(LDLIBS)

test: all
	@BUILD=$(BUILD) bash tests/run.sh

test-ops: all
	@if [ "$(CUDA)" != 1 ]; then echo "test-ops needs CUDA=1"; exit 2; fi
	@BUILD=$(BUILD) bash tests/run.sh --gpu

check: test
	@if [ "$(CUDA)" = 1 ]; then $(MAKE) test-ops; fi

bench: all
	@BUILD=$(BUILD) bash bench/run.sh

# libFuzzer targets: every tests/fuzz/fuzz_*.c, linked with the library built
# by clang with -fsanitize=fuzzer-no-link,address; each runs FUZZ_SECONDS.
FUZZ_BUILD := build-fuzz
FUZZ_SRCS := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_BINS := $(patsubst tests/fuzz/%.c,$(FUZZ_BUILD)/%,$(FUZZ_SRCS))
FUZZ_LIB_SRCS := $(foreach m,fetch verify core,$(filter-out %_cuda.c,$(wildcard $(m)/*.c))) runner/ctxstate_fmt.c formats/safetensors.c formats/config.c formats/eos.c serve/req.c formats/chat.c formats/chat_builtin.c formats/jinja.c formats/toolcall.c
FUZZ_CFLAGS := -std=c11 -O1 -g $(DEFS) $(INCLUDES) -fsanitize=fuzzer-no-link,address,undefined
fuzz: $(FUZZ_BINS)
	@set -e; for f in $(FUZZ_BINS); do n=$$(basename $$f); mkdir -p $(FUZZ_BUILD)/corpus-$$n; \
	  seeds=; [ -d tests/fuzz/seeds/$$n ] && seeds=tests/fuzz/seeds/$$n; \
	  echo "fuzz $$n for $(FUZZ_SECONDS)s"; \
	  if $$f -max_total_time=$(FUZZ_SECONDS) -max_len=65536 $(FUZZ_BUILD)/corpus-$$n $$seeds \
	     >$(FUZZ_BUILD)/$$n.log 2>&1; then tail -n 2 $(FUZZ_BUILD)/$$n.log; \
	  else tail -n 40 $(FUZZ_BUILD)/$$n.log; echo "fuzz $$n: FAILED"; exit 1; fi; done
$(FUZZ_BUILD)/%: tests/fuzz/%.c $(FUZZ_LIB_SRCS)
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $^ -lcurl $(SODIUM_LIB) -lcrypto -lcjson -lunistring -lpthread -lm
# fuzz_tokenizer also links the tokenizer (C++ over libsentencepiece).
$(FUZZ_BUILD)/tokenizer.o: formats/tokenizer.cpp
	@mkdir -p $(dir $@)
	clang++ -std=c++17 -O1 -g $(DEFS) $(INCLUDES) -fsanitize=fuzzer-no-link,address,undefined -c $< -o $@
$(FUZZ_BUILD)/fuzz_tokenizer: tests/fuzz/fuzz_tokenizer.c $(FUZZ_LIB_SRCS) $(FUZZ_BUILD)/tokenizer.o
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -fsanitize=fuzzer -fsanitize-link-c++-runtime -o $@ $^ -lsentencepiece -lstdc++ -lcurl $(SODIUM_LIB) -lcrypto -lcjson -lunistring -lpthread -lm

format:
	clang-format -i $$(git ls-files '*.c' '*.h' '*.cpp' '*.cu' '*.cuh')

# make install PREFIX=DIR: the binary, the pinned keys and pins (read by
# --pubkey NAME), and salafw.1 generated from the option tables (salafw --man).
PREFIX ?= /usr/local
DESTDIR ?=
install: $(BUILD)/salafw
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/salafw/manifests/pins $(DESTDIR)$(PREFIX)/share/man/man1
	install -m 0755 $(BUILD)/salafw $(DESTDIR)$(PREFIX)/bin/salafw
	install -m 0644 manifests/*.pub manifests/README.md $(DESTDIR)$(PREFIX)/share/salafw/manifests/
	install -m 0644 manifests/pins/*.pin $(DESTDIR)$(PREFIX)/share/salafw/manifests/pins/
	$(BUILD)/salafw --man > $(DESTDIR)$(PREFIX)/share/man/man1/salafw.1.tmp
	mv $(DESTDIR)$(PREFIX)/share/man/man1/salafw.1.tmp $(DESTDIR)$(PREFIX)/share/man/man1/salafw.1

setup:
	bash scripts/setup.sh

demo: all
	bash scripts/demo.sh

clean:
	rm -rf build build-san build-fuzz

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)

# Interoperability with compressed-tensors from PyPI (tests/interop/run.sh:
# a venv in $(BUILD)/interop-venv; pulls torch, ~2.5 GB; not part of `make test`).
.PHONY: interop
interop: all $(BUILD)/tests/interop/dequant
	@BUILD=$(BUILD) bash tests/interop/run.sh
