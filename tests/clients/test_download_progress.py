"""Download progress (engine.hub.progress): a bar on a terminal, a line every few seconds
otherwise, the same lines in the log; it watches a folder grow, so a plain folder and a
writer thread stand in for a download."""

from __future__ import annotations

import io
import logging
import time

from engine.hub.progress import DownloadProgress, describe


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _grow(blobs, total: int, steps: int = 8, pause: float = 0.2) -> None:
    blob = blobs / "x.incomplete"
    for i in range(1, steps + 1):
        blob.write_bytes(b"\0" * (total * i // steps))
        time.sleep(pause)
    time.sleep(0.6)  # a reading or two of the whole file before it stops


def test_a_pipe_gets_a_line_every_few_seconds_and_the_log_the_same(tmp_path, caplog):
    out = io.StringIO()
    watch = DownloadProgress(out, every_s=0.3)
    with caplog.at_level(logging.INFO, logger="lineage.hub"):
        watch.start("org/tiny", tmp_path, 1 << 20)
        _grow(tmp_path, 1 << 20)
        watch.stop()
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert lines[0] == "lineage: downloading org/tiny: 0 B of 1.0 MiB, 0 B/s, -"
    assert len(lines) >= 3  # the first, at least one while it grows, the last
    assert lines[-1].startswith("lineage: org/tiny: 1.0 MiB of 1.0 MiB, ")
    assert [r.getMessage() for r in caplog.records] == lines


def test_a_terminal_gets_a_bar(tmp_path):
    out = Terminal()
    heard = []
    watch = DownloadProgress(out, every_s=60, on_bytes=lambda d, t: heard.append((d, t)))
    watch.start("org/tiny", tmp_path, 1 << 20)
    _grow(tmp_path, 1 << 20)
    watch.stop()
    text = out.getvalue()
    assert "\rorg/tiny [" in text and "#" * 30 + "]" in text
    assert heard and heard[-1] == (1 << 20, 1 << 20)


def test_describe_says_bytes_rate_and_time_left():
    assert describe(1 << 20, 4 << 20, 2.0) == "1.0 MiB of 4.0 MiB, 512.0 KiB/s, 6 s left"
