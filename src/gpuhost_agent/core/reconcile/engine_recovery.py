"""What the agent redoes when the Docker Engine answers again after an outage.

The engine watch (runtime/engine/watch.py) only notices; this decides what
follows, in order: reconcile learns the outage's window (so it restarts the
stacks the outage stopped, and only those), every container list is pushed
again (what the marketplace has may be stale) once the event stream that
broke with the engine is re-opened, then reconcile runs at once rather than
at its next period.
"""

from __future__ import annotations

from datetime import datetime

from gpuhost_agent.core.containers.watch import ContainerWatch
from gpuhost_agent.core.reconcile.reconciler import Reconciler
from gpuhost_agent.uplink.session import SessionState


class EngineRecovery:
    def __init__(self, reconciler: Reconciler, container_watch: ContainerWatch, session: SessionState):
        self.reconciler, self.container_watch, self.session = reconciler, container_watch, session

    async def engine_back(self, last_up: datetime, back: datetime) -> None:
        self.reconciler.engine_restarted(last_up, back)
        self.container_watch.engine_back()
        await self.container_watch.resync(self.session.env_id)
        await self.reconciler.run_once()
