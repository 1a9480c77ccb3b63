"""A small filesystem of the soak's own for the cache directory, filled for real.

The disk-full fault fills the filesystem the cache directory lives on, so every
write of the server there (entry files, stored Responses) meets ENOSPC as on
a full disk, then frees it. The machine's own disk is never filled: the cache
directory is a tmpfs of `size` bytes mounted for the soak (Linux, as root),
and the fault writes a ballast file into it up to its last free byte and
deletes it after the window. The engine deletes files all the while (evictions
that keep its disk budget, files a newer one superseded), and the writes after
them would fit in the room they free: the fault fills again as it waits. Where
no such filesystem can be mounted, `why` says so and the fault is reported not
run.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

BALLAST = ".soak-ballast"  # not an entry file's name: the engine's scan leaves it alone


class SmallDisk:
    def __init__(self, path: Path, size: int):
        self.path, self.size = Path(path), size
        self.mounted = False
        self.why = ""  # why no filesystem of its own ("" once mounted)
        self._device: int | None = None  # the tmpfs's st_dev while mounted

    def mount(self) -> bool:
        self.path.mkdir(parents=True, exist_ok=True)
        if sys.platform != "linux" or os.geteuid() != 0:
            self.why = "the disk-full fault needs a tmpfs of its own (Linux, as root)"
            return False
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={self.size},mode=0700", "tmpfs", str(self.path)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            self.why = f"mount of a tmpfs failed: {done.stderr.strip()}"
            return False
        self.mounted, self._device = True, os.stat(self.path).st_dev
        return True

    def unmount(self) -> None:
        if self.mounted:
            self.mounted, self._device = False, None  # before: a fill under way stops
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True)

    def free(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def fill(self) -> int:
        """Grow the ballast up to the filesystem's last free byte; the bytes added. Called
        again, it takes back what was freed meanwhile (the engine's own deletes). Nothing
        once unmounted: the directory is then the machine's own disk (a fault still under
        way as the soak ends)."""
        written = 0
        chunk = b"\0" * (1 << 20)
        device = self._device
        if device is None:
            return 0
        with open(self.path / BALLAST, "ab", buffering=0) as f:
            if os.fstat(f.fileno()).st_dev != device:  # unmounted meanwhile
                os.unlink(self.path / BALLAST)
                return 0
            while True:
                try:
                    st = os.fstatvfs(f.fileno())  # the ballast's own filesystem
                    room = st.f_bavail * st.f_frsize
                    written += f.write(chunk[: max(4096, min(len(chunk), room))])
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    break
        return written

    def empty(self) -> None:
        (self.path / BALLAST).unlink(missing_ok=True)
