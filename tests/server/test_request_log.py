"""The per-request log line carries every Timing field, derived from the dataclass."""

from __future__ import annotations

import dataclasses
import logging

from engine.cache.kinds import RestoreKind
from engine.cache.messages import CapturePoint
from engine.runtime.events import Finished, FinishReason, Timing
from engine.server.front.inspection import log_request


def test_the_log_line_names_every_timing_field(caplog):
    timing = Timing(queue_ms=1.25, ttft_ms=12.0, bytes_copied_commit=7, restored_kv_bytes=4096)
    final = Finished("r1", FinishReason.STOP, 100, 64, 5, RestoreKind.REPLY, 64, timing)
    with caplog.at_level(logging.INFO, logger="lineage.request"):
        log_request(final, (CapturePoint(90, "guard"),))
    (line,) = [r.getMessage() for r in caplog.records if r.name == "lineage.request"]
    head = "request id=r1 model=- replica=- finish=stop prompt=100 cached=64 completion=5 "
    assert line.startswith(head)
    assert "restore=reply@64 lost=- captures=guard@90 " in line
    for field in dataclasses.fields(Timing):
        assert f" {field.name}=" in line, field.name
    assert "queue_ms=1.2 " in line or "queue_ms=1.3 " in line
    assert "bytes_copied_commit=7 " in line and " restored_kv_bytes=4096 " in line


def test_the_log_line_names_a_lost_restore_point(caplog):
    final = Finished("r2", FinishReason.STOP, 100, 0, 5, RestoreKind.NONE, 0, restore_lost="7@64")
    with caplog.at_level(logging.INFO, logger="lineage.request"):
        log_request(final, ())
    (line,) = [r.getMessage() for r in caplog.records if r.name == "lineage.request"]
    assert " restore=none@0 lost=7@64 " in line


def test_the_log_line_says_why_it_missed_and_which_volatile_lines_went(caplog):
    from engine.cache.kinds import MissKind
    from engine.cache.messages import Miss

    final = Finished("r3", FinishReason.STOP, 100, 0, 5, RestoreKind.NONE, 0)
    with caplog.at_level(logging.INFO, logger="lineage.request"):
        log_request(final, (), Miss(MissKind.SYSTEM, 17, 0, 340), volatile=1)
        log_request(final, (), Miss(MissKind.TOOLS, 9, -1, 340))
    first, second = [r.getMessage() for r in caplog.records if r.name == "lineage.request"]
    assert " miss=system@17/m0 volatile=1 " in first
    assert " miss=tools@9/head volatile=0 " in second
