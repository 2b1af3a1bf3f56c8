# kvlease: `make test` and `make demo` install what is missing themselves.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
JAVA_HOME ?= /usr/lib/jvm/java-17-openjdk-amd64
export JAVA_HOME
export SPARK_LOCAL_IP ?= 127.0.0.1
export PYSPARK_PYTHON := $(abspath $(PY))
PYTEST_ARGS ?=

.PHONY: test test-unit test-zk test-slow demo deps system-deps proto clean

system-deps:
	@bash ops/install_system_deps.sh

$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@touch $@

deps: system-deps $(VENV)/.installed

test: deps
	$(PY) -m pytest -q $(PYTEST_ARGS)

test-unit: deps
	$(PY) -m pytest -q -m unit $(PYTEST_ARGS)

test-zk: deps
	$(PY) -m pytest -q -m "zk or s3" $(PYTEST_ARGS)

test-slow: deps
	$(PY) -m pytest -q -m slow $(PYTEST_ARGS)

demo: deps
	$(VENV)/bin/kvlease demo

proto: $(VENV)/.installed
	$(PY) -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. common/proto/*.proto

clean:
	rm -rf $(VENV) .pytest_cache
