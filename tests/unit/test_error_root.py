"""One root for the agent's errors: every exception class
the package defines is an AgentError of one family at least (Refusal,
OutsideFailure, Stopped: gpuhost_agent/errors.py), and no two share a name."""

from __future__ import annotations

import collections
import errno
import importlib
import inspect
import pkgutil

import gpuhost_agent
from gpuhost_agent import errors

FAMILIES = (errors.Refusal, errors.OutsideFailure, errors.Stopped)


def _exception_classes() -> list[type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for module_info in pkgutil.walk_packages(gpuhost_agent.__path__, "gpuhost_agent."):
        if module_info.name.endswith(".__main__"):  # runs the command line when imported
            continue
        module = importlib.import_module(module_info.name)
        for _, value in inspect.getmembers(module, inspect.isclass):
            if issubclass(value, BaseException) and value.__module__ == module.__name__:
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return list(found.values())


def test_every_error_of_the_agent_has_the_one_root_and_a_family() -> None:
    classes = _exception_classes()
    assert len(classes) > 40, classes  # the walk found the package's errors
    rootless = [c for c in classes if not issubclass(c, errors.AgentError)]
    assert rootless == [], rootless
    familyless = [c for c in classes if c is not errors.AgentError and c not in FAMILIES]
    assert [c for c in familyless if not issubclass(c, FAMILIES)] == []


def test_no_two_errors_share_a_name() -> None:
    names = collections.Counter(c.__qualname__ for c in _exception_classes())
    assert [name for name, count in names.items() if count > 1] == []


def test_an_error_caught_by_its_builtin_base_is_still_caught_so() -> None:
    """The families sit beside each error's builtin base: what caught it before still does."""
    from gpuhost_agent.core.stack_errors import StackRejected
    from gpuhost_agent.runtime.container_process import ProcessGone

    assert issubclass(StackRejected, ValueError) and issubclass(StackRejected, errors.Refusal)
    gone = ProcessGone("the container has no process")
    assert isinstance(gone, OSError) and gone.errno == errno.ESRCH and isinstance(gone, errors.OutsideFailure)
