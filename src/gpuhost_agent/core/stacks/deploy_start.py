"""The start of a deploy: Compose's model of the renter's file, and an `up`
that waits for the hardened one.

Every Compose call is a process start of some 30 ms (a 70 MB Go binary
initialising) before it does anything, and a deploy needs two: `config`,
whose normalised model the sandbox policy judges, then `up` on the hardened
result. Run one after the other, the second start sat on every deploy's
path. Here they start together: `config` reads the renter's file at once,
while `up` reads its file from stdin and so waits, having read nothing and
asked the engine for nothing, until the deployer gives it the hardened model
(runtime/compose.py, PendingUp). The policy still judges only Compose's own
normalised output, and `up` still runs only what the policy let through.
The engine's list of names that are not the project's, which the policy
needs too, is asked for at the same time.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from gpuhost_agent.core.compose_values import ComposeModel
from gpuhost_agent.core.sandbox.apply import refuse_with_compose_error
from gpuhost_agent.core.sandbox.raw import RawReview
from gpuhost_agent.core.stack_errors import StackFailed
from gpuhost_agent.runtime.compose import ComposeError, ComposeRunner, PendingUp
from gpuhost_agent.runtime.engine.client import DockerEngine


async def start_compose(
    compose: ComposeRunner,
    engine: DockerEngine,
    project: str,
    original: Path,
    variables: dict[str, str],
    raw: RawReview,
) -> tuple[ComposeModel, frozenset[str], PendingUp]:
    """(Compose's model of `original`, the foreign names, a waiting `up` in
    `original`'s folder); what Compose warned of goes to `raw.compose_warnings`
    for the renter's notices. If any of the three fails, the waiting `up` is
    stopped before it read anything and the first failure is raised: a
    Compose error on the renter's file as the sandbox's refusal, one starting
    `up` as StackFailed, an engine error as it is."""
    workdir = original.parent

    async def normalised() -> ComposeModel:
        try:
            model, raw.compose_warnings = await compose.config_and_warnings(project, workdir, original.name, variables)
        except ComposeError as exc:
            raise refuse_with_compose_error(raw, str(exc)) from None
        return model

    async def waiting_up() -> PendingUp:
        try:
            return await compose.start_up(project, workdir)
        except ComposeError as exc:
            raise StackFailed(str(exc)) from None

    # config first: it is the one the deploy waits for.
    model, names, up = await asyncio.gather(
        normalised(), engine.foreign_names(project), waiting_up(), return_exceptions=True
    )
    if isinstance(up, PendingUp) and not (isinstance(model, dict) and isinstance(names, frozenset)):
        await up.discard()
    for result in (model, names, up):
        if isinstance(result, BaseException):
            raise result
    assert isinstance(model, dict) and isinstance(names, frozenset) and isinstance(up, PendingUp)
    return model, names, up
