"""Renter endpoints of the seed, as far as they concern the agent, under /v1."""

from __future__ import annotations

from aiohttp import web

from gpuhost_agent.local_marketplace import host_listing_api, shapes
from gpuhost_agent.local_marketplace.http_errors import json_body, json_error
from gpuhost_agent.local_marketplace.state import MarketplaceState
from gpuhost_agent.local_marketplace.stream_targets import find_container
from gpuhost_agent.protocol import wire, wire_jobs, wire_time, wire_values

RENTAL_STATUSES = (wire.RENTAL_ACTIVE, wire.RENTAL_COMPLETE)


def _name_problem(name: str) -> str | None:
    """Why a renter's name (of a rental or the environment) cannot be taken, or None."""
    if not wire_values.is_text(name):
        return "name is not valid Unicode text (it holds a lone surrogate)"
    return wire_jobs.name_problem(name, "name")


def routes(state: MarketplaceState) -> list[web.RouteDef]:
    store = state.store

    async def list_environments(_request: web.Request) -> web.Response:
        return web.json_response([shapes.environment(state)])

    async def get_environment(request: web.Request) -> web.Response:
        if request.match_info["envId"] != store.envId:
            return json_error(404, f"environment {request.match_info['envId']} not found")
        return web.json_response(shapes.environment(state))

    async def update_environment(request: web.Request) -> web.Response:
        """The seed's "Update environment": its name, the one field a renter-side key may set."""
        if request.match_info["envId"] != store.envId:
            return json_error(404, f"environment {request.match_info['envId']} not found")
        body = await json_body(request)
        if not isinstance(body, dict) or not isinstance(body.get("name"), str) or set(body) != {"name"}:
            return json_error(400, "body must be an object with a string name, and nothing else")
        if problem := _name_problem(body["name"]):
            return json_error(400, problem)
        store.envName, store.envUpdatedAt = body["name"], wire_time.iso()
        state.changed()
        return web.json_response("environment updated")

    async def get_listing(request: web.Request) -> web.Response:
        if request.match_info["envId"] != store.envId:
            return json_error(404, f"environment {request.match_info['envId']} not found")
        return web.json_response(shapes.listing(store))

    async def create_rental(request: web.Request) -> web.Response:
        body = await json_body(request)
        if not isinstance(body, dict):
            return json_error(400, "body must be a JSON object")
        if body.get("envId") != store.envId:
            return json_error(
                404 if isinstance(body.get("envId"), str) else 400,
                f"envId must name this marketplace's environment ({store.envId})",
            )
        gpu_count = wire_values.whole(body.get("gpuCount", 0), wire_jobs.MAX_GPU_COUNT)
        if gpu_count is None:
            return json_error(400, f"gpuCount must be an integer from 0 to {wire_jobs.MAX_GPU_COUNT}")
        listing = shapes.listing(store)
        reported = bool((store.host.get("report") or {}).get("listing"))  # before it, the machine is not known
        if reported and gpu_count > listing["availableGPUs"]:
            return json_error(
                409,
                f"gpuCount {gpu_count} is more than the environment can serve now: "
                f"{listing['availableGPUs']} of its {listing['totalGPUs']} GPU(s) are available",
            )
        name, end_date = body.get("name"), body.get("endDate")
        if name is not None and not isinstance(name, str):
            return json_error(400, "name must be a string")
        if name is not None and (problem := _name_problem(name)):
            return json_error(400, problem)
        if end_date is not None:
            try:
                end_date = wire_time.iso(wire_time.parse_iso(end_date)) if isinstance(end_date, str) else None
            except ValueError:
                end_date = None
            if end_date is None:
                return json_error(400, "endDate must be an ISO 8601 date-time")
        ends = wire_time.parse_iso(end_date) if end_date is not None else None
        if problem := host_listing_api.rental_refusal(store.listingSettings, wire_time.utcnow(), ends):
            return json_error(409, problem)
        rental = store.create_rental(name=name, gpu_count=gpu_count, end_date=end_date)
        rental["listing"] = shapes.renters_listing(shapes.listing(store, selected_gpus=gpu_count))  # as rented: frozen
        state.changed()
        return web.json_response(shapes.rental(store, rental), status=201)

    async def list_rentals(request: web.Request) -> web.Response:
        """The seed's "List rentals", and "List rentals with a specific status" as ?status=."""
        status = request.query.get("status")
        if status is not None and status not in RENTAL_STATUSES:
            return json_error(400, f"status must be one of {', '.join(RENTAL_STATUSES)}")
        rentals = [r for r in store.rentals.values() if status is None or r["status"] == status]
        return web.json_response([shapes.rental(store, r) for r in rentals])

    async def get_rental(request: web.Request) -> web.Response:
        return web.json_response(shapes.rental(store, store.rental(request.match_info["rentalId"])))

    async def update_rental(request: web.Request) -> web.Response:
        rental = store.rental(request.match_info["rentalId"])
        body = await json_body(request)
        if not isinstance(body, dict) or not isinstance(body.get("name"), str):
            return json_error(400, "body must be an object with a string name")
        if problem := wire_jobs.name_problem(body["name"], "name"):
            return json_error(400, problem)
        rental["name"], rental["updatedAt"] = body["name"], wire_time.iso()
        state.changed()
        return web.json_response("rental updated")

    async def end_rental(request: web.Request) -> web.Response:
        rental = state.end_rental(request.match_info["rentalId"])
        return web.json_response(shapes.rental(store, rental))

    async def create_stack(request: web.Request) -> web.Response:
        rental_id = request.match_info["rentalId"]
        store.rental(rental_id)  # 404 before 400, as the seed lists them
        held = sum(1 for stack in store.stacks.values() if stack["rentalId"] == rental_id)
        if held >= state.stacks_per_rental:
            return json_error(
                409,
                f"this rental has {held} stacks, the most one rental may have ({state.stacks_per_rental}): "
                "delete one (failed ones included) and create it again",
            )
        body = await json_body(request)
        if not isinstance(body, dict) or "template" not in body:
            return json_error(400, "body must be an object with a template")
        try:
            template = wire_jobs.validate_template(body["template"])
        except wire_jobs.InvalidBody as exc:
            return json_error(400, str(exc))
        if problem := wire_jobs.name_problem(template["name"], "template.name"):
            return json_error(400, problem)
        stack = store.create_stack(rental_id, template)
        state.changed(jobs=True)
        return web.json_response(stack["stackId"], status=201)

    async def list_stacks(request: web.Request) -> web.Response:
        rental_id = request.match_info["rentalId"]
        store.rental(rental_id)
        return web.json_response(
            [
                shapes.stack(s, state.tunnels.for_stack(s["stackId"]))
                for s in store.stacks.values()
                if s["rentalId"] == rental_id
            ]
        )

    async def delete_stack(request: web.Request) -> web.Response:
        stack = store.remove_stack(request.match_info["rentalId"], request.match_info["stackId"])
        state.changed(jobs=True)
        return web.json_response(shapes.stack(stack, state.tunnels.for_stack(stack["stackId"])))

    async def list_containers(request: web.Request) -> web.Response:
        stack = store.stack(request.match_info["rentalId"], request.match_info["stackId"])
        return web.json_response(store.containers.get(stack["stackId"], {}).get("containers", []))

    async def container_tunnels(request: web.Request) -> web.Response:
        """The seed's "Get container tunnel information"."""
        rental_id, stack_id = request.match_info["rentalId"], request.match_info["stackId"]
        container_id = find_container(store, rental_id, stack_id, request.match_info["containerId"])
        return web.json_response(state.tunnels.for_container(stack_id, container_id))

    return [
        web.get("/v1/environments", list_environments),
        web.get("/v1/environments/{envId}", get_environment),
        web.patch("/v1/environments/{envId}", update_environment),
        web.get("/v1/environments/{envId}/listing", get_listing),
        web.post("/v1/rentals", create_rental),
        web.get("/v1/rentals", list_rentals),
        web.get("/v1/rentals/{rentalId}", get_rental),
        web.patch("/v1/rentals/{rentalId}", update_rental),
        web.delete("/v1/rentals/{rentalId}", end_rental),
        web.post("/v1/rentals/{rentalId}/stacks", create_stack),
        web.get("/v1/rentals/{rentalId}/stacks", list_stacks),
        web.delete("/v1/rentals/{rentalId}/stacks/{stackId}", delete_stack),
        web.get("/v1/rentals/{rentalId}/stacks/{stackId}/containers", list_containers),
        web.get("/v1/rentals/{rentalId}/stacks/{stackId}/containers/{containerId}/tunnels", container_tunnels),
    ]
