"""`PerContext`: a balancer's state for each context it serves, held weakly."""

from __future__ import annotations

import copy
import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

__all__ = ["PerContext"]

State = TypeVar("State")


class PerContext(Generic[State]):
    """``per_context.of(context)`` is the state for ``context``, made by ``factory`` on first use.

    The context is referenced weakly, so a balancer never keeps a retired pool alive, and the
    states are dropped when the balancer is pickled (they describe pools of this process). A
    deep copy keeps, copied, the state of each context that the copy's memo maps to another
    object (as :mod:`shardline.balancers.explanation` maps a pool to a read-only view of it,
    so a copy of a plugin picks up where the plugin stands) and drops the others.
    """

    def __init__(self, factory: Callable[[], State]) -> None:
        self._factory = factory
        self._states: weakref.WeakKeyDictionary[Any, State] = weakref.WeakKeyDictionary()
        # The last context served and its state: a balancer nearly always serves one context,
        # and a weak-key lookup (a new weakref, a hash, a dict probe) costs ~0.5 us per call.
        self._last: tuple[weakref.ref[Any], State] | None = None

    def of(self, context: Any) -> State:
        """The state for ``context`` (a method, not ``__call__``: calling an instance costs
        ~0.1 us more, and balancers ask once per task)."""
        last = self._last
        if last is not None and last[0]() is context:
            return last[1]
        state = self._states.get(context)
        if state is None:
            state = self._states[context] = self._factory()
        self._last = (weakref.ref(context, self._forget), state)
        return state

    def peek(self, context: Any) -> State | None:
        """The state for ``context`` if it has one, without making one (for explanations,
        which must change nothing)."""
        return self._states.get(context)

    def _forget(self, dead: weakref.ref[Any]) -> None:
        """Drops the remembered state with its context."""
        last = self._last
        if last is not None and last[0] is dead:
            self._last = None

    def __len__(self) -> int:
        """How many live contexts have state."""
        return len(self._states)

    def __deepcopy__(self, memo: dict[int, Any]) -> PerContext[State]:
        copied = PerContext(self._factory)
        for context, state in list(self._states.items()):
            if id(context) in memo:
                copied._states[memo[id(context)]] = copy.deepcopy(state, memo)
        return copied

    def __getstate__(self) -> dict[str, Any]:
        return {"factory": self._factory}

    def __setstate__(self, pickled: dict[str, Any]) -> None:
        self.__init__(pickled["factory"])  # type: ignore[misc]
