"""Where a container runs, as the stream engine found it (EngineStreams.locate).

A terminal, an SSH session, SFTP and a tunnel need the machine that runs the
container: its engine, its pids, its network namespaces. On one machine every
container is here, always reachable (runtime/engine/streams.py). In an
environment of several machines the engine may find a container on another
one and reach it through that machine's agent (runtime/swarm_streams.py);
when that agent is silent the container is still known (its log comes
another way) but nothing else can reach it, and the answer says why, in the
words the renter reads.

So the streams layer asks this answer, never which kind of environment it
runs in, and the engine's inspect stays the engine's: nothing of ours is
written into it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ContainerAt:
    info: dict  # `docker inspect`, from the engine of the container's machine (or what stands for it)
    machine: str = ""  # "" for this machine; else the id of the machine it runs on
    unreachable: str | None = None  # why its machine cannot be reached (no exec, file or connection): None when it can

    @property
    def id(self) -> str:
        return str(self.info.get("Id") or "")
