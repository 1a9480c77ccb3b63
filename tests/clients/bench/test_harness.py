"""The benchmarks' cache directory: the one `--cache-dir` names stays, a temporary one goes."""

from __future__ import annotations

from clients.bench.harness import cache_dir


def test_a_temporary_cache_directory_is_removed_after_the_run():
    with cache_dir(None, "test") as path:
        assert path.is_dir() and path.name.startswith("lineage-test-")
        (path / "1.entry").write_bytes(b"x")
    assert not path.exists()


def test_the_cache_directory_given_is_kept(tmp_path):
    given = tmp_path / "cache"
    given.mkdir()
    with cache_dir(str(given), "test") as path:
        assert path == given
        (path / "1.entry").write_bytes(b"x")
    assert (given / "1.entry").is_file()
