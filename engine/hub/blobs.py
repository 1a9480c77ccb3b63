"""One large file of a repository into the cache, resumable across runs.

huggingface_hub (2.4) downloads each file to a temporary name of its process and
deletes it when the download fails, so a cut download starts again from zero
on the next run. A model's weights are the gigabytes worth keeping: they come
here instead, into the cache's own layout, `blobs/<sha256>` (an LFS file's blob
is named by its sha256) with the snapshot's entry a relative link to it. Bytes
arrive in `blobs/<sha256>.incomplete`; the next run asks for the rest with a
Range request; the blob is renamed into place only whole, with its size and
sha256 checked, so a partial file never appears in a snapshot.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from urllib.parse import quote

RETRIES = 3  # attempts within one run, while each one brings bytes
TIMEOUT_S = 30.0


class Corrupt(OSError):
    """A whole download whose bytes are not the ones the repository lists."""


def fetch_blob(
    folder: Path,
    url: str,
    commit: str,
    name: str,
    sha256: str,
    size: int,
    token: str | None,
) -> Path:
    """The snapshot entry of `name` at `commit` in the repository's cache `folder`, its blob
    fetched from `url` (the Hub's `{endpoint}/{repo}`) unless already there."""
    blob = folder / "blobs" / sha256
    if not blob.is_file():
        blob.parent.mkdir(parents=True, exist_ok=True)
        partial = blob.with_name(sha256 + ".incomplete")
        source = f"{url}/resolve/{commit}/{quote(name)}"
        for attempt in range(RETRIES):
            before = partial.stat().st_size if partial.exists() else 0
            try:
                _get(source, partial, size, token)
                break
            except OSError as error:
                brought = (partial.stat().st_size if partial.exists() else 0) > before
                if isinstance(error, Corrupt) or not brought or attempt == RETRIES - 1:
                    raise
                time.sleep(1.0)
        _check(partial, sha256, size)
        os.replace(partial, blob)
    entry = folder / "snapshots" / commit / name
    entry.parent.mkdir(parents=True, exist_ok=True)
    if not entry.exists():
        entry.symlink_to(os.path.relpath(blob, entry.parent))
    return entry


def _get(source: str, partial: Path, size: int, token: str | None) -> None:
    """The bytes of `source` that `partial` lacks, appended (the whole file when the
    server ignores the Range). huggingface_hub's errors for an error status; an OSError
    (httpx's transport errors are not) when the connection breaks."""
    import httpx2
    from huggingface_hub.utils import build_hf_headers, hf_raise_for_status

    have = partial.stat().st_size if partial.exists() else 0
    if have > size:
        partial.unlink()
        have = 0
    if have == size:
        return
    headers = build_hf_headers(token=token)
    headers["Accept-Encoding"] = "identity"
    if have:
        headers["Range"] = f"bytes={have}-"
    try:
        # Redirects followed: httpx drops the Authorization header on another host's.
        with httpx2.stream(
            "GET", source, headers=headers, follow_redirects=True, timeout=TIMEOUT_S
        ) as reply:
            if reply.status_code >= 400:
                reply.read()
                hf_raise_for_status(reply)
            with partial.open("ab" if reply.status_code == 206 else "wb") as out:
                for chunk in reply.iter_bytes():
                    out.write(chunk)
    except httpx2.TransportError as error:
        raise ConnectionError(f"{type(error).__name__}: {error}") from error


def _check(partial: Path, sha256: str, size: int) -> None:
    """Corrupt (and the partial file gone) unless it has `size` bytes hashing to `sha256`."""
    digest = hashlib.sha256()
    with partial.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    got = partial.stat().st_size
    if got != size or digest.hexdigest() != sha256:
        partial.unlink()
        raise Corrupt(f"{partial.name}: {got} bytes, sha256 {digest.hexdigest()[:12]}")
