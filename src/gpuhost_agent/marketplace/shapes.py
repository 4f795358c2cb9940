"""The seed's response shapes, built from the local marketplace's store."""

from __future__ import annotations

from .store import Store

_INTERNAL_STACK_KEYS = ("desired", "lastReportAt", "history")


def listing(store: Store, selected_gpus: int | None = None) -> dict:
    shaped = {"envId": store.envId, "totalGPUs": 0, "availableGPUs": 0, "isListed": False,
              "availabilityWindows": {}, "pricing": {}, "type": {}, "activeRentalIds": {
                  "rentalIds": [r["rentalId"] for r in store.rentals.values() if r["status"] == "ACTIVE"]},
              "updatedAt": store.createdAt}
    if selected_gpus is not None:
        shaped["selectedGPUs"] = selected_gpus
    return shaped


def environment(store: Store) -> dict:
    return {"envId": store.envId, "name": store.envName, "createdAt": store.createdAt, "updatedAt": store.createdAt,
            "orgId": "local-org", "userId": store.userId, "pEnvId": 1, "pEdgeKey": "",
            "systemData": {}, "isCompliant": True, "failedComplianceReason": "", "initState": {},
            "hold": {}, "listing": listing(store), "apiKey": masked_key(store.envApiKey), "heartbeat": {}, "isSeed": False}


def masked_key(key: str) -> str:
    """The environment's key as shown to a renter key holder: enough to tell keys
    apart, not enough to act as the agent (whose jobs carry every renter's
    template variables). The full key is in the state file, readable by root."""
    return f"{key[:4]}...{key[-4:]}"


def rental(store: Store, raw: dict) -> dict:
    shaped = {key: raw[key] for key in ("rentalId", "userId", "startDate", "endDate", "name", "status",
                                        "createdAt", "updatedAt", "isSeed")}
    shaped["listing"] = listing(store, selected_gpus=raw.get("gpuCount", 0))
    return shaped


def stack(raw: dict) -> dict:
    return {key: value for key, value in raw.items() if key not in _INTERNAL_STACK_KEYS}
