# tqlab: two commands.
#   make run    set up .venv (first time only), execute every notebook headless
#               into build/ (.ipynb + .html), print a status/seconds table
#   make test   set up .venv (first time only), run pytest (unit tests and
#               every notebook through nbmake)
#   make site   render the notebooks executed by `make run` into a static site,
#               build/site/html/index.html (Sphinx + MyST-NB, the `site` extra)
# Other targets: make setup | sync | check | lab | site-test | clean | distclean | help
#
# Knobs (make VAR=value ...):
#   NB=01           only notebooks whose name starts with / contains 01
#                   (comma-separated: NB=01,03)
#   PYTEST_ARGS=... extra pytest arguments (e.g. PYTEST_ARGS="-k workspace -x")
#   PYTHON=python3  interpreter used to create .venv (>= 3.10)
#   TORCH_SPEC=torch==2.13.0   the torch installed first, explicitly
#   TORCH_PIP_ARGS=...         extra pip arguments for that torch install
#                   (e.g. an --index-url of PyTorch's CPU wheels on a machine
#                   without the local CPU wheel; an unpinned torch from the
#                   default index is a multi-GB CUDA build)

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TORCH_SPEC ?= torch==2.13.0
TORCH_PIP_ARGS ?=
KERNEL_NAME := tqlab
KERNEL_DISPLAY := Python (tqlab)
STAMP := $(VENV)/.tqlab-setup-done
SITE_STAMP := $(VENV)/.tqlab-site-done
BUILD := build
NB ?=
PYTEST_ARGS ?=

# Quieter Jupyter start-up (platformdirs notice, debugpy frozen-module notice).
export JUPYTER_PLATFORM_DIRS := 1
export PYDEVD_DISABLE_FILE_VALIDATION := 1
# Put the venv's own kernelspecs ahead of any user-level ones (a `tqlab`
# kernel registered with --user by another checkout must not shadow ours).
export JUPYTER_PATH := $(abspath $(VENV))/share/jupyter$(if $(JUPYTER_PATH),:$(JUPYTER_PATH))

.PHONY: help setup run test sync check lab browser-test site site-test parity parity-record clean distclean

help:
	@echo "make run     execute every notebook headless into $(BUILD)/ (NB=01 to pick)"
	@echo "make test    run pytest: unit tests + every notebook (nbmake)"
	@echo "make setup   only create/refresh $(VENV) (done automatically by run/test)"
	@echo "make sync    jupytext --sync notebooks/*.ipynb <-> *.py, then strip outputs"
	@echo "make check   notebooks stored clean and paired .py in sync; import layers (lint-imports); ruff"
	@echo "make lab     open JupyterLab on notebooks/ with the $(KERNEL_NAME) kernel"
	@echo "make parity  cross-check against each supported vLLM's own classes ($(PARITY_VERSIONS); VLLM_VERSION=0.34.0 for one), each in its own venv (first run installs it)"
	@echo "make browser-test  run every notebook in JupyterLab + headless chromium; screenshots in $(BUILD)/screenshots"
	@echo "make site    static site of the executed notebooks: $(BUILD)/site/html/index.html (runs missing/stale ones)"
	@echo "make site-test  build the site, then check a page, its figures and widgets in headless chromium"
	@echo "make clean   remove $(BUILD)/ and caches; make distclean also removes $(VENV)"

# --- set-up (idempotent: the stamp is redone only when pyproject.toml changes)
setup: $(STAMP)

$(PY):
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "tqlab needs Python >= 3.10, $(PYTHON) is " + sys.version.split()[0])'
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	@echo ">> installing $(TORCH_SPEC) first (explicit pin: never an unpinned torch)"
	$(PIP) install --progress-bar off $(TORCH_PIP_ARGS) '$(TORCH_SPEC)'
	@echo ">> installing tqlab (editable) with the notebooks and test extras"
	$(PIP) install --progress-bar off -e '.[notebooks,test]'
	@echo ">> registering the '$(KERNEL_NAME)' Jupyter kernel inside $(VENV)"
	$(PY) -m ipykernel install --sys-prefix --name $(KERNEL_NAME) --display-name '$(KERNEL_DISPLAY)'
	@$(PY) -c 'import torch, tqlab; print(">> ready: torch", torch.__version__, "| tqlab", tqlab.__version__)'
	@touch $@

# --- the two commands
run: $(STAMP)
	$(PY) tools/run_notebooks.py run --out $(BUILD) --kernel $(KERNEL_NAME) $(if $(NB),--only '$(NB)')

# pytest exit status 5 = collected no tests: that is a failure, not a pass.
test: $(STAMP)
	@rc=0; $(PY) -m pytest $(PYTEST_ARGS) || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests (exit status 5): failing" >&2; fi; \
	exit $$rc

# --- notebook housekeeping
sync: $(STAMP)
	$(PY) tools/run_notebooks.py sync

# Notebooks stored clean and in sync with their .py twins; imports follow the
# layers of .importlinter (cli > lab > strategies | vllm_trace > engine > ... > core).
check: $(STAMP)
	$(PY) tools/run_notebooks.py check
	$(VENV)/bin/lint-imports .importlinter  # positional: --config is deprecated (import-linter 2.x warns)
	$(VENV)/bin/ruff check tqlab tests tools benchmarks parity notebooks

lab: $(STAMP)
	$(VENV)/bin/jupyter lab notebooks/

# End-to-end in a real browser (tools/browser_test.py): JupyterLab on 127.0.0.1
# with a token, Debian's /usr/bin/chromium (apt-get install -y chromium) driven
# by Playwright. The playwright package is installed into the venv if missing;
# never `playwright install` (it downloads a browser).
browser-test: $(STAMP)
	@$(PY) -c 'import playwright' 2>/dev/null || $(PIP) install --progress-bar off 'playwright>=1.40'
	$(PY) tools/browser_test.py --out $(BUILD)/screenshots $(if $(NB),--only '$(NB)')

# --- the static site (tools/build_site.py): Sphinx + MyST-NB render the notebooks
# executed into $(BUILD)/ by `make run` without executing them again; a notebook
# missing there, stale (edited since) or failed is executed first. The `site` extra
# is installed here only, so `make test` does not grow.
$(SITE_STAMP): pyproject.toml | $(STAMP)
	@echo ">> installing the site extra (Sphinx, MyST-NB, sphinx-book-theme)"
	$(PIP) install --progress-bar off -e '.[site]'
	@touch $@

site: $(STAMP) $(SITE_STAMP)
	$(PY) tools/build_site.py --executed $(BUILD) --out $(BUILD)/site --execute-missing --kernel $(KERNEL_NAME) $(if $(NB),--only '$(NB)')

# The built site in headless chromium, offline: the index links every page, figures load,
# widgets render from their saved state (tools/browser_site.py).
site-test: site
	@$(PY) -c 'import playwright' 2>/dev/null || $(PIP) install --progress-bar off 'playwright>=1.40'
	$(PY) tools/browser_test.py --site $(BUILD)/site/html --out $(BUILD)/screenshots/site $(if $(NB),--only '$(NB)')

clean:
	rm -rf $(BUILD) .pytest_cache .hypothesis *.egg-info .import_linter_cache
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +
	find . -path ./$(VENV) -prune -o -name .ipynb_checkpoints -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)

# --- parity with real vLLM (parity/README.md): each supported release's pure-Python modules in its
# own venv (parity/venv.sh: .venv-parity for 0.33.0, .venv-parity-0.34 for 0.34.0; wheel --no-deps +
# its non-CUDA requirements, torch 2.13 CPU). VLLM_VERSION=0.34.0 runs one release; every release
# runs even when an earlier one fails, and the target fails if any did.
PARITY_VERSIONS := $(if $(VLLM_VERSION),$(VLLM_VERSION),0.33.0 0.34.0)
parity:
	@failed=""; for v in $(PARITY_VERSIONS); do echo "== make parity: vLLM $$v"; \
	  VLLM_VERSION=$$v bash parity/run.sh $(PYTEST_ARGS) </dev/null || failed="$$failed $$v"; done; \
	  if [ -n "$$failed" ]; then echo "== make parity: failed for vLLM$$failed" >&2; exit 1; fi

# Same, and rewrite data/parity_results.json (0.33.0) / data/parity_results_<x>_<y>.json with provenance.
parity-record:
	@for v in $(PARITY_VERSIONS); do VLLM_VERSION=$$v bash parity/run.sh --record; done
