# gpushift — build, test, demo.  Every target installs what it needs itself (apt and pip),
# idempotently, on a fresh Debian 12 machine as root.
#
#   make demo        boot a private systemd user manager + session bus, run the daemon, switch
#   make test        lint + unit (3.10/3.11/3.12) + contract + integration + real backends
#   make test-gpu    tests against a real NVIDIA GPU (real NVML, CUDA processes)
#   make install     install the package, units, config, D-Bus policy (DESTDIR-aware)

SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed
PYENV_ROOT ?= /root/.pyenv
PYTEST_FLAGS ?= -q -p no:cacheprovider

APT_PACKAGES := systemd dbus dbus-daemon libgirepository1.0-dev libcairo2-dev pkg-config gcc \
	python3-dev python3-venv faketime sqlite3 util-linux procps

.PHONY: all deps venv lint test test-unit test-pythons test-contract test-integration test-real \
	test-gpu demo demo-stop install clean bench bench-smoke bench-gpu

all: venv

deps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then echo "apt: installing$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	else echo "apt: all present"; fi

$(STAMP): pyproject.toml | deps
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[test,lint]'
	touch $(STAMP)

venv: deps $(STAMP)

lint: venv
	$(VENV)/bin/ruff check gpushift tests bench
	$(VENV)/bin/ruff format --check gpushift tests bench
	$(VENV)/bin/mypy gpushift tests/support
	$(VENV)/bin/lint-imports

test-unit: venv
	$(VENV)/bin/pytest $(PYTEST_FLAGS) tests/unit

# The unit tests again under the other supported Pythons (3.10: Ubuntu 22.04, the field reports'
# host; 3.12), from the pyenv interpreters this machine kind has.
test-pythons: venv
	@for v in 3.10 3.12; do \
	  py=$$(ls -d $(PYENV_ROOT)/versions/$$v.*/bin/python3 2>/dev/null | tail -1); \
	  if [ -z "$$py" ]; then echo "FAIL: no Python $$v under $(PYENV_ROOT)/versions (make test needs it)"; exit 1; fi; \
	  env=.venv-$$v; \
	  if [ ! -f $$env/.installed ] || [ pyproject.toml -nt $$env/.installed ]; then \
	    $$py -m venv $$env && $$env/bin/pip install -q --upgrade pip && \
	    $$env/bin/pip install -q pytest pytest-timeout hypothesis "apscheduler>=3.11.2,<4" click structlog psutil nvidia-ml-py "tomli>=2; python_version<'3.11'" && \
	    $$env/bin/pip install -q --no-deps -e . && touch $$env/.installed || exit 1; \
	  fi; \
	  echo "== unit tests on $$($$env/bin/python --version)"; \
	  $$env/bin/pytest $(PYTEST_FLAGS) tests/unit || exit 1; \
	done

test-contract: venv
	$(VENV)/bin/pytest $(PYTEST_FLAGS) tests/contract

test-integration: venv
	$(VENV)/bin/pytest $(PYTEST_FLAGS) tests/integration

test-real: venv
	bash tests/realbackends/setup.sh
	$(VENV)/bin/pytest $(PYTEST_FLAGS) -s --durations=0 tests/realbackends

test: lint test-unit test-pythons test-contract test-integration test-real

# On a GPU host: needs torch (CUDA), nvidia-ml-py, psutil and pytest in $(PYTHON); see tests/gpu/README.md.
test-gpu:
	PYTHONPATH=. $(PYTHON) -m pytest --confcutdir=tests/gpu -p no:cacheprovider -v tests/gpu

demo: venv
	$(PY) -m tests.support.demo run

demo-stop:
	$(PY) -m tests.support.demo stop

# Benchmarks (results in docs/benchmarks.md; each script also runs alone, its docstring says how).
# bench: every one that runs here (about 6 minutes); bench-smoke: each for one short round, nothing
# written; bench-gpu: the GPU one, on a GPU host (system Python with torch and nvidia-ml-py).
bench: venv
	$(PY) bench/ledger_list.py
	$(PY) bench/switch_overhead.py
	$(PY) bench/status.py
	$(PY) bench/status.py --cold
	$(PY) bench/footprint.py

bench-smoke: venv
	$(PY) bench/ledger_list.py --smoke
	$(PY) bench/switch_overhead.py --smoke --start-delay 0
	$(PY) bench/status.py --smoke
	$(PY) bench/status.py --smoke --cold
	$(PY) bench/footprint.py --smoke

bench-gpu:
	PYTHONPATH=. $(PYTHON) bench/gate_latency.py
	PYTHONPATH=. $(PYTHON) bench/status.py --cold --section status_cold_gpu

install:
	$(PYTHON) -m pip install --prefix=$(DESTDIR)/usr/local .
	install -D -m 0644 units/gpushift.service $(DESTDIR)/etc/systemd/system/gpushift.service
	install -D -m 0644 units/gpushift-vllm.service $(DESTDIR)/etc/systemd/system/gpushift-vllm.service
	install -D -m 0644 units/gpushift-llama.service $(DESTDIR)/etc/systemd/system/gpushift-llama.service
	install -D -m 0644 etc/dbus-1/system.d/org.gpushift.Switcher1.conf $(DESTDIR)/usr/share/dbus-1/system.d/org.gpushift.Switcher1.conf
	test -e $(DESTDIR)/etc/gpushift/gpushift.toml || install -D -m 0644 etc/gpushift/gpushift.toml $(DESTDIR)/etc/gpushift/gpushift.toml
	test -e $(DESTDIR)/etc/gpushift/schedule || install -D -m 0644 etc/gpushift/schedule $(DESTDIR)/etc/gpushift/schedule

clean:
	rm -rf $(VENV) .venv-3.10 .venv-3.12 .demo build *.egg-info
