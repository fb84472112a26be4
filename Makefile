# Two commands for a new user: `make demo` (install + quickstart sweep) and `make test`.
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

export RAY_USAGE_STATS_ENABLED ?= 0
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER ?= 0
export RAY_AUTH_MODE ?= disabled
export MLFLOW_DISABLE_TELEMETRY ?= true

.PHONY: install system-deps demo check test test-pythons docs bench gpu-check lint clean

install: $(STAMP)

# torch==2.13.0 goes in first: with it present, the project's torch range installs nothing more,
# so pip never fetches a multi-GB CUDA build. setuptools' "Editable installation" notice (a
# warning its build backend prints for every editable install) is filtered out by its message.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	PYTHONWARNINGS="ignore:Editable installation" $(BIN)/python -m pip install -q -e '.[dev,glove,docs]'
	touch $(STAMP)

# What the SLURM tests (tests/test_slurm_cluster.py) run on: Debian's slurm-wlm and munge. Installed
# when missing and apt-get can (as root); otherwise those tests skip, saying why.
system-deps:
	@if command -v slurmctld >/dev/null && command -v munged >/dev/null; then :; \
	elif command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge) \
	    || echo "warning: installing slurm-wlm and munge failed; the SLURM tests will skip" >&2; \
	else echo "warning: slurm-wlm and munge are missing and cannot be installed here (needs apt-get as root); the SLURM tests will skip" >&2; fi

demo: install
	$(BIN)/orchestrate sweep search_spaces/quickstart.yaml --new
	$(BIN)/orchestrate results quickstart --out results/tables/quickstart.parquet --format md

# The suite in three parts (tests/run_suite.py says why): the SLURM cluster tests in a pytest of
# their own beside the rest on TEST_WORKERS pytest-xdist workers, then the tests that check a
# measured time, alone on the machine.
TEST_WORKERS ?= 2
test: install
	TEST_WORKERS=$(TEST_WORKERS) $(BIN)/python tests/run_suite.py

# The development loop: ruff, the unit tests and a handful of end-to-end tests (markers `unit`
# and `check`, pyproject.toml), on TEST_WORKERS workers.
check: install
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "unit or check" tests

# Each Python version the project declares (requires-python), in a fresh venv of its own under
# PYTHONS_DIR: install (not editable), the quickstart sweep from a folder outside the checkout,
# the unit tests (scripts/test_python_version.sh). Not part of `make test`: each version installs
# torch, Ray and MLflow anew.
PYTHON_VERSIONS ?= 3.11 3.12 3.13
PYTHONS_DIR ?= /tmp/nli-pythons
test-pythons:
	for version in $(PYTHON_VERSIONS); do scripts/test_python_version.sh $$version $(PYTHONS_DIR) || exit 1; done

# The documentation site (mkdocs.yml, docs/) into site/, warnings as errors.
docs: install
	$(BIN)/mkdocs build --strict --site-dir site

bench: install
	$(BIN)/python -m benchmarks.run

# The GPU check needs only torch + nli_models' own deps, so it runs on a bare GPU machine too:
# with the project's venv when there is one, else python3 with the repository on the path.
GPU_CHECK_PYTHON := $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)
gpu-check:
	PYTHONPATH=$(CURDIR) $(GPU_CHECK_PYTHON) -m benchmarks.gpu_check --device cuda --out gpu_check

lint: install
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) build dist site *.egg-info
