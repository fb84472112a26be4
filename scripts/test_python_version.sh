#!/usr/bin/env bash
# `make test-pythons`, for one Python version: a fresh venv of that version (VENV_ROOT/pyVERSION,
# made anew), torch==2.13.0 installed first, then the project from this checkout, not editable
# (the package as a user gets it); then, from an empty folder outside the checkout, a shipped spec
# copied with `orchestrate specs copy` and the quickstart sweep and its results table on a new
# store; then the unit tests (`-m unit`) on that interpreter. Each step's seconds are printed.
# Usage: scripts/test_python_version.sh VERSION VENV_ROOT   (e.g. 3.12 /tmp/nli-pythons)
set -euo pipefail
version=$1
venv=$2/py$version
repo=$(cd "$(dirname "$0")/.." && pwd)

# The interpreter: pyenv's newest VERSION.x when pyenv has one, else pythonVERSION on the PATH.
if command -v pyenv >/dev/null; then
    full=$(pyenv versions --bare | grep -E "^${version//./\\.}\.[0-9]+$" | sort -V | tail -n 1 || true)
    if [ -n "$full" ]; then export PYENV_VERSION=$full; fi
fi
python=python$version
command -v "$python" >/dev/null || { echo "error: $python is not on the PATH (nor in pyenv)" >&2; exit 2; }

step_start=$(date +%s)
step() {  # name of the step that just ended
    local now; now=$(date +%s)
    echo "== python $version: $1 took $((now - step_start)) s"
    step_start=$now
}

rm -rf "$venv"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q torch==2.13.0
"$venv/bin/python" -m pip install -q "$repo[dev,glove]"
step "install ($("$venv/bin/python" -V))"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
store=sqlite:///$work/mlruns.db
(
    cd "$work"
    "$venv/bin/orchestrate" --version
    "$venv/bin/orchestrate" specs copy quickstart
    "$venv/bin/orchestrate" sweep quickstart.yaml --tracking-uri "$store"
    "$venv/bin/orchestrate" results quickstart --tracking-uri "$store" --out quickstart.parquet --format md
)
step "quickstart sweep and results, outside the checkout"

cd "$repo"
"$venv/bin/python" -m pytest -q -p no:cacheprovider -m unit -n 2 tests
step "unit tests"
