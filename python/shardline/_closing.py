"""Objects that are their own async context manager: ``async with x:`` gives ``x`` and closes
it on the way out, with an exception or without."""

from __future__ import annotations

from types import TracebackType
from typing import Self

__all__ = ["AsyncClosing", "Closing"]


class AsyncClosing:
    """A base whose ``async with`` ends with ``await self.aclose()``; the subclass defines
    ``aclose``."""

    __slots__ = ()

    async def aclose(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()


class Closing(AsyncClosing):
    """An :class:`AsyncClosing` whose closing needs no wait: the subclass defines ``close()``,
    and ``aclose()`` (an async generator's name for it) calls it."""

    __slots__ = ()

    def close(self) -> None:
        raise NotImplementedError

    async def aclose(self) -> None:
        """:meth:`close`, as an async generator's ``aclose``."""
        self.close()
