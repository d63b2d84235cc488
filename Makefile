# worker-template: every command sets up what it needs on a fresh machine.
#   make demo   render a worker into the reference host and watch it process 200 items
#   make test   the template's whole test suite and the engine's (what CI runs)
SHELL := /bin/bash
.DEFAULT_GOAL := help
PYTHON ?= python3
UV := $(shell command -v uv 2>/dev/null || echo "$(PYTHON) -m uv")
export UV_CACHE_DIR ?= $(HOME)/.cache/uv
export UV_LINK_MODE ?= copy
PYTEST_ARGS ?=
# pytest-xdist processes for make test: most tests wait on copier, uv and host test runs.
PYTEST_WORKERS ?= auto
# Dependencies of the rendered workers/runtime that no reference-host package has.
RUNTIME_ONLY_DEPS := "cronsim>=2.8"
XDIST_VERSION := $(shell sed -n '/^name = "pytest-xdist"/{n;s/version = "\(.*\)"/\1/p}' uv.lock)

.PHONY: help setup services browser demo test engine-check bench bench-scale chaos soak lint clean release-manifest release-check

help:
	@echo "make demo   render shipment-notifier into the reference host and process 200 items"
	@echo "make test   run the template's whole test suite (sets everything up first)"
	@echo "make engine-check  ruff, mypy and the engine's own tests, read from engine/ (no render)"
	@echo "make bench  ours vs procrastinate and pgqueuer, held to bench/targets.json"
	@echo "make bench-scale  10M rows of history, 1M due: the claim, the drain and an upgrade at scale (~1 h)"
	@echo "make chaos  10,000 items through 4 workers under kill -9, outages and half-open links"
	@echo "make soak   30 minutes at half capacity: no growth in memory, connections, fds, tasks"
	@echo "make lint   ruff and strict mypy over the template's own Python"
	@echo "make release-manifest VERSION=vX.Y.Z [COMMIT=<sha>]   record a release's rendered paths"
	@echo "make release-check   the template against those paths (also part of make test)"
	@echo "make clean  remove scratch renders (.demo/, .cache/)"

## Install uv (from PyPI) when missing, the template's locked tooling, and warm the uv
## cache with every package a rendered host needs, so renders sync offline afterwards.
setup:
	@command -v uv >/dev/null 2>&1 || $(PYTHON) -m uv --version >/dev/null 2>&1 \
		|| $(PYTHON) -m pip install --quiet --disable-pip-version-check uv
	@# Bytecode compiled once here: copier runs hundreds of times in make test, and a shell
	@# with PYTHONDONTWRITEBYTECODE set would otherwise compile its imports on every run.
	@$(UV) sync --locked --quiet --compile-bytecode
	@cd tests/fixtures/reference-host && UV_PROJECT_ENVIRONMENT=$(CURDIR)/.cache/warm-venv \
		$(UV) sync --locked --all-packages --quiet
	@# make engine-check runs the engine's tests under pytest-xdist in a rendered host, which
	@# installs it offline: this puts it (the template's locked version) in the uv cache.
	@$(UV) pip install --quiet --python .cache/warm-venv/bin/python pytest-xdist==$(XDIST_VERSION)
	@# The runtime's dependencies the reference host does not lock (workers/runtime's
	@# pyproject.toml.jinja): a render resolves them from the uv cache, offline.
	@$(UV) pip install --quiet --python .cache/warm-venv/bin/python $(RUNTIME_ONLY_DEPS)
	@# A render adds a workspace member, so its host re-resolves the lock offline: that needs
	@# the index metadata of every locked package (every Python fork), which installing from
	@# the lock alone never fetches.
	@cd tests/fixtures/reference-host && { $(UV) lock --refresh --dry-run --quiet 2>/dev/null \
		|| echo "make setup: package index unreachable; renders resolve from the uv cache alone" >&2; }
	@# prettier, pinned in package-lock.json, for tests/test_formatters.py (which fails without
	@# it); reinstalled only when the lock changed.
	@if [ node_modules/.package-lock.json -nt package-lock.json ]; then :; \
	elif command -v npm >/dev/null 2>&1; then npm ci --no-audit --no-fund --loglevel=error; \
	else echo "make setup: npm not found: install Node.js 20+ with npm (tests/test_formatters.py needs prettier)" >&2; \
		[ -z "$$CI" ] || exit 1; fi

services:
	@bash scripts/services.sh

## The browser test's Chromium (Debian packages), installed when missing.
browser:
	@bash scripts/browser.sh

demo: setup
	@$(UV) run --locked --quiet python scripts/demo.py $(DEMO_ARGS)

test: setup services browser
	@$(UV) run --locked ruff check --quiet extensions tests scripts bench
	@$(UV) run --locked ruff format --check --quiet extensions tests scripts bench
	@$(UV) run --locked mypy
	@$(UV) run --locked --quiet pytest -n $(PYTEST_WORKERS) --dist worksteal $(PYTEST_ARGS)
	@# The engine's exhaustive suite, once: hosts receive only its contract and seed cases.
	@$(UV) run --locked --quiet python scripts/engine_check.py
	@# The chaos harness's 1,000-item smoke, alone on the machine (its bounds are timings).
	@$(UV) run --locked --quiet python scripts/chaos.py --items 1000 $(CHAOS_SMOKE_ARGS)

## ENGINE_CHECK_NO_PG=1: without PostgreSQL and Redis (the integration tests deselected).
engine-check: setup
	@$(UV) run --locked --quiet python scripts/engine_check.py

## The peers (procrastinate, pgqueuer) go into their own virtualenv, never into a host's.
bench: setup services
	@$(UV) venv --quiet --allow-existing --python $(PYTHON) .bench/peers-venv
	@$(UV) pip install --quiet --python .bench/peers-venv/bin/python -r bench/requirements-peers.txt
	@$(UV) run --locked --quiet python bench/run.py

## Not in CI: its own PostgreSQL cluster (bench/scale.py; BENCH_SCALE_* knobs).
bench-scale: setup
	@$(UV) run --locked --quiet python bench/scale.py

## Its own PostgreSQL cluster and redis-server (initdb, pg_ctl, free ports): never the shared ones.
chaos: setup
	@$(UV) run --locked --quiet python scripts/chaos.py $(CHAOS_ARGS)

soak: setup
	@$(UV) run --locked --quiet python scripts/chaos.py --mode soak $(SOAK_ARGS)

lint: setup
	@$(UV) run --locked ruff check extensions tests scripts bench
	@$(UV) run --locked ruff format --check extensions tests scripts bench
	@$(UV) run --locked mypy

## When a release is cut: the paths that release renders for fixed sample answers, into
## release/manifest.json (commit it). Tags do not survive here, so the commit is explicit.
release-manifest: setup
	@test -n "$(VERSION)" || { echo "usage: make release-manifest VERSION=vX.Y.Z [COMMIT=<release commit>]" >&2; exit 2; }
	@$(UV) run --locked --quiet python scripts/release_guard.py build --version "$(VERSION)" --commit "$(or $(COMMIT),HEAD)"

## No rendered path of the last release gone without a _migrations step (tests/test_release_guard.py).
release-check: setup
	@$(UV) run --locked --quiet python scripts/release_guard.py check

clean:
	rm -rf .demo .bench .cache .chaos
