"""GPU faults the moment NVML reports them: Xid critical errors, double-bit
ECC errors and a GPU that becomes unavailable, read from NVML's event set in
a thread of its own (nvmlEventSetWait blocks).

The periodic probe (every systemDataSeconds, 5 minutes by default) would see
a broken GPU late, and meanwhile hand it to the next rental. Each fault is
passed on as it comes (`GpuFault`), on the agent's event loop; what it means
for the rentals is core/stacks/gpu_faults.py's. No driver, no GPU, or a driver
without events are ordinary: the watch says so once and stops.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass

import pynvml

from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.inventory.nvml_probe import NvmlProbe, nvml_error_text

log = get_logger(__name__)

XID = pynvml.nvmlEventTypeXidCriticalError
DOUBLE_BIT_ECC = pynvml.nvmlEventTypeDoubleBitEccError
UNAVAILABLE = getattr(pynvml, "nvmlEventTypeGpuUnavailableError", 0x4000)
WATCHED = XID | DOUBLE_BIT_ECC | UNAVAILABLE
WAIT_MS = 500  # how long one wait blocks: the most a stop waits for the thread
# Xids that say the GPU itself is broken or gone (NVIDIA's Xid catalogue).
# Others (13: an application's illegal access, 31: an MMU fault of one
# process, 43: a stopped context...) are a workload's own errors.
FATAL_XIDS = {
    48: "double-bit ECC error",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping event",
    64: "ECC page retirement or row remapping failure",
    74: "NVLink error",
    79: "the GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}


@dataclass(frozen=True)
class GpuFault:
    uuid: str
    reason: str  # for the renter and the operator: "Xid 79 (the GPU has fallen off the bus)"


def fault_of(event_type: int, data: int) -> str | None:
    """The reason a GPU is out of service, or None for an event that does not make it so."""
    if event_type & XID:
        meaning = FATAL_XIDS.get(data)
        return f"Xid {data} ({meaning})" if meaning else None
    if event_type & DOUBLE_BIT_ECC:
        return "uncorrectable (double-bit) ECC memory error"
    if event_type & UNAVAILABLE:
        return "the GPU became unavailable"
    return None


class GpuEventWatch:
    def __init__(self, nvml: NvmlProbe, on_fault: Callable[[GpuFault], None]):
        self.nvml, self.on_fault = nvml, on_fault
        self.events = 0  # every event read, fatal or not (tests, status)
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, args=(loop,), name="gpu-events", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, WAIT_MS / 1000 * 4)
            self._thread = None

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self.nvml.opened():
            log.info("gpu_events_unavailable", reason="NVML is not available")
            return
        try:
            events = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError as exc:
            log.info("gpu_events_unavailable", reason=nvml_error_text(exc))
            return
        try:
            count = pynvml.nvmlDeviceGetCount()
            for index in range(count):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                try:
                    wanted = pynvml.nvmlDeviceGetSupportedEventTypes(handle) & WATCHED
                    if wanted:
                        pynvml.nvmlDeviceRegisterEvents(handle, wanted, events)
                except pynvml.NVMLError as exc:
                    log.info("gpu_events_not_supported", gpu=index, reason=nvml_error_text(exc))
            log.info("gpu_events_watched", gpus=count)
            self._follow(loop, events)
        except pynvml.NVMLError as exc:
            log.warning("gpu_events_stopped", error=nvml_error_text(exc))
        finally:
            try:
                pynvml.nvmlEventSetFree(events)
            except pynvml.NVMLError:
                pass

    def _follow(self, loop: asyncio.AbstractEventLoop, events: object) -> None:
        while not self._stopping.is_set():
            try:
                data = pynvml.nvmlEventSetWait_v2(events, WAIT_MS)
            except pynvml.NVMLError_Timeout:
                continue
            self.events += 1
            reason = fault_of(int(data.eventType), int(data.eventData))
            try:
                uuid = str(pynvml.nvmlDeviceGetUUID(data.device))
            except pynvml.NVMLError as exc:  # a GPU gone from the bus may not answer any more
                log.warning("gpu_event_unattributed", event_type=int(data.eventType), error=nvml_error_text(exc))
                continue
            log.info(
                "gpu_event", gpu=uuid, event_type=int(data.eventType), data=int(data.eventData), fatal=bool(reason)
            )
            if reason:
                loop.call_soon_threadsafe(self.on_fault, GpuFault(uuid, reason))
