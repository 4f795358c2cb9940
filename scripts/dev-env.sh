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

# Editable install: source edits need no reinstall, only pyproject.toml
# changes do, so a stamp newer than pyproject.toml means "up to date".
# Delete .venv/.dev-env-installed to force a reinstall.
stamp=.venv/.dev-env-installed
if [ ! -f pyproject.toml ]; then
    echo "dev-env: no pyproject.toml yet, skipping pip install"
elif [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ]; then
    echo "dev-env: .venv up to date with pyproject.toml, skipping pip install"
else
    echo "dev-env: pip install -e '.[test]'"
    .venv/bin/pip install -q -e '.[test]'
    touch "$stamp"
fi

bash scripts/ensure-dockerd.sh
bash scripts/build-test-images.sh

echo "dev-env: ready in $((SECONDS - start)) s"
