# gpufleet.mps - development entry points. `make test` is what CI runs (.ci/run), from a fresh clone.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := $(CURDIR)/.venv
VPY := $(VENV)/bin/python
SIMHOST := $(CURDIR)/.simhost
# ansible-test needs the collection at a real .../ansible_collections/gpufleet/mps path outside this
# git checkout (it lists files from the nearest .git up the tree).
TEST_ROOT ?= /tmp/gpufleet-mps-test-$(shell printf '%s' '$(CURDIR)' | md5sum | cut -c1-8)
COLL := $(TEST_ROOT)/ansible_collections/gpufleet/mps
ANSIBLE_TEST := $(VENV)/bin/ansible-test
# ansible-test's venvs see the repository's collections only through this path.
export ANSIBLE_COLLECTIONS_PATH := $(TEST_ROOT)
# Tools call each other by name (antsibull-docs runs ansible-doc, ansible-lint runs ansible).
export PATH := $(VENV)/bin:$(PATH)

.PHONY: help
help:
	@echo 'make test       everything CI runs: sanity, units, integration, lint, docs, fakes, engines, molecule'
	@echo 'make demo       provision a simulated 4-GPU host in $$TEST_ROOT/demo with the fleet role (make demo-clean to undo)'
	@echo 'make simhost    build the simulated GPU host into .simhost/ (then: . .simhost/env)'
	@echo 'make venv       create .venv from requirements-dev.txt (exact pins)'
	@echo 'make docs       build the HTML docsite offline (into $$TEST_ROOT/docsite)'
	@echo 'make sanity | units | integration | upgrade | lint | changelog-lint | docs-lint | test-fakes | packaging | engines | molecule'
	@echo 'make ee         ansible-builder create on the example execution environment (no container engine needed)'
	@echo 'make runner     the fleet role through ansible-runner as AWX runs it, a rolling change included'
	@echo 'make clean      remove .simhost and $$TEST_ROOT (the copied collection tree, the demo), ending what runs there'

# --- environment ------------------------------------------------------------------------------
.PHONY: deps venv
deps:
	hacking/install-deps.sh

venv: $(VENV)/.installed
$(VENV)/.installed: requirements-dev.txt
	test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	touch $@

# ansible-test bootstraps pip in each venv it makes with a script it downloads from a host that is
# not reachable offline (ansible/ansible#77304); it uses a cached copy when present.
GET_PIP_VERSION = $(shell grep -oP "pip='\K[0-9.]+" $$($(VPY) -c 'import ansible_test, os; print(os.path.dirname(ansible_test.__file__))')/_internal/python_requirements.py)
.PHONY: ansible-test-bootstrap
ansible-test-bootstrap: venv
	mkdir -p $(HOME)/.ansible/test/cache
	install -m 0644 hacking/get_pip_standin.py $(HOME)/.ansible/test/cache/get_pip_$(subst .,_,$(GET_PIP_VERSION)).py

# --- simulated GPU host -----------------------------------------------------------------------
NVML_INCLUDE = $(shell $(VPY) -c 'import glob, os, sysconfig; print(os.path.dirname(sorted(glob.glob(sysconfig.get_paths()["purelib"] + "/nvidia/*/include/nvml.h"))[-1]))')

.PHONY: simhost simhost-reset
simhost: deps venv
	$(MAKE) -s -C tests/fakes/nvml OUT=$(SIMHOST)/lib NVML_INCLUDE=$(NVML_INCLUDE)
	tests/fakes/make-simhost.sh $(SIMHOST) $(SIMHOST)/lib $(VPY)

# Back to the pristine 4-GPU host (compute modes are written into nvml.ini by the fake).
simhost-reset:
	rm -f $(SIMHOST)/nvml.ini
	$(MAKE) simhost

# --- tests --------------------------------------------------------------------------------------
# Each step that runs simulated GPU hosts runs as on a machine of its own (hacking/own-host.py: a PID namespace and a
# /dev/shm of its own, where root can have them): it sees no daemon of another suite, another checkout or a running
# `make demo`, and what it leaves running is named, then ended with it.
OWN_HOST = $(PYTHON) $(CURDIR)/hacking/own-host.py --check $(CURDIR) --check $(TEST_ROOT) --

.PHONY: test collection engines sanity units integration upgrade lint changelog-lint docs-lint docs docs-commands test-fakes molecule packaging bench-quick ssh ee runner leftovers
test: changelog-lint test-fakes sanity units integration upgrade lint docs-lint docs docs-commands packaging ee runner bench-quick ssh engines molecule
	$(MAKE) leftovers
	@echo 'make test: all passed'

# Every step stops what it started: fail, naming them, when a process of this checkout's tests (a simulated
# daemon, server or client) is still running (hacking/leftovers.py; other checkouts' are not looked at). A
# running `make demo` is the user's, not a test's: make demo-clean stops it.
leftovers:
	$(VPY) hacking/leftovers.py --except $(DEMO_DIR) $(CURDIR) $(TEST_ROOT)

collection: venv
	hacking/collection-tree.sh $(TEST_ROOT) >/dev/null

sanity: collection ansible-test-bootstrap deps
	cd $(COLL) && $(ANSIBLE_TEST) sanity --python 3.11 --color no --venv --requirements

units: collection ansible-test-bootstrap deps
	if [ -d tests/unit ]; then cd $(COLL) && $(OWN_HOST) $(ANSIBLE_TEST) units --python 3.11 --color no --venv --requirements; \
	else echo 'units: no tests/unit yet'; fi

# Targets lay out their own simulated hosts from these (tests/integration/targets/setup_simhost).
integration: collection ansible-test-bootstrap simhost
	if ls tests/integration/targets/*/ >/dev/null 2>&1; then \
	  printf 'fakes_dir: %s\nsimhost_lib: %s\nsimhost_python: %s\ncollections_path: %s\n' $(CURDIR)/tests/fakes $(SIMHOST)/lib $(VPY) $(TEST_ROOT) \
	    > $(COLL)/tests/integration/integration_config.yml; \
	  cd $(COLL) && $(OWN_HOST) $(ANSIBLE_TEST) integration --python 3.11 --color no --local $(TARGETS); \
	else echo 'integration: no targets yet'; fi

# Upgrade in place: a host provisioned by the previous main (daemons running, a client connected) is taken over by
# this tree with changed=0, no daemon restarted and the client still running (hacking/test-upgrade.py).
upgrade: simhost
	$(OWN_HOST) $(VPY) hacking/test-upgrade.py $(TEST_ROOT)/upgrade $(SIMHOST)/lib $(VPY)

lint: venv
	$(VENV)/bin/ansible-lint

changelog-lint: venv
	$(VENV)/bin/antsibull-changelog lint

docs-lint: collection
	$(VENV)/bin/antsibull-docs lint-collection-docs --plugin-docs --check-extra-docs-refs $(COLL)

# The HTML docsite (modules, role, filter, docs/docsite/rst), offline; any Sphinx warning fails it.
DOCS_DEST ?= $(TEST_ROOT)/docsite
docs: collection
	hacking/build-docs.sh $(DOCS_DEST)

# The benchmark in its smallest form, so it keeps working (bench/README.md; never judges wall-clock times); then the
# no-op's CPU per host against BENCH_BASELINE measured in the same run (bench/compare.py), so that a regression shows in
# every run's output - a report: it fails only when a run fails. 4e9c7f4: main before issues 40-42.
BENCH_BASELINE ?= 4e9c7f4
bench-quick: collection simhost
	$(OWN_HOST) $(VPY) bench/fleetbench.py --hosts 2 --reps 1 --out $(TEST_ROOT)/bench-quick --sim-base $(TEST_ROOT)
	rm -rf $(TEST_ROOT)/bench-compare
	$(VPY) bench/compare.py --baseline $(BENCH_BASELINE) --hosts 2 --pairs 1 --reps 1 --out $(TEST_ROOT)/bench-compare --sim-base $(TEST_ROOT)

# The fleet role over SSH to an sshd of the test's own on 127.0.0.1, as fleets are reached (openssh-server: make deps).
ssh: collection simhost deps
	TEST_ROOT=$(TEST_ROOT) $(OWN_HOST) $(VPY) -m pytest -q -p no:cacheprovider tests/ssh

# The galaxy tarball: no dev artefacts in it, and the installed copy runs by FQCN.
packaging: simhost
	$(OWN_HOST) hacking/test-packaging.sh $(SIMHOST)/lib $(VPY)

# An execution environment as AWX / Automation Platform uses it: the build context ansible-builder
# creates for meta/ee-example/ (which includes this collection's tarball) holds what the collection
# declares in meta/execution-environment.yml. `ansible-builder build` needs podman or docker: not run.
ee: collection
	hacking/test-ee.sh $(COLL) $(TEST_ROOT)/ee

# Jobs through ansible-runner on a private data dir (project, inventory of simulated hosts, env), the
# rolling recipe of docs/docsite/rst/guide_awx.rst included; tears down and leaves no daemon running.
runner: collection simhost
	$(OWN_HOST) $(VPY) hacking/test-runner.py --work $(TEST_ROOT)/runner --simhost-lib $(SIMHOST)/lib --python $(VPY)

# Every command the README and the guides show, run as shown (make demo and make demo-clean included), its
# shown output compared; a block that cannot run here says why (tests/docs/test_documented_commands.py).
docs-commands: collection simhost
	TEST_ROOT=$(TEST_ROOT) $(OWN_HOST) $(VPY) -m pytest -q -p no:cacheprovider tests/docs

# Real engines beside the collection (issue 28): a one-node Slurm cluster (munge, slurmctld, slurmd), a podman
# container and a node_exporter, each with a configuration under TEST_ROOT, against simulated hosts of their own;
# everything they start is stopped by pid, on failure too (tests/engines/README.md).
engines: collection simhost deps
	TEST_ROOT=$(TEST_ROOT) $(OWN_HOST) $(VPY) -m pytest -q -p no:cacheprovider tests/engines

test-fakes: simhost
	. $(SIMHOST)/env && $(OWN_HOST) $(VPY) -m pytest -q -p no:cacheprovider tests/fakes tests/gpu

# Scenarios find the role and modules through ANSIBLE_COLLECTIONS_PATH (the copied tree). Molecule keeps
# per-scenario state ("already prepared") across runs; each run starts from a reset. On failure the failed task and
# its message are printed last (hacking/failed-task.py), since CI keeps only the tail and molecule ends with its recap.
molecule: collection simhost
	if ls extensions/molecule/*/molecule.yml >/dev/null 2>&1; then \
	  . $(SIMHOST)/env && export GPUFLEET_TEST_ROOT=$(TEST_ROOT) && \
	  for scenario in $(if $(SCENARIO),$(SCENARIO),$$(ls extensions/molecule/*/molecule.yml | xargs -n1 dirname | xargs -n1 basename)); do \
	    $(VENV)/bin/molecule reset -s $$scenario >/dev/null; \
	  done && \
	  $(OWN_HOST) $(VENV)/bin/molecule test $(if $(SCENARIO),-s $(SCENARIO),--all) 2>&1 | tee $(TEST_ROOT)/molecule.log \
	  || { $(VPY) hacking/failed-task.py $(TEST_ROOT)/molecule.log; exit 1; }; \
	else echo 'molecule: no scenarios yet'; fi

.PHONY: demo demo-clean
# The README's first command: the fleet role on a simulated 4-GPU host, twice (the second run changes nothing),
# in this checkout's own directory; it fails unless every resource runs a healthy daemon.
DEMO_DIR := $(TEST_ROOT)/demo
# This checkout's collection (the tree `make collection` copies), never a copy installed elsewhere (molecule
# installs one in ~/.ansible/collections, which any checkout may have written last).
DEMO = . $(SIMHOST)/env && GPUFLEET_DEMO_DIR=$(DEMO_DIR) ANSIBLE_COLLECTIONS_PATH=$(TEST_ROOT) \
  ANSIBLE_STDOUT_CALLBACK=default ANSIBLE_DISPLAY_SKIPPED_HOSTS=false ansible-playbook -i localhost, hacking/demo.yml
demo: collection simhost
	mkdir -p $(DEMO_DIR)
	$(DEMO)
	@echo '--- the same run again: nothing to change ---'
	$(DEMO) > $(DEMO_DIR)/again.log || { cat $(DEMO_DIR)/again.log; exit 1; }
	tail -n 3 $(DEMO_DIR)/again.log
	grep -Eq 'localhost +: ok=[0-9]+ +changed=0 +unreachable=0 +failed=0' $(DEMO_DIR)/again.log
	@echo 'Tear it down with: make demo-clean'

# The role's teardown, then nothing of the demo may run any more (checked), and its directory goes. A simulated
# client still connected to a demo daemon is ended with it (mps_busy=terminate): the whole demo is going away.
demo-clean: collection simhost
	if [ -d $(DEMO_DIR)/host ]; then \
	  $(DEMO) -e mps_state=absent -e mps_remove_logs=true -e mps_busy=terminate > $(DEMO_DIR)/clean.log || { cat $(DEMO_DIR)/clean.log; exit 1; }; \
	  tail -n 3 $(DEMO_DIR)/clean.log; \
	fi
	$(VPY) hacking/leftovers.py $(DEMO_DIR)
	rm -rf $(DEMO_DIR)

.PHONY: clean
# Nothing may keep running on what this removes (the demo lives in TEST_ROOT; a simulated daemon whose
# directories are gone can no longer be stopped the role's way): end those processes first. Standard
# library only, so it works without .venv.
clean:
	$(PYTHON) hacking/leftovers.py --kill $(SIMHOST) $(TEST_ROOT)
	rm -rf $(SIMHOST) $(TEST_ROOT)
