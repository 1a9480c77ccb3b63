"""The cache directory: its lock, a header-only scan of its files, and deletion.

It reads headers (engine.storage.file_format) and file metadata; it never
reads a body and never decides which files go: the cache policy's disk index
does, from the files `open_directory` hands it. The entries directory is
private: created 0700, refused when another user owns it or when a directory
above it is open to others, its mode tightened when looser; the scan reads
regular files only (never a link), opened relative to the directory
(file_format.open_entry), and tightens a loose file to 0600.
"""

from __future__ import annotations

import fcntl
import logging
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.cache.disk_index import DiskIndex, FoundFile, index_files
from engine.config import CacheConfig, format_bytes
from engine.storage.file_format import (
    DAMAGED_SUFFIX,
    SUFFIX,
    TEMP_NAME,
    DamagedFile,
    Header,
    entries_dir,
    entry_file,
    file_id,
    read_header,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ScannedFile:
    """One file of the directory: its header, or why it is damaged."""

    entry_id: int
    path: Path
    nbytes: int
    mtime: float
    header: Header | None
    problem: str | None = None


@dataclass(frozen=True)
class Scan:
    files: tuple[ScannedFile, ...]
    removed_temps: tuple[Path, ...]
    max_id: int  # the largest id of any file, temporary ones included (0: none)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def check_parents(path: Path) -> None:
    """PermissionError naming the first existing directory above `path` that another user
    could change: one owned by neither this user nor root, or one others may write
    without the sticky bit (which keeps them from renaming what is ours, as in /tmp).

    Such a user could swap the cache directory for one of theirs. The path is
    checked as given and as resolved: a link's own directory and its target's.
    """
    path = Path(path).absolute()
    uid = os.getuid()
    for chain in (path.parents, path.resolve().parents):
        for parent in chain:
            try:
                st = os.stat(parent)
            except FileNotFoundError:
                continue
            if st.st_uid not in (0, uid):
                raise PermissionError(
                    f"{parent} belongs to uid {st.st_uid}, not to uid {uid} or root: its "
                    "owner could replace the cache directory below it"
                )
            if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
                raise PermissionError(
                    f"{parent} has mode {stat.S_IMODE(st.st_mode):o}: other users may write "
                    "it, and so replace the cache directory below it"
                )


def private_directory(path: Path) -> Path:
    """Create `path` (mode 0700); PermissionError when it is a link or another user's, or
    when a directory above it is open to others (`check_parents`).

    A mode looser than 0700 is tightened, with a warning: entry files hold
    every tenant's prompts. Missing directories above it are made 0700 too.
    """
    path = Path(path)
    check_parents(path)
    for missing in reversed([p for p in (path, *path.parents) if not p.exists()]):
        try:
            os.mkdir(missing, 0o700)
        except FileExistsError:
            pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise PermissionError(f"{path} is not a directory (a symbolic link?)")
    if st.st_uid != os.getuid():
        raise PermissionError(f"{path} belongs to uid {st.st_uid}, not to uid {os.getuid()}")
    if st.st_mode & 0o077:
        log.warning("disk tier: %s had mode %o; tightened to 700", path, st.st_mode & 0o777)
        os.chmod(path, 0o700)
    return path


def _file_problem(path: Path, st: os.stat_result) -> str | None:
    """Why a file of the directory is not ours to read, if it is not; tightens a loose mode."""
    if st.st_uid != os.getuid():
        return f"owned by uid {st.st_uid}"
    if st.st_mode & 0o077:
        try:
            os.chmod(path, 0o600, follow_symlinks=False)
        except OSError as e:
            return f"mode {st.st_mode & 0o777:o} cannot be tightened: {e}"
    return None


def scan_directory(directory: Path, remove_temps: bool = True) -> Scan:
    """Read every entry file's header; remove temporary files whose writer is gone.

    A temporary file of a live process (another server's writer, mid-write) is
    kept. Damaged files come back with `problem` set, never with a header.
    """
    directory = Path(directory)
    files, removed, max_id = [], [], 0
    if not directory.is_dir():
        return Scan((), (), 0)
    for path in sorted(directory.iterdir()):
        temp = TEMP_NAME.match(path.name)
        if temp:
            max_id = max(max_id, int(temp.group(1)))
            pid = int(temp.group(2))
            if remove_temps and (pid == os.getpid() or not _alive(pid)):
                path.unlink(missing_ok=True)
                removed.append(path)
            continue
        entry_id = file_id(path)
        if entry_id is None:
            continue
        max_id = max(max_id, entry_id)
        try:
            st = path.lstat()
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(st.st_mode):  # a link, a fifo, a directory: never read
            log.warning("disk tier: skipping %s: not a regular file", path)
            continue
        header, problem = None, _file_problem(path, st)
        if problem is None and path.suffix == DAMAGED_SUFFIX:
            problem = "quarantined after a failed load"
        elif problem is None:
            try:
                header = read_header(path)
            except DamagedFile as e:
                problem = str(e)
            except OSError as e:
                problem = f"unreadable: {e}"
        files.append(ScannedFile(entry_id, path, st.st_size, st.st_mtime, header, problem))
    return Scan(tuple(files), tuple(removed), max_id)


def file_sizes(directory: Path) -> dict[int, int]:
    """Entry id -> bytes of its file in `directory` (a quarantined copy added in; temporary
    files left out)."""
    out: dict[int, int] = {}
    try:
        with os.scandir(directory) as it:
            for d in it:
                entry_id = file_id(d.name)  # no Path: see file_id
                if entry_id is None:
                    continue
                try:
                    out[entry_id] = out.get(entry_id, 0) + d.stat(follow_symlinks=False).st_size
                except FileNotFoundError:  # deleted meanwhile
                    pass
    except FileNotFoundError:
        pass
    return out


def files_bytes(directory: Path) -> int:
    """The bytes of the entry files in `directory`, quarantined ones too (temporary files
    left out): what the disk index counts against the budget once the writers are idle."""
    return sum(file_sizes(directory).values())


def remove_file(path: str) -> int:
    """Unlink `path`; the bytes freed (0 when it was not there)."""
    try:
        nbytes = os.stat(path).st_size
        os.unlink(path)
    except FileNotFoundError:
        return 0
    return nbytes


def delete_files(directory: Path, entry_id: int) -> int:
    """Remove an entry's file (and a quarantined copy); the bytes freed. The paths are
    strings (the writer deletes a file per superseded entry): see file_format.entry_name."""
    paths = (os.path.join(directory, f"{entry_id}{s}") for s in (SUFFIX, DAMAGED_SUFFIX))
    return sum(remove_file(path) for path in paths)


LOCK_NAME = "LOCK"


def lock_directory(directory: Path, wait: float = 3.0):
    """The directory's lock file, held (None if another process still holds it after `wait` s)."""
    fd = os.open(Path(directory) / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    handle = os.fdopen(fd, "a+")  # held while the index lives
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            handle.seek(0)
            handle.truncate()
            handle.write(f"{os.getpid()}\n")
            handle.flush()
            return handle
        except BlockingIOError:
            if time.monotonic() >= deadline:
                handle.close()
                return None
            time.sleep(0.1)


def found_files(scan: Scan) -> list[FoundFile]:
    """The scan as the cache policy's disk index takes it."""
    return [
        FoundFile(
            f.entry_id,
            f.nbytes,
            f.mtime,
            f.header.fingerprint if f.header else "",
            f.header.record if f.header else None,
            f.problem,
        )
        for f in scan.files
    ]


def index_scan(scan: Scan, fingerprint: str, budget: int, caps: tuple[int, int]) -> DiskIndex:
    """A DiskIndex of a scan: this model's files matchable, the others counted."""
    return index_files(found_files(scan), fingerprint, budget, *caps, max_id=scan.max_id)


@dataclass
class OpenDirectory:
    """A locked cache directory and the disk index built from its files."""

    path: Path
    index: DiskIndex
    lock: Any  # the open lock file; closing it releases the directory

    def rescan(self, fingerprint: str, budget: int, caps: tuple[int, int]) -> DiskIndex:
        """A fresh index of what is on disk now (the lock stays held)."""
        self.index = index_scan(scan_directory(self.path), fingerprint, budget, caps)
        return self.index

    def nbytes(self) -> int:
        """The bytes of the files in the directory now (`files_bytes`)."""
        return files_bytes(self.path)

    def sizes(self) -> dict[int, int]:
        """Entry id -> bytes of its file now (`file_sizes`)."""
        return file_sizes(self.path)

    def free(self) -> int:
        """The bytes free to this user on the directory's filesystem (0 when unreadable)."""
        try:
            st = os.statvfs(self.path)
        except OSError:
            return 0
        return st.f_bavail * st.f_frsize

    def entry_ids(self) -> set[int]:
        """The ids of the entry files in the directory now (quarantined copies left out);
        temporary files of writers that are gone are removed on the way."""
        scan = scan_directory(self.path)
        return {f.entry_id for f in scan.files if f.path.suffix == SUFFIX}

    def delete(self, entry_ids) -> int:
        """Remove these entry files (a quarantined copy stays); the bytes freed."""
        return sum(remove_file(entry_file(self.path, i)) for i in entry_ids)

    def close(self) -> None:
        if self.lock is not None:
            self.lock.close()
            self.lock = None


def open_directory(
    directory: Path, fingerprint: str, budget: int, caps: tuple[int, int] = (16, 16 << 30)
) -> OpenDirectory | None:
    """Lock the directory, scan its headers and index them; None when another server holds it.

    `caps` are the anchor caps (entries, bytes). Temporary files left by a
    crashed writer are removed; damaged files are reported in the log and
    counted, never matched. The lock is held until `close()`, so two servers
    never share one set of entry ids.
    """
    directory = Path(directory)
    try:
        private_directory(directory)
    except PermissionError as e:
        log.error("disk tier off: %s", e)
        return None
    lock = lock_directory(directory)
    if lock is None:
        log.warning("disk tier off: another server holds %s", directory / LOCK_NAME)
        return None
    t0 = time.perf_counter()
    found = scan_directory(directory)
    index = index_scan(found, fingerprint, budget, caps)
    for f in found.files:
        if f.problem is not None:
            log.warning("disk tier: skipping damaged file %s: %s", f.path, f.problem)
    for path in found.removed_temps:
        log.info("disk tier: removed %s, left by an interrupted write", path)
    foreign = sum(f.reason == "foreign" for f in index.files.values())
    log.info(
        "disk tier: %d entries of this model, %d of other models, %d damaged, %s "
        "in %s (scanned in %.2f s)",
        index.entries,
        foreign,
        index.damaged,
        format_bytes(index.nbytes),
        directory,
        time.perf_counter() - t0,
    )
    return OpenDirectory(directory, index, lock)


def open_cache_directory(config: CacheConfig, fingerprint: str) -> OpenDirectory | None:
    """The configured mode's entry directory, opened; None when the disk tier is off.

    Off when the cache is off, the disk budget is zero, there is no model
    fingerprint, or another server holds the directory.
    """
    if config.mode == "off" or config.disk_budget <= 0 or not fingerprint:
        return None
    return open_directory(
        entries_dir(config.resolved_cache_dir, config.mode),
        fingerprint,
        config.disk_budget,
        (config.anchor_max_entries, config.anchor_max_bytes),
    )
