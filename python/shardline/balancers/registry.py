"""Balancers by name: the ``shardline.balancers`` entry-point group.

A name resolves to a balancer through the entry points of the installed distributions, so a
service can name its balancer in configuration (``WorkerProxy(loadbalancer="least-loaded")``,
``shardline demo --balancer NAME``) and a plugin distribution adds names by installing.

Registering a balancer (for plugin authors): the entry point names a **factory**, a callable
that takes no arguments and returns a new balancer (an object with the
:class:`~shardline.LoadBalancerLike` ``delegate`` method). A class whose constructor needs no
arguments is such a factory, so the usual entry point names the class::

    [project.entry-points."shardline.balancers"]
    my-balancer = "my_package.balancers:MyLoadBalancer"

Every resolution calls the factory once, and every :class:`~shardline.WorkerProxy` made with
the name gets its own balancer. A balancer that needs settings is registered as a function that
builds it with the settings its service wants by default; one that cannot be built without the
caller's objects (such as :class:`~shardline.BucketLoadBalancer`, which needs a topology and a
tier) is not registered, and is passed as an object instead. Names are matched exactly (case
included). Check a plugin with :func:`shardline.balancer_conformance.check_balancer`.

shardline registers its own: ``round-robin`` (:class:`~shardline.RoundRobinLoadBalancer`, the
proxy's default), ``weighted`` (:class:`~shardline.WeightedRoundRobinLoadBalancer`),
``least-loaded`` (:class:`~shardline.LeastLoadedLoadBalancer`) and ``affinity``
(:class:`~shardline.AffinityLoadBalancer` with its default key, ``str(task)``).

An unknown name, a name that two distributions register, an entry point that is not callable
and a factory that returns no balancer raise :class:`~shardline.InvalidArgument`; the message
names the balancer and, for an unknown name, lists the known ones. An entry point whose module
fails to import raises that module's error, with a note naming the entry point.

Implementation notes:
    The group is read once, on the first resolution (``importlib.metadata`` is imported then,
    not with shardline: it costs more than the rest of ``import shardline``), and kept. A name
    missing from what was kept makes the registry read the group again before it gives up, so
    a distribution that became importable since (a directory added to ``sys.path``) is found.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from shardline.balancers.protocol import LoadBalancerLike
from shardline.errors import InvalidArgument

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

__all__ = ["GROUP", "balancer_names", "create_balancer"]

GROUP: Final = "shardline.balancers"
"""The entry-point group balancers are registered in."""

# name -> the entry points registering it (more than one is an error reported on use)
_registered: dict[str, list[EntryPoint]] | None = None


def _read_group() -> dict[str, list[EntryPoint]]:
    from importlib.metadata import entry_points

    found: dict[str, list[EntryPoint]] = {}
    for entry_point in entry_points(group=GROUP):
        found.setdefault(entry_point.name, []).append(entry_point)
    return found


def _entry_points(name: str) -> list[EntryPoint] | None:
    global _registered
    registered = _registered
    if registered is None or name not in registered:
        registered = _registered = _read_group()
    return registered.get(name)


def balancer_names() -> list[str]:
    """The names registered in the ``shardline.balancers`` group, sorted."""
    global _registered
    if _registered is None:
        _registered = _read_group()
    return sorted(_registered)


def _provider(entry_point: EntryPoint) -> str:
    """``value (distribution)``: where an entry point comes from, for messages."""
    dist = entry_point.dist
    return f"{entry_point.value} ({dist.name if dist is not None else 'unknown distribution'})"


def create_balancer(name: str) -> LoadBalancerLike:
    """A new balancer from the factory registered as ``name``; see the module docstring."""
    found = _entry_points(name)
    if not found:
        known = balancer_names()
        if not known:
            raise InvalidArgument(
                f"unknown balancer {name!r}: no balancer is registered in the {GROUP!r}"
                " entry-point group (is shardline installed, with its metadata?)"
            )
        raise InvalidArgument(
            f"unknown balancer {name!r}: the known names are {', '.join(known)}"
            f" (the {GROUP!r} entry-point group)"
        )
    if len(found) > 1:
        providers = "; ".join(_provider(entry_point) for entry_point in found)
        raise InvalidArgument(
            f"balancer {name!r} is registered by more than one distribution: {providers}"
        )
    entry_point = found[0]
    try:
        factory: Callable[[], object] = entry_point.load()
    except Exception as error:
        error.add_note(f"loading balancer {name!r} from entry point {_provider(entry_point)}")
        raise
    if not callable(factory):
        raise InvalidArgument(
            f"balancer {name!r}: entry point {_provider(entry_point)} is {factory!r},"
            " not a factory (a class or a function taking no arguments)"
        )
    balancer = factory()
    if not isinstance(balancer, LoadBalancerLike):
        raise InvalidArgument(
            f"balancer {name!r}: the factory {_provider(entry_point)} returned {balancer!r},"
            " which has no delegate method"
        )
    return balancer
