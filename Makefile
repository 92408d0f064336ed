# fp4lab: every target creates the virtual environment on first use (only python3 and make needed).
#   make test      set up, then run the test suite (CPU only)
#   make report    set up, run every notebook with papermill into runs/<run-id>/, build the book
#   make share     one self-contained HTML file of the diagnosis (after make report)
#   make lab       JupyterLab with the fp4lab kernel
#   make browser-check  open the built book in headless Chromium (installs Debian's chromium)
#   make clean     remove the venv and build outputs (runs/ and results/ are kept: they are data)
# Knobs: REPORT_PROFILE=auto|smoke|full  RUN_ID=<id>  RUNS_DIR=runs  TORCH_SPEC=torch==2.13.0

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0
REPORT_PROFILE ?= auto
RUN_ID ?=
RUNS_DIR ?= runs
PIP := $(BIN)/python -m pip -q --disable-pip-version-check
STAMP := $(VENV)/.fp4lab-installed

.PHONY: setup test report share lab browser-check clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@echo "==> setting up $(VENV) (first use only)"
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip
	$(PIP) install "$(TORCH_SPEC)"
	$(PIP) install -e ".[test]"
	$(BIN)/python -m ipykernel install --sys-prefix --name fp4lab --display-name "Python (fp4lab)" >/dev/null
	@touch $@

test: $(STAMP)
	$(BIN)/python -m pytest

report: $(STAMP)
	$(BIN)/python -m fp4lab report --profile $(REPORT_PROFILE) --runs-dir $(RUNS_DIR) $(if $(RUN_ID),--run-id $(RUN_ID))

share: $(STAMP)
	$(BIN)/python -m fp4lab share --runs-dir $(RUNS_DIR) $(if $(RUN_ID),--run-id $(RUN_ID))

lab: $(STAMP)
	$(PIP) install -e ".[lab]"
	$(BIN)/jupyter lab --notebook-dir=notebooks

browser-check: $(STAMP)
	@command -v chromedriver >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null)
	$(BIN)/python -m pytest -m browser tests/test_browser.py

clean:
	rm -rf $(VENV) book/_build book/chapters share .pytest_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
