# One venv per checkout; every target goes through `setup`, which is idempotent and fast when done.
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
# The exact versions every install takes (pip's -c): setup.cfg says what atlas needs, this file what is installed
LOCK := constraints.txt
STAMP := $(VENV)/.installed-$(shell cat setup.cfg $(LOCK) | sha1sum | cut -c1-12)

.PHONY: setup test test-slow test-all quickstart bench lint docs clean lock

setup: $(STAMP)
	@echo "atlas is installed in $(VENV)/. Put it on your PATH with:  source $(VENV)/bin/activate"

$(STAMP): setup.cfg pyproject.toml $(LOCK)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@# The pinned CPU wheel first (its version from the lock): anything that pulls a bare `torch` would fetch a
	@# CUDA build.
	$(PY) -m pip install -q -c $(LOCK) torch
	@# setuptools warns at every editable install that a folder named like a package could shadow it:
	@# true of any checkout, so it is silenced here (it is the only warning of the build)
	PYTHONWARNINGS="ignore:Editable installation" $(PY) -m pip install -q -c $(LOCK) -e '.[test,docs]'
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

# The suite in two tiers (docs/contributing.md): `make test` the fast tier, after every change (tests marked slow are
# skipped); `make test-slow` only those; `make test-all` both, as CI runs them. Two workers, each test file on one of
# them (its module fixtures built once), one torch thread a worker: two workers of two threads contend on 2 cores.
PYTEST := HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=1 $(PY) -m pytest -n 2 --dist loadfile
test: $(STAMP)
	$(PYTEST) tests

test-slow: $(STAMP)
	RUN_SLOW=1 $(PYTEST) -m slow tests

test-all: test test-slow

quickstart: $(STAMP)
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(VENV)/bin/atlas quickstart

# The documentation site into build/site/ (git ignores build/; SITE=DIR puts it elsewhere); `mkdocs serve`
# browses it while writing. Strict: any warning (a broken link or anchor, a page missing from the nav) fails.
# The references and figures are regenerated from the code by docs/_gen/ at every build.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(VENV)/bin/mkdocs build --strict --site-dir $(or $(SITE),build/site)

# Lint and format, as CI checks them (`ruff format .` applies the format)
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Refresh the lock: resolve setup.cfg afresh in a throwaway venv and pin what it installed (torch stays at the
# locked version unless TORCH=VERSION says otherwise). Then `make test` with it, and commit constraints.txt.
LOCK_VENV := build/lock-venv
TORCH ?= $(shell sed -n 's/^torch==//p' $(LOCK))
lock:
	rm -rf $(LOCK_VENV)
	$(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/python -m pip install -q --upgrade pip
	$(LOCK_VENV)/bin/python -m pip install -q torch==$(TORCH)
	PYTHONWARNINGS="ignore:Editable installation" $(LOCK_VENV)/bin/python -m pip install -q -e '.[test,docs]'
	sed -n '/^#/p' $(LOCK) | grep -v '^# Generated' > $(LOCK).new
	echo "# Generated $$(date -u +%F) by make lock (python $$($(LOCK_VENV)/bin/python -c 'import platform; print(platform.python_version(), platform.system(), platform.machine())'))." >> $(LOCK).new
	@# the local label of a CPU or CUDA build (+cpu) dropped: either build satisfies the pin
	$(LOCK_VENV)/bin/python -m pip freeze --exclude-editable | sed -E 's/\+[A-Za-z0-9.]+$$//' | LC_ALL=C sort -f >> $(LOCK).new
	mv $(LOCK).new $(LOCK)
	rm -rf $(LOCK_VENV)

clean:
	rm -rf $(VENV) .pytest_cache build/site
