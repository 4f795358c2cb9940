.PHONY: setup run check test test-fast lock test-latest fuzz bench soak clean-test-docker

# Label the agent puts on every container/network/volume it creates.
MANAGED_LABEL := io.gpuhost.managed=true

# The tests' Python keeps its bytecode caches (__pycache__, ignored by git), even
# where the environment turns them off (PYTHONDONTWRITEBYTECODE): pytest rewrites
# the asserts of every test module on every start otherwise, and each agent process a
# test starts recompiles the agent; with the caches, `make test-fast` takes 15 s less.
PYTEST := env -u PYTHONDONTWRITEBYTECODE .venv/bin/python -m pytest
# The unit tests' workers: one more than the cores, since a few of them wait on
# timers (an idle timeout, a throttled link) while the others can use the CPU.
UNIT_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
# schemathesis's pytest plugin serves the integration tests' API fuzzing only;
# each unit worker would import it (half a second) for nothing.
UNIT_TESTS := $(PYTEST) -q -n $(UNIT_WORKERS) -p no:schemathesis tests/unit

# Idempotent: fast when the machine is already set up.
setup:
	bash scripts/dev-env.sh

# A state directory of its own, inside the checkout (git ignores it): never the
# production one a real install keeps, even as root. ARGS="--state-dir ..." overrides.
# Renters' images may come from the local test registry (docs/operations.md, GPUHOST_ALLOWED_REGISTRIES).
# The agent takes make's place (exec) and stops when make does (setpriv's parent-death
# signal): `kill <pid of make run>`, as timeout or a supervisor sends it, stops the agent too.
run: setup
	GPUHOST_ALLOWED_REGISTRIES=$${GPUHOST_ALLOWED_REGISTRIES-127.0.0.1:5000} exec setpriv --pdeathsig TERM \
		.venv/bin/gpuhost-agent run --state-dir $(CURDIR)/state $(ARGS)

# The tools that keep the code's shape: style and format (ruff), types (mypy on
# src/), and the layers' import contracts (import-linter, pyproject.toml).
check:
	@test -x .venv/bin/python || { echo "check: no .venv yet; run 'make setup' once" >&2; exit 2; }
	.venv/bin/ruff check src tests bench scripts
	.venv/bin/ruff format --check src tests bench scripts
	.venv/bin/mypy
	.venv/bin/lint-imports

# Everything: the checks, then unit and integration tests against the real engine (what CI runs).
# The 15 slowest tests are listed at the end: the whole of .ci/run must stay under 35 minutes on 2 cores.
# The unit tests run on every core (pytest-xdist), the integration tests in one process (they
# share one Docker Engine and one test Swarm) with the modern host's beside it in another
# (scripts/integration-tests.sh says why). A PYTEST_ARGS that selects no test of a half
# (pytest's exit status 5) is not a failure.
test: setup check
	$(UNIT_TESTS) $(PYTEST_ARGS) || [ $$? -eq 5 ]
	bash scripts/integration-tests.sh $(PYTEST_ARGS)

# tests/unit alone, on every core: no Docker Engine, about a minute on 2 cores
# (docs/performance.md has the figure). Needs .venv: `make setup` once
# (and again after pyproject.toml changes).
test-fast:
	@test -x .venv/bin/python || { echo "test-fast: no .venv yet; run 'make setup' once" >&2; exit 2; }
	$(UNIT_TESTS) $(PYTEST_ARGS)

# Renew requirements/*.lock to the newest versions (scripts/lock.sh): then `make test`,
# and commit the renewal alone. Until then every install takes the locked versions.
lock:
	bash scripts/lock.sh

# The unit tests against the newest versions, without the lock, in a venv of their own
# (.venv-latest): what the next `make lock` would bring, tried before it is taken.
test-latest: setup
	rm -rf .venv-latest
	.venv/bin/uv venv -q --python .venv/bin/python .venv-latest
	.venv/bin/uv pip install -q --python .venv-latest/bin/python -e '.[test]'
	.venv-latest/bin/python -m gpuhost_agent.common.lock_check requirements/dev.lock \
		|| echo "test-latest: the packages above differ from the lock (a newer version is what make lock would take)"
	env -u PYTHONDONTWRITEBYTECODE .venv-latest/bin/python -m pytest -q -n $(UNIT_WORKERS) -p no:schemathesis \
		tests/unit $(PYTEST_ARGS)

# The hostile Compose generator (tests/support/hostile_compose.py) for longer than
# CI's fixed slice: FUZZ_EXAMPLES files judged by the sandbox (the raw pass, real
# Compose, the policy) and a tenth of that number deployed by the agent on the real
# engine, every container checked with docker inspect. A new random seed each run;
# FUZZ_SEED=N repeats one. 3000 files: about a quarter of an hour on 2 cores.
# First, the decoders' properties (tests/unit/test_decoders_property.py) with twenty
# times CI's examples: about three minutes.
FUZZ_EXAMPLES ?= 3000
FUZZ_SEED ?=
fuzz: setup
	GPUHOST_PROPERTY_SCALE=20 $(PYTEST) -q -p no:cacheprovider tests/unit/test_decoders_property.py $(PYTEST_ARGS)
	GPUHOST_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) GPUHOST_FUZZ_SEED=$(FUZZ_SEED) \
		$(PYTEST) -q -p no:cacheprovider tests/integration/test_sandbox_fuzz_engine.py $(PYTEST_ARGS)

# Every benchmark, printing its table; about an hour and a half on 2 cores, most
# of it the soak at the end (alone: make soak). ARGS go to pickup_latency.py.
bench: setup
	.venv/bin/python bench/pickup_latency.py $(ARGS)
	.venv/bin/python bench/probe_time.py
	.venv/bin/python bench/log_throughput.py
	.venv/bin/python bench/event_latency.py
	.venv/bin/python bench/host_limits.py
	.venv/bin/python bench/pull_guard.py
	.venv/bin/python bench/idle_cost.py
	.venv/bin/python bench/many_at_once.py
	bash scripts/build-bench-images.sh
	.venv/bin/python bench/tunnel.py
	.venv/bin/python bench/swarm_cluster.py
	.venv/bin/python bench/soak.py --cycles 2000 --every 100

# Months of churn compressed: 2000 deploy/remove cycles, about an hour on
# 2 cores; `make soak ARGS="--cycles 200"` for a shorter one.
soak: setup
	.venv/bin/python bench/soak.py --cycles 2000 --every 100 $(ARGS)

# Remove leftovers of interrupted tests/runs; containers first, they pin networks and volumes.
clean-test-docker:
	docker ps -aq --filter label=$(MANAGED_LABEL) | xargs -r docker rm -f
	docker network ls -q --filter label=$(MANAGED_LABEL) | xargs -r docker network rm
	docker volume ls -q --filter label=$(MANAGED_LABEL) | xargs -r docker volume rm -f
