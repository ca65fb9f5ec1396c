# One venv per checkout; every target goes through `setup`, which is idempotent and fast when done.
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat setup.cfg | sha1sum | cut -c1-12)

.PHONY: setup test quickstart bench lint clean

setup: $(STAMP)
	@echo "atlas is installed in $(VENV)/. Put it on your PATH with:  source $(VENV)/bin/activate"

$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@# The pinned CPU wheel first: anything that pulls a bare `torch` would fetch a CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	@# setuptools warns at every editable install that a folder named like a package could shadow it:
	@# true of any checkout, so it is silenced here (it is the only warning of the build)
	PYTHONWARNINGS="ignore:Editable installation" $(PY) -m pip install -q -e '.[test]'
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

test: $(STAMP)
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(PY) -m pytest tests

quickstart: $(STAMP)
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(VENV)/bin/atlas quickstart

lint: $(STAMP)
	$(PY) -m pip install -q ruff && $(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache
