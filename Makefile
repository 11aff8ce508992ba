# From a bare machine with Python 3.10 or newer (and make), two commands:
#
#   make run    set up .venv, then run the example job: elfes submit examples/quickstart/job.yaml --follow
#   make test   set up .venv, then check and run the tests (inside .venv): python -m ruff check .,
#               python -m mypy (strict on elfes/ and launcher/, pyproject.toml), then python -m pytest -q
#
# Setting up creates .venv when it is missing, installs torch into it first, then the project in
# editable mode with its test extras (pip install -e ".[test]"); it is redone when pyproject.toml
# changes (`make clean` starts over). Nothing outside .venv is touched. The torch build:
#
#   TORCH_SPEC   the torch requirement (default torch==2.13.0)
#   TORCH_INDEX  the index to take it from. Unset: a torch already in .venv or on this machine's disk
#                (pip's find-links) is used; else, with an NVIDIA GPU (nvidia-smi) or on macOS, the
#                ordinary index (PyPI: a CUDA build on Linux); else the CPU build from TORCH_CPU_INDEX.
#                E.g. make test TORCH_INDEX=https://download.pytorch.org/whl/cu128
#   TORCH_CPU_INDEX  default https://download.pytorch.org/whl/cpu
#   PYTHON       the interpreter that creates .venv (default python3), e.g. make run PYTHON=python3.12

PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu

PIP := $(VENV)/bin/python -m pip
# A fresh venv's pip is older than the index's; that is fine here.
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: run test setup clean

run: setup
	$(VENV)/bin/elfes submit examples/quickstart/job.yaml --follow

test: setup
	$(VENV)/bin/python -m ruff check .
	$(VENV)/bin/python -m mypy
	$(VENV)/bin/python -m pytest -q

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml | $(VENV)/bin/pip
	@if [ -n "$(TORCH_INDEX)" ]; then \
	    echo "make: $(TORCH_SPEC) from $(TORCH_INDEX)"; \
	    $(PIP) install --quiet "$(TORCH_SPEC)" --index-url "$(TORCH_INDEX)"; \
	elif $(PIP) install --quiet --dry-run --no-index --no-deps "$(TORCH_SPEC)" >/dev/null 2>&1; then \
	    echo "make: $(TORCH_SPEC), found in $(VENV) or on this machine's disk"; \
	    $(PIP) install --quiet "$(TORCH_SPEC)"; \
	elif nvidia-smi -L >/dev/null 2>&1 || [ "$$(uname -s)" = Darwin ]; then \
	    echo "make: $(TORCH_SPEC) from the ordinary index (a GPU or macOS here)"; \
	    $(PIP) install --quiet "$(TORCH_SPEC)"; \
	else \
	    echo "make: $(TORCH_SPEC), the CPU build, from $(TORCH_CPU_INDEX) (no GPU here; set TORCH_INDEX for another)"; \
	    $(PIP) install --quiet "$(TORCH_SPEC)" --index-url "$(TORCH_CPU_INDEX)"; \
	fi
	$(PIP) install --quiet -e ".[test]"
	@touch $@

$(VENV)/bin/pip:
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null || { \
	    echo "make: ELFES needs Python 3.10 or newer; '$(PYTHON)' is $$($(PYTHON) --version 2>&1 || echo missing)." \
	         "Name another: make $(MAKECMDGOALS) PYTHON=python3.12"; exit 1; }
	$(PYTHON) -m venv $(VENV) || { \
	    echo "make: '$(PYTHON) -m venv' failed; on Debian or Ubuntu install the venv module" \
	         "(apt-get install python3-venv), then run make again"; exit 1; }

clean:
	rm -rf $(VENV)
