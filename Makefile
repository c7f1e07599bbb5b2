# zkbeat: `make demo` shows the idea, `make test` proves it. Both install
# what is missing first (Debian/Ubuntu packages and a local virtualenv).

PYTHON      ?= python3
VENV        ?= .venv
BIN         := $(VENV)/bin
APT_PACKAGES := zookeeper redis-server faketime iproute2 chromium prometheus
SUDO        := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
PYTEST_ARGS ?=

.PHONY: help install system-deps test matrix lint format docs settings-doc demo bench chaos clean

help:
	@echo "make demo     run 3 beat replicas on a local ZooKeeper + Redis, kill the leader, show what happened"
	@echo "              (BROKER=amqp://guest:guest@127.0.0.1:5672// runs it on that broker instead of Redis)"
	@echo "make test     install what is missing and run the whole suite against real servers"
	@echo "make matrix   the in-process tests and one failover on every dependency version zkbeat claims (nox + uv)"
	@echo "make lint     ruff"
	@echo "make docs     the manual (Sphinx) into docs/_build/html, warnings as errors"
	@echo "make settings-doc  write the settings table of docs/settings.md from zkbeat/conf.py"
	@echo "make bench    benchmarks side by side with celery beat and celery-redbeat"
	@echo "make chaos    DURATION=1800: 3 replicas, 20 entries, a random fault every 20-60 s, then the accounting"

install: system-deps $(VENV)/.installed

# Servers the tests and the demo start themselves: ZooKeeper (Debian's
# package, on the installed Java) and redis-server; faketime (libfaketime)
# skews the clocks of replicas in the clock-skew tests; iproute2 (ip netns)
# gives the host-loss tests hosts of their own. RabbitMQ is only checked:
# the tests use the machine's own on 127.0.0.1:5672 (guest/guest), in vhosts
# of their own, and never start or stop one. chromium is the browser the
# dashboard's tests drive (playwright, launched on /usr/bin/chromium: no browser
# is ever downloaded); prometheus brings promtool, which checks the alert rules
# in docker/ (its server is never started).
system-deps:
	@missing=""; \
	[ -f /usr/share/java/zookeeper.jar ] || missing="$$missing zookeeper"; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	command -v faketime >/dev/null || missing="$$missing faketime"; \
	command -v ip >/dev/null || missing="$$missing iproute2"; \
	command -v java >/dev/null || missing="$$missing zookeeper"; \
	[ -x /usr/bin/chromium ] || missing="$$missing chromium"; \
	command -v promtool >/dev/null || missing="$$missing prometheus"; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $(APT_PACKAGES) >/dev/null; \
	fi
	@command -v rabbitmqctl >/dev/null || [ -x /usr/sbin/rabbitmqctl ] || \
	  echo "warning: rabbitmq-server is not installed; the RabbitMQ tests will fail: apt-get install -y rabbitmq-server, then rabbitmq-server -detached"
	@$(PYTHON) -c 'import socket; socket.create_connection(("127.0.0.1", 5672), timeout=3).close()' 2>/dev/null || \
	  echo "warning: nothing listens on 127.0.0.1:5672; the RabbitMQ tests will fail: start it with rabbitmq-server -detached"

$(VENV)/.installed: setup.cfg pyproject.toml
	[ -x $(BIN)/python ] || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,dev,django]'
	touch $@

# The suite runs on WORKERS pytest-xdist workers (-n; --dist loadfile is in
# pyproject.toml). Its tests mostly wait on real servers, processes and
# sessions, not on the CPU, so it runs WORKERS_PER_CORE workers per core
# (docs/development.md has the measurements). WORKERS=0 runs it serially in
# one process (for --pdb, or to read one test's output in order).
WORKERS_PER_CORE ?= 2
WORKERS ?= $(shell echo $$(( $$(nproc 2>/dev/null || echo 1) * $(WORKERS_PER_CORE) )))

test: install
	$(BIN)/python -m pytest -n $(WORKERS) $(PYTEST_ARGS)

# The version matrix (noxfile.py): each Celery minor, kazoo and
# django-celery-beat (with each Django) at their floor and newest, each session
# in its own virtualenv under .nox/ made by uv (installs come from uv's cache
# after the first run). Prints the table of results and times at the end and
# exits non-zero if any session failed. NOX_ARGS="-s floors" runs one session.
# Sessions run MATRIX_JOBS at a time, each its own `nox -s` process with its
# output in .nox/logs/<session>.log (printed when it fails); MATRIX_JOBS=1
# runs them one after another.
NOX_ARGS ?=
MATRIX_JOBS ?= $(WORKERS)

$(VENV)/.installed-matrix: $(VENV)/.installed setup.cfg
	$(BIN)/python -m pip install -q -e '.[matrix]'
	touch $@

matrix: install $(VENV)/.installed-matrix
	@rm -rf .nox/matrix.json .nox/logs && mkdir -p .nox/logs
	@start=$$(date +%s); status=0; \
	$(BIN)/nox --list-sessions --json $(NOX_ARGS) \
	  | $(BIN)/python -c 'import json, sys; print("\n".join(s["session"] for s in json.load(sys.stdin)))' \
	  | xargs -P $(MATRIX_JOBS) -I {} sh -c \
	    'if $(BIN)/nox -s "$$1" >".nox/logs/$$1.log" 2>&1; then echo "matrix: $$1 passed"; \
	     else echo "matrix: $$1 FAILED, the end of .nox/logs/$$1.log:"; tail -n 80 ".nox/logs/$$1.log"; exit 1; fi' _ {} \
	  || status=$$?; \
	$(BIN)/python noxfile.py || status=1; \
	echo "matrix wall time: $$(( $$(date +%s) - start )) s"; \
	exit $$status

lint: install
	$(BIN)/ruff check zkbeat tests example_project demo bench noxfile.py
	$(BIN)/ruff format --check zkbeat tests example_project demo bench noxfile.py

format: install
	$(BIN)/ruff check --fix zkbeat tests example_project demo bench noxfile.py
	$(BIN)/ruff format zkbeat tests example_project demo bench noxfile.py

# The settings table in docs/settings.md is generated from zkbeat/conf.py
# and committed (so it reads the same on GitHub as in the built manual);
# tests/test_docs_settings.py fails until this has been run after a change.
settings-doc: install
	$(BIN)/python -m zkbeat._settings_doc --write docs/settings.md

# The manual (docs/, Sphinx with MyST Markdown). The API reference is
# generated from the docstrings, so autodoc imports zkbeat (and Django, for DatabaseScheduler): the docs extra
# goes into the same venv. Warnings are errors, as in CI.
$(VENV)/.installed-docs: $(VENV)/.installed setup.cfg
	$(BIN)/python -m pip install -q -e '.[docs,django]'
	touch $@

docs: install $(VENV)/.installed-docs
	$(BIN)/sphinx-build -W --keep-going -b html docs docs/_build/html

# BROKER=<url>: a broker you run (RabbitMQ: amqp://guest:guest@127.0.0.1:5672//)
# instead of the private Redis the demo starts.
BROKER ?=

demo: install
	BROKER='$(BROKER)' $(BIN)/python -m demo

# Benchmarks (bench/, never part of `make test`): zkbeat side by side
# with celery beat and celery-redbeat on ZooKeeper and Redis started for the
# run. About twenty minutes; BENCH_ARGS=--quick for a short run (< 2 min).
BENCH_ARGS ?=

$(VENV)/.installed-bench: $(VENV)/.installed setup.cfg
	$(BIN)/python -m pip install -q -e '.[bench]'
	touch $@

bench: install $(VENV)/.installed-bench
	$(BIN)/python -m bench $(BENCH_ARGS)

# The chaos soak (tests/support/chaos.py): real replicas on a 3-member ensemble and
# Redis, faults injected into the leader, then twice/lost/skipped and who led
# when. Exits non-zero if a tick was published twice or lost unexplained.
# `make test` runs a short version (tests/test_chaos.py).
DURATION ?= 1800

chaos: install
	$(BIN)/python -m tests.support.chaos --duration $(DURATION)

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .ruff_cache docs/_build .nox
