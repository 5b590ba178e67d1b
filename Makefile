# The two commands a newcomer runs (see README):  make demo   |   make test
# Both create a local virtual environment in .venv first. TORCH selects the torch requirement: the default
# pins the CPU build this project is developed and tested with.
PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup demo test artifacts clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[test,docs]"
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/liac demo

# Two pytest-xdist workers (this project's CI machine has two cores), one file per worker at a time so module
# fixtures are built once; TEST_WORKERS=0 runs the suite in this process.
TEST_WORKERS ?= 2

test: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# Regenerate the checked-in plans/, docs/plans/ and docs/plan-format.md (tests/test_checked_in.py checks them).
artifacts: $(STAMP)
	$(PY) scripts/refresh-artifacts

clean:
	rm -rf $(VENV) build *.egg-info
