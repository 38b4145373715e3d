# Sparkpoint: `make demo` runs the product, `make test` runs the tests (both set up everything).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO_DIR ?= .sparkpoint/demo

.PHONY: demo test bench bench-ss lint format clean

$(VENV)/.installed: pyproject.toml
	@command -v java >/dev/null || { echo "PySpark needs Java 17+: apt-get install -y openjdk-17-jre-headless"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

test: $(VENV)/.installed
	$(PY) -m pytest

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check jobs backend migrations tests
	$(VENV)/bin/ruff format --check jobs backend migrations tests
	$(VENV)/bin/mypy

format: $(VENV)/.installed
	$(VENV)/bin/ruff format jobs backend migrations tests

bench: $(VENV)/.installed
	$(PY) tests/benchmarks/bench_pv.py

bench-ss: $(VENV)/.installed
	$(PY) tests/benchmarks/bench_vs_structured_streaming.py

demo: $(VENV)/.installed
	rm -rf $(DEMO_DIR) && mkdir -p $(DEMO_DIR)
	$(VENV)/bin/sparkpoint run jobs/examples/pv_count.py --standalone \
		--checkpoint-dir file://$(abspath $(DEMO_DIR))/checkpoints --checkpoint-interval 1 \
		--events-log $(DEMO_DIR)/events.jsonl --local-dir $(DEMO_DIR)/local \
		--events 200000 --apps 10 --rate 20000 --output $(DEMO_DIR)/output
	@echo
	@echo "committed output:  $(DEMO_DIR)/output (files not starting with . or _)"
	@echo "checkpoints:       $(DEMO_DIR)/checkpoints/<job-id>/chk-<n>/_metadata"
	@echo "protocol events:   $(DEMO_DIR)/events.jsonl"

clean:
	rm -rf $(VENV) .sparkpoint .pytest_cache .mypy_cache .ruff_cache
