.PHONY: setup run test bench clean-test-docker

# Label the agent puts on every container/network/volume it creates.
MANAGED_LABEL := io.gpuhost.managed=true

# Idempotent: fast when the machine is already set up.
setup:
	bash scripts/dev-env.sh

run: setup
	.venv/bin/gpuhost-agent run $(ARGS)

test: setup
	.venv/bin/python -m pytest -q tests $(PYTEST_ARGS)

bench: setup
	.venv/bin/python bench/pickup_latency.py $(ARGS)
	.venv/bin/python bench/probe_time.py
	.venv/bin/python bench/log_throughput.py
	.venv/bin/python bench/event_latency.py

# Remove leftovers of interrupted tests/runs; containers first, they pin networks and volumes.
clean-test-docker:
	docker ps -aq --filter label=$(MANAGED_LABEL) | xargs -r docker rm -f
	docker network ls -q --filter label=$(MANAGED_LABEL) | xargs -r docker network rm
	docker volume ls -q --filter label=$(MANAGED_LABEL) | xargs -r docker volume rm -f
