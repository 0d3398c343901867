"""How a source's failures are logged: a warning when a reason starts failing, a reminder at
most every REPEAT_WARNING_INTERVAL seconds while it keeps failing, never a line per poll."""

from __future__ import annotations

import logging

import pytest

from shardline.topology.sources import state
from shardline.topology.sources.state import FailureReason, StateRecorder


def test_a_long_outage_is_warned_about_again_at_most_once_an_interval(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(state, "monotonic", lambda: clock[0])
    recorder = StateRecorder("PollingSource(db)")
    with caplog.at_level(logging.DEBUG, logger="shardline.topology.sources"):
        for second in range(0, 131):  # a poll a second, every one refused
            clock[0] = 1000.0 + second
            recorder.failure(FailureReason.CONNECT, "connection refused")
        recorder.failure(FailureReason.TIMEOUT, "no answer in 5 s")
        recorder.refreshed()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "PollingSource(db): connect: connection refused",
        "PollingSource(db): still failing (61 failures in 60 s): connect: connection refused",
        "PollingSource(db): still failing (121 failures in 120 s): connect: connection refused",
        "PollingSource(db): timeout: no answer in 5 s",
    ]
    debug = [r for r in caplog.records if r.levelno == logging.DEBUG]
    assert len(debug) == 131 - 3
    info = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert info == ["PollingSource(db): refreshed again after connect, timeout"]


def test_a_reason_failing_again_after_a_refresh_is_warned_about_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    recorder = StateRecorder("source")
    with caplog.at_level(logging.WARNING, logger="shardline.topology.sources"):
        recorder.failure(FailureReason.CONNECT, "refused")
        recorder.refreshed()
        recorder.failure(FailureReason.CONNECT, "refused")
    assert [r.getMessage() for r in caplog.records] == ["source: connect: refused"] * 2
