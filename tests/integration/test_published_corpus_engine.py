"""The published Compose files that deploy (tests/sandbox_corpus/published/
outcomes.yaml), pasted as they are, through the local marketplace and the
agent on the real engine, every container then checked with `docker inspect`
for the sandbox's invariants. The decision alone:
tests/unit/test_published_corpus.py.

Their images cannot be pulled here, so each image name is a local tag of one
stand-in image, built for this test from the corpus itself: busybox, plus a
`standin` program under every executable name the files start (their
entrypoints, shell commands and health checks). As the container's first
process (or docker-init's child) it sleeps; anywhere else (a health check, a
step of a shell command) it exits 0, so health checks pass. A one-shot
service (one another waits on with `service_completed_successfully`) has its
arguments known to the stand-in, which then exits 0 even as the first
process: a shell runs the last step of `a && b` with exec, so n8n's import
step is the container's first process.
"""

from __future__ import annotations

import asyncio
import io
import re
import shlex
import tarfile

import docker
import pytest
import yaml
from support.sandbox_corpus import CORPUS, assert_container_sandboxed
from support.stacks import TEST_IMAGE

from gpuhost_agent.core.sandbox.apply import review_raw
from gpuhost_agent.protocol import wire
from gpuhost_agent.runtime.compose import ComposeRunner, find_compose_command

PUBLISHED = CORPUS / "published"
OUTCOMES = yaml.safe_load((PUBLISHED / "outcomes.yaml").read_text())
# Not deployable on this test engine, for reasons of the machine, not of the file:
NOT_HERE = {
    "36-ollama-docker-gpu.yaml",  # pull_policy: always (its renter's choice) needs the real registry
    # ulimits nofile 65536 is above the test dockerd's own hard limit: runc fails "error setting rlimit
    # type 7"; a dockerd under Docker's systemd unit has a higher one
    "26-nvidia-ai-blueprints-rag-nims.yaml",
}
DEPLOYS = sorted(n for n, w in OUTCOMES.items() if w["outcome"] == "deploys" and n not in NOT_HERE)
STANDIN = """#!/bin/sh
case "$*" in
    ONE_SHOTS) exit 0 ;;
esac
if [ $$ = 1 ] || { [ "$PPID" = 1 ] && [ "$(cat /proc/1/comm)" = docker-init ]; }; then
    exec sleep 2147483647
fi
exit 0
"""
WORD = re.compile(r"^[A-Za-z][A-Za-z0-9._-]*$")


def _words(value: object) -> set[str]:
    """Executable names a Compose value may start: first words of commands and of shell steps."""
    items = value if isinstance(value, list) else [value] if value else []
    found: set[str] = set()
    for item in items:
        for step in re.split(r"&&|\|\||;|\|", str(item)):
            first = step.strip().split(" ")[0].rsplit("/", 1)[-1] if step.strip() else ""
            if WORD.match(first):
                found.add(first)
    return found


def standin_names(models: list[dict]) -> set[str]:
    names = {"curl", "wget"}
    for model in models:
        for service in (model.get("services") or {}).values():
            names |= _words(service.get("entrypoint"))
            for item in service.get("command") or []:
                names |= _words(item)
            names |= _words((service.get("healthcheck") or {}).get("test"))
    return names - {"sh", "CMD", "CMD-SHELL", "exit", "sleep", "cat", "echo", "test", "true", "false"}


def one_shot_arguments(models: list[dict]) -> set[str]:
    """The arguments each step of a one-shot service's command gives its program."""
    found: set[str] = set()
    for model in models:
        services = model.get("services") or {}
        waited = {
            name
            for service in services.values()
            for name, spec in (service.get("depends_on") or {}).items()
            if (spec or {}).get("condition") == "service_completed_successfully"
        }
        for name in waited & set(services):
            service = services[name]
            for item in [*(service.get("entrypoint") or []), *(service.get("command") or [])]:
                for step in re.split(r"&&|\|\||;|\|", str(item)):
                    words = step.split()
                    if len(words) > 1 and WORD.match(words[0].rsplit("/", 1)[-1]):
                        found.add(" ".join(words[1:]))
    return found


def build_standin(client: docker.DockerClient, names: set[str], one_shots: set[str]) -> str:
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        links = " && ".join(f"ln -s /usr/local/bin/standin /usr/local/bin/{name}" for name in sorted(names))
        dockerfile = (
            f"FROM {TEST_IMAGE}\nCOPY standin /usr/local/bin/standin\n"
            f'RUN ["/bin/sh", "-c", "chmod 755 /usr/local/bin/standin && {links}"]\n'
            'ENTRYPOINT ["/usr/local/bin/standin"]\n'
        )
        cases = "|".join(shlex.quote(arguments) for arguments in sorted(one_shots)) or "'-no-one-shot-'"
        for name, text in (("Dockerfile", dockerfile), ("standin", STANDIN.replace("ONE_SHOTS", cases))):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    context.seek(0)
    image, _ = client.images.build(fileobj=context, custom_context=True, tag="gpuhost-test/standin:1", rm=True)
    return image.id


@pytest.fixture(scope="module")
def standin_tags(docker_client, tmp_path_factory):
    """Every image the deployable files name, as a tag of one stand-in image
    (built once for the module from the files' Compose models)."""
    compose = ComposeRunner(find_compose_command(), tmp_path_factory.mktemp("docker-config"))
    models = {}
    for name in DEPLOYS:
        variables = OUTCOMES[name].get("variables") or {}
        work = tmp_path_factory.mktemp(name.split("-")[0])
        raw = review_raw((PUBLISHED / name).read_text(), variables.get("COMPOSE_PROFILES", ""))
        (work / "compose.yaml").write_text(raw.text)
        models[name] = asyncio.run(compose.config("corpus", work, "compose.yaml", variables))
    image = build_standin(
        docker_client, standin_names(list(models.values())), one_shot_arguments(list(models.values()))
    )
    tags = {s["image"] for m in models.values() for s in m["services"].values()}
    for tag in tags:
        docker_client.api.tag(image, *_split(tag))
    yield tags
    for tag in tags:
        _untag(docker_client, tag)


@pytest.mark.parametrize("name", DEPLOYS)
async def test_a_published_file_deploys_as_pasted_and_stays_sandboxed(
    gpu_agent, docker_client, standin_tags, name
) -> None:
    renter, _parts, _local, _ = await gpu_agent(gpus=2)
    rental = await renter.rental(gpu_count=2)
    template_vars = OUTCOMES[name].get("variables") or {}
    text = await asyncio.to_thread((PUBLISHED / name).read_text)
    stack_id = await renter.stack(rental, text, variables=template_vars, name=name[:20])
    stack = await renter.wait_stack(rental, stack_id, (wire.APPLIED, wire.ERROR), timeout=120)
    assert stack["status"] == wire.APPLIED, (name, stack["errorMsg"])
    containers = await asyncio.to_thread(
        docker_client.containers.list, all=True, filters={"label": f"{wire.LABEL_STACK}={stack_id}"}
    )
    assert containers, name
    for container in containers:
        assert_container_sandboxed(container.attrs, allowed_gpus=2)


def _split(tag: str) -> tuple[str, str]:
    repository, _, version = tag.rpartition(":") if ":" in tag.rsplit("/", 1)[-1] else (tag, "", "latest")
    return repository, version


def _untag(client: docker.DockerClient, tag: str) -> None:
    try:
        client.images.remove(tag, noprune=True)
    except docker.errors.APIError:
        pass
