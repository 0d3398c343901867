"""The ``items()`` and ``values()`` views of a :class:`shardline.WorkersView`.

The Rust core builds them (``WorkersView.items()``, ``.values()``); they are here because a view
that is a real ``collections.abc.ItemsView`` (its set operations included) must subclass one, which
a Rust class cannot. They sit at the bottom of the layers, beside ``errors``: they import only the
core.
"""

from __future__ import annotations

from collections.abc import ItemsView, Iterator, ValuesView
from typing import Any

from shardline._core import WorkersView

__all__ = ["WorkersItemsView", "WorkersValuesView"]


class WorkersItemsView(ItemsView[Any, tuple[Any, Any]]):
    """The ``(uid, (metadata, connection))`` items of a pool's workers: live for ``len`` and
    ``in``; each iteration yields one consistent snapshot of the pool, taken when it starts, so
    a worker evicted, refreshed or admitted while it runs changes nothing it yields.

    Implementation notes:
        ``ItemsView`` iterates the uids and looks each one up, which fails for a worker evicted
        in between; the snapshot is copied by the pool in one read of its state instead.
    """

    __slots__ = ()
    _mapping: WorkersView

    def __iter__(self) -> Iterator[tuple[Any, tuple[Any, Any]]]:
        return iter(self._mapping._items_snapshot())


class WorkersValuesView(ValuesView[tuple[Any, Any]]):
    """The ``(metadata, connection)`` values of a pool's workers: live for ``len`` and ``in``;
    each iteration yields one consistent snapshot of the pool, taken when it starts (see
    :class:`WorkersItemsView`)."""

    __slots__ = ()
    _mapping: WorkersView

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        return iter(self._mapping._values_snapshot())
