# The front door of libattn's build: a few words over CMake (CMakeLists.txt is the build).
#
#   make                  configure and build (Release) in build/
#   make test             build, run every test in build/, then again in build-asan/ under
#                         AddressSanitizer + UndefinedBehaviorSanitizer, then the Python
#                         package's tests (test-python); all must pass
#   make test-python      pip install PyTorch and JAX (PyPI) and this package into build/venv,
#                         run pytest
#   make test-clang       the suite once more, built by the other compiler (CC2, default clang) in
#                         build-clang/: Release, CPU only, no sanitizer pass (CI runs it after test)
#   make bench            build and run `attn bench`, the default CPU table (BENCH_ARGS adds options)
#   make install PREFIX=/usr/local
#   make format           clang-format -i on the C sources
#   make clean            remove build/, build-asan/ and build-clang/
#
# The compiler is CMake's choice (cc) unless CC names one: `CC=clang make test` (a build folder
# remembers its compiler; `make clean` first to switch).
# CI=true in the environment makes warnings errors (ATTN_WERROR=ON). CMAKE_ARGS adds options.
BUILD ?= build
ASAN_BUILD ?= build-asan
CC2_BUILD ?= build-clang
CC2 ?= clang
JOBS ?= 2
PREFIX ?= /usr/local
CMAKE ?= cmake
CTEST ?= ctest
CLANG_FORMAT ?= clang-format
BENCH_ARGS ?=
CMAKE_ARGS ?=
MAKEFLAGS += --no-print-directory

# override: also when CMAKE_ARGS is given on the command line (make test CMAKE_ARGS=...), which
# would otherwise replace this addition and build CI without -Werror.
ifeq ($(CI),true)
override CMAKE_ARGS += -DATTN_WERROR=ON
endif

# The sanitizers stop at the first error, print a stack, and also report leaks.
SAN_ENV = ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:halt_on_error=1 \
          UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

.PHONY: all build configure test test-release test-asan test-python test-clang bench install \
        format clean

all: build

# Configuring every time is cheap once the cache exists, and picks up a changed CMAKE_ARGS or CI.
configure:
	$(CMAKE) -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS)

build: configure
	$(CMAKE) --build $(BUILD) -j $(JOBS)

# One after the other, even under make -j: the sanitizer run is the second opinion on the same suite.
test:
	$(MAKE) --no-print-directory test-release
	$(MAKE) --no-print-directory test-asan
	$(MAKE) --no-print-directory test-python

test-release: build
	cd $(BUILD) && $(CTEST) --output-on-failure -j $(JOBS)

# RelWithDebInfo: optimised enough that the suite stays quick, with line numbers in reports. The
# GPU modules are left out: nvcc takes no sanitizer, and the Release pass compiled them already.
test-asan:
	$(CMAKE) -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DATTN_SANITIZE=ON \
	  -DATTN_BUILD_BENCH=OFF $(CMAKE_ARGS) -DATTN_WITH_CUDA=OFF -DATTN_WITH_CUDNN=OFF
	$(CMAKE) --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && $(SAN_ENV) $(CTEST) --output-on-failure -j $(JOBS)

# The Python package (pyproject.toml) in a virtual environment under the build folder: PyTorch
# and JAX (CPU jaxlib, about 100 MB; its FFI headers are handed to the build, which keeps its
# isolation, so the JAX front-end's handlers are built and its tests never skip) from PyPI as the
# README says (the default wheel, with its nvidia-* wheels: about 5 GB and one to
# three minutes, once per build folder), then `pip install .`, which builds the C library again
# with scikit-build-core in $(BUILD)/python. CPU only: the GPU modules are tested on a GPU with
# tests/python/gpu (docs/PYTHON.md): of CMAKE_ARGS only the warnings setting is passed on, so CI's
# request for the GPU modules never compiles CUDA a second time. pytest runs from tests/python, so
# the installed package is the one imported.
PYTHON ?= python3
VENV ?= $(BUILD)/venv
test-python:
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q torch jax pytest numpy
	CMAKE_ARGS="$(filter -DATTN_WERROR%,$(CMAKE_ARGS))" $(VENV)/bin/python -m pip install -q . \
	  -C build-dir=$(BUILD)/python \
	  -C cmake.define.ATTN_WITH_CUDA=OFF -C cmake.define.ATTN_WITH_CUDNN=OFF \
	  -C cmake.define.ATTN_PYTHON_JAX=ON -C cmake.define.ATTN_JAX_FFI_INCLUDE="$$($(VENV)/bin/python \
	    -c 'import jax.ffi; print(jax.ffi.include_dir())')"
	cd tests/python && $(abspath $(VENV))/bin/python -m pytest -q -p no:cacheprovider --ignore=gpu .

# The second compiler: every warning it adds is an error in CI as for the first, and its own test
# pass proves the kernels it compiles (the dispatch test forces each instruction set). CPU only and
# Release only, so CI pays for one more build, not two.
test-clang:
	$(CMAKE) -S . -B $(CC2_BUILD) -DCMAKE_C_COMPILER=$(CC2) -DCMAKE_BUILD_TYPE=Release \
	  $(CMAKE_ARGS) -DATTN_WITH_CUDA=OFF -DATTN_WITH_CUDNN=OFF -DATTN_WITH_MPI=OFF
	$(CMAKE) --build $(CC2_BUILD) -j $(JOBS)
	cd $(CC2_BUILD) && $(CTEST) --output-on-failure -j $(JOBS)

bench: configure
	$(CMAKE) --build $(BUILD) -j $(JOBS) --target attn_tool
	$(BUILD)/tools/attn bench $(BENCH_ARGS)

install: build
	$(CMAKE) --install $(BUILD) --prefix $(PREFIX)

# The project's own C files; the build folders are not sources.
FORMAT_FILES = $(or $(shell git ls-files -co --exclude-standard '*.c' '*.h' 2>/dev/null), \
                   $(shell find include src tests bench examples -name '*.[ch]'))
format:
	$(CLANG_FORMAT) -i $(FORMAT_FILES)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(CC2_BUILD)
