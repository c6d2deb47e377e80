# gpushift — build, test, demo.  Every target installs what it needs itself (apt and pip),
# idempotently, on a fresh Debian 12 machine as root.
#
#   make demo        boot a private systemd user manager + session bus, run the daemon, switch
#   make test        lint + unit (3.10/3.11/3.12) + contract + integration + test-deb + real backends
#   make test-deb    make deb, lintian, the package's life cycle and the Ansible role in throwaway roots
#   make test-gpu    tests against a real NVIDIA GPU (real NVML, CUDA processes)
#   make soak        1,000 random events on the real daemon (about an hour): docs/reliability.md "Soak"
#   make build       the wheel, the man page and the shell completions, under build/
#   make install     as root: a virtualenv in /opt/gpushift, units, config, D-Bus policy, group,
#                    completions, man page (DESTDIR, PREFIX; docs/install.md says where each goes)
#   make uninstall   removes it again; keeps the ledger and edited config unless PURGE=1
#   make deb         gpushift_<version>_<arch>.deb under build/ (DEB_VERSION=...): docs/install.md

SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed
PYENV_ROOT ?= /root/.pyenv
PYTEST_FLAGS ?= -q -p no:cacheprovider

APT_PACKAGES := systemd dbus dbus-daemon libgirepository1.0-dev libcairo2-dev pkg-config gcc \
	python3-dev python3-venv faketime sqlite3 util-linux procps groff-base curl
# The fleet tests (tests/support/pgcluster.py) start a private PostgreSQL cluster of their own with
# the server's initdb and pg_ctl (/usr/lib/postgresql/15/bin); the package's own cluster (15/main on
# port 5432, which its install creates and may start) is never used.
APT_PACKAGES_TEST := postgresql
# Installed without their recommended packages: prometheus (with promtool) for the metrics tests,
# which start a private Prometheus of their own (not node_exporter, which it recommends).  On a host
# booted with systemd the package also enables its own prometheus.service; the tests never use it.
# nginx: the reference the front door's benchmarks measure beside it (tests/integration/
# test_bench_scripts.py runs them in their smoke mode); each run starts its own nginx with its own
# config and prefix on a loopback port, never the nginx.service the package may enable on such a host.
APT_PACKAGES_NO_RECOMMENDS := prometheus nginx
# Only the integration tests need these: chromium, the real headless browser the status page's test
# opens the page in (tests/support/chromium.py).
TEST_APT_PACKAGES := chromium

.PHONY: all deps test-deps venv lint test test-unit test-pythons test-contract test-integration test-real \
	test-gpu test-deb soak demo demo-stop build man completions install uninstall deb clean bench bench-smoke bench-gpu

all: venv

deps:
	@missing=""; for p in $(APT_PACKAGES) $(APT_PACKAGES_TEST); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	bare=""; for p in $(APT_PACKAGES_NO_RECOMMENDS); do dpkg -s $$p >/dev/null 2>&1 || bare="$$bare $$p"; done; \
	if [ -n "$$missing$$bare" ]; then echo "apt: installing$$missing$$bare"; apt-get update -qq || exit 1; \
	  if [ -n "$$missing" ]; then DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null || exit 1; fi; \
	  if [ -n "$$bare" ]; then DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$bare >/dev/null || exit 1; fi; \
	else echo "apt: all present"; fi

$(STAMP): pyproject.toml | deps
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[test,lint]'
	touch $(STAMP)

venv: deps $(STAMP)

lint: venv
	$(VENV)/bin/ruff check gpushift tests bench packaging
	$(VENV)/bin/ruff format --check gpushift tests bench packaging
	$(VENV)/bin/mypy gpushift tests/support packaging
	$(VENV)/bin/lint-imports
	$(PY) -m tests.support.lint_sizes gpushift   # no module over 500 lines, no function over 80

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
	    $$env/bin/pip install -q pytest pytest-timeout hypothesis "apscheduler>=3.11.2,<4" click structlog psutil nvidia-ml-py "prometheus-client>=0.17" "jeepney>=0.8" "aiohttp>=3.9" "asyncpg>=0.29" "tomli>=2; python_version<'3.11'" && \
	    $$env/bin/pip install -q --no-deps -e . && touch $$env/.installed || exit 1; \
	  fi; \
	  echo "== unit tests on $$($$env/bin/python --version)"; \
	  $$env/bin/pytest $(PYTEST_FLAGS) tests/unit || exit 1; \
	done

test-contract: venv
	$(VENV)/bin/pytest $(PYTEST_FLAGS) tests/contract

test-deps:
	@missing=""; for p in $(TEST_APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then echo "apt: installing$$missing"; apt-get update -qq || exit 1; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null || exit 1; \
	else echo "apt (tests): all present"; fi

# The package's tests (test_deb_*, test_ansible_*) are test-deb's, which installs what they need.
test-integration: venv test-deps
	$(VENV)/bin/pytest $(PYTEST_FLAGS) --ignore-glob='*/test_deb_*' --ignore-glob='*/test_ansible_*' tests/integration

test-real: venv
	bash tests/realbackends/setup.sh
	$(VENV)/bin/pytest $(PYTEST_FLAGS) -s --durations=0 tests/realbackends

# The Debian package (docs/install.md, "The Debian package"): make deb's package, lintian, and its
# life cycle in a throwaway Debian 12 (debootstrap, cached under /var/cache/gpushift); then the
# Ansible role against two such roots (contrib/ansible).  Needs the Debian mirror once per machine.
DEB_TEST_APT_PACKAGES := lintian debootstrap dpkg-dev binutils file
test-deb: venv
	@missing=""; for p in $(DEB_TEST_APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then echo "apt: installing$$missing"; apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null || exit 1; fi
	$(VENV)/bin/pytest $(PYTEST_FLAGS) --durations=0 tests/integration/test_deb_build.py tests/integration/test_deb_lifecycle.py \
	  tests/integration/test_ansible_role.py

test: lint test-unit test-pythons test-contract test-integration test-deb test-real

# The soak (tests/support/soak.py) at 1,000 events: the short version runs in test-integration.  It
# writes its report into docs/reliability.md ("Soak") and every event, one JSON line each, to
# build/soak-events.jsonl.  SOAK_EVENTS and SOAK_SEED change the run; SOAK_DEADLINE_S (seconds) stops
# it early (the report then says how many events ran, and the target fails).
SOAK_EVENTS ?= 1000
SOAK_SEED ?= 7
SOAK_DEADLINE_S ?=
soak: venv
	mkdir -p $(BUILDDIR)
	GPUSHIFT_SOAK_EVENTS=$(SOAK_EVENTS) GPUSHIFT_SOAK_SEED=$(SOAK_SEED) GPUSHIFT_SOAK_DEADLINE_S=$(SOAK_DEADLINE_S) GPUSHIFT_SOAK_REPORT=docs/reliability.md \
	  GPUSHIFT_SOAK_LOG=$(BUILDDIR)/soak-events.jsonl $(VENV)/bin/pytest $(PYTEST_FLAGS) -s tests/integration/test_soak.py

# On a GPU host: needs torch (CUDA), nvidia-ml-py, psutil and pytest in $(PYTHON); see tests/gpu/README.md.
test-gpu:
	PYTHONPATH=.$${PYTHONPATH:+:$$PYTHONPATH} $(PYTHON) -m pytest --confcutdir=tests/gpu -p no:cacheprovider -v tests/gpu

demo: venv
	$(PY) -m tests.support.demo run

demo-stop:
	$(PY) -m tests.support.demo stop

# Benchmarks (results in docs/benchmarks.md; each script also runs alone, its docstring says how).
# bench: every one that runs here (about 20 minutes); bench-smoke: each for one short round, nothing
# written; bench-gpu: the GPU one, on a GPU host (system Python with torch and nvidia-ml-py).
bench: venv
	$(PY) bench/ledger_list.py
	$(PY) bench/switch_overhead.py
	$(PY) bench/status.py
	$(PY) bench/status.py --cold
	$(PY) bench/footprint.py
	$(PY) bench/prewarm.py
	$(PY) bench/fleet_ledger.py
	$(PY) bench/frontdoor_speed.py
	$(PY) bench/frontdoor_stream.py
	$(PY) bench/frontdoor_switch.py
	$(PY) bench/status_flood.py

bench-smoke: venv
	$(PY) bench/ledger_list.py --smoke
	$(PY) bench/switch_overhead.py --smoke --start-delay 0
	$(PY) bench/status.py --smoke
	$(PY) bench/status.py --smoke --cold
	$(PY) bench/prewarm.py --smoke
	$(PY) bench/footprint.py --smoke
	$(PY) bench/fleet_ledger.py --smoke
	$(PY) bench/frontdoor_speed.py --smoke
	$(PY) bench/frontdoor_stream.py --smoke
	$(PY) bench/frontdoor_switch.py --smoke
	$(PY) bench/status_flood.py --smoke

bench-gpu:
	PYTHONPATH=.$${PYTHONPATH:+:$$PYTHONPATH} $(PYTHON) bench/gate_latency.py
	PYTHONPATH=.$${PYTHONPATH:+:$$PYTHONPATH} $(PYTHON) bench/status.py --cold --section status_cold_gpu

# ------------------------------------------------------------------ build, install, uninstall
# `make build` (run by install) writes under $(BUILDDIR): the wheel, built from a copy of only what
# it is made of (a stale build/ or egg-info of the checkout cannot leak into it); gpushift(1),
# generated from the click commands (packaging/manpage.py), so it never drifts from --help; the
# bash, zsh and fish completions, which click generates itself (_GPUSHIFT_COMPLETE=SHELL_source).
# `make install` / `make uninstall` run packaging/install.sh, which says what each step does; as
# root, DESTDIR (a staged tree that runs once moved to /) and PREFIX (the virtualenv) respected.
# The venv is made at $(DESTDIR)$(PREFIX).new, then every path it names of itself (shebangs,
# pyvenv.cfg, the source paths in .pyc files) is rewritten to $(PREFIX), and install fails if one is
# left: not made at its final path in a private mount namespace, because a package build with
# DESTDIR (fakeroot, a build container) has neither root nor mount namespaces, and because the same
# staging lets an upgrade replace a running daemon's venv only once the new one is complete.
# The venv is made from the system Python (INSTALL_PYTHON), never from a pyenv under /root that
# the group's members could not read; PIP_ARGS go to every pip (e.g. --no-index --find-links DIR).
BUILDDIR ?= build
PREFIX ?= /opt/gpushift
BINDIR ?= /usr/local/bin
INSTALL_PYTHON ?= $(firstword $(wildcard /usr/bin/python3) python3)
PIP_ARGS ?=
PURGE ?= 0
PKG_SOURCES := pyproject.toml README.md LICENSE $(shell find gpushift -name '*.py' -o -name '*.xml')
WHEEL_STAMP := $(BUILDDIR)/wheel/.built
MAN_PAGE := $(BUILDDIR)/man/gpushift.1
COMPLETIONS_STAMP := $(BUILDDIR)/completions/.built
INSTALL_ENV = DESTDIR="$(DESTDIR)" PREFIX="$(PREFIX)" BINDIR="$(BINDIR)" BUILDDIR="$(abspath $(BUILDDIR))" \
	PYTHON="$(INSTALL_PYTHON)" BUILD_PYTHON="$(abspath $(PY))" PIP_ARGS="$(PIP_ARGS)" PURGE="$(PURGE)"

build: $(WHEEL_STAMP) man completions

man: $(MAN_PAGE)

completions: $(COMPLETIONS_STAMP)

$(WHEEL_STAMP): $(PKG_SOURCES) | $(STAMP)
	rm -rf $(BUILDDIR)/wheel $(BUILDDIR)/src
	mkdir -p $(BUILDDIR)/src
	cp -r pyproject.toml README.md LICENSE gpushift $(BUILDDIR)/src/
	find $(BUILDDIR)/src -name __pycache__ -prune -exec rm -rf {} +
	$(PIP) wheel -q --no-deps $(PIP_ARGS) -w $(BUILDDIR)/wheel $(BUILDDIR)/src
	rm -rf $(BUILDDIR)/src
	touch $@

$(MAN_PAGE): $(PKG_SOURCES) packaging/manpage.py | $(STAMP)
	$(PY) packaging/manpage.py -o $@

$(COMPLETIONS_STAMP): $(PKG_SOURCES) | $(STAMP)
	mkdir -p $(@D)
	_GPUSHIFT_COMPLETE=bash_source $(VENV)/bin/gpushift > $(@D)/gpushift.bash
	_GPUSHIFT_COMPLETE=zsh_source $(VENV)/bin/gpushift > $(@D)/_gpushift
	_GPUSHIFT_COMPLETE=fish_source $(VENV)/bin/gpushift > $(@D)/gpushift.fish
	touch $@

install: build
	$(INSTALL_ENV) bash packaging/install.sh install

uninstall:
	$(INSTALL_ENV) bash packaging/install.sh uninstall

# `make deb`: packaging/deb.sh stages what make install lays out (the same install.sh, the venv at
# /opt/gpushift from the wheel that `make build` built with pip's isolated build), and makes it a
# Debian package with dpkg-deb: docs/install.md, "The Debian package".  DEB_VERSION overrides the
# version (default: the wheel's, "-1"); DEB_OUTDIR where the .deb goes (default BUILDDIR).
DEB_VERSION ?=
DEB_OUTDIR ?= $(BUILDDIR)
deb: build
	BUILDDIR="$(abspath $(BUILDDIR))" DEB_OUTDIR="$(abspath $(DEB_OUTDIR))" DEB_VERSION="$(DEB_VERSION)" \
	  PYTHON="$(INSTALL_PYTHON)" BUILD_PYTHON="$(abspath $(PY))" PIP_ARGS="$(PIP_ARGS)" bash packaging/deb.sh

clean:
	rm -rf $(VENV) .venv-3.10 .venv-3.12 .demo $(BUILDDIR) *.egg-info
