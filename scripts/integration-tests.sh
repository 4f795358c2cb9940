#!/usr/bin/env bash
# The integration tests (`make test`'s second half), in two pytest processes
# side by side:
#   - the modern host (tests/integration/test_modern_host.py, -m modern_host):
#     a Debian 13 booted with its own systemd and dockerd in one container of
#     the test engine; about five minutes, most of them waiting on that host
#     (its boot, systemd's watchdog, restarts, upgrades and rollbacks);
#   - everything else, in one process: those tests share the test engine's
#     containers, networks and the test Swarm, and judge them.
# The two touch nothing of each other's (the modern host's container and
# network carry their own label; its dockerd, agent and stacks live inside
# it), and together they keep `.ci/run` under its 30 minutes on 2 cores.
# The modern host's output follows the others'. Arguments go to both (a -k,
# a path); a half that selects no test (pytest's status 5) is not a failure.
#
#   bash scripts/integration-tests.sh [PYTEST_ARGS...]
set -uo pipefail
cd "$(dirname "$0")/.."

pytest=(env -u PYTHONDONTWRITEBYTECODE .venv/bin/python -m pytest)
log=$(mktemp -t gpuhost-modern-host.XXXXXX)
trap 'rm -f "$log"' EXIT

"${pytest[@]}" -q -p no:cacheprovider -m modern_host tests/integration/test_modern_host.py "$@" >"$log" 2>&1 &
modern=$!
"${pytest[@]}" -q --durations=15 -m "not modern_host" tests/integration "$@"
others=$?
wait "$modern"
host=$?

echo "---- beside them: the modern host (tests/integration/test_modern_host.py) ----"
cat "$log"
passed() { [ "$1" -eq 0 ] || [ "$1" -eq 5 ]; }
passed "$others" && passed "$host"
