# One venv per checkout; every target goes through `setup`, which is idempotent and fast when done.
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat setup.cfg | sha1sum | cut -c1-12)

.PHONY: setup test quickstart bench lint docs clean

setup: $(STAMP)
	@echo "atlas is installed in $(VENV)/. Put it on your PATH with:  source $(VENV)/bin/activate"

$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@# The pinned CPU wheel first: anything that pulls a bare `torch` would fetch a CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	@# setuptools warns at every editable install that a folder named like a package could shadow it:
	@# true of any checkout, so it is silenced here (it is the only warning of the build)
	PYTHONWARNINGS="ignore:Editable installation" $(PY) -m pip install -q -e '.[test,docs]'
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

test: $(STAMP)
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(PY) -m pytest tests

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

clean:
	rm -rf $(VENV) .pytest_cache build/site
