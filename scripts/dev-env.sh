#!/usr/bin/env bash
# One entry point to make this machine ready to run the agent and its tests:
# system packages, .venv with the package installed editable, a running
# dockerd, and the offline test images. Every step skips what is already done.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
start=$SECONDS

bash scripts/install-system-deps.sh

if [ ! -x .venv/bin/python ]; then
    echo "dev-env: creating .venv"
    python3 -m venv .venv
fi

# The locked versions only (requirements/*.lock, `make lock` renews them), each
# file checked against its sha256: first what builds the packages that are not
# wheels, then the rest built with those (no unhashed build environment), then
# the agent itself, editable (source edits need no reinstall). A stamp newer
# than pyproject.toml and every lock means "up to date"; delete
# .venv/.dev-env-installed to force a reinstall.
stamp=.venv/.dev-env-installed
# (The grep drops pip's warnings about this machine's configured extra indexes.)
pip() { .venv/bin/python -m pip install -q --disable-pip-version-check "$@" \
    2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2); }
if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ] && [ "$stamp" -nt requirements/dev.lock ] \
    && [ "$stamp" -nt requirements/build.lock ]; then
    echo "dev-env: .venv up to date with pyproject.toml and requirements/*.lock, skipping pip install"
else
    echo "dev-env: pip install --require-hashes -r requirements/build.lock, then -r requirements/dev.lock"
    pip --require-hashes -r requirements/build.lock
    pip --require-hashes --no-build-isolation -r requirements/dev.lock
    echo "dev-env: pip install --no-deps -e . (the agent, editable)"
    pip --no-deps --no-build-isolation -e .
    .venv/bin/python -m gpuhost_agent.common.lock_check requirements/dev.lock
    touch "$stamp"
fi

bash scripts/ensure-dockerd.sh
bash scripts/build-test-images.sh

echo "dev-env: ready in $((SECONDS - start)) s"
