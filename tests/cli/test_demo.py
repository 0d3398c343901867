"""`shardline demo`: the built-in seed cases, scenario files, their validation, and both views."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from shardline import bucket_id
from shardline.cli import main
from shardline.demo import Replay, parse_scenario, render_rich, seed_cases
from shardline.demo import pool as pool_module
from shardline.demo.scenario import MAX_FILE_BYTES
from support.etcd_server import EtcdServer
from support.paths import ROOT

pytestmark = pytest.mark.integration

EXAMPLE = ROOT / "examples" / "scenario.json"
ANSI = re.compile(r"\x1b\[")


def run_demo(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main(["demo", *args])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def step_block(output: str, number: int) -> str:
    """The plain-text block of step ``number``, up to the next step or the summary."""
    match = re.search(rf"^Step {number}/\d+: .*?(?=^Step |^Map clearings)", output, re.M | re.S)
    assert match, f"no step {number} in the output"
    return match.group(0)


def tier_lines(block: str, tier: str) -> tuple[str, str, str]:
    """The three lines of ``tier`` in a step block: header, map, requests."""
    lines = block.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"  {tier}: epoch "))
    header, map_line, requests = lines[start : start + 3]
    return header.strip(), map_line.strip(), requests.strip()


def requests_of(line: str) -> dict[str, int]:
    """``requests: r1 10.0.1.1:3301 521, ..., no route 0`` as {"r1": 521, ..., "no route": 0}."""
    counts = {}
    for part in line.removeprefix("requests: ").split(", "):
        label, _, count = part.rpartition(" ")
        counts[label.split(" ")[0] if label != "no route" else label] = int(count)
    return counts


def write(directory: Path, document: Any, name: str = "scenario.json") -> Path:
    """Writes ``document`` as a scenario file in ``directory``."""
    path = directory / name
    path.write_text(json.dumps(document), encoding="utf-8")
    return path


def hot_unrouted(output: str, steps: list[int]) -> int:
    """The requests of ``steps`` that found no route in tier hot."""
    return sum(requests_of(tier_lines(step_block(output, n), "hot")[2])["no route"] for n in steps)


# --- the built-in scenario, plain text ---------------------------------------------------------


def test_builtin_run_exits_0_and_replays_all_steps(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run_demo(capsys, "--plain", "--in-process")
    assert status == 0
    assert err == ""
    assert not ANSI.search(out)
    assert len(re.findall(r"^Step \d+/11: ", out, re.M)) == 11


def test_r2_expelled_clears_hot_only_and_no_request_is_routed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, out, _ = run_demo(capsys, "--plain", "--part", "topology")
    block = step_block(out, 2)
    assert "R2 expelled" in block
    assert "  - replicaset delete R2" in block
    header, map_line, requests = tier_lines(block, "hot")
    assert header == "hot: epoch 2, 0 of 3000 buckets mapped"
    assert map_line == "map: (empty)"
    assert requests == "requests: no route 2000"
    header, map_line, requests = tier_lines(block, "cold")
    assert header == "cold: epoch 1, 3000 of 3000 buckets mapped"
    assert map_line == "map: 1-1500 -> C1, 1501-3000 -> C2"
    assert requests_of(requests)["no route"] == 0


def test_maps_follow_the_seed_cases_step_by_step(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run_demo(capsys, "--plain", "--part", "topology")
    expected_hot = {
        1: "1-1000 -> R1, 1001-2000 -> R2, 2001-3000 -> R3",
        2: "(empty)",
        3: "1-1500 -> R1",
        4: "1-1500 -> R1, 1501-3000 -> R3",
        5: "(empty)",
        6: "1-1000 -> R1",
        7: "1-1000 -> R1, 1001-2000 -> R3",
        8: "1-1000 -> R1, 1001-2000 -> R3, 2001-3000 -> R4",
        9: "1-750 -> R1",
        10: "1-750 -> R1, 751-1500 -> R3",
        11: "1-750 -> R1, 751-1500 -> R3, 1501-3000 -> R4",
    }
    for number, hot_map in expected_hot.items():
        block = step_block(out, number)
        header, map_line, _ = tier_lines(block, "hot")
        assert map_line == f"map: {hot_map}", f"step {number}"
        assert header.startswith(f"hot: epoch {number}, "), f"step {number}"
        # Clearing hot never touches cold: same map and epoch after every step.
        header, map_line, _ = tier_lines(block, "cold")
        assert header == "cold: epoch 1, 3000 of 3000 buckets mapped", f"step {number}"
        assert map_line == "map: 1-1500 -> C1, 1501-3000 -> C2", f"step {number}"


def test_requests_per_master_match_bucket_ids_of_the_final_map(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, out, _ = run_demo(capsys, "--plain", "--part", "topology")
    final = {(1, 750): "r1", (751, 1500): "r3", (1501, 3000): "r4"}
    expected = Counter(
        next(name for (lo, hi), name in final.items() if lo <= bucket_id(f"user:{i}", 3000) <= hi)
        for i in range(2000)
    )
    _, _, requests = tier_lines(step_block(out, 11), "hot")
    assert requests_of(requests) == {**expected, "no route": 0}
    # Partly refilled: only the keys whose bucket is mapped are routed.
    _, _, requests = tier_lines(step_block(out, 9), "hot")
    assert requests_of(requests) == {"r1": expected["r1"], "no route": 2000 - expected["r1"]}


def test_summary_reports_each_clearing_and_its_refill(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run_demo(capsys, "--plain", "--part", "topology")
    summary = out[out.index("Map clearings") :].splitlines()[1:]
    assert len(summary) == 6
    expected = [(2, 4, 2, 2, [2, 3]), (5, 8, 3, 3, [5, 6, 7]), (9, 11, 3, 2, [9, 10])]
    for (head, outcome), (cleared, refilled, events, steps, blind) in zip(
        zip(summary[::2], summary[1::2], strict=True), expected, strict=True
    ):
        assert head.startswith(f"  hot, cleared at step {cleared}/11: ")
        # The unrouted requests of the window are the hot "no route" counts of its steps.
        unrouted = hot_unrouted(out, blind)
        assert unrouted > 0
        assert re.fullmatch(
            rf"    {unrouted} requests found no route; refilled at step {refilled} after"
            rf" {events} bucket events over {steps} steps \(\d+\.\d µs of event-apply time\)",
            outcome,
        ), outcome


def test_keys_option_sets_the_request_count(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run_demo(capsys, "--plain", "--part", "topology", "--keys", "7")
    assert status == 0
    assert tier_lines(step_block(out, 2), "hot")[2] == "requests: no route 7"
    assert sum(requests_of(tier_lines(step_block(out, 1), "cold")[2]).values()) == 7


@pytest.mark.parametrize("keys", ["0", "-3", "1000001"])
def test_keys_out_of_range_exits_2(capsys: pytest.CaptureFixture[str], keys: str) -> None:
    status, out, err = run_demo(capsys, "--plain", "--keys", keys)
    assert status == 2
    assert out == ""
    assert f"--keys must be an integer from 1 to 1000000, got {keys}" in err


# --- the replay driver ---------------------------------------------------------------------------


def test_replay_records_clearings_with_their_windows() -> None:
    replay = Replay(parse_scenario(seed_cases()))
    reports = list(replay.steps())
    assert [r.number for r in reports] == list(range(1, 12))
    hot = [next(t for t in r.tiers if t.tier == "hot") for r in reports]
    assert hot[-1].ranges[0][:2] == (1, 750)
    assert [(c.tier, c.step, c.refilled_at, c.bucket_events) for c in replay.clearings] == [
        ("hot", 2, 4, 2),
        ("hot", 5, 8, 3),
        ("hot", 9, 11, 3),
    ]
    assert [c.unrouted for c in replay.clearings] == [
        hot[1].unrouted + hot[2].unrouted,
        hot[4].unrouted + hot[5].unrouted + hot[6].unrouted,
        hot[8].unrouted + hot[9].unrouted,
    ]
    assert all(c.apply_ns > 0 for c in replay.clearings)


def test_a_map_never_refilled_is_reported_as_such(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    document = seed_cases()
    document["steps"] = document["steps"][:3]  # R2 expelled, then only R1's bucket event
    path = str(write(tmp_path, document))
    status, out, _ = run_demo(capsys, "--plain", "--part", "topology", "--scenario", path)
    assert status == 0
    unrouted = hot_unrouted(out, [2, 3])
    assert out.endswith(
        f"    {unrouted} requests found no route; not refilled by the end of the scenario"
        " (1 bucket event so far)\n"
    )


# --- scenario files ------------------------------------------------------------------------------


def test_example_scenario_replays(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run_demo(capsys, "--plain", "--part", "topology", "--scenario", str(EXAMPLE))
    assert (status, err) == (0, "")
    assert out.startswith(f"shardline demo: {EXAMPLE}\n")
    # The master switch keeps the map and moves A's requests from a1 to a2.
    before = requests_of(tier_lines(step_block(out, 1), "default")[2])
    header, map_line, requests = tier_lines(step_block(out, 2), "default")
    assert header == "default: epoch 1, 3000 of 3000 buckets mapped"
    assert map_line == "map: 1-1500 -> A, 1501-3000 -> B"
    assert requests_of(requests) == {"a2": before["a1"], "b1": before["b1"], "no route": 0}
    # A snapshot replaces the map atomically: nothing goes unrouted.
    assert tier_lines(step_block(out, 3), "default")[1] == "map: 1-1400 -> A, 1401-3000 -> B"
    assert requests_of(tier_lines(step_block(out, 3), "default")[2])["no route"] == 0
    assert tier_lines(step_block(out, 4), "default")[1] == "map: 1-1000 -> A"
    assert tier_lines(step_block(out, 5), "default")[1] == "map: 1-1000 -> A, 1001-3000 -> B"
    assert "refilled at step 5 after 2 bucket events over 1 step (" in out


def test_a_long_snapshot_is_shortened_in_the_event_list(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    document = seed_cases()
    cold = document["steps"][0]["events"][-1]
    assert (cold["kind"], cold["tier"]) == ("bucket_snapshot", "cold")
    owners = [row["current_replicaset_uuid"] for row in cold["rows"]]
    cold["rows"] = [
        {**cold["rows"][0], "bucket_id_start": 500 * n + 1, "bucket_id_end": 500 * (n + 1),
         "current_replicaset_uuid": owners[n % 2]}
        for n in range(6)
    ]  # fmt: skip
    status, out, _ = run_demo(
        capsys, "--plain", "--part", "topology", "--scenario", str(write(tmp_path, document))
    )
    assert status == 0
    assert (
        "  - bucket snapshot cold: 1-500 -> C1, 501-1000 -> C2, 1001-1500 -> C1,"
        " 1501-2000 -> C2, ... (6 rows in all)\n"
    ) in out
    assert tier_lines(step_block(out, 1), "cold")[1].count(" -> ") == 6


def test_builtin_scenario_survives_a_json_round_trip(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    _, builtin, _ = run_demo(capsys, "--plain", "--part", "topology")
    _, from_file, _ = run_demo(
        capsys, "--plain", "--part", "topology", "--scenario", str(write(tmp_path, seed_cases()))
    )
    strip = re.compile(r"^shardline demo: .*$|\(\d+\.\d µs", re.M)
    assert strip.sub("", from_file) == strip.sub("", builtin)


def seed_with(change: Any) -> dict[str, Any]:
    document = seed_cases()
    change(document)
    return document


def set_event(step: int, event: int, **fields: Any) -> Any:
    return lambda d: d["steps"][step]["events"][event].update(fields)


def drop_field(step: int, event: int, field: str) -> Any:
    return lambda d: d["steps"][step]["events"][event].pop(field)


BAD_DOCUMENTS = {
    "unknown kind": (
        set_event(2, 0, kind="bucket_move"),
        "steps[2].events[0]: field 'kind' must be one of 'instance', 'replicaset', 'bucket',"
        " 'bucket_snapshot', got 'bucket_move'",
    ),
    "missing field": (drop_field(2, 0, "end"), "steps[2].events[0] (bucket): missing field 'end'"),
    "unknown field": (
        set_event(1, 0, master="x"),
        "steps[1].events[0] (replicaset): unknown field 'master' (allowed: current_master_uuid,"
        " op, replicaset_uuid, tier)",
    ),
    "bad value, named by the library": (
        set_event(2, 0, start="1"),
        "steps[2].events[0] (bucket): field 'start' must be a bucket id (an int >= 1), got '1'",
    ),
    "range beyond the tier": (
        set_event(3, 0, end=3001),
        "steps[3].events[0] (bucket): bucket range end 3001 exceeds",
    ),
    "bad op": (
        set_event(1, 1, op="remove"),
        "steps[1].events[1] (instance): field 'op' must be 'replace' or 'delete', got 'remove'",
    ),
    "undeclared tier": (
        set_event(2, 0, tier="warm"),
        "steps[2].events[0] (bucket): tier 'warm' is not declared in 'tiers'",
    ),
    "new replicaset without a tier": (
        drop_field(4, 0, "tier"),
        "steps[4].events[0] (replicaset): field 'tier' is required for a replicaset not yet known",
    ),
    "snapshot row without a field": (
        lambda d: d["steps"][0]["events"][10]["rows"][1].pop("bucket_id_end"),
        "steps[0].events[10].rows[1]: bucket row has no field 'bucket_id_end'",
    ),
    "overlapping snapshot": (
        lambda d: d["steps"][0]["events"][10]["rows"][1].update(bucket_id_start=900),
        "steps[0].events[10] (bucket_snapshot): snapshot of tier 'hot' has overlapping ranges",
    ),
    "wrong version": (lambda d: d.update(version=2), "field 'version' must be 1, got 2"),
    "no steps": (lambda d: d.update(steps=[]), "field 'steps' must be a non-empty list"),
    "step without events": (
        lambda d: d["steps"][3].update(events=[]),
        "steps[3]: field 'events' must be a non-empty list",
    ),
    "bad bucket count": (
        lambda d: d["tiers"].update(cold=0),
        "tiers.cold: bucket count must be an int >= 1, got 0",
    ),
    "key pattern without {i}": (
        lambda d: d["keys"].update(pattern="user"),
        "keys.pattern must be a string containing '{i}', got 'user'",
    ),
}


@pytest.mark.parametrize("case", BAD_DOCUMENTS)
def test_invalid_scenario_exits_2_naming_the_location(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, case: str
) -> None:
    change, message = BAD_DOCUMENTS[case]
    path = write(tmp_path, seed_with(change))
    status, out, err = run_demo(capsys, "--plain", "--scenario", str(path))
    assert status == 2
    assert out == ""
    assert err.startswith(f"shardline demo: error: {path}: ")
    assert message in err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"version": 1,', "invalid JSON at line 1 column 15"),
        (b'{"version": 1, "version": 1}', "duplicate key 'version'"),
        (b'{"version": NaN}', "NaN is not valid JSON"),
        (b"\xff\xfe{}", "not UTF-8 text"),
        (b"[1, 2]", "the top level must be a JSON object, got a list"),
        (b'{"version": 1, "tiers": {"hot": 10}}', "the top level: missing field 'steps'"),
        (b"[" * 100_000, "invalid JSON"),
    ],
)
def test_undecodable_file_exits_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: bytes, message: str
) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    status, out, err = run_demo(capsys, "--plain", "--scenario", str(path))
    assert (status, out) == (2, "")
    assert err.startswith(f"shardline demo: error: {path}: ")
    assert message in err


def test_oversized_file_exits_2_before_parsing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "big.json"
    # Valid JSON but one byte over the limit: only the size check can refuse it.
    path.write_bytes(b"{" + b" " * (MAX_FILE_BYTES - 1) + b"}")
    status, out, err = run_demo(capsys, "--plain", "--scenario", str(path))
    assert (status, out) == (2, "")
    assert err == f"shardline demo: error: {path}: file is larger than {MAX_FILE_BYTES} bytes\n"


def test_missing_file_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "absent.json"
    status, _, err = run_demo(capsys, "--scenario", str(path))
    assert status == 2
    assert err == f"shardline demo: error: {path}: cannot read: No such file or directory\n"


# --- the rich view -------------------------------------------------------------------------------


def test_rich_view_shows_tables_and_user_text_literally() -> None:
    document = seed_cases()
    document["steps"][1]["description"] = "[bold]R2[/] expelled [/oops]"
    document["names"] = {k: f"[{v}]" for k, v in document["names"].items()}
    out = io.StringIO()
    render_rich(Replay(parse_scenario(document)), Console(file=out, width=160, color_system=None))
    text = out.getvalue()
    assert "Step 2/11: [bold]R2[/] expelled [/oops]" in text
    assert "1-750 → [R1]" in text
    assert "Map clearings and re-fills" in text
    assert re.search(r"│ hot\s+│\s+2\s+│\s+0/3000\s+│ \(empty\)\s+│ -\s+│\s+2000 │", text)


# --- the console command ------------------------------------------------------------------------


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "shardline.cli", *args]


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    assert "demo" in capsys.readouterr().out


def test_command_is_required() -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([])
    assert exit_info.value.code == 2


@pytest.mark.skipif(sys.platform == "win32", reason="needs a pseudo-terminal")
def test_command_on_a_terminal_draws_rich_tables() -> None:
    import pty

    leader, follower = pty.openpty()
    env = {**os.environ, "COLUMNS": "140", "TERM": "xterm"}
    env.pop("NO_COLOR", None)
    process = subprocess.Popen(command("demo"), stdout=follower, stderr=subprocess.PIPE, env=env)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert process.wait(timeout=120) == 0
    text = b"".join(chunks).decode()
    assert "┏" in text
    assert "Map clearings and re-fills" in text
    # the pool part, with real worker processes by default
    assert "Pool phase 5/5: w3 leaves gracefully (SIGTERM)" in text
    assert "killed (SIGKILL)" in text
    assert "Pool summary: tasks per address" in text


# --- the worker-pool part in-process (--in-process) ---------------------------------------------

POOL_ROW = re.compile(
    r"^    (w\d) ([0-9a-f]{8}) (\S+) (pooled|superseded|left): (\d+) tasks?"
    r" \((\d+) at this address so far\)$"
)


def pool_phase(output: str, number: int) -> tuple[str, dict[tuple[str, str], tuple[str, int]]]:
    """Phase ``number`` of the pool part: its block, and (worker, address) → (status, tasks)."""
    match = re.search(
        rf"^Pool phase {number}/4: .*?(?=^Pool phase |^Pool summary:)", output, re.M | re.S
    )
    assert match, f"no pool phase {number} in the output"
    rows = {}
    for line in match.group(0).splitlines():
        if row := POOL_ROW.match(line):
            rows[row[1], row[3]] = (row[4], int(row[5]))
    return match.group(0), rows


def test_pool_part_follows_the_topology_part(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run_demo(capsys, "--plain", "--in-process")
    assert (status, err) == (0, "")
    assert out.index("Map clearings") < out.index("Worker pool: ") < out.index("Pool summary:")
    assert len(re.findall(r"^Pool phase \d/4: ", out, re.M)) == 4


def test_pool_phases_follow_joins_the_refresh_and_the_drop(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, out, _ = run_demo(capsys, "--plain", "--part", "pool", "--in-process")
    assert status == 0
    old, new = ("w2", "127.0.0.1:7002"), ("w2", "127.0.0.1:7102")
    w1 = ("w1", "127.0.0.1:7001")
    totals: Counter[tuple[str, str]] = Counter()
    for number, dispatched in zip(range(1, 5), [9, 9, 12, 9], strict=True):
        block, rows = pool_phase(out, number)
        assert f"  balancer: RoundRobinLoadBalancer; {dispatched} tasks dispatched\n" in block
        assert sum(tasks for _, tasks in rows.values()) == dispatched, f"phase {number}"
        totals.update({key: tasks for key, (_, tasks) in rows.items()})
        if number == 1:
            assert rows == {
                ("w1", "127.0.0.1:7001"): ("pooled", 3),
                ("w2", "127.0.0.1:7002"): ("pooled", 3),
                ("w3", "127.0.0.1:7003"): ("pooled", 3),
            }
        else:
            # After the refresh the new address serves w2's share; the old one serves nothing.
            assert "  - worker-updated w2 " in pool_phase(out, 2)[0]
            assert rows[new][0] == "pooled", f"phase {number}"
            assert rows[new][1] > 0, f"phase {number}"
            assert rows[old] == ("superseded", 0), f"phase {number}"
    _, rows = pool_phase(out, 3)
    assert rows["w4", "127.0.0.1:7004"] == ("pooled", 3)
    block, rows = pool_phase(out, 4)
    assert "  - worker-dropped w1 " in block
    assert rows[w1] == ("left", 0)
    assert {key for key, (status, _) in rows.items() if status == "pooled"} == {
        new,
        ("w3", "127.0.0.1:7003"),
        ("w4", "127.0.0.1:7004"),
    }
    summary = out[out.index("Pool summary:") :].splitlines()
    assert summary[1] == f"  total tasks: {totals.total()}" == "  total tasks: 39"
    per_address = {
        tuple(line.strip().rsplit(": ", 1)[0].split(" ")): int(line.rsplit(": ", 1)[1])
        for line in summary[3:-1]
    }
    assert per_address == totals
    assert summary[-1] == "  tasks sent to a superseded address: 0"


async def test_a_superseded_address_is_counted_when_it_serves() -> None:
    # The count is measured by the connection, not assumed: a connection to an address its
    # worker has moved away from (or to a worker that left) reports itself as superseded.
    cluster = pool_module._Cluster()
    metadata = pool_module._metadata("w2", "127.0.0.1:7002")
    cluster.names[metadata.uid] = "w2"
    cluster.current[metadata.uid] = metadata.address
    connection = cluster.connect(metadata)
    assert not (await connection.dispatch("a")).superseded
    cluster.current[metadata.uid] = "127.0.0.1:7102"
    served = await connection.dispatch("b")
    assert (served.address, served.superseded) == ("127.0.0.1:7002", True)
    del cluster.current[metadata.uid]
    assert (await connection.dispatch("c")).superseded


def test_part_selects_one_part(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run_demo(capsys, "--plain", "--part", "pool", "--in-process")
    assert status == 0
    assert "Step " not in out
    assert "Map clearings" not in out
    assert "Pool summary:" in out
    status, out, _ = run_demo(capsys, "--plain", "--part", "topology")
    assert status == 0
    assert "Worker pool" not in out
    assert "Pool phase" not in out
    assert out.rstrip().endswith("event-apply time)")


def test_weighted_balancer_is_named_and_never_reaches_a_superseded_address(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, out, _ = run_demo(
        capsys, "--plain", "--part", "pool", "--balancer", "weighted", "--in-process"
    )
    assert status == 0
    for number in range(1, 5):
        block, rows = pool_phase(out, number)
        assert "  balancer: WeightedRoundRobinLoadBalancer; " in block
        assert all(tasks == 0 for status, tasks in rows.values() if status != "pooled")
    assert out.endswith("  tasks sent to a superseded address: 0\n")


def test_topology_options_without_the_topology_part_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, out, err = run_demo(capsys, "--part", "pool", "--keys", "5")
    assert (status, out) == (2, "")
    assert "--scenario and --keys need the topology part" in err


def test_pool_options_without_the_pool_part_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for option in (["--in-process"], ["--etcd", "http://127.0.0.1:2379"]):
        status, out, err = run_demo(capsys, "--part", "topology", *option)
        assert (status, out) == (2, "")
        assert "--etcd and --in-process need the pool part" in err
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--in-process", "--etcd", "http://127.0.0.1:2379"])
    assert exit_info.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_without_msgpack_the_default_pool_part_says_what_to_install(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "msgpack", None)  # what `import msgpack` fails on
    status, out, err = run_demo(capsys, "--plain")
    assert (status, out) == (1, "")
    assert err == (
        "shardline demo: error: the worker-pool part (real worker processes) needs msgpack,"
        " which is not installed: pip install 'shardline[msgpack]', or run it with --in-process\n"
    )
    status, out, _ = run_demo(capsys, "--plain", "--part", "pool", "--in-process")
    assert status == 0
    assert "Pool summary:" in out


# --- the worker-pool part with real worker processes (the default, and --etcd) -------------------

REAL_ROW = re.compile(
    r"^    (?P<name>w\d) (?P<uid>[0-9a-f]{8})"
    r" (?P<address>msgpack\+tcp://127\.0\.0\.1:\d+) pid (?P<pid>\d+)"
    r" (?P<status>pooled|superseded|left): (?P<tasks>\d+) tasks?"
    r" \((?P<so_far>\d+) at this address so far\)"
    r"(?:, (?P<failures>\d+) dispatch(?:es)? failed here transiently)?"
    r"(?:, (?P<superseded>\d+) sent here while superseded)?"
    r"(?:; process (?P<process>.+))?$"
)


@dataclass(frozen=True)
class Row:
    name: str
    uid: str
    address: str
    pid: int
    status: str
    tasks: int
    so_far: int
    failures: int
    superseded: int
    process: str


@dataclass(frozen=True)
class RealRun:
    """A real-process run of the demo: its exit status, output, and the folders it was given
    as TMPDIR and XDG_RUNTIME_DIR, which it must leave as it found them (empty)."""

    returncode: int
    out: str
    err: str
    tmp: Path
    runtime: Path

    def phase(self, number: int) -> tuple[str, list[Row]]:
        match = re.search(
            rf"^Pool phase {number}/5: .*?(?=^Pool phase |^Pool summary:)", self.out, re.M | re.S
        )
        assert match, f"no pool phase {number} in the output:\n{self.out}"
        rows = []
        for line in match.group(0).splitlines():
            if row := REAL_ROW.match(line):
                rows.append(
                    Row(
                        row["name"],
                        row["uid"],
                        row["address"],
                        int(row["pid"]),
                        row["status"],
                        int(row["tasks"]),
                        int(row["so_far"]),
                        int(row["failures"] or 0),
                        int(row["superseded"] or 0),
                        row["process"] or "running",
                    )
                )
        return match.group(0), rows

    @property
    def summary(self) -> list[str]:
        return self.out[self.out.index("Pool summary:") :].splitlines()


def run_real(tmp: Path, *args: str) -> RealRun:
    (tmp / "tmp").mkdir()
    (tmp / "runtime").mkdir(mode=0o700)
    env = {**os.environ, "TMPDIR": str(tmp / "tmp"), "XDG_RUNTIME_DIR": str(tmp / "runtime")}
    result = subprocess.run(
        command("demo", "--plain", *args), capture_output=True, text=True, timeout=180, env=env
    )
    return RealRun(result.returncode, result.stdout, result.stderr, tmp / "tmp", tmp / "runtime")


@pytest.fixture(scope="module")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> RealRun:
    """The default demo, both parts, on a pipe: real worker processes over LocalDiscovery."""
    return run_real(tmp_path_factory.mktemp("default"))


@pytest.fixture(scope="module")
def etcd_run(tmp_path_factory: pytest.TempPathFactory, etcd: EtcdServer) -> RealRun:
    """The pool part over the tests' etcd, with the weighted balancer."""
    return run_real(
        tmp_path_factory.mktemp("etcd"),
        "--part", "pool", "--etcd", etcd.endpoint, "--balancer", "weighted",
    )  # fmt: skip


def check_real_run(run: RealRun) -> None:
    """What the demo must show over either backend."""
    assert run.returncode == 0, run.err
    assert run.err == ""
    assert not ANSI.search(run.out)
    assert len(re.findall(r"^Pool phase \d/5: ", run.out, re.M)) == 5

    # Phase 1: three worker processes, distinct, none of them the demo's, each answering.
    block, rows = run.phase(1)
    assert [(r.name, r.status, r.process) for r in rows] == [
        ("w1", "pooled", "running"),
        ("w2", "pooled", "running"),
        ("w3", "pooled", "running"),
    ]
    assert len({r.pid for r in rows}) == len({r.address for r in rows}) == 3
    assert all(r.tasks > 0 for r in rows)
    assert sum(r.tasks for r in rows) == int(re.search(r"; (\d+) tasks dispatched", block)[1])
    first = {r.name: r for r in rows}
    for r in rows:
        assert f"the proxy got worker-added {r.name} {r.uid} at {r.address} (pid {r.pid})" in block

    # Phase 2: w2 moved: the same uid at a new address, served by a new process; the old one
    # exited 0 without withdrawing the record, which now belongs to the new process.
    block, rows = run.phase(2)
    old, new = (r for r in rows if r.name == "w2")
    assert (old.address, old.pid) == (first["w2"].address, first["w2"].pid)
    assert new.uid == old.uid == first["w2"].uid
    assert new.address != old.address
    assert new.pid not in {r.pid for r in first.values()}
    assert (old.status, old.process) == ("superseded", "exited 0"), block
    assert (new.status, new.process) == ("pooled", "running"), block
    assert new.tasks > 0
    assert old.superseded == 0
    assert f"the proxy got worker-updated w2 {new.uid} at {new.address} (pid {new.pid})" in block
    assert f"w2's record still names the new process (pid {new.pid})" in block

    # Phase 3: w4 joins and takes tasks; the old w2 address takes none.
    _, rows = run.phase(3)
    by_pid = {r.pid: r for r in rows}
    w4 = next(r for r in rows if r.name == "w4")
    assert (w4.status, w4.process) == ("pooled", "running")
    assert w4.tasks > 0
    assert by_pid[old.pid].tasks == 0

    # Phase 4: w1 SIGKILLed: dispatches to it fail transiently and go on to the next worker
    # until its record is dropped by the liveness bound; then it has left the pool.
    block, rows = run.phase(4)
    by_pid = {r.pid: r for r in rows}
    w1 = by_pid[first["w1"].pid]
    assert (w1.status, w1.process) == ("left", "killed (SIGKILL)")
    assert w1.failures > 0
    reasons = re.search(r"dispatches to it failed transiently \(([^)]*)\)", block)[1]
    counts = dict(reversed(part.split(" ", 1)) for part in reasons.split(", "))
    assert sum(map(int, counts.values())) == w1.failures
    assert int(counts.get("connection lost", 0)) + int(counts.get("cannot connect", 0)) > 0
    assert f"the proxy got worker-dropped w1 {w1.uid} at {w1.address}" in block
    dropped = float(re.search(r"w1's record was dropped ([\d.]+) s after the SIGKILL", block)[1])
    assert 0.3 < dropped < 15
    assert f"pid {w1.pid}" not in block[block.index("  pool: ") :].splitlines()[0]
    assert sum(r.tasks for r in rows if r.status == "pooled") > 0

    # Phase 5: w3 leaves gracefully: it withdraws its record and exits 0.
    block, rows = run.phase(5)
    by_pid = {r.pid: r for r in rows}
    w3 = by_pid[first["w3"].pid]
    assert (w3.status, w3.process) == ("left", "exited 0")
    assert f"the proxy got worker-dropped w3 {w3.uid} at {w3.address}" in block
    pool = block[block.index("  pool: ") :].splitlines()[0]
    assert pool == (
        f"  pool: w2 {new.uid} at {new.address} (pid {new.pid}),"
        f" w4 {w4.uid} at {w4.address} (pid {w4.pid})"
    ) or pool == (
        f"  pool: w4 {w4.uid} at {w4.address} (pid {w4.pid}),"
        f" w2 {new.uid} at {new.address} (pid {new.pid})"
    )
    assert by_pid[new.pid].tasks > 0
    assert by_pid[w4.pid].tasks > 0

    # Measured in every phase: no task reached a superseded address.
    for number in range(1, 6):
        block, rows = run.phase(number)
        assert ", 0 sent to a superseded address\n" in block, f"phase {number}"
        assert all(r.superseded == 0 for r in rows), f"phase {number}"
    summary = run.summary
    assert summary[-1] == "  tasks sent to a superseded address: 0"
    pids = {first["w1"].pid, first["w2"].pid, first["w3"].pid, new.pid, w4.pid}
    assert f"  worker processes that answered: 5 (pids {', '.join(map(str, sorted(pids)))})" in (
        summary
    )
    # the phases account for every task and every transient failure
    tasks = sum(r.tasks for n in range(1, 6) for r in run.phase(n)[1])
    assert f"  total tasks: {tasks}" in summary
    retried = sum(r.failures for n in range(1, 6) for r in run.phase(n)[1])
    assert (
        f"  dispatches that failed transiently and went on to the next worker: {retried}" in summary
    )

    # Nothing left behind: no process, no file, nothing in the runtime directory.
    assert (
        f"  the worker processes still running were sent SIGTERM: w2 pid {new.pid} exited 0,"
        f" w4 pid {w4.pid} exited 0"
    ) in summary
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert list(run.tmp.iterdir()) == []
    assert list(run.runtime.iterdir()) == []


def test_default_demo_runs_real_worker_processes_over_local_discovery(real_run: RealRun) -> None:
    out = real_run.out
    assert "  hot: epoch 11, 3000 of 3000 buckets mapped\n" in out
    assert out.index("Map clearings") < out.index("Worker pool: ") < out.index("Pool summary:")
    assert "Worker pool: a WorkerProxy over LocalDiscovery (namespace shardline-demo-" in out
    assert "liveness: heartbeat 0.2 s; a worker that dies is dropped 1 s after" in out
    assert "balancer: RoundRobinLoadBalancer; 4 callers dispatch `whoami` tasks" in out
    check_real_run(real_run)


def test_no_task_fails_while_a_worker_is_killed(real_run: RealRun) -> None:
    assert real_run.returncode == 0, real_run.err
    assert "  tasks failed: 0" in real_run.summary


async def test_the_pool_part_runs_over_etcd(etcd_run: RealRun) -> None:
    assert "Worker pool: a WorkerProxy over etcd at http://127.0.0.1:" in etcd_run.out
    assert "Step " not in etcd_run.out
    check_real_run(etcd_run)
    # The weighted balancer follows the weights (w1 1, w2 2, w3 1), and no task failed.
    _, rows = etcd_run.phase(1)
    w1, w2, w3 = rows
    assert 1.4 < w2.tasks / w1.tasks < 2.6
    assert 1.4 < w2.tasks / w3.tasks < 2.6
    assert "  tasks failed: 0" in etcd_run.summary
    # Every record is gone from etcd: withdrawn, or (w1's) dropped with its lease.
    namespace = re.search(r"\(namespace (\S+)\)", etcd_run.out)[1]
    endpoint = re.search(r"over etcd at (\S+) ", etcd_run.out)[1]

    async def registered() -> list[Any]:
        from shardline.discovery.etcd import EtcdDiscovery

        discovery = EtcdDiscovery([endpoint], namespace)
        try:
            subscription = discovery.subscribe()
            with pytest.raises(TimeoutError):
                return [await asyncio.wait_for(anext(subscription), 0.5)]
            return []
        finally:
            await discovery.aclose()

    assert await registered() == []


# --- the worker options the demo passes ----------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--ttl", "2"], "--ttl applies to --etcd only"),
        (["--etcd", "http://127.0.0.1:1", "--heartbeat", "0.2"], "--heartbeat applies to"),
        (["--etcd", "http://127.0.0.1:1", "--liveness-timeout", "1"], "--liveness-timeout"),
    ],
)
def test_worker_liveness_options_belong_to_their_backend(
    capsys: pytest.CaptureFixture[str], options: list[str], message: str
) -> None:
    status = main(["worker", "--namespace", "n", "--address", "127.0.0.1:0", *options])
    assert status == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("weight", ["0", "-1", "nan", "x"])
def test_worker_weight_must_be_positive(capsys: pytest.CaptureFixture[str], weight: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["worker", "--namespace", "n", "--address", "127.0.0.1:0", "--weight", weight])
    assert exit_info.value.code == 2
    assert "--weight" in capsys.readouterr().err


# --- the registration part (--part registration): a replica swap whose replacement never comes up

REGISTRATION_EVENT = re.compile(r"^  - +(?P<time>\d+\.\d) s  (?P<events>.+)$")
REGISTRATION_STATE = re.compile(
    r"^ +record: (?P<record>.+?); advertised_address: (?P<advertised>\S+);"
    r" the proxy got (?P<got>.+?); a dispatch now: (?P<dispatch>.+)$"
)
SERVING = "owner a-1, registered True, address 10.0.1.1:8080"
CLAIMED = "owner b-2, registered False, no address"
NOBODY = "failed, NoWorkersAvailable (app is not in the pool)"


@dataclass(frozen=True)
class RegistrationRow:
    time: float
    events: str
    record: str
    advertised: str
    got: str
    dispatch: str


def registration_timeline(output: str, number: int) -> tuple[str, list[RegistrationRow]]:
    """Timeline ``number`` of the registration part: its block and its rows."""
    match = re.search(
        rf"^Registration timeline {number}/2, .*?(?=^Registration timeline |^Registration: )",
        output,
        re.M | re.S,
    )
    assert match, f"no registration timeline {number} in the output:\n{output}"
    rows, event = [], None
    for line in match.group(0).splitlines():
        if found := REGISTRATION_EVENT.match(line):
            event = found
        elif (state := REGISTRATION_STATE.match(line)) and event is not None:
            rows.append(
                RegistrationRow(
                    float(event["time"]),
                    event["events"],
                    state["record"],
                    state["advertised"],
                    state["got"],
                    state["dispatch"],
                )
            )
            event = None
    return match.group(0), rows


def test_registration_part_runs_alone(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run_demo(capsys, "--plain", "--part", "registration")
    assert (status, err) == (0, "")  # the keeper's warnings are shown in the timeline
    assert not ANSI.search(out)
    assert "Step " not in out
    assert "Pool phase" not in out
    assert "time is virtual: the keepers sleep on an injected clock" in out
    assert len(re.findall(r"^Registration timeline \d/2, ", out, re.M)) == 2
    assert re.search(r"^Registration: 240 s of virtual time per run; both runs took", out, re.M)
    # the same output as the driver's, but for the real time it took
    assert re.sub(r"took \S+ s", "", out) == re.sub(
        r"took \S+ s", "", run_demo(capsys, "--plain", "--part", "registration")[1]
    )


def test_registration_comes_between_the_topology_and_the_pool_parts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, out, _ = run_demo(capsys, "--plain", "--in-process")
    assert status == 0
    assert (
        out.index("Map clearings")
        < out.index("Registration timeline 1/2")
        < out.index("Registration timeline 2/2")
        < out.index("Worker pool: ")
    )


def test_the_record_goes_false_at_the_claim_and_heals_on_the_next_probe(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, out, _ = run_demo(capsys, "--plain", "--part", "registration")
    block, rows = registration_timeline(out, 1)
    assert "the library's RegistrationKeeper" in block
    by_time = {row.time: row for row in rows}
    assert sorted(by_time) == [0.0, 60.0, 61.0, 91.0, 120.0, 121.0, 130.0, 180.0, 240.0]

    first = by_time[0.0]
    assert first.events.startswith("A (a-1): starts, claims the record, register() returned")
    assert (first.record, first.advertised) == (SERVING, "10.0.1.1:8080")
    assert (first.got, first.dispatch) == ("worker-added 10.0.1.1:8080", "served by A")

    # B's claim turns the record False while A serves: advertised_address says None and the
    # proxy drops the service, one event after the claim
    claim = by_time[61.0]
    assert claim.events.startswith("B (b-2): starts, claims the record (a wrong False")
    assert "register() refused: client already exists and is active" in claim.events
    assert (claim.record, claim.advertised, claim.got, claim.dispatch) == (
        CLAIMED,
        "None",
        "worker-dropped",
        NOBODY,
    )
    assert "next attempt in 30.0 s" in block  # the keeper's own warning, shown in the timeline

    # A's next probe re-asserts True: the record heals, and the proxy and the reader follow
    heal = by_time[120.0]
    assert heal.events == (
        "A (a-1): probe() answered: still served, reports True: the record heals,"
        " 59.0 s after B's claim"
    )
    assert (heal.record, heal.advertised, heal.got, heal.dispatch) == (
        SERVING,
        "10.0.1.1:8080",
        "worker-added 10.0.1.1:8080",
        "served by A",
    )
    for row in rows:
        wrong = 61.0 <= row.time < 120.0
        assert row.record == (CLAIMED if wrong else SERVING), row
        assert row.advertised == ("None" if wrong else "10.0.1.1:8080"), row
        assert row.dispatch == (NOBODY if wrong else "served by A"), row
    assert by_time[130.0].events.startswith("B (b-2): killed (it never deregisters")

    window = re.search(
        r"^  wrong-False window: (\S+) s, from B's claim at 61\.0 s until A's report True after"
        r" its probe at 120\.0 s healed the record; within the bound: probe interval 60 s"
        r" \+ tick 5 s = 65 s, and within one probe interval \(60 s\)$",
        block,
        re.M,
    )
    assert window, block
    assert float(window[1]) == 59.0 <= 60 + 5
    assert (
        "  the proxy (fed by RegistrationDiscovery): worker-dropped at 61.0 s;"
        " worker-added again at 120.0 s\n"
    ) in block
    assert (
        "  requests to app through the proxy, one per virtual second: 240; served by A: 181;"
        " failed with NoWorkersAvailable while A served and the record said False: 59\n"
    ) in block


def test_the_pre_fix_contrast_stays_false(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run_demo(capsys, "--plain", "--part", "registration")
    block, rows = registration_timeline(out, 2)
    assert "for contrast, the seed's pre-fix behaviour (a model, not library code)" in block
    assert [row.time for row in rows] == [0.0, 60.0, 61.0, 91.0, 120.0, 121.0, 130.0, 180.0, 240.0]
    for row in rows:
        wrong = row.time >= 61.0
        assert row.record == (CLAIMED if wrong else SERVING), row
        assert row.advertised == ("None" if wrong else "10.0.1.1:8080"), row
        assert row.dispatch == (NOBODY if wrong else "served by A"), row
        if row.time in (60.0, 120.0, 180.0, 240.0):
            # A's probes succeed and assert nothing
            assert row.events == (
                "A (a-1): probe() answered: still served, reports nothing"
                " (pre-fix: only a registration does)"
            )
    assert (
        "  wrong-False window: still open at the end of the run (240.0 s), 179.0 s after B's"
        " claim at 61.0 s, while A served all along: nothing will ever write True again\n"
    ) in block
    assert "worker-dropped at 61.0 s; never added again\n" in block
    assert (
        "  requests to app through the proxy, one per virtual second: 240; served by A: 61;"
        " failed with NoWorkersAvailable while A served and the record said False: 179\n"
    ) in block


@pytest.mark.parametrize(
    ("tick", "claim_at"),
    [(5.0, 1.0), (5.0, 59.5), (5.0, 60.0), (5.0, 60.5), (5.0, 100.0), (7.0, 64.0), (7.0, 10.0)],
)
def test_the_wrong_false_window_stays_within_the_bound(tick: float, claim_at: float) -> None:
    from shardline.demo import run_registration_demo

    run = run_registration_demo(
        tick=tick, claim_at=claim_at, killed_at=claim_at + 40, end=claim_at + 200, contrast=False
    )
    assert run.contrast is None
    timeline = run.fixed
    [window] = timeline.windows
    assert window.start == claim_at
    assert window.opened_by == "B's claim"
    assert window.closed_by == "A's report True after its probe"
    assert window.length is not None
    assert 0 < window.length <= run.bound == run.probe_interval + tick
    # the proxy followed: dropped at the claim, added back when the record healed
    assert timeline.dropped_at == [claim_at]
    assert timeline.added_at == [0.0, window.end]
    assert timeline.failed_otherwise == 0
    assert timeline.failed_while_wrong <= int(window.length) + 1
    assert timeline.served + timeline.failed_while_wrong == timeline.requests
    # advertised_address and a dispatch through the proxy follow the record, row by row, and
    # the record says False only within the window
    for row in timeline.rows:
        assert row.record is not None
        registered = row.record.registered
        assert row.advertised == ("10.0.1.1:8080" if registered else None), row
        assert row.served_by == ("A" if registered else None), row
        assert registered or window.start <= row.time < window.end, row


def test_a_tick_that_misses_the_probe_time_still_heals_within_the_bound() -> None:
    # tick 7 s: A's probes fall due at 60 s and 120 s but run at the next ticks (63 s, 126 s):
    # a claim just after the first one is wrong for more than a probe interval, never longer
    # than a probe interval plus a tick
    from shardline.demo import run_registration_demo

    run = run_registration_demo(tick=7.0, claim_at=64.0, killed_at=100.0, end=200.0)
    [window] = run.fixed.windows
    assert (window.start, window.end) == (64.0, 126.0)
    assert run.probe_interval < 62.0 <= run.bound
    assert run.contrast is not None
    [open_window] = run.contrast.windows
    assert (open_window.start, open_window.end) == (64.0, None)


def test_registration_rich_view_shows_the_timelines() -> None:
    from shardline.demo import render_registration_rich, run_registration_demo

    buffer = io.StringIO()
    run = run_registration_demo()
    render_registration_rich(run, Console(file=buffer, width=140, force_terminal=False))
    text = buffer.getvalue()
    assert "Registration timeline 1/2, with the fix" in text
    assert "Registration timeline 2/2, for contrast" in text
    assert "┏" in text
    assert re.search(r"│\s+61\.0 s │ B \(b-2\): starts, claims the record", text)
    assert "b-2, False, -" in text
    assert "NoWorkersAvailable" in text
    assert "nothing will" in text
    # virtual time: minutes of keeper time in well under the couple of seconds allowed
    assert run.elapsed < 5.0


def test_registration_part_refuses_the_other_parts_options(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, out, err = run_demo(capsys, "--part", "registration", "--in-process")
    assert (status, out) == (2, "")
    assert "--etcd and --in-process need the pool part" in err
    status, out, err = run_demo(capsys, "--part", "registration", "--keys", "5")
    assert (status, out) == (2, "")
    assert "--scenario and --keys need the topology part" in err
    from shardline.demo import run_registration_demo

    with pytest.raises(ValueError, match="claim_at"):
        run_registration_demo(claim_at=0.0)


# --- the topology part against a live cluster (--pg DSN) ----------------------------------------

import socket  # noqa: E402

from shardline import InstanceEvent, ReplicasetEvent, Topology  # noqa: E402
from shardline.demo import live as live_module  # noqa: E402
from support.picodata_catalog import Catalog, Expected, name_uuid  # noqa: E402
from support.replicasets import rs_uuid  # noqa: E402


def poll_block(output: str, number: int) -> str:
    """The plain-text block of poll ``number``, up to the next poll or the summary."""
    match = re.search(rf"^Poll {number}/\d+, .*?(?=^Poll |^Live summary)", output, re.M | re.S)
    assert match, f"no poll {number} in the output"
    return match.group(0)


def live_table(block: str, title: str) -> list[list[str]]:
    """The rows of the table titled ``title`` in a poll block, split on whitespace."""
    lines = block.splitlines()
    start = next(n for n, line in enumerate(lines) if line.startswith(f"  {title}"))
    rows = []
    for line in lines[start + 2 :]:  # after the title and the header
        if not line.startswith("    "):
            break
        rows.append(line.split())
    return rows


def catalog_topology(catalog: Catalog) -> Topology:
    """The catalog's committed state in a Topology of its own (not through the demo)."""
    expected = catalog.expected()
    topology = Topology()
    topology.apply_tiers(expected.tiers)
    for rs, (tier, master) in expected.replicasets.items():
        topology.apply(ReplicasetEvent("replace", rs, tier=tier, current_master_uuid=master))
    for instance, (rs, state, address) in expected.instances.items():
        topology.apply(
            InstanceEvent(
                "replace", instance, replicaset_uuid=rs, current_state=state, address=address
            )
        )
    for tier in expected.tiers:
        topology.apply_bucket_snapshot(tier, catalog.pico_bucket(tier))
    return topology


def check_poll_against_catalog(block: str, expected: Expected, topology: Topology) -> None:
    """The tiers, ranges, keys per master and sample keys of a poll are the catalog's."""
    tiers = {row[0]: row for row in live_table(block, "tiers")}
    for tier, count in expected.tiers.items():
        assert tiers[tier][1:4] == [str(count), str(len(expected.maps[tier])), f"{count}/{count}"]
    ranges = [(row[0], row[1], row[2]) for row in live_table(block, "bucket ranges")]
    assert ranges == [
        (tier, f"{start}-{end}", owner)
        for tier in sorted(expected.maps)
        for start, end, owner in expected.maps[tier]
    ]
    keys = [f"user:{i}" for i in range(500)]
    routing = live_table(block, "routing: keys per master")
    for tier in expected.tiers:
        wanted = Counter(m.uuid for m in topology.route_many(tier, keys) if m is not None)
        shown = {row[2]: int(row[-1]) for row in routing if row[0] == tier and row[2] != "(no"}
        assert shown == dict(wanted)
        assert [row[-1] for row in routing if row[0] == tier and row[2] == "(no"] == ["0"]
        for row in routing:
            if row[0] == tier and row[2] != "(no":
                rs, _, address = expected.instances[row[2]]
                assert row[3:5] == [address, rs]
                assert expected.replicasets[rs][1] == row[2]  # the replicaset's master
    samples = live_table(block, "sample keys")
    assert len(samples) == 3 * len(expected.tiers)
    for key, tier, bucket, rs, master, address in samples:
        assert int(bucket) == bucket_id(key, expected.tiers[tier])
        owner = next(o for s, e, o in expected.maps[tier] if s <= int(bucket) <= e)
        assert rs == owner
        assert master == expected.replicasets[owner][1]  # the master the catalog names
        assert address == expected.instances[master][2]
        found = topology.route(tier, key)
        assert found is not None
        assert found.uuid == master


def test_pg_shows_the_live_clusters_maps_and_routing_and_what_changed(
    catalog: Catalog, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[Expected, Topology]] = [(catalog.expected(), catalog_topology(catalog))]

    async def between_polls(after: int, interval: float) -> None:
        assert interval == 0.0
        if after == 1:  # a replicaset joins and the buckets are rebalanced before poll 2
            with catalog.transaction():
                catalog.add_replicaset("r4", uuid=rs_uuid(4))
                catalog.rebalance("default")
            seen.append((catalog.expected(), catalog_topology(catalog)))
        elif after == 2:  # a rebalance in progress: _pico_bucket raises for poll 3
            catalog.fail_buckets("other")

    monkeypatch.setattr(live_module, "between_polls", between_polls)
    status, out, err = run_demo(
        capsys,
        *("--part", "topology", "--pg", catalog.dsn, "--plain"),
        *("--polls", "3", "--interval", "0", "--keys", "500"),
    )
    assert (status, err) == (0, "")
    assert not ANSI.search(out)
    assert "password" not in out
    assert out.startswith("shardline demo --pg: the live cluster at 127.0.0.1:")
    assert "Step 1/" not in out  # nothing of the embedded scenario
    assert "Registration" not in out
    assert "Pool phase" not in out

    first, second, third = (poll_block(out, n) for n in (1, 2, 3))
    assert first.startswith("Poll 1/3, +")
    assert first.splitlines()[0].endswith(": complete")
    check_poll_against_catalog(first, *seen[0])
    assert ["default", "1-1500", rs_uuid(1)] == live_table(first, "bucket ranges")[0][:3]

    assert second.splitlines()[0].endswith(": complete")
    check_poll_against_catalog(second, *seen[1])
    r4_master = seen[1][0].replicasets[rs_uuid(4)][1]
    assert f"- replicaset {rs_uuid(4)} added to tier default, master {r4_master}" in second
    assert "- default: epoch " in second
    assert "3 ranges (was 2)" in second
    moves = [row for row in live_table(second, "bucket moves:") if row]
    assert moves == [
        ["default", "1001-1500", rs_uuid(1), rs_uuid(2)],
        ["default", "2001-3000", rs_uuid(2), rs_uuid(4)],
    ]
    moved = sum(
        1
        for key in (f"user:{i}" for i in range(500))
        if seen[0][1].route("default", key) != seen[1][1].route("default", key)
    )
    assert f"- default: {moved} of 500 keys now reach another master" in second
    assert "other:" not in second  # the other tier did not change

    assert "INCOMPLETE" in third.splitlines()[0]
    assert "failures: bucket-error (1x)" in third
    assert "rebalance in progress" in third
    assert "no change since poll 2" in third  # the failing tier keeps its map
    summary = out[out.index("Live summary:") :]
    assert "polls: 3, complete: 2" in summary
    assert "changes seen at polls: 2" in summary
    assert "keys with no route at the last poll: default 0, other 0" in summary


def test_pg_on_a_terminal_draws_rich_tables(
    catalog: Catalog, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "240")
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    status, out, err = run_demo(capsys, "--part", "topology", "--pg", catalog.dsn, "--polls", "1")
    assert (status, err) == (0, "")
    assert "━" in out or "─" in out
    assert "routing: keys per master" in out
    assert "routed queries: where they ran" in out
    assert rs_uuid(3) in out
    assert "Live summary:" in out


def test_pg_that_cannot_be_reached_exits_1_with_the_reason(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: refused
        status, out, err = run_demo(
            capsys, "--part", "topology", "--pg", f"postgresql://x@127.0.0.1:{port}"
        )
    assert (status, out) == (1, "")
    assert "shardline demo: error: cannot read the cluster: connect (1x)" in err
    assert "refused" in err


def test_pg_without_asyncpg_says_what_to_install(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "asyncpg", None)
    status, out, err = run_demo(capsys, "--part", "topology", "--pg", "postgresql://127.0.0.1")
    assert (status, out) == (1, "")
    assert err == (
        "shardline demo: error: --pg needs asyncpg, which is not installed:"
        " pip install 'shardline[pg]'\n"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--polls", "2"], "--polls and --interval need --pg"),
        (["--interval", "1"], "--polls and --interval need --pg"),
        (["--pg", "postgresql://127.0.0.1", "--part", "pool"], "--pg needs the topology part"),
        (["--pg", "postgresql://127.0.0.1", "--scenario", "f.json"], "--pg and --scenario"),
        (["--pg", "postgresql://127.0.0.1", "--polls", "0"], "--polls must be an integer from 1"),
        (
            ["--pg", "postgresql://127.0.0.1", "--interval", "nan"],
            "--interval must be a number of seconds",
        ),
        (["--pg", "postgresql://127.0.0.1", "--keys", "0"], "--keys must be an integer from 1"),
        (["--pg", "host=127.0.0.1", "--part", "topology"], "--pg: dsn must be a postgresql://"),
        (["--queries", "5"], "--queries needs --pg"),
        (["--pg", "postgresql://127.0.0.1", "--queries", "-1"], "--queries must be an integer"),
        (
            ["--pg", "postgresql://127.0.0.1", "--queries", "1000001"],
            "--queries must be an integer from 0 to 1000000",
        ),
    ],
)
def test_pg_usage_errors_exit_2(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    status, out, err = run_demo(capsys, *args)
    assert (status, out) == (2, "")
    assert message in err


# --- routed queries (--pg DSN --queries N) ------------------------------------------------------

from support.picodata_cluster import (  # noqa: E402
    BUCKET_COUNT,
    REPLICASETS,
    PicodataCluster,
)


def query_rows(block: str) -> dict[str, tuple[str, str, int, int, int]]:
    """The routed-queries table of a poll block: instance → (tier, address, keys, queries,
    failed)."""
    rows = {}
    for tier, *label, address, keys, queries, failed in live_table(
        block, "routed queries: where they ran"
    ):
        rows[" ".join(label)] = (
            tier,
            address,
            int(keys),
            int(queries) if queries != "-" else -1,
            int(failed),
        )
    return rows


def test_pg_routed_queries_run_on_the_master_owning_each_key(
    picodata_cluster: PicodataCluster,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster = picodata_cluster
    cluster.reset()
    m2 = cluster.instances["m2"]
    with cluster.catalog.transaction():
        # a second tier, on an instance of its own (m2's server): its keys are routed there
        # with their own tier, not the client's
        cluster.catalog.add_tier("other", 100)
        cluster.catalog.add_replicaset("rs3", "other", instances=0)
        cluster.catalog.add_instance("o1", "rs3")
        cluster.catalog.set_address("o1", m2.address)
        cluster.catalog.switch_master("rs3", "o1")
        cluster.catalog.rebalance("other")

    async def between_polls(after: int, interval: float) -> None:
        cluster.catalog.switch_master("rs1", "r1")  # r1 takes over rs1's buckets

    monkeypatch.setattr(live_module, "between_polls", between_polls)
    try:
        status, out, err = run_demo(
            capsys,
            *("--part", "topology", "--pg", cluster.dsn, "--plain"),
            *("--polls", "2", "--interval", "0", "--keys", "500", "--queries", "300"),
        )
    finally:
        cluster.reset()
    assert (status, err) == (0, "")
    keys = [f"user:{i}" for i in range(300)]  # the first 300 of the demo's keys
    # the owner of each key's bucket, worked out here: rs1 has buckets 1-1500, rs2 the rest
    assert REPLICASETS == {"rs1": ("m1", "r1"), "rs2": ("m2",)}
    in_rs1 = sum(1 for key in keys if bucket_id(key, BUCKET_COUNT) <= 1500)
    assert 0 < in_rs1 < 300
    address = {name: instance.address for name, instance in cluster.instances.items()}

    first, second = poll_block(out, 1), poll_block(out, 2)
    assert query_rows(first) == {
        "m1": ("default", address["m1"], in_rs1, in_rs1, 0),
        "m2": ("default", address["m2"], 300 - in_rs1, 300 - in_rs1, 0),
        "o1": ("other", address["m2"], 300, 300, 0),
    }  # r1, a replica, ran none
    assert "600 queries in " in first
    assert ", 0 failed; misses: none, fallbacks: none; retries: 0;" in first

    assert f"- replicaset {name_uuid('rs1')}: master {name_uuid('m1')} -> {name_uuid('r1')}" in (
        second
    )
    assert query_rows(second) == {
        "r1": ("default", address["r1"], in_rs1, in_rs1, 0),
        "m2": ("default", address["m2"], 300 - in_rs1, 300 - in_rs1, 0),
        "o1": ("other", address["m2"], 300, 300, 0),
    }  # m1 is a replica now: it ran none
    summary = out[out.index("Live summary:") :]
    assert "routed queries: 1200 sent, 0 failed, 0 fallbacks" in summary


def test_pg_queries_to_unreachable_instances_are_reported_and_the_demo_goes_on(
    catalog: Catalog, capsys: pytest.CaptureFixture[str]
) -> None:
    names = {name_uuid(name): name for name in ("r1_1", "r1_2", "r2_1", "r3_1")}
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{sock.getsockname()[1]}"  # bound, not listening: refused
        for name in names.values():
            catalog.set_address(name, closed)
        status, out, err = run_demo(
            capsys,
            *("--part", "topology", "--pg", catalog.dsn, "--plain"),
            *("--polls", "2", "--interval", "0", "--keys", "50", "--queries", "40"),
        )
    assert (status, err) == (0, "")
    expected = catalog.expected()
    topology = catalog_topology(catalog)
    keys = [f"user:{i}" for i in range(40)]
    for number in (1, 2):
        block = poll_block(out, number)
        assert block.splitlines()[0].endswith(": complete")
        wanted: Counter[tuple[str, str]] = Counter()
        for tier in expected.tiers:
            for master in topology.route_many(tier, keys):
                assert master is not None
                wanted[tier, names[master.uuid]] += 1
        assert query_rows(block) == {
            name: (tier, closed, n, 0, n) for (tier, name), n in wanted.items()
        }
        assert "80 queries in " in block
        assert ", 80 failed; misses: none, fallbacks: none; retries: 80;" in block
        failures = [line for line in block.splitlines() if line.startswith("  failed: ")]
        assert len(failures) == 3  # one reason per master
        for line in failures:
            assert "InstanceUnavailable: cannot connect to instance" in line
            assert f"at {closed}: " in line
            assert "refused" in line
    summary = out[out.index("Live summary:") :]
    assert "routed queries: 160 sent, 160 failed, 0 fallbacks" in summary


def test_pg_queries_0_runs_none(catalog: Catalog, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run_demo(
        capsys,
        *("--part", "topology", "--pg", catalog.dsn, "--plain"),
        *("--polls", "1", "--queries", "0"),
    )
    assert (status, err) == (0, "")
    assert "routing: keys per master" in out
    assert "routed queries" not in out
    assert "SELECT 1" not in out
