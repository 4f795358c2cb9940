#!/usr/bin/env bash
# The integration tests (`make test`'s second half), in two pytest processes
# side by side:
#   - the hosts of their own (BESIDE): the modern host (test_modern_host.py, a
#     Debian 13 booted with its own systemd and dockerd in one container of
#     the test engine; about five minutes, most of them waiting on that host:
#     its boot, systemd's watchdog, restarts, upgrades and rollbacks) and the
#     GPU machine's script (test_gpu_machine_bundle.py: its own dockerd in a
#     network namespace of its own; about a minute); and install.sh's tests
#     (test_install*.py, test_upgrade_install.py: throw-away Debian chroots
#     with stand-ins for docker and systemd, no engine; about three minutes,
#     most of it pip installing in the chroot);
#   - everything else, in one process: those tests share the test engine's
#     containers, networks and the test Swarm, and judge them.
# The two touch nothing of each other's (the modern host's container and
# network carry their own label; its dockerd, agent and stacks live inside
# it; the bundle's dockerd has its own socket, data and namespace; the
# chroots are private mount namespaces over a cached rootfs), and
# together they keep `.ci/run` under its 30 minutes on 2 cores. The second
# half's output follows the first's. One module runs after both, alone:
# test_engine_restart.py restarts the test engine's dockerd, which stops
# every container it runs, the modern host's among them. Arguments go to all
# (a -k, a path); a part that selects no test (pytest's status 5) is not a
# failure.
#
#   bash scripts/integration-tests.sh [PYTEST_ARGS...]
set -uo pipefail
cd "$(dirname "$0")/.."

pytest=(env -u PYTHONDONTWRITEBYTECODE .venv/bin/python -m pytest)
log=$(mktemp -t gpuhost-beside.XXXXXX)
trap 'rm -f "$log"' EXIT

BESIDE=(
    tests/integration/test_modern_host.py
    tests/integration/test_gpu_machine_bundle.py
    tests/integration/test_install.py
    tests/integration/test_install_checks.py
    tests/integration/test_install_marketplace_line.py
    tests/integration/test_upgrade_install.py
)
AFTER=(tests/integration/test_engine_restart.py)
"${pytest[@]}" -q -p no:cacheprovider --durations=5 "${BESIDE[@]}" "$@" >"$log" 2>&1 &
beside=$!
"${pytest[@]}" -q --durations=15 "${BESIDE[@]/#/--ignore=}" "${AFTER[@]/#/--ignore=}" tests/integration "$@"
others=$?
wait "$beside"
host=$?

echo "---- beside them: ${BESIDE[*]} ----"
cat "$log"
echo "---- after both: ${AFTER[*]} ----"
"${pytest[@]}" -q -p no:cacheprovider "${AFTER[@]}" "$@"
after=$?
passed() { [ "$1" -eq 0 ] || [ "$1" -eq 5 ]; }
passed "$others" && passed "$host" && passed "$after"
