"""The seed's response shapes, built from the local marketplace's store."""

from __future__ import annotations

from gpuhost_agent.local_marketplace.state import MarketplaceState
from gpuhost_agent.local_marketplace.store import Store

_INTERNAL_STACK_KEYS = ("desired", "lastReportAt", "history", "basicAuth")
HARDWARE_FIELDS = (
    "totalGPUs",
    "gpuName",
    "gpuVRAM",
    "gpuBandwidth",
    "gpuInterconnect",
    "gpuCUDA",
    "totalCPUs",
    "totalRAM",
    "totalStorage",
    "networkUploadSpeed",
    "networkDownloadSpeed",
    "location",
)
# The local marketplace serves the host it runs on: listed from the start, so
# the host can rent its own machine at once; PATCH .../listing unlists it.
LISTED_BY_DEFAULT = True
NOT_REPORTED = "the agent has not reported this machine yet"


def listing(store: Store, selected_gpus: int | None = None) -> dict:
    """The Listing: hardware fields as the agent measured them (null until it
    has reported), GPUs in active rentals subtracted from the available ones."""
    report = store.host.get("report") or {}
    hardware = report.get("listing") or {}
    active = [r for r in store.rentals.values() if r["status"] == "ACTIVE"]
    total = hardware.get("totalGPUs") or 0
    shaped = {
        "envId": store.envId,
        **{key: hardware.get(key) for key in HARDWARE_FIELDS},
        "totalGPUs": total,
        "availableGPUs": available_gpus(store, total, active),
        **listing_settings(store.listingSettings),
        "activeRentalIds": {"rentalIds": [r["rentalId"] for r in active], "count": len(active)},
        "updatedAt": max(report.get("reportedAt") or store.createdAt, store.listingSettings.get("updatedAt", "")),
    }
    if selected_gpus is not None:
        shaped["selectedGPUs"] = selected_gpus
    return shaped


def renters_listing(shaped: dict) -> dict:
    """The Listing as any renter may read it (the catalogue, a rental's own
    copy): how many rentals are active, not their ids, which are other renters'
    (and with them when each starts and ends). The host's views name them."""
    active = shaped["activeRentalIds"]
    count = active.get("count", len(active.get("rentalIds") or []))  # a copy kept before count existed
    return {**shaped, "activeRentalIds": {"rentalIds": [], "count": count}}


def listing_settings(settings: dict) -> dict:
    """What the host set (host_listing_api.py), in the response's object shapes."""
    return {
        "isListed": settings.get("isListed", LISTED_BY_DEFAULT),
        "availabilityWindows": {"windows": settings.get("availabilityWindows", [])},
        "pricing": {"pricePerGpu": settings.get("pricePerGpu", 0.0), "unit": "GPU-hour"},
        "type": {"name": settings.get("type", "on-demand")},
    }


def available_gpus(store: Store, total: int, active: list[dict]) -> int:
    """`totalGPUs` minus the active rentals' GPUs, and, once the agent's
    heartbeat said which GPUs it has free, assigned and being released, no
    more than those free or being released (an ended rental's GPUs are free
    within its stop timeout, and a deploy waits for them) less what active
    rentals that hold none yet will take. A GPU out of service is never
    available."""
    by_count = max(0, total - sum(r.get("gpuCount", 0) for r in active))
    states = store.live.get("gpuAssignments")
    if not isinstance(states, dict):
        return by_count
    assigned = states.get("assigned") or {}
    free = len(states.get("free") or []) + sum(len(uuids) for uuids in (states.get("releasing") or {}).values())
    to_take = sum(r.get("gpuCount", 0) for r in active if r["rentalId"] not in assigned)
    return max(0, min(by_count, free - to_take))


def environment(state: MarketplaceState) -> dict:
    store = state.store
    report = store.host.get("report") or {}
    compliance = report.get("compliance") or {
        "isCompliant": False,
        "failedComplianceReason": NOT_REPORTED,
        "checks": [],
    }
    system_data = (
        {
            **report["systemData"],
            "complianceChecks": compliance["checks"],
            "fingerprint": report["fingerprint"],
            "reportedAt": report["reportedAt"],
        }
        if report
        else {}
    )
    return {
        "envId": store.envId,
        "name": store.envName,
        "createdAt": store.createdAt,
        "updatedAt": max(report.get("reportedAt") or store.createdAt, store.envUpdatedAt),
        "orgId": "local-org",
        "userId": store.userId,
        "pEnvId": 1,
        "pEdgeKey": "",
        "systemData": system_data,
        "isCompliant": compliance["isCompliant"],
        "failedComplianceReason": compliance["failedComplianceReason"],
        "initState": store.host.get("initState") or {},
        "hold": {},
        "listing": listing(store),
        "apiKey": masked_key(store.envApiKey),
        "heartbeat": state.liveness(),
        "isSeed": False,
    }


def masked_key(key: str) -> str:
    """The environment's key as shown to a renter key holder: enough to tell keys
    apart, not enough to act as the agent (whose jobs carry every renter's
    template variables). The full key is in the state file, readable by root."""
    return f"{key[:4]}...{key[-4:]}"


def rental(store: Store, raw: dict) -> dict:
    shaped = {
        key: raw[key]
        for key in ("rentalId", "userId", "startDate", "endDate", "name", "status", "createdAt", "updatedAt", "isSeed")
    }
    # The listing as it was when the rental was made (renter_api keeps it with
    # the rental), so a later price or window does not rewrite an old rental;
    # rentals saved before it was kept show the listing as it is now.
    shaped["listing"] = renters_listing(raw.get("listing") or listing(store, selected_gpus=raw.get("gpuCount", 0)))
    return shaped


def stack(raw: dict, tunnels: list[dict]) -> dict:
    """The seed's Stack, with its tunnels as they are now (tunnels.py)."""
    return {**{key: value for key, value in raw.items() if key not in _INTERNAL_STACK_KEYS}, "tunnels": tunnels}
