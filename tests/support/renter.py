"""A renter using the marketplace's public API over HTTP."""

from __future__ import annotations

import asyncio

import aiohttp

from gpuhost_agent.protocol import wire
from support.stacks import SLEEPER
from support.waiting import until


class Renter:
    """A renter using the marketplace's public API over HTTP."""

    def __init__(self, http: aiohttp.ClientSession, base_url: str, store):
        self.http = http
        self.base_url = base_url
        self.store = store

    async def call(self, method: str, path: str, body=None, *, key: str | None = None, raw: bytes | None = None):
        headers = {wire.API_KEY_HEADER: self.store.renterApiKey if key is None else key}
        kwargs = (
            {"data": raw, "headers": {**headers, "Content-Type": "application/json"}}
            if raw is not None
            else {"json": body, "headers": headers}
        )
        async with self.http.request(method, self.base_url + path, **kwargs) as response:
            return response.status, await response.json(content_type=None)

    async def rental(self, gpu_count: int = 0) -> str:
        status, body = await self.call(
            "POST", "/rentals", {"envId": self.store.envId, "name": "test", "gpuCount": gpu_count}
        )
        assert status == 201, body
        return body["rentalId"]

    async def stack(
        self, rental_id: str, content: str, variables: dict | None = None, name: str = "test stack", **flags: bool
    ) -> str:
        """A new stack's id; `flags` are the template's (isSSHEnabled=True...)."""
        template = {
            "name": name,
            "description": "test",
            "content": content,
            "environmentVariables": variables or {},
            **flags,
        }
        status, body = await self.call("POST", f"/rentals/{rental_id}/stacks", {"template": template})
        assert status == 201, body
        return body

    async def applied(
        self, content: str, name: str = "test stack", timeout: float = 60, **flags: bool
    ) -> tuple[str, str]:
        """A new rental with one stack of `content`, APPLIED: (rental id, stack id)."""
        rental_id = await self.rental()
        stack_id = await self.stack(rental_id, content, name=name, **flags)
        stack = await self.wait_stack(rental_id, stack_id, (wire.APPLIED, wire.ERROR), timeout=timeout)
        assert stack["status"] == wire.APPLIED, stack["errorMsg"]
        return rental_id, stack_id

    async def deployed(self, content: str = SLEEPER):
        """A new rental with one stack, APPLIED and its deploy job completed: (rental id, stack id, job)."""
        rental_id = await self.rental()
        stack_id = await self.stack(rental_id, content)
        stack = await self.wait_stack(rental_id, stack_id, (wire.APPLIED, wire.ERROR))
        assert stack["status"] == wire.APPLIED, stack["errorMsg"]
        job = next(j for j in self.store.jobs.values() if j.stackId == stack_id)
        await until(lambda: job.state == "completed")
        return rental_id, stack_id, job

    async def stacks(self, rental_id: str) -> list[dict]:
        status, body = await self.call("GET", f"/rentals/{rental_id}/stacks")
        assert status == 200, body
        return body

    async def tunnels(
        self, rental_id: str, stack_id: str, count: int, keep=lambda _tunnel: True, timeout: float = 20
    ) -> list[dict]:
        """The stack's tunnel info once exactly `count` entries pass `keep`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            stack = next(s for s in await self.stacks(rental_id) if s["stackId"] == stack_id)
            found = [t for t in stack["tunnels"] if keep(t)]
            if len(found) == count:
                return found
            assert loop.time() < deadline, stack["tunnels"]
            await asyncio.sleep(0.1)

    async def containers(self, rental_id: str, stack_id: str) -> list[dict]:
        status, body = await self.call("GET", f"/rentals/{rental_id}/stacks/{stack_id}/containers")
        assert status == 200, body
        return body

    async def wait_stack(
        self, rental_id: str, stack_id: str, statuses: tuple[str, ...], timeout: float = 30
    ) -> dict | None:
        """The stack once its status is one of `statuses` (None: once it is gone)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        last = None
        while loop.time() < deadline:
            last = next((s for s in await self.stacks(rental_id) if s["stackId"] == stack_id), None)
            if last is None and not statuses:
                return None
            if last is not None and last["status"] in statuses:
                return last
            await asyncio.sleep(0.05)
        raise AssertionError(f"stack {stack_id} did not reach {statuses or 'gone'} in {timeout}s; last seen: {last}")

    async def wait_stacks(
        self, rental_id: str, stack_ids: list[str], statuses: tuple[str, ...], timeout: float = 30
    ) -> list[dict]:
        """Each stack once its status is one of `statuses`, in the order asked. One
        poller for them all: a poller each (99 for the hostile corpus) lists the
        rental's stacks thousands of times a second and starves the agent under
        test of the CPU it shares with them."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        done: dict[str, dict] = {}
        while loop.time() < deadline:
            for stack in await self.stacks(rental_id):
                if stack["stackId"] in stack_ids and stack["status"] in statuses:
                    done[stack["stackId"]] = stack
            if len(done) == len(set(stack_ids)):
                return [done[stack_id] for stack_id in stack_ids]
            await asyncio.sleep(0.2)
        waiting = sorted(set(stack_ids) - set(done))
        raise AssertionError(f"stacks {waiting} did not reach {statuses} in {timeout}s")
