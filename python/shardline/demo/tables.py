"""A topology's parts as tables (tiers, replicasets, instances, bucket ranges), printed as plain
text or as ``rich`` tables: shared by ``shardline inspect`` and ``shardline demo --pg``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from rich.table import Table

__all__ = ["TableData", "plain_table", "rich_table", "topology_tables"]

TableData = tuple[str, list[str], list[list[object]]]
"""A table: its title, its header and its rows (cells are shown with ``str``)."""


def topology_tables(
    tier_counts: Mapping[str, int],
    replicasets: Mapping[str, Any],
    instances: Mapping[str, Any],
    maps: Mapping[str, list[tuple[int, int, str]]],
) -> list[TableData]:
    """A topology's parts as tables: (title, header, rows) for tiers, replicasets, instances
    and bucket ranges."""

    def address(uuid: str | None) -> str:
        instance = instances.get(uuid) if uuid is not None else None
        return (instance.address or "-") if instance is not None else "-"

    tiers: list[list[object]] = []
    for tier, count in sorted(tier_counts.items()):
        ranges = maps.get(tier, [])
        mapped = sum(end - start + 1 for start, end, _ in ranges)
        members = sum(1 for rs in replicasets.values() if rs.tier == tier)
        tiers.append([tier, count, len(ranges), f"{mapped}/{count}", members])
    rs_rows: list[list[object]] = []
    for rs in sorted(replicasets.values(), key=lambda r: (r.tier, r.uuid)):
        members_of = [i for i in instances.values() if i.replicaset_uuid == rs.uuid]
        online = sum(1 for i in members_of if i.is_online)
        master = rs.current_master_uuid
        rs_rows.append(
            [rs.uuid, rs.tier, master or "-", address(master), f"{online}/{len(members_of)}"]
        )
    instance_rows: list[list[object]] = []
    for i in sorted(instances.values(), key=lambda i: (i.replicaset_uuid or "", i.uuid)):
        owner = replicasets.get(i.replicaset_uuid) if i.replicaset_uuid else None
        is_master = owner is not None and owner.current_master_uuid == i.uuid
        instance_rows.append(
            [
                i.uuid,
                i.replicaset_uuid or "-",
                i.current_state or "-",
                i.address or "-",
                "master" if is_master else "",
            ]
        )
    range_rows: list[list[object]] = []
    for tier in sorted(maps):
        for start, end, owner_uuid in maps[tier]:
            owner = replicasets.get(owner_uuid)
            master = owner.current_master_uuid if owner is not None else None
            range_rows.append([tier, f"{start}-{end}", owner_uuid, address(master)])
    return [
        ("tiers", ["tier", "buckets", "ranges", "mapped", "replicasets"], tiers),
        ("replicasets", ["replicaset", "tier", "master", "master address", "online"], rs_rows),
        ("instances", ["instance", "replicaset", "state", "address", "role"], instance_rows),
        ("bucket ranges", ["tier", "buckets", "replicaset", "master address"], range_rows),
    ]


def plain_table(
    header: Sequence[str], rows: Sequence[Sequence[object]], out: TextIO, indent: str = ""
) -> None:
    """Writes ``rows`` under ``header`` as left-aligned columns two spaces apart."""
    lines = [list(header), *([str(cell) for cell in row] for row in rows)]
    widths = [max(len(line[n]) for line in lines) for n in range(len(header))]
    for line in lines:
        cells = (cell.ljust(width) for cell, width in zip(line, widths, strict=True))
        print((indent + "  ".join(cells)).rstrip(), file=out)


def rich_table(title: str | None, header: Sequence[str], rows: Sequence[Sequence[object]]) -> Table:
    """The same table for a terminal (cells are :class:`~rich.text.Text`, never markup)."""
    # imported here so that plain output (`shardline inspect --plain`) needs no `cli` extra
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, title_justify="left")
    for column in header:
        table.add_column(column, no_wrap=True)
    for row in rows:
        table.add_row(*(Text(str(cell)) for cell in row))
    return table
