# Makefile for mesh: meshc (compiler), meshrun and libmesh (runtime).
#
# One plain GNU Makefile (GNU make >= 4.3). Everything is built out of tree
# under $(BUILD); nothing is probed: features are switched on explicitly.
#
#   make                 meshc, meshrun, libmesh.a, libmesh.so in build/
#                        (with MPI; MPI=0 without)
#   make test            build, then tests/run.sh (prints `N passed, N failed`)
#   make asan            the same in build-asan/ with ASan+UBSan+LSan
#   make fuzz            libFuzzer on the front end for FUZZ_SECONDS (clang)
#   make fuzz-plan       libFuzzer on meshrun's plan reader and runtime (CPU ranks)
#   make fuzz-ckpt       libFuzzer on loading checkpoints (safetensors)
#   make fuzz-ci         fuzz 15 s, fuzz-plan 10 s, fuzz-ckpt 5 s (CI)
#   make sweep           trainings drawn at random (model, mesh, schedule,
#                        ZeRO, precision...) against one rank's losses, for
#                        SWEEP_SECONDS (600) from SWEEP_SEED (the time);
#                        make sweep-gpu: on 4 emulated GPUs over NCCL
#   make check-exports   libmesh exports only mesh_ symbols
#   make install         PREFIX=/usr/local, DESTDIR honored; its two halves
#                        are install-runtime (libmesh, mesh.h, mesh.pc,
#                        meshrun) and install-compiler (meshc, lang/std)
#   make torch-gpt2      GPT-2 124M trained next to PyTorch (tests/torch/)
#   make deps            install the Debian packages the build and the tests
#                        need (root; PyTorch among them)
#   make demo            deps but PyTorch, build, meshc on every example,
#                        train gpt-tiny, sample
#   make clean           remove build*/

# ---- Settings -----------------------------------------------------------

# make's built-in default for CC is `cc`; use gcc unless CC is set.
ifeq ($(origin CC),default)
CC = gcc
endif
AR      ?= ar
LD      ?= ld
OBJCOPY ?= objcopy
BISON   ?= bison
BISONFLAGS ?= -Wall -Werror
FLEX    ?= flex
NM      ?= nm

CFLAGS  ?= -std=c11 -O2 -g -Wall -Wextra -Wpedantic -Wshadow \
           -Wstrict-prototypes -Wmissing-prototypes -Wundef -Werror \
           -D_POSIX_C_SOURCE=200809L
LDFLAGS ?=
LDLIBS  ?= -lm -lpthread

# libyaml, for the plan file (compiler/plan*.c): meshc and the unit tests.
PKG_CONFIG  ?= pkg-config
YAML_CFLAGS := $(shell $(PKG_CONFIG) --cflags yaml-0.1)
YAML_LIBS   := $(shell $(PKG_CONFIG) --libs yaml-0.1)
BLAS_CFLAGS := $(shell $(PKG_CONFIG) --cflags openblas)
BLAS_LIBS   := $(shell $(PKG_CONFIG) --libs openblas)
# PCRE2, for GPT-2's pre-tokenizer pattern (runtime/bpe.c).
PCRE_CFLAGS := $(shell $(PKG_CONFIG) --cflags libpcre2-8)
PCRE_LIBS   := $(shell $(PKG_CONFIG) --libs libpcre2-8)

# MPI (Open MPI 4.1, libopenmpi-dev; `make deps` installs it): libmesh's
# MPI communicator (runtime/comm_mpi.c), which runs one rank per process
# under mpirun or srun. On unless MPI=0, which builds libmesh without it
# (mesh_run_ranks then runs a job of several processes not at all, and
# one process as before). Its headers are system headers: our warnings stay
# on for our code.
MPI ?= 1
ifeq ($(MPI),1)
MPI_CFLAGS := $(patsubst -I%,-isystem %,$(shell $(PKG_CONFIG) --cflags ompi-c 2>/dev/null))
MPI_LIBS   := $(shell $(PKG_CONFIG) --libs ompi-c 2>/dev/null)
MPI_PC      = ompi-c
else ifneq ($(MPI),0)
$(error MPI must be 0 or 1)
endif

# Build folder, and sanitizers: SAN=1 is ASan+UBSan (+LSan), SAN=fuzz adds
# libFuzzer instrumentation (clang only), SAN=thread is TSan, SAN=cov is
# gcc's line coverage (make gpu-emu-cov). `make asan` and `make fuzz` set
# both; each sanitizer build needs its own BUILD folder.
BUILD   ?= build
SAN     ?= 0

# Installation.
PREFIX  ?= /usr/local
DESTDIR ?=
BINDIR      = $(PREFIX)/bin
LIBDIR      = $(PREFIX)/lib
INCLUDEDIR  = $(PREFIX)/include
DATADIR     = $(PREFIX)/share

# Fuzzing.
FUZZ_CC      ?= clang
FUZZ_SECONDS ?= 600
FUZZ_BUILD    = build-fuzz

# Minimum tool versions (checked once per build folder, see $(TOOLS_OK)).
BISON_MIN = 3.5

# ---- CUDA (off unless CUDA=1) -------------------------------------------
# CUDA=1 builds the NCCL communicator (runtime/comm_nccl*.c; with CUDA=0
# comm_nccl_none.c says libmesh was built without CUDA) and links libmesh and every
# program with NCCL and the CUDA runtime from CUDA_HOME (NCCL from
# NCCL_HOME, the same by default), with an rpath, so that they run from the
# build tree. Their headers are system headers: our warnings stay on for
# our code. No GPU is needed to build or test it: without one,
# comm_nccl_available says why and the NCCL tests skip. The CUDA kernels,
# kernels/cuda/*.cu (kcuda.h), are built with $(NVCC) $(NVCCFLAGS)
# $(NVCC_WARN) $(CUDA_ARCH) into libmesh (see "CUDA kernels" below), and
# link cuBLASLt; their tests and benchmark are $(BUILD)/gpu_tests and
# $(BUILD)/gpu_bench (tests/gpu/run.sh runs them on a GPU machine).
CUDA      ?= 0
CUDA_HOME ?= /usr/local/cuda
# cuDNN's graph header, where the toolkit has it (libmesh never needs it:
# kernels/cuda/cudnn_api.h; the check of its values does)
CUDNN_HEADER = $(wildcard $(CUDA_HOME)/include/cudnn_graph.h)
NCCL_HOME ?= $(CUDA_HOME)
NVCC      ?= $(CUDA_HOME)/bin/nvcc
NVCCFLAGS ?= -O2 -std=c++17
# nvcc's own warnings and the host compiler's, all errors; no GNU-unique
# symbols (cub's function-local statics would be, and objcopy cannot make
# those local in libmesh.a, which keeps only mesh_* global)
NVCC_WARN  = -Werror all-warnings -Xcompiler -Wall,-Wextra,-Werror,-fno-gnu-unique
CUDA_ARCH ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
# kernels/cuda/attention_wg.cu alone: Hopper's own wgmma is in sm_90a's
# machine code only (its kernels trap in the compute_90 PTX, and
# attention_wg.cu's probe tells the launcher which one the GPU loaded);
# the other files keep CUDA_ARCH (one front-end pass, not two)
CUDA_ARCH_WGMMA ?= -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_90,code=compute_90
ifeq ($(CUDA),1)
CUDA_CFLAGS := $(addprefix -isystem ,$(sort $(CUDA_HOME)/include $(NCCL_HOME)/include))
CUDA_SRC    := $(wildcard kernels/cuda/*.cu)
# With CUDA=1 the runtime's CUDA files (the kernel table kern_cuda.c, and
# device_cuda.c and comm_nccl_wait.c: kcuda_fault_hint) need the CUDA kernels'
# library; defined here, before the rules that list it among their inputs
KCUDA_LIB    = $(if $(CUDA_SRC),$(BUILD)/libmeshkcuda.a)
# (nvcc's objects need the C++ runtime, the kernels' matmuls cuBLASLt)
CUDA_LIBS   := $(foreach d,$(sort $(CUDA_HOME)/lib64 $(NCCL_HOME)/lib64),-L$(d) -Wl,-rpath,$(d)) -lnccl \
               $(if $(CUDA_SRC),-lcublasLt -lcublas) -lcudart $(if $(CUDA_SRC),-lstdc++)
else ifneq ($(CUDA),0)
$(error CUDA must be 0 or 1)
endif

# ---- Derived settings (no need to edit below) ---------------------------

# The version lives in runtime/mesh.h only.
version_part = $(shell sed -n 's/^\#define MESH_VERSION_$(1)[[:space:]]\{1,\}\([0-9]\{1,\}\).*/\1/p' runtime/mesh.h)
VERSION_MAJOR := $(call version_part,MAJOR)
VERSION       := $(VERSION_MAJOR).$(call version_part,MINOR).$(call version_part,PATCH)
SONAME         = libmesh.so.$(VERSION_MAJOR)

# The public headers, by name: installed, and nothing else is.
PUBLIC_HEADERS = runtime/mesh.h

GEN      = $(BUILD)/gen
OBJ      = $(BUILD)/obj
TOOLS_OK = $(BUILD)/.tools-ok

ifeq ($(SAN),1)
ifeq ($(BUILD),build)
$(error SAN=1 needs its own build folder: use `make asan` (BUILD=build-asan))
endif
SAN_CFLAGS  = -fsanitize=address,undefined -fno-omit-frame-pointer \
              -fno-sanitize-recover=all -O1
SAN_LDFLAGS = -fsanitize=address,undefined
else ifeq ($(SAN),fuzz)
SAN_CFLAGS  = -fsanitize=fuzzer-no-link,address,undefined \
              -fno-omit-frame-pointer -fno-sanitize-recover=all -O1
SAN_LDFLAGS = -fsanitize=address,undefined
else ifeq ($(SAN),thread)
SAN_CFLAGS  = -fsanitize=thread -fno-omit-frame-pointer -O1
SAN_LDFLAGS = -fsanitize=thread
else ifeq ($(SAN),cov)
SAN_CFLAGS  = --coverage -fprofile-update=atomic
SAN_LDFLAGS = --coverage
else ifneq ($(SAN),0)
$(error SAN must be 0, 1, thread, fuzz or cov)
endif

INCLUDES  = -Ilang -I$(GEN) -Iruntime
ALL_CFLAGS  = $(CFLAGS) $(SAN_CFLAGS) $(INCLUDES) -MMD -MP
ALL_LDFLAGS = $(LDFLAGS) $(SAN_LDFLAGS)
# The shared library must resolve all its symbols itself; sanitizer runtimes
# are only resolved at program link time, so skip the check there.
SO_LDFLAGS  = -shared -Wl,-soname,$(SONAME) \
              -Wl,--version-script=runtime/libmesh.map
ifeq ($(SAN),0)
SO_LDFLAGS += -Wl,--no-undefined
endif

# ---- Sources and objects ------------------------------------------------

# Front end: lang/*.c plus the generated parser and scanner.
GEN_C      = $(GEN)/parser.c $(GEN)/lexer.c
GEN_H      = $(GEN)/parser.h $(GEN)/lexer.h
LANG_SRC   = $(wildcard lang/*.c)
LANG_OBJ   = $(LANG_SRC:%.c=$(OBJ)/%.o) $(OBJ)/gen/parser.o $(OBJ)/gen/lexer.o

# The compiler library: compiler/*.c but meshc.c (the thin program, with main).
COMPILER_SRC = $(filter-out compiler/meshc.c,$(wildcard compiler/*.c))
COMPILER_OBJ = $(COMPILER_SRC:%.c=$(OBJ)/%.o) $(OBJ)/compiler/meshc.o

# libmesh: runtime/*.c except meshrun's main; of the NCCL communicator,
# its files (comm_nccl*.c) with CUDA=1, else its stubs (comm_nccl_none.c).
NCCL_SRC     = $(filter-out runtime/comm_nccl_none.c,$(wildcard runtime/comm_nccl*.c))
RUNTIME_SRC  = $(filter-out runtime/meshrun.c $(if $(filter 1,$(CUDA)),runtime/comm_nccl_none.c,$(NCCL_SRC)), \
                            $(wildcard runtime/*.c))
RUNTIME_OBJ  = $(RUNTIME_SRC:%.c=$(OBJ)/%.o)

# Unit tests: tests/unit/runner.c plus every tests/unit/test_*.c, the
# checked front end the compiler's tests start from (fixture.c), and the
# communicator cases they share with the MPI tests (tests/mpi/, run by
# tests/run.sh under mpirun).
UNIT_SRC     = tests/unit/runner.c tests/unit/comm_cases.c tests/unit/fixture.c $(wildcard tests/unit/test_*.c)
UNIT_OBJ     = $(UNIT_SRC:%.c=$(OBJ)/%.o)
MPI_TEST_OBJ = $(OBJ)/tests/mpi/mpi_tests.o

# The CPU kernels: kernels/cpu/*.c (the reference every backend is tested
# against), in libmesh and its own archive for the tests.
KCPU_SRC     = $(wildcard kernels/cpu/*.c)
KCPU_OBJ     = $(KCPU_SRC:%.c=$(OBJ)/%.o)

# The CUDA kernels: kernels/cuda/*.cu with CUDA=1 (none otherwise), in
# libmesh; built by $(NVCC) (see "CUDA kernels" below).
CUDA_OBJ     = $(CUDA_SRC:%.cu=$(OBJ)/%.o)

FUZZ_OBJ     = $(OBJ)/tests/fuzz/fuzz_lang.o $(OBJ)/tests/fuzz/fuzz_plan.o $(OBJ)/tests/fuzz/fuzz_ckpt.o

ALL_OBJ = $(LANG_OBJ) $(COMPILER_OBJ) $(RUNTIME_OBJ) \
          $(OBJ)/runtime/meshrun.o $(UNIT_OBJ) $(FUZZ_OBJ) $(MPI_TEST_OBJ)

# ---- Top-level targets --------------------------------------------------

.PHONY: all test asan tsan fuzz fuzz-plan fuzz-ckpt fuzz-ci fuzz-build check-exports install bench sweep sweep-gpu \
        install-runtime install-compiler deps demo clean FORCE

all: $(BUILD)/libmesh.a $(BUILD)/libmesh.so $(BUILD)/meshrun $(BUILD)/meshc

# In sanitizer builds, LeakSanitizer checks every process at exit, and
# the unit tests that train on several ranks train 3 steps, not 20
# (MESH_UNIT_STEPS: a sanitizer needs each path run, which 3 steps do;
# make test checks the losses of all 20).
SAN_STEPS = MESH_UNIT_STEPS=3
ifneq ($(SAN),0)
TEST_ENV = ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 \
           UBSAN_OPTIONS=print_stacktrace=1 $(SAN_STEPS)
endif

# With MPI, the MPI tests' program too (tests/run.sh runs it under mpirun);
# and the benchmarks' programs, built (not run) so that make bench links.
# With CUDA=1, the GPU programs too (tests/run.sh's gpu section runs
# gpu_tests and gpu_selftest: without a GPU each must say so in one SKIP
# line; gpu_bench is built, so that the GPU machine's link is CI's).
GPU_PROGS = $(if $(filter 1,$(CUDA)),$(addprefix $(BUILD)/,gpu_tests gpu_bench gpu_selftest \
              $(if $(CUDNN_HEADER),cudnn_values cudnn_check)))
test: all $(BUILD)/unit_tests $(if $(filter 1,$(MPI)),$(BUILD)/mpi_tests) $(BUILD)/train_bench $(BUILD)/comm_bench \
      $(GPU_PROGS)
	$(TEST_ENV) MESH_BUILD=$(BUILD) MESH_MPI=$(MPI) MESH_CUDA=$(CUDA) tests/run.sh

asan:
	$(MAKE) BUILD=build-asan SAN=1 test

# ThreadSanitizer over the unit tests that run ranks as threads: the
# communicators (threads, TCP; a communication queue's thread beside the
# rank's, comm_async.c), the executor on several ranks (the overlapped
# gradient sync) and the guarded device, 3 steps of each run
# (MESH_UNIT_STEPS, as make asan). Ends with `N passed, N failed`.
TSAN_TESTS = $(shell sed -n 's/^TEST(\(comm_[a-z0-9_]*\|parallel_[a-z0-9_]*\|exec_guarded[a-z0-9_]*\|kcpu_gemm_[a-z0-9_]*\))$$/\1/p' \
               tests/unit/test_list.h tests/unit/test_list_kcpu_dense.h)
tsan:
	$(MAKE) BUILD=build-tsan SAN=thread build-tsan/unit_tests
	OPENBLAS_NUM_THREADS=1 $(SAN_STEPS) TSAN_OPTIONS="halt_on_error=1 exitcode=66" build-tsan/unit_tests $(TSAN_TESTS) \
	    >build-tsan/tsan.out 2>&1; rc=$$?; cat build-tsan/tsan.out; \
	    sed -n 's/^# \([0-9]* passed, [0-9]* failed\)$$/\1/p' build-tsan/tsan.out; exit $$rc

# The central guarantee on meshes no one picked (tests/sweep/mesh_sweep.py;
# make test runs 40 of seed 1): a failure prints the commands that make
# it again, and the seed and case number find it again.
SWEEP_SECONDS ?= 600
SWEEP_SEED    ?= $(shell date +%s)
sweep: all
	python3 tests/sweep/mesh_sweep.py --build $(BUILD) --seconds $(SWEEP_SECONDS) --seed $(SWEEP_SEED)

sweep-gpu: all $(BUILD)/meshrun_emu
	python3 tests/sweep/mesh_sweep.py --build $(BUILD) --device cuda --seconds $(SWEEP_SECONDS) --seed $(SWEEP_SEED)

# Benchmarks print numbers measured side by side in one run; they never
# fail on a number (tests/bench/run.sh).
# (with CUDA=1 the kernels' benchmark too: tests/gpu/gpu_bench.c's ratios to
# cuBLAS and to a device copy, on a GPU; without one it says so)
bench: all $(BUILD)/train_bench $(BUILD)/comm_bench $(if $(filter 1,$(CUDA)),$(BUILD)/gpu_bench)
	MESHC=$(BUILD)/meshc TRAIN_BENCH=$(BUILD)/train_bench COMM_BENCH=$(BUILD)/comm_bench \
	  GPU_BENCH=$(if $(filter 1,$(CUDA)),$(BUILD)/gpu_bench) tests/bench/run.sh

# (the runtime's internals, and what they use: the CPU kernels' packing)
$(BUILD)/comm_bench: tests/bench/comm_bench.c $(BUILD)/libmeshrt.a $(KCUDA_LIB) $(BUILD)/libmeshkcpu.a \
                     $(BUILD)/libmeshcomp.a $(BUILD)/libmeshlang.a
	$(CC) $(CFLAGS) $(SAN_CFLAGS) $(ALL_LDFLAGS) -Iruntime -o $@ $< -Wl,--start-group $(filter %.a,$^) -Wl,--end-group \
	  $(YAML_LIBS) $(BLAS_LIBS) $(PCRE_LIBS) $(MPI_LIBS) $(CUDA_LIBS) $(LDLIBS)

$(BUILD)/train_bench: tests/bench/train_bench.c $(BUILD)/libmesh.a
	$(CC) -std=c11 -O2 -Wall -Wextra -Werror $(SAN_CFLAGS) $(ALL_LDFLAGS) -Iruntime $(BLAS_CFLAGS) -o $@ $< $(BUILD)/libmesh.a \
	  $(YAML_LIBS) $(BLAS_LIBS) $(PCRE_LIBS) $(MPI_LIBS) $(CUDA_LIBS) $(LDLIBS)

check-exports: $(BUILD)/libmesh.a $(BUILD)/libmesh.so
	tests/check-exports.sh $^

# ---- Front end (flex + bison) -------------------------------------------

# Check the tools once per build folder, with a message that says what to do.
$(TOOLS_OK):
	@command -v $(BISON) >/dev/null 2>&1 || { \
	  echo "error: $(BISON) not found (need GNU Bison >= $(BISON_MIN)); run \`make deps\`" >&2; exit 1; }
	@v=$$($(BISON) --version | sed -n '1s/^.* \([0-9][0-9.]*\)$$/\1/p'); \
	 if [ -z "$$v" ]; then \
	   echo "error: cannot read the version of $(BISON) (need GNU Bison >= $(BISON_MIN))" >&2; exit 1; \
	 elif [ "$$(printf '%s\n' "$(BISON_MIN)" "$$v" | sort -V | head -n 1)" != "$(BISON_MIN)" ]; then \
	   echo "error: $(BISON) is version $$v, mesh needs >= $(BISON_MIN); run \`make deps\`" >&2; exit 1; \
	 fi
	@command -v $(FLEX) >/dev/null 2>&1 || { \
	  echo "error: $(FLEX) not found; run \`make deps\`" >&2; exit 1; }
	@mkdir -p $(@D) && touch $@

$(GEN)/parser.c $(GEN)/parser.h &: lang/parser.y | $(TOOLS_OK)
	@mkdir -p $(@D)
	$(BISON) $(BISONFLAGS) -d -o $(GEN)/parser.c lang/parser.y

$(GEN)/lexer.c $(GEN)/lexer.h &: lang/lexer.l | $(TOOLS_OK)
	@mkdir -p $(@D)
	$(FLEX) --header-file=$(GEN)/lexer.h -o $(GEN)/lexer.c lang/lexer.l

# Objects that may include a generated header wait for both headers; after
# the first build, the -MMD dependency files track the real includes.
$(LANG_OBJ) $(COMPILER_OBJ) $(UNIT_OBJ) $(FUZZ_OBJ): | $(GEN_H)

$(BUILD)/libmeshlang.a: $(LANG_OBJ)
	@rm -f $@
	$(AR) rcs $@ $^

# ---- meshc --------------------------------------------------------------

# The standard library folder of the source tree (the folder holding std/);
# meshc tries -I, $MESH_PATH and <exe>/../share/mesh before it.
$(OBJ)/compiler/meshc.o $(FUZZ_OBJ): CPPFLAGS += -DMESH_STD_DIR='"$(abspath lang)"' -Icompiler

$(BUILD)/libmeshcomp.a: $(filter-out $(OBJ)/compiler/meshc.o,$(COMPILER_OBJ))
	@rm -f $@
	$(AR) rcs $@ $^

$(COMPILER_OBJ): CPPFLAGS += $(YAML_CFLAGS)

$(BUILD)/meshc: $(OBJ)/compiler/meshc.o $(BUILD)/libmeshcomp.a $(BUILD)/libmeshlang.a $(BUILD)/libmesh.a
	$(CC) $(ALL_LDFLAGS) -o $@ $^ $(YAML_LIBS) $(BLAS_LIBS) $(PCRE_LIBS) $(MPI_LIBS) $(CUDA_LIBS) $(LDLIBS)

# ---- libmesh and meshrun ------------------------------------------------

# libmesh carries the front end and the compiler (mesh_compile) inside it.
# Their symbols are made local, so an embedding program sees only mesh_*:
# the static library is one partially linked object whose other globals
# objcopy localizes; the shared one hides them with its version script.
# But for DW.ref.*: the C++ kernels' hidden COMDAT pointers to the
# exception personality. Made local, they still claim their COMDAT group,
# so a static libstdc++ linked after them drops its own copy and cannot
# resolve its references (a PIE link fails, as on the GPU machine's gcc).
LIBMESH_OBJ = $(RUNTIME_OBJ) $(KCPU_OBJ) $(CUDA_OBJ) $(LANG_OBJ) $(filter-out $(OBJ)/compiler/meshc.o,$(COMPILER_OBJ))

$(BUILD)/libmesh.a: $(LIBMESH_OBJ)
	@rm -f $@
	$(LD) -r -o $(BUILD)/libmesh-all.o $^
	$(OBJCOPY) --wildcard --keep-global-symbol='mesh_*' --keep-global-symbol='DW.ref.*' $(BUILD)/libmesh-all.o
	$(AR) rcs $@ $(BUILD)/libmesh-all.o

# (the same objects: every one is position-independent, see the pattern
# rules, so each source is compiled once for both libraries)
$(BUILD)/libmesh.so: $(LIBMESH_OBJ) runtime/libmesh.map
	$(CC) $(ALL_LDFLAGS) $(SO_LDFLAGS) -o $@ $(LIBMESH_OBJ) $(YAML_LIBS) $(BLAS_LIBS) $(PCRE_LIBS) $(MPI_LIBS) $(CUDA_LIBS) $(LDLIBS)
	ln -sf libmesh.so $(BUILD)/$(SONAME)

# the runtime's compile API sees the compiler's headers and the std folder
# (by #include "..." only: compiler/sched.h must not stand for <sched.h>)
$(RUNTIME_OBJ): CPPFLAGS += -iquote compiler -Ikernels/cpu $(BLAS_CFLAGS) $(YAML_CFLAGS) -DMESH_STD_DIR='"$(abspath lang)"'
$(LIBMESH_OBJ): | $(GEN_H)
$(LIBMESH_OBJ): CPPFLAGS += $(YAML_CFLAGS)

# The MPI communicator: MESH_MPI says whether it is built (else its stubs
# say libmesh has no MPI). It is rebuilt, and with it what links it, when
# the folder's MPI setting changes; MPI=1 without Open MPI stops here.
$(OBJ)/runtime/comm_mpi.o: CPPFLAGS += $(MPI_CFLAGS) -DMESH_MPI=$(MPI)
$(OBJ)/runtime/comm_mpi.o: $(BUILD)/.mpi

$(BUILD)/.mpi: FORCE
	@if [ "$(MPI)" = 1 ] && ! $(PKG_CONFIG) --exists ompi-c; then \
	  echo "error: MPI=1 needs Open MPI (pkg-config ompi-c, from libopenmpi-dev): run \`make deps\`, or build without MPI: make MPI=0" >&2; \
	  exit 1; fi
	@mkdir -p $(@D); [ "$$(cat $@ 2>/dev/null)" = "$(MPI)" ] || echo "$(MPI)" >$@

# The NCCL communicator, the CUDA device (runtime/device_cuda.c, with the
# GPU probe), the executor's CUDA kernel table (runtime/kern_cuda.c), and
# the NCCL test (device buffers through the CUDA runtime):
# MESH_CUDA says whether they are built for CUDA (else the stubs say
# libmesh has none). They are rebuilt, and with them what links them, when
# the folder's CUDA setting (or CUDA_HOME, NCCL_HOME) changes; CUDA=1
# without the toolkit's and NCCL's headers stops here.
NCCL_OBJ = $(NCCL_SRC:%.c=$(OBJ)/%.o) $(OBJ)/runtime/device_cuda.o $(OBJ)/runtime/kern_cuda.o \
           $(OBJ)/tests/unit/test_comm_nccl.o
$(NCCL_OBJ): CPPFLAGS += $(CUDA_CFLAGS) -DMESH_CUDA=$(CUDA)
$(OBJ)/runtime/kern_cuda.o $(OBJ)/runtime/device_cuda.o $(NCCL_SRC:%.c=$(OBJ)/%.o): CPPFLAGS += -Ikernels/cuda
$(NCCL_OBJ): $(BUILD)/.cuda

CUDA_STAMP = $(if $(filter 1,$(CUDA)),1 $(CUDA_HOME) $(NCCL_HOME) ptxas-reports,0)
$(BUILD)/.cuda: FORCE
	@if [ "$(CUDA)" = 1 ]; then for h in $(CUDA_HOME)/include/cuda_runtime.h $(NCCL_HOME)/include/nccl.h; do \
	  [ -f "$$h" ] || { echo "error: CUDA=1 needs $$h (the CUDA toolkit with NCCL): set CUDA_HOME (and NCCL_HOME), or build without CUDA: make CUDA=0" >&2; exit 1; }; \
	done; fi
	@mkdir -p $(@D); [ "$$(cat $@ 2>/dev/null)" = "$(CUDA_STAMP)" ] || echo "$(CUDA_STAMP)" >$@

# CUDA kernels (CUDA=1): each kernels/cuda/NAME.cu by $(NVCC) into libmesh,
# with its dependencies tracked; rebuilt when the CUDA setting changes.
# ptxas's report of each kernel's registers and spills goes to NAME.ptxas
# beside the object (tests/gpu/ptxas_check.sh holds them to their budgets);
# anything else on nvcc's stderr is shown as usual.
$(CUDA_OBJ): $(BUILD)/.cuda
$(OBJ)/%.o: %.cu $(OBJ)/.pic
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) $(NVCC_WARN) $(if $(filter %/attention_wg.cu,$<),$(CUDA_ARCH_WGMMA),$(CUDA_ARCH)) \
	  -Iruntime -Ikernels/cuda -Xcompiler -fPIC -Xptxas -v -MMD -MP -c -o $@ $< 2>$(@:.o=.ptxas); \
	  rc=$$?; grep -v -e '^ptxas info' -e '^    [0-9]* bytes stack frame' $(@:.o=.ptxas) >&2; exit $$rc

-include $(CUDA_OBJ:.o=.d)

# The CUDA kernels' tests against the CPU reference (tests/gpu/gpu_tests*.c;
# without a GPU they print one SKIP line and pass) and their benchmark
# (tests/gpu/gpu_bench.c, also raw cuBLASLt/cuBLAS): host C over kcuda.h
# and kcpu.h, linking the kernels' own archive, whose kcuda_* symbols stay
# global (libmesh keeps only mesh_*).
GPU_TESTS_SRC = $(wildcard tests/gpu/gpu_tests*.c)
GPU_TEST_OBJ = $(GPU_TESTS_SRC:%.c=$(OBJ)/%.o) $(OBJ)/tests/gpu/gpu_bench.o
$(GPU_TEST_OBJ): CPPFLAGS += -Ikernels/cpu -Ikernels/cuda $(CUDA_CFLAGS) $(BLAS_CFLAGS)
-include $(GPU_TEST_OBJ:.o=.d)

ifeq ($(CUDA),1)
$(GPU_TEST_OBJ): $(BUILD)/.cuda

$(BUILD)/libmeshkcuda.a: $(CUDA_OBJ)
	@rm -f $@
	$(AR) rcs $@ $^

$(BUILD)/gpu_tests: $(GPU_TESTS_SRC:%.c=$(OBJ)/%.o) $(BUILD)/libmeshkcuda.a $(BUILD)/libmeshkcpu.a
	$(CC) $(ALL_LDFLAGS) -o $@ $^ $(BLAS_LIBS) $(CUDA_LIBS) $(LDLIBS)

$(BUILD)/gpu_bench: $(OBJ)/tests/gpu/gpu_bench.o $(BUILD)/libmeshkcuda.a
	$(CC) $(ALL_LDFLAGS) -o $@ $^ $(CUDA_LIBS) $(LDLIBS)

# The emulation's self-tests built by nvcc for the GPU (sm_90a: wgmma):
# a GPU runs their semantics cases, the instructions' layouts first,
# against the emulation's expectations (tests/gpu/emu/selftest.cu's
# on_a_gpu); without a GPU, one SKIP line
$(OBJ)/tests/gpu/gpu_selftest.o: tests/gpu/emu/selftest.cu $(BUILD)/.cuda
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) $(NVCC_WARN) $(CUDA_ARCH_WGMMA) -Ikernels/cuda -MMD -MP -c -o $@ $<
-include $(OBJ)/tests/gpu/gpu_selftest.d

$(BUILD)/gpu_selftest: $(OBJ)/tests/gpu/gpu_selftest.o
	$(CC) $(ALL_LDFLAGS) -o $@ $^ $(CUDA_LIBS) $(LDLIBS)

# kernels/cuda/cudnn_api.h's values against cuDNN's header (CUDNN_HEADER),
# by the compiler (tests/run.sh's gpu section runs it)
$(BUILD)/cudnn_values: tests/gpu/cudnn_values.c kernels/cuda/cudnn_api.h $(CUDNN_HEADER)
	$(CC) $(CPPFLAGS) $(ALL_CFLAGS) -Wno-deprecated-declarations $(CUDA_CFLAGS) -Ikernels/cuda -o $@ $<

# whether cuDNN has engines for the attention's graphs, asked without a
# GPU (tests/gpu/cudnn_check.c; tests/run.sh's gpu section)
$(OBJ)/tests/gpu/cudnn_check.o: CPPFLAGS += -Ikernels/cuda
$(BUILD)/cudnn_check: $(OBJ)/tests/gpu/cudnn_check.o $(BUILD)/libmeshkcuda.a
	$(CC) $(ALL_LDFLAGS) -o $@ $^ $(CUDA_LIBS) $(LDLIBS)
else
$(BUILD)/gpu_tests $(BUILD)/gpu_bench $(BUILD)/gpu_selftest:
	@echo "error: $@ needs the CUDA kernels: make CUDA=1 BUILD=$(BUILD) $@" >&2; exit 1
endif


# meshrun is a program over the public API (mesh.h) alone: it links
# libmesh.a and nothing else of the tree (tests/run.sh checks that it calls
# no mesh__ internals).
$(BUILD)/meshrun: $(OBJ)/runtime/meshrun.o $(BUILD)/libmesh.a
	$(CC) $(ALL_LDFLAGS) -o $@ $^ $(YAML_LIBS) $(BLAS_LIBS) $(PCRE_LIBS) $(MPI_LIBS) $(CUDA_LIBS) $(LDLIBS)

# ---- Tests --------------------------------------------------------------

$(OBJ)/tests/unit/%.o: CPPFLAGS += -Itests/unit -Icompiler -Ikernels/cpu -DMESH_STD_DIR='"$(abspath lang)"'
$(MPI_TEST_OBJ): CPPFLAGS += -Itests/unit -Icompiler

$(KCPU_OBJ): CPPFLAGS += -Ikernels/cpu $(BLAS_CFLAGS)

$(BUILD)/libmeshkcpu.a: $(KCPU_OBJ)
	@rm -f $@
	$(AR) rcs $@ $^

# The runtime's objects with their internal symbols global (comm_*, ...),
# for the unit tests; libmesh.a keeps only mesh_* global.
$(BUILD)/libmeshrt.a: $(RUNTIME_OBJ)
	@rm -f $@
	$(AR) rcs $@ $^

$(BUILD)/unit_tests: $(UNIT_OBJ) $(BUILD)/libmeshrt.a $(KCUDA_LIB) $(BUILD)/libmeshkcpu.a $(BUILD)/libmeshcomp.a \
                     $(BUILD)/libmeshlang.a
	$(CC) $(ALL_LDFLAGS) -o $@ $^ $(YAML_LIBS) $(BLAS_LIBS) $(PCRE_LIBS) $(MPI_LIBS) $(CUDA_LIBS) $(LDLIBS)

# The MPI tests' program (tests/mpi/mpi_tests.c), started by tests/run.sh
# under mpirun; it shares the communicator cases with the unit tests.
$(BUILD)/mpi_tests: $(MPI_TEST_OBJ) $(OBJ)/tests/unit/comm_cases.o $(BUILD)/libmeshrt.a $(KCUDA_LIB) $(BUILD)/libmeshkcpu.a \
                    $(BUILD)/libmeshcomp.a $(BUILD)/libmeshlang.a
	$(CC) $(ALL_LDFLAGS) -o $@ $(filter %.o,$^) -Wl,--start-group $(filter %.a,$^) -Wl,--end-group \
	  $(YAML_LIBS) $(BLAS_LIBS) $(PCRE_LIBS) $(MPI_LIBS) $(CUDA_LIBS) $(LDLIBS)

# ---- CUDA kernels on a CPU emulation (tests/gpu/emu) ----------------------
# The CUDA kernels' tests (tests/gpu/gpu_tests*.c, unchanged) on a machine
# without a GPU: the kernels, kernels/cuda/*.cu and *.h unchanged but for
# their <<<...>>> launches (rewritten at build time into $(BUILD)/emu-gen/
# by tests/gpu/emu/launch_rewrite.py, nothing else), compiled by g++ as
# C++17 against the CPU emulation in tests/gpu/emu/ (its include/ first: the
# CUDA runtime, the device side, mma/ldmatrix/cp.async, cuBLASLt and cub;
# no CUDA toolkit)
# with cuda_runtime.h force-included as nvcc does; linked with gpu_tests*.c
# and the CPU reference. Every case runs, in fp32, bf16 and fp16; the
# output ends with `N passed, N failed` (tests/gpu/emu/README.md).
#   make gpu-emu        build in $(EMU_BUILD) (build/, beside `make test`'s
#                       objects, which it shares) and run (-j2 builds in parallel)
#   make gpu-emu-tsan   the same under ThreadSanitizer, in $(EMU_TSAN_BUILD)
#                       (build-tsan/, sharing `make tsan`'s)
# The emulator's own machinery (exec.cpp: fibers, barriers) is not
# instrumented; under TSan it tells ThreadSanitizer exactly the
# happens-before edges CUDA promises (-DEMU_TSAN), under ASan (SAN=1) which
# dynamic shared memory a block has none of (-DEMU_ASAN).
EMU_DIR      = tests/gpu/emu
EMU_CXX     ?= g++
# How a * b + c is rounded (EMU_CONTRACT): nvcc fuses such expressions
# into one FMA where it chooses (its default), so the kernels' bits must
# not depend on the choice where they claim the same bits on two paths.
# `make gpu-emu` fuses where g++ chooses (fast, with -mfma, on a CPU with
# FMA), `make gpu-emu-tsan` nowhere (off): two different choices, each
# run through the same bit-for-bit checks (the emulated __fadd_rn and
# __fmul_rn stay apart under either: emu/device.h).
EMU_FMA_CPU := $(shell grep -qw fma /proc/cpuinfo 2>/dev/null && echo 1)
EMU_CONTRACT ?= $(if $(EMU_FMA_CPU),fast,off)
EMU_CXXFLAGS ?= -std=c++17 -O2 -g -Wall -Wextra $(if $(filter fast,$(EMU_CONTRACT)),-mfma) \
                -ffp-contract=$(EMU_CONTRACT) -pthread
EMU_GEN      = $(BUILD)/emu-gen
EMU_OBJ      = $(BUILD)/emu-obj
EMU_KSRC     = $(wildcard kernels/cuda/*.cu)
EMU_KGEN     = $(addprefix $(EMU_GEN)/,$(wildcard kernels/cuda/*.cu kernels/cuda/*.h))
EMU_KOBJ     = $(EMU_KSRC:%.cu=$(EMU_OBJ)/%.o)
EMU_RT_OBJ   = $(patsubst $(EMU_DIR)/%.cpp,$(EMU_OBJ)/emu/%.o,$(filter-out %/cudnn.cpp,$(wildcard $(EMU_DIR)/*.cpp)))
# the emulated cuDNN, a library of its own that attention_cudnn.cu's dlopen
# finds as it finds NVIDIA's; it calls the emulated runtime in the program,
# which exports it (-rdynamic)
EMU_CUDNN    = $(BUILD)/emu-driver/libcudnn.so.9
EMU_TEST_OBJ = $(GPU_TESTS_SRC:%.c=$(EMU_OBJ)/%.o) $(EMU_OBJ)/tests/gpu/gpu_bench.o
EMU_SAN      = $(SAN_CFLAGS)
$(EMU_OBJ)/emu/exec.o: EMU_SAN = $(if $(filter thread,$(SAN)),-DEMU_TSAN)$(if $(filter 1,$(SAN)),-DEMU_ASAN)
.SECONDARY: $(EMU_KGEN) $(EMU_GEN)/$(EMU_DIR)/selftest.cu

.PHONY: gpu-emu gpu-emu-tsan gpu-rehearse gpu-emu-cov gpu-emu-faults torch-gpt2
# tests/gpu/emu/run.sh: the emulator's self-tests (selftest.cu), then every
# case with a block's threads run first to last, and (not under TSan, which
# sees every unordered access anyway) last to first; one summary at the end
EMU_BUILD      ?= build
EMU_TSAN_BUILD ?= build-tsan
gpu-emu:
	$(MAKE) BUILD=$(EMU_BUILD) $(addprefix $(EMU_BUILD)/,emu_selftest gpu_tests_emu unit_tests_emu meshrun_emu meshc \
	  gpu_bench_emu ignoring_emu)
	$(EMU_DIR)/run.sh $(EMU_BUILD) forward reverse

gpu-emu-tsan:
	$(MAKE) BUILD=$(EMU_TSAN_BUILD) SAN=thread EMU_CONTRACT=off $(addprefix $(EMU_TSAN_BUILD)/,emu_selftest gpu_tests_emu unit_tests_emu)
	TSAN_OPTIONS="halt_on_error=1 exitcode=66" EMU_TSAN=1 $(EMU_DIR)/run.sh $(EMU_TSAN_BUILD) forward

# GPT-2 124M itself (examples/gpt2.mesh, full size, fp32, one rank) trained
# next to PyTorch (tests/torch/gpt2-124m.sh; make test's torch section
# checks the models shrunk): some 4.5 minutes, 5 GB
torch-gpt2: all
	tests/torch/gpt2-124m.sh $(BUILD)

# tests/gpu/run.sh, the GPU machine's script, rehearsed whole on the
# emulation at cut sizes (its plumbing, not the GPU; results in OUT,
# default tests/gpu/out/): some 18 minutes here (budget 1800 s)
gpu-rehearse:
	MESH_GPU_REHEARSE=1 MESH_GPU_BUILD=$(EMU_BUILD) tests/gpu/run.sh

# What of the GPU code (kernels/cuda, the CUDA device, kernel table and
# NCCL communicator) `make gpu-emu`'s tests never run: built with gcc's
# coverage in $(EMU_COV_BUILD), run forward, then the lines and template
# instantiations never run, listed by tests/gpu/emu/coverage.py (and into
# $(EMU_COV_BUILD)/gpu-coverage.txt). What is listed would first run on a
# GPU, if ever. Then every unit test too, and the runtime's other files'
# lines that neither ran. About 8 minutes here; not in CI. (`all` too:
# tests/gpu/run.sh's rehearsal, among the runs, builds it in that folder,
# and would link it without the coverage flags.)
EMU_COV_BUILD ?= build-cov
gpu-emu-cov:
	$(MAKE) BUILD=$(EMU_COV_BUILD) SAN=cov all $(addprefix $(EMU_COV_BUILD)/,emu_selftest gpu_tests_emu unit_tests_emu \
	  meshrun_emu meshc gpu_bench_emu ignoring_emu)
	find $(EMU_COV_BUILD) -name '*.gcda' -delete
	$(EMU_DIR)/run.sh $(EMU_COV_BUILD) forward
	OPENBLAS_NUM_THREADS=1 $(EMU_COV_BUILD)/unit_tests_emu > $(EMU_COV_BUILD)/unit-tests-cov.log 2>&1 || \
	  { tail -n 20 $(EMU_COV_BUILD)/unit-tests-cov.log; exit 1; }
	python3 $(EMU_DIR)/coverage.py $(EMU_COV_BUILD) --runtime | tee $(EMU_COV_BUILD)/gpu-coverage.txt

# What meshrun --device cuda does when a GPU or NCCL call fails: each kind
# of failure the emulation injects (EMU_FAIL: an allocation, a stream,
# event or communicator made, a kernel that faults, a cuBLASLt product, an
# NCCL operation that never ends) at FAULT_POINTS calls spread over a run
# of dp 2 ZeRO-3 and one of tp 2 x pp 2 in bf16 (ranks as threads), and
# one of pp 2 under mpirun (FAULT_PLANS: some of these), each judged: a clear
# error naming a rank (or, if the failure was survived, the same losses),
# no hang, no crash, nothing leaked, and a checkpoint folder a clean run
# resumes from to the same losses (tests/gpu/emu/faults.sh). About 15
# minutes here at the default 4; not in CI.
FAULT_POINTS ?= 4
gpu-emu-faults:
	$(MAKE) BUILD=$(EMU_BUILD) $(addprefix $(EMU_BUILD)/,meshrun_emu meshc)
	$(EMU_DIR)/faults.sh $(EMU_BUILD) $(FAULT_POINTS)

$(EMU_GEN)/%: % $(EMU_DIR)/launch_rewrite.py
	@mkdir -p $(@D)
	python3 $(EMU_DIR)/launch_rewrite.py $< $@

$(EMU_OBJ)/%.o: $(EMU_GEN)/%.cu | $(EMU_KGEN)
	@mkdir -p $(@D)
	$(EMU_CXX) $(EMU_CXXFLAGS) -Wno-unknown-pragmas -fno-extern-tls-init $(SAN_CFLAGS) -x c++ \
	  -I$(EMU_DIR)/include -Iruntime -include cuda_runtime.h -MMD -MP -c -o $@ $<

$(EMU_OBJ)/emu/%.o: $(EMU_DIR)/%.cpp
	@mkdir -p $(@D)
	$(EMU_CXX) $(EMU_CXXFLAGS) -Werror $(EMU_SAN) -I$(EMU_DIR)/include -MMD -MP -c -o $@ $<

$(EMU_TEST_OBJ): $(EMU_OBJ)/%.o: %.c
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(ALL_CFLAGS) -isystem $(EMU_DIR)/include -Ikernels/cpu -Ikernels/cuda \
	  $(BLAS_CFLAGS) -MMD -MP -c -o $@ $<

# kcuda_available()'s dlopen("libcuda.so.1") finds this stub: the test's RPATH (not
# RUNPATH, which a dlopen made through a sanitizer's interceptor would not search)
$(BUILD)/emu-driver/libcuda.so.1: $(EMU_DIR)/libcuda_stub.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -fPIC -shared -Wl,-soname,libcuda.so.1 -o $@ $<

$(EMU_CUDNN): $(EMU_DIR)/cudnn.cpp
	@mkdir -p $(@D)
	$(EMU_CXX) $(EMU_CXXFLAGS) -Werror $(EMU_SAN) -I$(EMU_DIR)/include -fPIC -shared -Wl,-soname,libcudnn.so.9 \
	  -o $@ $<

$(BUILD)/gpu_tests_emu: $(GPU_TESTS_SRC:%.c=$(EMU_OBJ)/%.o) $(EMU_KOBJ) $(EMU_RT_OBJ) $(BUILD)/libmeshkcpu.a \
                        $(BUILD)/emu-driver/libcuda.so.1 $(EMU_CUDNN)
	$(EMU_CXX) $(ALL_LDFLAGS) -pthread -rdynamic -o $@ $(filter %.o %.a,$^) $(BLAS_LIBS) \
	  -Wl,--disable-new-dtags,-rpath,'$$ORIGIN/emu-driver' $(LDLIBS)

# the benchmark on the emulation (cuBLAS's GemmEx too: cublas.cpp), at
# --tiny sizes: tests/gpu/run.sh's rehearsal runs it (MESH_GPU_REHEARSE=1)
$(BUILD)/gpu_bench_emu: $(EMU_OBJ)/tests/gpu/gpu_bench.o $(EMU_KOBJ) $(EMU_RT_OBJ) $(BUILD)/emu-driver/libcuda.so.1 \
                        $(EMU_CUDNN)
	$(EMU_CXX) $(ALL_LDFLAGS) -pthread -rdynamic -o $@ $(filter %.o %.a,$^) \
	  -Wl,--disable-new-dtags,-rpath,'$$ORIGIN/emu-driver' $(LDLIBS)

$(BUILD)/emu_selftest: $(EMU_OBJ)/$(EMU_DIR)/selftest.o $(EMU_RT_OBJ)
	$(EMU_CXX) $(ALL_LDFLAGS) -pthread -o $@ $^ $(LDLIBS)

# The executor's GPU path on the emulation: the unit tests with the CUDA
# device (runtime/device_cuda.c) and the executor's CUDA kernel table
# (runtime/kern_cuda.c) built for CUDA against the emulation's runtime API,
# linked with the emulated kernels (ahead of libmeshrt.a's CPU-only
# builds of the two); and the NCCL communicator (runtime/comm_nccl*.c) with
# its tests, built for CUDA against the emulated NCCL (nccl.cpp: ranks as
# threads, each on an emulated GPU of MESH_EMU_GPUS). run.sh runs the unit
# tests that need a GPU and fails if one of them skips.
EMU_RT_CUDA = $(EMU_OBJ)/runtime/device_cuda.o $(EMU_OBJ)/runtime/kern_cuda.o $(NCCL_SRC:%.c=$(EMU_OBJ)/%.o) \
              $(EMU_OBJ)/tests/unit/test_comm_nccl.o

$(EMU_RT_CUDA): $(EMU_OBJ)/%.o: %.c
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(ALL_CFLAGS) -DMESH_CUDA=1 -isystem $(EMU_DIR)/include -Ikernels/cuda -MMD -MP -c -o $@ $<

# What both programs below link besides their own objects, and how.
EMU_LINK_WITH = $(filter-out %/test_comm_nccl.o,$(EMU_RT_CUDA)) $(EMU_KOBJ) $(EMU_RT_OBJ) $(BUILD)/libmeshrt.a \
                $(BUILD)/libmeshkcpu.a $(BUILD)/libmeshcomp.a $(BUILD)/libmeshlang.a $(BUILD)/emu-driver/libcuda.so.1 \
                $(EMU_CUDNN)
EMU_LINK = $(EMU_CXX) $(ALL_LDFLAGS) -pthread -rdynamic -o $@ $(filter %.o,$^) -Wl,--start-group $(filter %.a,$^) \
           -Wl,--end-group $(YAML_LIBS) $(BLAS_LIBS) $(PCRE_LIBS) $(MPI_LIBS) \
           -Wl,--disable-new-dtags,-rpath,'$$ORIGIN/emu-driver' $(LDLIBS)

$(BUILD)/unit_tests_emu: $(filter-out %/test_comm_nccl.o,$(UNIT_OBJ)) $(EMU_OBJ)/tests/unit/test_comm_nccl.o \
                         $(EMU_LINK_WITH)
	$(EMU_LINK)

# meshrun on the emulation (the same objects as unit_tests_emu's): what a
# user runs with --device cuda, ranks as threads over the emulated NCCL
# (MESH_EMU_GPUS); tests/gpu/emu/meshrun.sh rehearses it.
$(BUILD)/meshrun_emu: $(OBJ)/runtime/meshrun.o $(EMU_LINK_WITH)
	$(EMU_LINK)

# An embedding program whose ranks ignore a failed step (ignoring.c;
# meshrun.sh runs it).
$(BUILD)/ignoring_emu: $(OBJ)/$(EMU_DIR)/ignoring.o $(EMU_LINK_WITH)
	$(EMU_LINK)

-include $(EMU_KOBJ:.o=.d) $(EMU_RT_OBJ:.o=.d) $(EMU_TEST_OBJ:.o=.d) $(EMU_OBJ)/$(EMU_DIR)/selftest.d \
         $(EMU_RT_CUDA:.o=.d)

# ---- Fuzzing (clang + libFuzzer) ----------------------------------------

# The corpus folder keeps what libFuzzer finds between runs; it is seeded
# from tests/fuzz/seeds/, examples/*.mesh and lang/std/*.mesh on every run.
# Crashes are written to $(FUZZ_BUILD)/crash-* (and leak-*, timeout-*).
FUZZ_ARGS = -max_total_time=$(FUZZ_SECONDS) -max_len=65536 -timeout=10 \
            -rss_limit_mb=2048 -print_final_stats=1 \
            -artifact_prefix=$(FUZZ_BUILD)/

fuzz:
	$(MAKE) BUILD=$(FUZZ_BUILD) SAN=fuzz CC=$(FUZZ_CC) fuzz-build
	@mkdir -p $(FUZZ_BUILD)/corpus
	@for f in tests/fuzz/seeds/* examples/*.mesh lang/std/*.mesh; do \
	  [ -f "$$f" ] || continue; \
	  cp "$$f" "$(FUZZ_BUILD)/corpus/seed-$$(printf '%s' "$$f" | tr '/' '_')"; \
	done
	$(FUZZ_BUILD)/fuzz_lang $(FUZZ_ARGS) -dict=tests/fuzz/mesh.dict $(FUZZ_BUILD)/corpus

# meshrun's side: plan text (seeds: the examples compiled small by this
# build's meshc, on several meshes) read, then stepped on the CPU's ranks.
FUZZ_PLAN_SMALL = train.global_batch=2,train.seq_len=16
FUZZ_PLAN_LM    = model.vocab=256,model.dim=64,model.heads=4,model.kv_heads=2,model.ffn_dim=64,model.layers=1,mesh.dp=1,mesh.tp=1,mesh.pp=1,mesh.ep=1,train.micro_batch=1,train.schedule=1f1b,train.virtual_stages=1,train.zero=0,train.sequence_parallel=false
FUZZ_PLAN_SEEDS = gpt-tiny: gpt-tiny:mesh.tp=2 gpt-tiny:mesh.pp=2,train.micro_batch=1 \
                  gpt-tiny:mesh.dp=2,train.micro_batch=1,train.zero=3 \
                  gpt-tiny:train.precision=bf16,train.recompute=full \
                  llama:$(FUZZ_PLAN_LM) moe:$(FUZZ_PLAN_LM),model.experts=4,model.top_k=2,mesh.ep=2
fuzz-plan:
	$(MAKE) BUILD=$(FUZZ_BUILD) SAN=fuzz CC=$(FUZZ_CC) fuzz-build
	@mkdir -p $(FUZZ_BUILD)/plan-corpus
	@i=0; for s in $(FUZZ_PLAN_SEEDS); do \
	  i=$$((i + 1)); ex=$${s%%:*}; sets=$$(printf '%s' "$(FUZZ_PLAN_SMALL),$${s#*:}" | sed 's/,$$//; s/,/ --set /g'); \
	  $(FUZZ_BUILD)/meshc --set $$sets examples/$$ex.mesh -o $(FUZZ_BUILD)/plan-corpus/seed-$$i-$$ex >/dev/null || exit 1; \
	done
	$(FUZZ_BUILD)/fuzz_plan $(FUZZ_ARGS) -dict=tests/fuzz/plan.dict $(FUZZ_BUILD)/plan-corpus

# checkpoints: a small GPT's two safetensors files, saved by the harness
# itself (its corpus' seeds), loaded mutated, then a training step.
fuzz-ckpt:
	$(MAKE) BUILD=$(FUZZ_BUILD) SAN=fuzz CC=$(FUZZ_CC) fuzz-build
	@mkdir -p $(FUZZ_BUILD)/ckpt-corpus
	MESH_FUZZ_SEEDS=$(FUZZ_BUILD)/ckpt-corpus $(FUZZ_BUILD)/fuzz_ckpt -runs=0 $(FUZZ_BUILD)/ckpt-corpus
	$(FUZZ_BUILD)/fuzz_ckpt $(FUZZ_ARGS) -dict=tests/fuzz/ckpt.dict $(FUZZ_BUILD)/ckpt-corpus

fuzz-ci:
	$(MAKE) fuzz FUZZ_SECONDS=15
	$(MAKE) fuzz-plan FUZZ_SECONDS=10
	$(MAKE) fuzz-ckpt FUZZ_SECONDS=5

fuzz-build: $(BUILD)/fuzz_lang $(BUILD)/fuzz_plan $(BUILD)/fuzz_ckpt $(BUILD)/meshc

$(BUILD)/fuzz_ckpt: $(OBJ)/tests/fuzz/fuzz_ckpt.o $(BUILD)/libmesh.a
	$(CC) $(ALL_LDFLAGS) -fsanitize=fuzzer -o $@ $^ $(YAML_LIBS) $(BLAS_LIBS) $(PCRE_LIBS) $(MPI_LIBS) $(CUDA_LIBS) $(LDLIBS)

$(BUILD)/fuzz_plan: $(OBJ)/tests/fuzz/fuzz_plan.o $(BUILD)/libmesh.a
	$(CC) $(ALL_LDFLAGS) -fsanitize=fuzzer -o $@ $^ $(YAML_LIBS) $(BLAS_LIBS) $(PCRE_LIBS) $(MPI_LIBS) $(CUDA_LIBS) $(LDLIBS)

$(BUILD)/fuzz_lang: $(OBJ)/tests/fuzz/fuzz_lang.o $(BUILD)/libmeshcomp.a $(BUILD)/libmeshlang.a $(BUILD)/libmesh.a
	$(CC) $(ALL_LDFLAGS) -fsanitize=fuzzer -o $@ $^ $(YAML_LIBS) $(BLAS_LIBS) $(PCRE_LIBS) $(MPI_LIBS) $(CUDA_LIBS) $(LDLIBS)

# ---- Install ------------------------------------------------------------

install: install-runtime install-compiler

# libmesh (static, and shared as libmesh.so.VERSION with the soname link and
# the development link), the public header, mesh.pc and meshrun.
install-runtime: $(BUILD)/libmesh.a $(BUILD)/libmesh.so $(BUILD)/meshrun
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(INCLUDEDIR)
	install -m 755 $(BUILD)/meshrun $(DESTDIR)$(BINDIR)/meshrun
	install -m 644 $(BUILD)/libmesh.a $(DESTDIR)$(LIBDIR)/libmesh.a
	install -m 755 $(BUILD)/libmesh.so $(DESTDIR)$(LIBDIR)/libmesh.so.$(VERSION)
	ln -sf libmesh.so.$(VERSION) $(DESTDIR)$(LIBDIR)/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(LIBDIR)/libmesh.so
	install -m 644 $(PUBLIC_HEADERS) $(DESTDIR)$(INCLUDEDIR)/
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(VERSION)|g' \
	  -e 's|@MPI_LIBS@|$(strip $(MPI_LIBS) $(CUDA_LIBS))|' -e 's|@MPI_PC@|$(MPI_PC)|' \
	  runtime/mesh.pc.in >$(DESTDIR)$(LIBDIR)/pkgconfig/mesh.pc

# meshc and the standard library it finds at <exe>/../share/mesh/std.
install-compiler: $(BUILD)/meshc
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(DATADIR)/mesh/std
	install -m 755 $(BUILD)/meshc $(DESTDIR)$(BINDIR)/meshc
	for f in lang/std/*.mesh; do \
	  [ ! -f "$$f" ] || install -m 644 "$$f" $(DESTDIR)$(DATADIR)/mesh/std/ || exit 1; \
	done

# ---- Convenience --------------------------------------------------------

deps:
	.ci/deps.sh

# `make demo` on a fresh machine: packages, build, every example, then
# train gpt-tiny on the shipped corpus on 8 ranks, threads of one process
# (dp 2 x tp 2 x pp 2: 2 micro-batches of 4 per data-parallel rank, the
# fewest 1F1B takes on 2 stages; one BLAS thread per rank, since the 8 ranks
# share the machine's cores), sample from its checkpoint with the one-rank
# plan (sampling needs tp = 1; a checkpoint loads into any mesh), and end
# with the run's summary: losses, throughput, memory and bytes sent per
# step beside the plan's (meshrun's output is kept in $(BUILD)/gpt-tiny-8.log).
demo:
	.ci/deps.sh --demo
	$(MAKE) all
	@n=0; bad=0; for f in examples/*.mesh; do \
	  [ -f "$$f" ] || continue; n=$$((n + 1)); \
	  echo "== $(BUILD)/meshc $$f"; \
	  $(BUILD)/meshc "$$f" || bad=$$((bad + 1)); \
	done; \
	echo "demo: $$n examples compiled, $$bad failed"; [ $$bad -eq 0 ] && [ $$n -gt 0 ]
	@mkdir -p $(BUILD)/data
	$(BUILD)/meshrun tokenize examples/data/devils-dictionary.txt -o $(BUILD)/data/devil.bin --val $(BUILD)/data/devil-val.bin
	$(BUILD)/meshc --set mesh.dp=2 --set mesh.tp=2 --set mesh.pp=2 --set train.micro_batch=4 examples/gpt-tiny.mesh -o $(BUILD)/gpt-tiny-8.plan
	@echo "$(BUILD)/meshrun $(BUILD)/gpt-tiny-8.plan --data $(BUILD)/data/devil.bin --val $(BUILD)/data/devil-val.bin --checkpoint $(BUILD)/gpt-tiny-ckpt --threads 1"
	@t0=$$(date +%s); \
	{ $(BUILD)/meshrun $(BUILD)/gpt-tiny-8.plan --data $(BUILD)/data/devil.bin --val $(BUILD)/data/devil-val.bin \
	    --checkpoint $(BUILD)/gpt-tiny-ckpt --threads 1; echo $$? >$(BUILD)/gpt-tiny-8.log.rc; } | tee $(BUILD)/gpt-tiny-8.log; \
	echo "$$(( $$(date +%s) - t0 ))" >$(BUILD)/gpt-tiny-8.log.s; exit "$$(cat $(BUILD)/gpt-tiny-8.log.rc)"
	$(BUILD)/meshrun sample examples/gpt-tiny.plan --checkpoint $(BUILD)/gpt-tiny-ckpt --prompt "MONEY, n. " --tokens 300
	@echo; echo "== demo: gpt-tiny trained on 8 ranks (dp 2 x tp 2 x pp 2) in $$(cat $(BUILD)/gpt-tiny-8.log.s) s; the run's summary:"; \
	grep '^step .* | loss ' $(BUILD)/gpt-tiny-8.log | tail -n 1; \
	grep ' | val loss ' $(BUILD)/gpt-tiny-8.log | tail -n 1; \
	grep -E '^meshrun: (memory|bytes|time)' $(BUILD)/gpt-tiny-8.log

clean:
	rm -rf build build-*/

# ---- Pattern rules ------------------------------------------------------

# Every object is position-independent (-fPIC), so that one set makes both
# libmesh.a and libmesh.so. $(OBJ)/.pic marks a build folder whose objects
# are: made once, it rebuilds those of an older folder, which were not.
$(OBJ)/.pic:
	@mkdir -p $(@D) && touch $@

$(OBJ)/%.o: %.c $(OBJ)/.pic
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(ALL_CFLAGS) -fPIC -c -o $@ $<

$(OBJ)/gen/%.o: $(GEN)/%.c $(OBJ)/.pic
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(ALL_CFLAGS) -fPIC -c -o $@ $<

-include $(ALL_OBJ:.o=.d) $(LIBMESH_OBJ:.o=.d)
