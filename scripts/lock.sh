#!/usr/bin/env bash
# Renew the dependency locks in requirements/ (`make lock`): every package,
# direct and transitive, pinned with the sha256 of each of its files, for every
# Python the agent supports (one universal resolution: markers pick per Python).
#   dev.lock    the agent and its tests' tools: make setup, .ci/run
#   agent.lock  the agent alone: install.sh on a host, the wheelhouses, releases
#   build.lock  what builds the packages that are not wheels (installed first)
#   checks.lock docker-py, for the GPU machine's checks (its bundle's wheels)
# agent.lock, build.lock and checks.lock are cut from dev.lock's resolution, so a host runs
# exactly the versions the suite ran. A renewal is a commit of its own, after
# `make test` passed on it; `make test-latest` tries the newest without a lock.
# After a change to the dependencies in pyproject.toml: `bash scripts/lock.sh --keep`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
uv=${UV:-.venv/bin/uv}
[ -x "$uv" ] || { echo "lock: no $uv (run 'make setup' once, or UV=/path/to/uv)" >&2; exit 2; }
compile=("$uv" pip compile --quiet --universal --python-version 3.10 --generate-hashes
         --no-strip-extras --custom-compile-command "make lock" ${LOCK_ARGS:-})
# --keep: the versions locked now stay where they still fit (a dependency added or
# removed in pyproject.toml); without it, every package goes to its newest.
upgrade=--upgrade
if [ "${1:-}" = --keep ]; then upgrade=; fi
"${compile[@]}" $upgrade pyproject.toml requirements/build.in --extra test -o requirements/dev.lock
"${compile[@]}" -c requirements/dev.lock pyproject.toml -o requirements/agent.lock
"${compile[@]}" -c requirements/dev.lock requirements/build.in -o requirements/build.lock
"${compile[@]}" -c requirements/dev.lock requirements/checks.in -o requirements/checks.lock
echo "lock: requirements/{dev,agent,build,checks}.lock renewed; review 'git diff requirements/', run 'make test', commit alone"
