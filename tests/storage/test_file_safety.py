"""Cache files are private and a load trusts nothing it did not plan.

0600 files in a 0700 directory, refused when another user owns it; temporary
files created O_EXCL|O_NOFOLLOW; the scan reads regular files only; a load
checks the plan's namespace and tokens; entry metadata may name mlx-lm cache
classes only. Real files, real MLX arrays; no model, no Ray.
"""

from __future__ import annotations

import os
import stat

import numpy as np
import pytest

from engine.storage import file_format, writer
from engine.storage.codec import CACHE_CLASSES, _class
from engine.storage.codec import read_entry as load_entry
from engine.storage.codec import to_write_job as capture
from engine.storage.directory import open_directory, private_directory, scan_directory
from engine.storage.disk_store import DiskStore
from tests.storage.test_disk_files import _entry, _record


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_files_are_0600_in_a_0700_directory(tmp_path):
    old = os.umask(0o022)
    try:
        d = tmp_path / "entries"
        w = writer.DiskWriter(d)
        w.write(capture(_entry("bfloat16"), _record(3, 30), "fp"))
        assert w.close(30)
    finally:
        os.umask(old)
    assert mode(d) == 0o700
    assert mode(d / "3.entry") == 0o600


def test_a_loose_directory_is_tightened_and_another_users_is_refused(tmp_path):
    d = tmp_path / "loose"
    d.mkdir(mode=0o777)
    os.chmod(d, 0o777)
    private_directory(d)
    assert mode(d) == 0o700
    if os.getuid() != 0:
        pytest.skip("changing a directory's owner needs root")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, 12345, 12345)
    with pytest.raises(PermissionError, match="uid 12345"):
        private_directory(theirs)
    assert open_directory(theirs, "fp", 1 << 30) is None  # disk tier off, logged
    link = tmp_path / "link"
    link.symlink_to(d)
    with pytest.raises(PermissionError, match="not a directory"):
        private_directory(link)


def test_a_planted_link_at_the_temporary_name_is_never_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    d = tmp_path / "entries"
    d.mkdir(mode=0o700)
    (d / f".5.{os.getpid()}.tmp").symlink_to(victim)
    writer.write_file(d, capture(_entry("bfloat16"), _record(5, 30), "fp"))
    assert victim.read_bytes() == b"precious"
    assert stat.S_ISREG(os.lstat(d / "5.entry").st_mode)


def test_the_scan_skips_links_and_other_non_regular_files(tmp_path):
    writer.write_file(tmp_path, capture(_entry("bfloat16"), _record(1, 30), "fp"))
    (tmp_path / "2.entry").symlink_to(tmp_path / "1.entry")
    os.mkfifo(tmp_path / "3.entry")
    os.chmod(tmp_path / "1.entry", 0o644)
    found = scan_directory(tmp_path).files
    assert [f.entry_id for f in found] == [1]  # the fifo was not opened: no hang
    assert found[0].header is not None and mode(tmp_path / "1.entry") == 0o600


def test_a_load_checks_the_plans_namespace_and_tokens(tmp_path):
    record = _record(4, 30)  # namespace "ns", tokens 4000..4029
    writer.write_file(tmp_path, capture(_entry("bfloat16"), record, "fp"))
    path = tmp_path / "4.entry"
    load_entry(path, "fp", 4, "ns", np.asarray(record.tokens[:20]))  # the plan's prefix
    with pytest.raises(file_format.DamagedFile, match="namespace"):
        load_entry(path, "fp", 4, "other", np.asarray(record.tokens[:20]))
    wrong = np.asarray(record.tokens[:20]).copy()
    wrong[7] += 1
    with pytest.raises(file_format.DamagedFile, match="planned tokens"):
        load_entry(path, "fp", 4, "ns", wrong)
    with pytest.raises(file_format.DamagedFile, match="planned tokens"):
        load_entry(path, "fp", 4, "ns", np.arange(40, dtype=np.int32))


def test_entry_metadata_names_mlx_lm_cache_classes_only():
    assert "mlx_lm.models.cache:KVCache" in CACHE_CLASSES
    assert _class("mlx_lm.models.cache:RotatingKVCache").__name__ == "RotatingKVCache"
    for path in ("mlx_lm.utils:load", "mlx_lm.models.cache:make_prompt_cache", "os:system"):
        with pytest.raises(file_format.DamagedFile, match="refusing"):
            _class(path)


def test_a_file_naming_another_class_is_damaged_not_imported(tmp_path):
    job = capture(_entry("bfloat16"), _record(6, 30), "fp")
    job.meta["layers"] = list(job.meta["layers"]) + [{"c": "mlx_lm.utils:load"}]
    writer.write_file(tmp_path, job)
    with pytest.raises(file_format.DamagedFile, match="refusing"):
        load_entry(tmp_path / "6.entry", "fp", 6)


def test_every_parent_of_the_cache_directory_is_checked(tmp_path):
    """A parent others may write lets them swap the entries directory for their own."""
    loose = tmp_path / "loose"
    loose.mkdir()
    os.chmod(loose, 0o777)
    with pytest.raises(PermissionError, match="loose"):
        private_directory(loose / "cache" / "entries")
    assert open_directory(loose / "cache" / "entries", "fp", 1 << 30) is None  # disk tier off
    sticky = tmp_path / "sticky"  # like /tmp: others may not rename what is ours
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    private_directory(sticky / "entries")
    if os.getuid() != 0:
        pytest.skip("changing a directory's owner needs root")
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, 12345, 12345)
    with pytest.raises(PermissionError, match="uid 12345"):
        private_directory(theirs / "entries")


def test_a_load_refuses_a_file_another_user_owns(tmp_path):
    if os.getuid() != 0:
        pytest.skip("changing a file's owner needs root")
    record = _record(8, 30)
    writer.write_file(tmp_path, capture(_entry("bfloat16"), record, "fp"))
    os.chown(tmp_path / "8.entry", 12345, 12345)  # replaced after the scan, say
    with pytest.raises(file_format.DamagedFile, match="uid 12345"):
        load_entry(tmp_path / "8.entry", "fp", 8)


def test_loads_read_the_directory_opened_at_start_not_a_swapped_path(tmp_path):
    """Entry files are opened relative to the directory's descriptor, held from the start."""
    d = tmp_path / "entries"
    store = DiskStore(d, "fp")
    store.write(_entry("bfloat16", 30), _record(9, 30))
    assert store.flush(30)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    writer.write_file(elsewhere, capture(_entry("bfloat16", 20), _record(9, 20), "fp"))
    d.rename(tmp_path / "moved")
    d.symlink_to(elsewhere)
    loaded = store.load(9)
    assert loaded is not None and loaded.length == 30
