"""core/stacks/image_checks.py on an engine answering as the real one does
when an image's inspect is over what the agent reads (AnswerTooLarge) or the
image is absent (None). The real engine: tests/integration/test_image_labels_engine.py."""

from __future__ import annotations

from gpuhost_agent.core.stacks.image_checks import image_problems
from gpuhost_agent.runtime.engine.errors import AnswerTooLarge


class Engine:
    async def image_config(self, reference: str, max_bytes: int) -> dict | None:
        if reference == "huge:1":
            raise AnswerTooLarge("over")
        return None if reference == "absent:1" else {}


async def test_an_image_two_services_share_is_asked_once_and_said_for_each() -> None:
    stack = {"services": {"a": {"image": "huge:1"}, "b": {"image": "huge:1"}, "c": {"image": "absent:1"}}}
    problems = await image_problems(Engine(), stack, local=True)  # type: ignore[arg-type]
    assert [problem.split("'")[0] for problem in problems] == [
        'service "a" (image ',
        'service "b" (image ',
        'service "c": its image ',
    ]
    assert all("configuration is over 1,024 KiB" in problem for problem in problems[:2]), problems
    assert await image_problems(Engine(), {"services": {"c": {"image": "absent:1"}}}, local=False) == []  # type: ignore[arg-type]
