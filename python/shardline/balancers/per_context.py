"""`PerContext`: a balancer's state for each context it serves, held weakly."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

__all__ = ["PerContext"]

State = TypeVar("State")


class PerContext(Generic[State]):
    """``per_context(context)`` is the state for ``context``, made by ``factory`` on first use.

    The context is referenced weakly, so a balancer never keeps a retired pool alive, and the
    states are dropped when the balancer is pickled (they describe pools of this process).
    """

    def __init__(self, factory: Callable[[], State]) -> None:
        self._factory = factory
        self._states: weakref.WeakKeyDictionary[Any, State] = weakref.WeakKeyDictionary()

    def __call__(self, context: Any) -> State:
        state = self._states.get(context)
        if state is None:
            state = self._states[context] = self._factory()
        return state

    def __len__(self) -> int:
        """How many live contexts have state."""
        return len(self._states)

    def __getstate__(self) -> dict[str, Any]:
        return {"factory": self._factory}

    def __setstate__(self, pickled: dict[str, Any]) -> None:
        self.__init__(pickled["factory"])  # type: ignore[misc]
