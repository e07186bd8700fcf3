# The two commands that matter: `make run` (the service, CPU engine) and `make test`.
# Each installs what it needs: a venv, packages from PyPI, the ONNX model built from
# the shipped checkpoint.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
MODEL := models/minilm-l6-squad
ONNX_DIR := build/onnx/minilm-l6-squad
ONNX := $(ONNX_DIR)/model-fused.onnx
TEST_TOOLS := build/.test-tools
PYTEST := $(BIN)/python -m pytest

FP8_CALIBRATION := build/fp8-calibration/minilm-l6-squad.json

.PHONY: run gateway test test-all test-gpu accuracy lint venv model loadtest bench-cpu clean \
	fp8-calibration

run: $(STAMP) $(ONNX)  ## Triton (CPU engine) + gateway on :8080
	$(BIN)/python -m service.launcher

gateway: $(STAMP)  ## the gateway alone (Triton already running)
	$(BIN)/python -m service

venv: $(STAMP)
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# CPU build of torch (only training, export and the reference engine need it)
	$(BIN)/pip install -q "torch==2.13.0"
	$(BIN)/pip install -q -e ".[train,kernels,dev]"
	rm -f $(VENV)/.installed-* && touch $@

model: $(ONNX)
$(ONNX): $(STAMP) $(MODEL)/model.safetensors training/export_onnx.py
	$(BIN)/python -m training.export_onnx --model-dir $(MODEL) --out $(ONNX_DIR)

$(TEST_TOOLS): $(STAMP) tests/requirements.txt tests/apt.txt
	bash tests/install-tools.sh $(BIN)/pip
	mkdir -p build && touch $@

test: $(STAMP) $(ONNX) $(TEST_TOOLS)  ## the default suite (no GPU, < 15 min)
	$(PYTEST) -m "not slow and not gpu" -q --durations=15

test-all: $(STAMP) $(ONNX) $(TEST_TOOLS)  ## everything that runs without a GPU, slow suites too
	$(PYTEST) -m "not gpu" -q

test-gpu: $(STAMP)  ## on a CUDA machine
	$(PYTEST) -m gpu -q

accuracy: $(STAMP) $(ONNX)  ## full SQuAD v1.1 dev through the HTTP API vs offline
	$(PYTEST) -m slow -q tests/integration/test_accuracy.py

lint: $(STAMP)
	$(BIN)/ruff check service engine training tests loadtest
	$(BIN)/mypy

loadtest: $(STAMP) $(ONNX)  ## capacity at SLO against a locally started service
	bash loadtest/run_local.sh

bench-cpu: $(STAMP) $(ONNX)
	$(BIN)/python -m benchmarks.bench_cpu

fp8-calibration: $(FP8_CALIBRATION)  ## static FP8 scales of the shipped model (BERT_QA_FP8_CALIBRATION)

$(FP8_CALIBRATION): $(STAMP) $(MODEL)/model.safetensors
	$(BIN)/python -m training.calibrate --model-dir $(MODEL) \
		--data data/train-subset-v1.1.json.xz --out $@

clean:
	rm -rf build
