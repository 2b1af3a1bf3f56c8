# kvlease: `make test` and `make demo` install what is missing themselves
# (Java 17, the Debian `zookeeper` package, python3-venv, the venv) on a fresh
# Debian machine; run them as root or with sudo available.
#
#   make test        every test (Docker-only tests skip without a Docker engine)
#   make test-unit   tier 1: pure tests, no processes        (-m unit)
#   make test-zk     tier 2: real ZooKeeper / local S3        (-m "zk or s3")
#   make test-slow   tier 3: multi-process drills, long tests (-m slow)
#   make test-spark  the Spark source on real Spark, local[2] (-m spark)
#   make test PYTEST_ARGS="-x -k lease"
#   make test TEST_WORKERS=0   one process, no pytest-xdist workers
#   make bench       every benchmark; rewrites README's performance table
#
# Tests run in TEST_WORKERS pytest-xdist processes (default 3: on 2 cores most
# tests wait on servers); a module's tests stay on one worker, the Spark tests
# share one (tests/conftest.py).
#
# `make test` exits non-zero when pytest does; pytest's own exit code is left
# in $(PYTEST_RC) (.ci/run reports and returns it). No tests collected
# (pytest exit 5) fails `make test`; in a tier target it only says so.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
ARCH := $(shell dpkg --print-architecture 2>/dev/null || echo amd64)
JAVA_HOME ?= /usr/lib/jvm/java-17-openjdk-$(ARCH)
export JAVA_HOME
export SPARK_LOCAL_IP ?= 127.0.0.1
export PYSPARK_PYTHON := $(abspath $(PY))
PYTEST_ARGS ?=
TEST_WORKERS ?= 3
PYTEST_RC := .pytest_cache/kvlease-exit-code

.PHONY: test test-unit test-zk test-slow test-spark demo bench deps system-deps proto clean

system-deps:
	@bash ops/install_system_deps.sh

$(VENV)/.installed: pyproject.toml setup.py | system-deps
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@touch $@

deps: system-deps $(VENV)/.installed

# $(1): marker expression (empty: every test); $(2): "tier" if selecting no test is fine.
define run_pytest
	@mkdir -p $(dir $(PYTEST_RC)); rm -f $(PYTEST_RC); \
	$(PY) -m pytest -q --durations=25 -n $(TEST_WORKERS) --dist loadgroup $(if $(1),-m "$(1)") $(PYTEST_ARGS); rc=$$?; \
	echo $$rc > $(PYTEST_RC); \
	if [ $$rc -eq 5 ]; then \
	  if [ "$(2)" = tier ]; then echo "make: no test selected by -m '$(1)' $(PYTEST_ARGS): nothing to run"; rc=0; \
	  else echo "make: pytest collected no tests (exit code 5): that is a failure" >&2; fi; \
	fi; \
	exit $$rc
endef

test: deps
	$(call run_pytest,,)

test-unit: deps
	$(call run_pytest,unit,tier)

test-zk: deps
	$(call run_pytest,zk or s3,tier)

test-slow: deps
	$(call run_pytest,slow,tier)

test-spark: deps
	$(call run_pytest,spark,tier)

demo: deps
	$(VENV)/bin/kvlease demo

# every benchmark, one run (~20 min on 2 cores: keep the machine otherwise idle); the
# README's performance table and docs/bench-all.png are regenerated from its JSON
bench: deps
	$(VENV)/bin/kvlease bench all --json --plot docs/bench-all.png > docs/bench-all.json.new
	mv docs/bench-all.json.new docs/bench-all.json
	$(PY) -m kvlease.ops.bench.readme_table

proto: $(VENV)/.installed
	$(PY) -m kvlease.ops.proto

clean:
	rm -rf $(VENV) .pytest_cache
