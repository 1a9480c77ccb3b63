"""`lineage cache ls|stats|rm|prune` on a cache directory (no server)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from clients.cli.main import main
from engine.cache.messages import EntryRecord
from engine.storage import file_format
from engine.storage.directory import lock_directory
from tests.fakes import KVPT, STATE, write_fake_file


def _record(entry_id, n, role="conversation", namespace=""):
    toks = np.arange(entry_id * 1000, entry_id * 1000 + n, dtype=np.int32)
    return EntryRecord(entry_id, namespace, role, toks, n, (), KVPT, STATE)


@pytest.fixture
def cache_dir(tmp_path):
    """Own files 1-4 (fingerprint "fp", file 4 the newest), one of "old", one damaged, a temp."""
    d = file_format.entries_dir(tmp_path)
    d.mkdir(parents=True)
    write_fake_file(d, _record(5, 50), fingerprint="old")
    for i, (role, ns) in enumerate(
        [("conversation", "a"), ("anchor", "a"), ("conversation", "b"), ("conversation", "a")],
        start=1,
    ):
        write_fake_file(d, _record(i, 100 * i, role, ns), fingerprint="fp", body_bytes=1000 * i)
        os.utime(d / f"{i}.entry", (1000 + i, 1000 + i))
    os.utime(d / "5.entry", (500, 500))
    (d / "6.entry").write_bytes(b"garbage")
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (d / f".7.{dead}.tmp").write_bytes(b"partial")
    return tmp_path


def run_json(capsys, *argv) -> dict:
    assert main(["cache", *argv, "--json"], env={}) == 0
    return json.loads(capsys.readouterr().out)


def test_ls_reads_headers_and_marks_own_foreign_and_damaged(cache_dir, capsys):
    out = run_json(capsys, "ls", "--cache-dir", str(cache_dir))
    status = {row["id"]: row["status"].split(":")[0] for row in out["files"]}
    assert out["fingerprint"] == "fp"  # the newest sound file's
    assert status == {1: "own", 2: "own", 3: "own", 4: "own", 5: "foreign", 6: "damaged"}
    row = next(r for r in out["files"] if r["id"] == 2)
    assert (row["role"], row["namespace"], row["tokens"]) == ("anchor", "a", 200)
    assert main(["cache", "ls", "--cache-dir", str(cache_dir)], env={}) == 0
    assert "foreign" in capsys.readouterr().out


def test_stats_totals_the_directory(cache_dir, capsys):
    out = run_json(capsys, "stats", "--cache-dir", str(cache_dir))
    assert (out["files"], out["conversations"], out["anchors"]) == (6, 4, 1)
    assert (out["damaged_files"], out["temporary_files"]) == (1, 1)
    assert out["fingerprints"] == {"fp": 4, "old": 1}


def test_rm_by_id_and_by_namespace(cache_dir, capsys):
    d = file_format.entries_dir(cache_dir)
    out = run_json(capsys, "rm", "--cache-dir", str(cache_dir), "3")
    assert [r["id"] for r in out["removed"]] == [3] and not (d / "3.entry").exists()
    out = run_json(capsys, "rm", "--cache-dir", str(cache_dir), "--namespace", "a")
    assert sorted(r["id"] for r in out["removed"]) == [1, 2, 4]
    assert main(["cache", "rm", "--cache-dir", str(cache_dir), "99"], env={}) == 2


def test_prune_removes_foreign_damaged_leftovers_then_lru_over_budget(cache_dir, capsys):
    d = file_format.entries_dir(cache_dir)
    sizes = {i: (d / f"{i}.entry").stat().st_size for i in (1, 2, 3, 4)}
    budget = sizes[2] + sizes[4]  # the anchor and the newest conversation fit
    out = run_json(
        capsys,
        "prune",
        "--cache-dir",
        str(cache_dir),
        "--fingerprint",
        "fp",
        "--budget",
        str(budget),
    )
    why = {r["id"]: r["why"] for r in out["removed"]}
    assert sorted(why) == [1, 3, 5, 6]
    assert why[5] == "another model's file" and why[6].startswith("damaged")
    assert len(out["removed_temporary"]) == 1
    assert sorted(p.name for p in d.iterdir()) == ["2.entry", "4.entry", "LOCK"]


def test_rm_and_prune_refuse_a_directory_a_server_holds(cache_dir, capsys):
    d = file_format.entries_dir(cache_dir)
    lock = lock_directory(d)
    try:
        assert main(["cache", "rm", "--cache-dir", str(cache_dir), "1"], env={}) == 2
        assert (d / "1.entry").exists()
        assert "holds" in capsys.readouterr().err
        assert main(["cache", "rm", "--cache-dir", str(cache_dir), "1", "--force"], env={}) == 0
        assert not (d / "1.entry").exists()
    finally:
        lock.close()
