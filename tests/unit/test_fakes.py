"""The fakes in tests/support/fakes.py keep the shape of the classes they stand in
for: a method renamed, added a parameter to or made async in the agent fails
here, named, instead of somewhere in a test that happens to use the fake."""

from __future__ import annotations

import inspect

import pytest
from support.fakes import FAKES


def _public_methods(cls: type) -> dict[str, object]:
    return {
        name: member
        for name, member in inspect.getmembers(cls, callable)
        if not name.startswith("_") and not inspect.isclass(member)
    }


def _shape(function, *, drop_self: bool = False) -> tuple:
    """Parameter names, kinds and which have defaults (annotations are the fakes'
    documentation; the values of defaults may differ), and whether it is async.
    drop_self: a fake's method standing in for a module's function."""
    parameters = list(inspect.signature(function).parameters.values())[1 if drop_self else 0 :]
    return (
        inspect.iscoroutinefunction(function),
        [(p.name, p.kind, p.default is inspect.Parameter.empty) for p in parameters],
    )


def _mismatches(fake: type) -> list[str]:
    real = fake.stands_in_for
    real_methods = _public_methods(real)
    found = []
    for name, method in _public_methods(fake).items():
        if name in fake.test_side:
            if name in real_methods:
                found.append(f"{fake.__name__}.{name} is listed as test-side but {real.__name__} has it")
        elif name not in real_methods:
            found.append(f"{real.__name__} has no method {name} ({fake.__name__} is out of date?)")
        elif _shape(method, drop_self=inspect.ismodule(real)) != _shape(real_methods[name]):
            found.append(
                f"{fake.__name__}.{name}{inspect.signature(method)} is not "
                f"{real.__name__}.{name}{inspect.signature(real_methods[name])}"
            )
    return found


@pytest.mark.parametrize("fake", FAKES, ids=[fake.__name__ for fake in FAKES])
def test_every_method_of_a_fake_is_the_real_one_s(fake: type) -> None:
    assert _mismatches(fake) == []


def test_a_renamed_or_reshaped_method_is_caught() -> None:
    class Real:
        async def deploy(self, job) -> str:
            return ""

        def report_status(self, job, status: str, error_msg: str = "") -> None:
            pass

    class Fake:
        stands_in_for = Real
        test_side = ("recorded",)

        def deploy(self, job) -> str:  # not async
            return ""

        def report_status(self, job, status: str) -> None:  # a parameter short
            pass

        async def remove(self, job) -> str:  # the real class has none
            return ""

        def recorded(self) -> list:
            return []

    assert len(_mismatches(Fake)) == 3
