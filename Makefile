# Sparkpoint: `make demo` runs the product, `make test` runs the tests (both set up everything).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO_DIR ?= .sparkpoint/demo

.PHONY: demo test bench bench-ss bench-control-plane bench-dashboard lint format clean

$(VENV)/.installed: pyproject.toml
	@command -v java >/dev/null || { echo "PySpark needs Java 17+: apt-get install -y openjdk-17-jre-headless"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

test: $(VENV)/.installed
	$(PY) -m pytest

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check jobs backend frontend migrations tests
	$(VENV)/bin/ruff format --check jobs backend frontend migrations tests
	$(VENV)/bin/mypy

format: $(VENV)/.installed
	$(VENV)/bin/ruff format jobs backend frontend migrations tests

bench: $(VENV)/.installed
	$(PY) tests/benchmarks/bench_pv.py

bench-control-plane: $(VENV)/.installed
	$(PY) tests/benchmarks/bench_ingest.py
	$(PY) tests/benchmarks/bench_api.py

bench-dashboard: $(VENV)/.installed
	$(PY) tests/benchmarks/bench_dashboard.py

bench-ss: $(VENV)/.installed
	$(PY) tests/benchmarks/bench_vs_structured_streaming.py

DEMO_PORT ?= 8081
DEMO_DASHBOARD_PORT ?= 8050

# The control plane (embedded Redis unless REDIS_URL, SQLite unless DATABASE_URL), the dashboard
# and the example job connected to them; the control plane and the dashboard keep running after
# the job finished, until Ctrl-C.
demo: $(VENV)/.installed
	rm -rf $(DEMO_DIR) && mkdir -p $(DEMO_DIR)
	@set -euo pipefail; \
	export SPARKPOINT_DATA_DIR=$(abspath $(DEMO_DIR))/server; \
	export SPARKPOINT_API_URL=http://127.0.0.1:$(DEMO_PORT); \
	$(VENV)/bin/sparkpoint server --port $(DEMO_PORT) > $(DEMO_DIR)/server.log 2>&1 & server=$$!; \
	$(VENV)/bin/sparkpoint dashboard --port $(DEMO_DASHBOARD_PORT) > $(DEMO_DIR)/dashboard.log 2>&1 & dashboard=$$!; \
	trap 'kill $$server $$dashboard 2>/dev/null; wait $$server $$dashboard 2>/dev/null' EXIT INT TERM; \
	for _ in $$(seq 60); do curl -sf http://127.0.0.1:$(DEMO_PORT)/healthz >/dev/null && break; sleep 0.5; done; \
	curl -sf http://127.0.0.1:$(DEMO_PORT)/healthz >/dev/null || { cat $(DEMO_DIR)/server.log; exit 1; }; \
	for _ in $$(seq 60); do curl -sf http://127.0.0.1:$(DEMO_DASHBOARD_PORT)/ >/dev/null && break; sleep 0.5; done; \
	curl -sf http://127.0.0.1:$(DEMO_DASHBOARD_PORT)/ >/dev/null || { cat $(DEMO_DIR)/dashboard.log; exit 1; }; \
	echo "dashboard:     http://127.0.0.1:$(DEMO_DASHBOARD_PORT)"; \
	echo "control plane: http://127.0.0.1:$(DEMO_PORT) (OpenAPI: /docs, metrics: /metrics)"; \
	echo "API token:     $$(cat $$SPARKPOINT_DATA_DIR/api-token) (paste it into the dashboard's header to act)"; \
	$(VENV)/bin/sparkpoint run jobs/examples/pv_count.py \
		--checkpoint-dir file://$(abspath $(DEMO_DIR))/checkpoints --checkpoint-interval 1 \
		--retained 5 --local-dir $(DEMO_DIR)/local \
		--events 2400000 --apps 10 --rate 20000 --output $(DEMO_DIR)/output; \
	echo; \
	echo "committed output:  $(DEMO_DIR)/output (files not starting with . or _)"; \
	echo "dashboard:         http://127.0.0.1:$(DEMO_DASHBOARD_PORT) (keeps running; Ctrl-C stops both)"; \
	wait $$server
