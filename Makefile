# fp4lab: every target creates the virtual environment on first use (only python3 and make needed).
#   make test      set up, then run the test suite (CPU only)
#   make report    set up, run every notebook with papermill into runs/<run-id>/, build the book
#   make share     one self-contained HTML file of the diagnosis (after make report)
#   make lab       JupyterLab on notebooks/ with the fp4lab kernel (--allow-root only when run as root)
#   make browser-check  check every page of the built book in headless Chromium, screenshots in
#                  screenshots/ (installs Debian's chromium and the browser extra only when missing)
#   make clean     remove the venv and build outputs (runs/ and results/ are kept: they are data)
# Knobs: REPORT_PROFILE=auto|smoke|full  RUN_ID=<id>  RUNS_DIR=runs
# Setup knobs (scripts/setup_env.sh says what each decides; changing one re-runs setup):
#   TORCH_SPEC=torch==2.13.0  the torch to install (a CPU machine takes the local CPU wheel)
#   TORCH_INDEX_URL=<url>     where torch comes from (GPU box default: the PyTorch index of the
#                             newest CUDA build the driver supports; a container's CUDA torch is
#                             reused as it is unless TORCH_SPEC or TORCH_INDEX_URL is given)
#   SETUP_DEVICE=auto|cpu|cuda  auto: a GPU box when nvidia-smi lists a GPU
#   offline: PIP_NO_INDEX=1 PIP_FIND_LINKS=<wheel folder> (read by pip)

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX_URL ?=
SETUP_DEVICE ?= auto
REPORT_PROFILE ?= auto
RUN_ID ?=
RUNS_DIR ?= runs
PIP := $(BIN)/python -m pip -q --disable-pip-version-check
STAMP := $(VENV)/.fp4lab-installed

.PHONY: setup test report share lab browser-check clean FORCE

setup: $(STAMP)

# Always asks the script, which returns at once when the stamp matches the settings.
$(STAMP): FORCE
	@PYTHON="$(PYTHON)" VENV="$(VENV)" TORCH_SPEC="$(TORCH_SPEC)" TORCH_SPEC_ORIGIN="$(origin TORCH_SPEC)" \
		TORCH_INDEX_URL="$(TORCH_INDEX_URL)" SETUP_DEVICE="$(SETUP_DEVICE)" bash scripts/setup_env.sh

FORCE:

test: $(STAMP)
	$(BIN)/python -m pytest

report: $(STAMP)
	$(BIN)/python -m fp4lab report --profile $(REPORT_PROFILE) --runs-dir $(RUNS_DIR) $(if $(RUN_ID),--run-id $(RUN_ID))

share: $(STAMP)
	$(BIN)/python -m fp4lab share --runs-dir $(RUNS_DIR) $(if $(RUN_ID),--run-id $(RUN_ID))

# JupyterLab refuses to start as root unless told to: the flag is given exactly when uid is 0.
# The fp4lab kernel is registered by setup (scripts/setup_env.sh).
USER_ID := $(shell id -u)

lab: $(STAMP)
	@$(BIN)/python -c "import jupyterlab" 2>/dev/null || { echo "==> installing the lab extra (JupyterLab) into $(VENV)"; \
		$(PIP) install $(if $(wildcard $(VENV)/fp4lab-constraints.txt),-c $(VENV)/fp4lab-constraints.txt) -e ".[lab]"; }
	$(BIN)/jupyter lab --notebook-dir=notebooks$(if $(filter 0,$(USER_ID)), --allow-root)

# Skips become failures here (FP4LAB_BROWSER_REQUIRED): the check cannot pass by not running.
browser-check: $(STAMP)
	@VENV="$(VENV)" bash scripts/browser_setup.sh
	@FP4LAB_BROWSER_REQUIRED=1 $(BIN)/python -m pytest -m browser tests/test_browser.py; status=$$?; \
		echo "screenshots in $(CURDIR)/screenshots"; exit $$status

clean:
	rm -rf $(VENV) book/_build book/chapters share .pytest_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
