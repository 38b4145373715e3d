# Sparkpoint: `make demo` runs the product, `make test` runs the tests (both set up everything).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO_DIR ?= .sparkpoint/demo

.PHONY: demo docs test test-slow test-spark-matrix test-long chaos bench bench-ss bench-commit-latency bench-control-plane bench-load bench-dashboard bench-state bench-pv-keys bench-catch-up bench-recovery bench-per-record bench-map-batch bench-redis-to-sql lint format clean

$(VENV)/.installed: pyproject.toml
	@command -v java >/dev/null || { echo "PySpark needs Java 17+: apt-get install -y openjdk-17-jre-headless"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

# `make test`: the suite without the tests marked `slow` (a few minutes); `make test-slow`:
# those (end-to-end, browser, cluster, fuzz) but the `long` modules (`make test-long`); CI
# runs both. `make test-spark-matrix` runs each failure point of the exactly-once matrices on
# Spark (make test runs them in process); it and `make test-long` are left out of CI to keep
# CI under 30 minutes.
# `make test` runs in TEST_WORKERS pytest-xdist processes (one SparkSession each;
# TEST_WORKERS=0: one process). Many tests wait (for Spark, Redis, PostgreSQL, a subprocess),
# so a worker keeps less than a core busy. worksteal hands each worker a contiguous share of the tests
# and moves tests only when a worker runs dry, so a module's Spark baseline (a module-scoped
# fixture) is mostly computed once.
TEST_WORKERS ?= 3
# `make test-slow` in SLOW_TEST_WORKERS processes: its tests mostly wait for the processes they
# start (one worker keeps 0.7 of a core busy), so two take 9.6 min instead of ~24 here; a third
# gains under a minute and slows each end-to-end test by half. loadscope keeps a module's tests
# in one worker, so a module's stack (compose services, a standalone cluster, a dashboard)
# starts once and its tests run in the order they were written.
SLOW_TEST_WORKERS ?= 2
test: $(VENV)/.installed
	$(PY) -m pytest -m "not slow and not spark_matrix" -n $(TEST_WORKERS) --dist worksteal

test-slow: $(VENV)/.installed
	$(PY) -m pytest -m "slow and not spark_matrix and not long" -n $(SLOW_TEST_WORKERS) --dist loadscope

# The modules of several minutes each (marker `long`: the origin failovers, the one-driver
# and Spark supervisor scenarios, Redis outages, `sparkpoint run` recoveries, the standalone
# cluster, the bounded chaos run): ~25 min of test time that kept CI past 30 minutes on a
# loaded machine, so they run here and not in CI.
test-long: $(VENV)/.installed
	$(PY) -m pytest -m "long and not spark_matrix" -n $(SLOW_TEST_WORKERS) --dist loadscope

test-spark-matrix: $(VENV)/.installed
	$(PY) -m pytest -m spark_matrix

# The chaos suite for minutes, the server in both its modes (make test-long runs its bounded
# form: 60 s of faults, the server in its default mode).
CHAOS_SECONDS ?= 300
chaos: $(VENV)/.installed
	SPARKPOINT_CHAOS_SECONDS=$(CHAOS_SECONDS) SPARKPOINT_CHAOS_MODES=two-processes,one-process \
		$(PY) -m pytest -m chaos tests/chaos -s

# The REST reference, generated from the API's OpenAPI document (a test checks it is current).
docs: $(VENV)/.installed
	$(PY) -m sparkpoint_server.api.reference > docs/rest.md

# The benchmarks and examples are type-checked too: no test runs every benchmark, and a
# benchmark that an API change broke was found only when someone ran it.
lint: $(VENV)/.installed
	$(VENV)/bin/ruff check jobs backend frontend migrations tests
	$(VENV)/bin/ruff format --check jobs backend frontend migrations tests
	$(VENV)/bin/mypy
	$(VENV)/bin/mypy tests/benchmarks jobs/examples

format: $(VENV)/.installed
	$(VENV)/bin/ruff format jobs backend frontend migrations tests

bench: $(VENV)/.installed
	$(PY) tests/benchmarks/bench_pv.py

bench-control-plane: $(VENV)/.installed
	$(PY) tests/benchmarks/bench_ingest.py
	$(PY) tests/benchmarks/bench_api.py

# 200 simulated connected jobs checkpointing every second against a real `sparkpoint server`
# (LOAD_MINUTES=1 for a short run, LOAD_ARGS="--py-spy py-spy" to profile the server);
# writes tests/benchmarks/results/load.md and load.csv.
LOAD_MINUTES ?= 10
LOAD_JOBS ?= 200
LOAD_ARGS ?=
bench-load: $(VENV)/.installed
	$(PY) tests/benchmarks/bench_load.py --jobs $(LOAD_JOBS) --minutes $(LOAD_MINUTES) $(LOAD_ARGS)

# The Redis -> SQL example pipeline with checkpoints every second vs without (PostgreSQL and
# Redis of the tests); writes tests/benchmarks/results/redis_to_sql.md and .json.
bench-redis-to-sql: $(VENV)/.installed
	$(PY) tests/benchmarks/bench_redis_to_sql.py

# A connected PV job's output: how long after its checkpoint completed the sinks commit, with
# completions obeyed while an epoch runs vs between epochs only (~3 min; the tests' Redis);
# writes tests/benchmarks/results/commit_latency.md and .json.
bench-commit-latency: $(VENV)/.installed
	$(PY) tests/benchmarks/bench_commit_latency.py

bench-dashboard: $(VENV)/.installed
	$(PY) tests/benchmarks/bench_dashboard.py

bench-ss: $(VENV)/.installed
	$(PY) tests/benchmarks/bench_vs_structured_streaming.py

# Keyed state backends without Spark: checkpoint and working-state cost at 1 MB, 100 MB, 1 GB
# (hashmap, rocksdb full / native / incremental; ~15 min; STATE_ARGS="--sizes 1MB,100MB" for a
# short run); writes tests/benchmarks/results/state.md and state.csv.
STATE_ARGS ?=
bench-state: $(VENV)/.installed
	$(PY) tests/benchmarks/bench_state.py $(STATE_ARGS)

# The PV job with 40 and with 1,000,000 keys on both state backends, 4 M and 20 M events
# (~12 min); writes tests/benchmarks/results/pv_keys.md and .json.
bench-pv-keys: $(VENV)/.installed
	$(PY) tests/benchmarks/bench_pv_keys.py

# The PV job paced at 20 k events/s, started 2 M events behind, --emit epoch and every (~3 min);
# writes tests/benchmarks/results/catch_up.md, .json and .svg (epoch size and lag over time).
bench-catch-up: $(VENV)/.installed
	$(PY) tests/benchmarks/bench_catch_up.py

# A task failure -> the first record processed after the restore, the PV job with ~1 MB and
# ~100 MB of state on both backends (~20 min); writes tests/benchmarks/results/recovery.md, .json.
bench-recovery: $(VENV)/.installed
	$(PY) tests/benchmarks/bench_recovery.py

# PyFlink pins older numpy, pandas, pyarrow, cloudpickle, py4j and redis than the project's
# venv has, so it gets a venv of its own, used only by this benchmark.
PYFLINK_VENV ?= .venv-pyflink
$(PYFLINK_VENV)/.installed:
	test -x $(PYFLINK_VENV)/bin/python || $(PYTHON) -m venv $(PYFLINK_VENV)
	$(PYFLINK_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(PYFLINK_VENV)/bin/python -m pip install --quiet apache-flink==2.3.0
	touch $@

# A KeyedProcessFunction with a ValueState count per key, 1,000 keys, checkpoints every second:
# Sparkpoint (4 M events) vs PyFlink 2.3 (1 M and 200 k, thread mode) (~7 min); writes
# tests/benchmarks/results/per_record.md and .json.
PER_RECORD_ARGS ?=
bench-per-record: $(VENV)/.installed $(PYFLINK_VENV)/.installed
	$(PY) tests/benchmarks/bench_per_record.py --pyflink-python $(PYFLINK_VENV)/bin/python $(PER_RECORD_ARGS)

# The same stateless stage per record (map + filter), with map_batch in numpy and through Arrow
# (pyarrow.compute), in process without Spark (~30 s); writes tests/benchmarks/results/map_batch.md
# and .json.
bench-map-batch: $(VENV)/.installed
	$(PY) tests/benchmarks/bench_map_batch.py

DEMO_PORT ?= 8081
DEMO_DASHBOARD_PORT ?= 8050

# The control plane (embedded Redis unless REDIS_URL, SQLite unless DATABASE_URL), the dashboard
# and the example job connected to them; the control plane and the dashboard keep running after
# the job finished, until Ctrl-C. They run in sessions of their own (setsid), so Ctrl-C reaches
# only the job: it cancels and reports that through the control plane's Redis, and then the
# trap stops the control plane (and with it the embedded Redis) and the dashboard.
demo: $(VENV)/.installed
	@# A new demo starts clean but keeps the savepoints earlier demos took (nothing deletes them).
	mkdir -p $(DEMO_DIR)/server
	find $(DEMO_DIR) -mindepth 1 -maxdepth 1 ! -name server -exec rm -rf {} +
	find $(DEMO_DIR)/server -mindepth 1 -maxdepth 1 ! -name savepoints -exec rm -rf {} +
	@test ! -d $(DEMO_DIR)/server/savepoints || echo "earlier savepoints kept: $(DEMO_DIR)/server/savepoints"
	@set -euo pipefail; \
	export SPARKPOINT_DATA_DIR=$(abspath $(DEMO_DIR))/server; \
	export SPARKPOINT_API_URL=http://127.0.0.1:$(DEMO_PORT); \
	setsid $(VENV)/bin/sparkpoint server --port $(DEMO_PORT) > $(DEMO_DIR)/server.log 2>&1 & server=$$!; \
	setsid $(VENV)/bin/sparkpoint dashboard --port $(DEMO_DASHBOARD_PORT) > $(DEMO_DIR)/dashboard.log 2>&1 & dashboard=$$!; \
	trap 'kill $$server $$dashboard 2>/dev/null; wait $$server $$dashboard 2>/dev/null' EXIT INT TERM; \
	for _ in $$(seq 60); do curl -sf http://127.0.0.1:$(DEMO_PORT)/healthz >/dev/null && break; sleep 0.5; done; \
	curl -sf http://127.0.0.1:$(DEMO_PORT)/healthz >/dev/null || { cat $(DEMO_DIR)/server.log; exit 1; }; \
	for _ in $$(seq 60); do curl -sf http://127.0.0.1:$(DEMO_DASHBOARD_PORT)/ >/dev/null && break; sleep 0.5; done; \
	curl -sf http://127.0.0.1:$(DEMO_DASHBOARD_PORT)/ >/dev/null || { cat $(DEMO_DIR)/dashboard.log; exit 1; }; \
	echo "dashboard:     http://127.0.0.1:$(DEMO_DASHBOARD_PORT)"; \
	echo "control plane: http://127.0.0.1:$(DEMO_PORT) (OpenAPI: /docs, metrics: /metrics)"; \
	echo "API token:     $$(cat $$SPARKPOINT_DATA_DIR/api-token) (paste it into the dashboard's header to act)"; \
	echo "for the CLI (sparkpoint list, savepoint, restore, ...) in another shell, paste:"; \
	echo "  export SPARKPOINT_API_URL=$$SPARKPOINT_API_URL"; \
	echo "  export SPARKPOINT_API_TOKEN=$$(cat $$SPARKPOINT_DATA_DIR/api-token)"; \
	$(VENV)/bin/sparkpoint run jobs/examples/pv_count.py \
		--checkpoint-dir file://$(abspath $(DEMO_DIR))/checkpoints --checkpoint-interval 1 \
		--retained 30 --local-dir $(DEMO_DIR)/local \
		--events 12000000 --apps 10 --rate 20000 --output $(DEMO_DIR)/output; \
	echo; \
	echo "committed output:  $(DEMO_DIR)/output (files not starting with . or _)"; \
	echo "dashboard:         http://127.0.0.1:$(DEMO_DASHBOARD_PORT) (keeps running; Ctrl-C stops both)"; \
	wait $$server
