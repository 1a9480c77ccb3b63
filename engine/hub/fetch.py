"""Resolving a reference to a directory: the cache first, else the Hub, checked, then fetched.

`resolve(text, settings)`:

1. A local path is returned as given (the caller checks it as it always did).
2. A repository whose snapshot for the revision is complete in the cache is
   returned as is: no network (a new upstream revision arrives by `lineage pull`).
3. Offline (`HF_HUB_OFFLINE`), anything else is a HubError.
4. The Hub lists the revision's files and sizes (one call). Refused before a byte
   is fetched: a repository that is missing or needs a token, PyTorch-only
   weights (say the `mlx_lm.convert` command), a download larger than the free
   room of the cache's disk.
5. config.json comes first; an architecture mlx-lm does not have is refused.
6. The other files, the largest last, each whole before it appears in the
   snapshot, with `progress` watching the bytes: the small ones through
   huggingface_hub, the LFS ones (the weights) through `blobs`, which keeps a
   cut download's bytes and resumes them with a Range request on the next run.

It knows huggingface_hub's calls, errors and cache layout; nothing of MLX or Ray.
"""

from __future__ import annotations

import json
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

from engine.hub import files
from engine.hub.blobs import Corrupt, fetch_blob
from engine.hub.progress import DownloadProgress
from engine.hub.refs import HubSettings, ModelRef, parse_ref

EXIT_SETUP, EXIT_FAILED = 2, 1  # what to fix before running again; a download that broke
SLACK = 1.05  # free room needed beyond the listed bytes (the filesystem's own blocks)


class HubError(ValueError):
    """A model that cannot be served from the Hub, in one line; `status`: the exit code."""

    def __init__(self, message: str, status: int = EXIT_SETUP):
        super().__init__(message)
        self.status = status


def free_bytes(path: Path) -> int:
    """The free room on the disk that holds `path` (its nearest existing parent)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def repo_folder(settings: HubSettings, ref: ModelRef) -> Path:
    """The cache's folder of `ref`'s repository (huggingface_hub's layout)."""
    return settings.cache_dir / ("models--" + ref.repo.replace("/", "--"))


def cached_snapshot(settings: HubSettings, ref: ModelRef) -> Path | None:
    """The snapshot directory of `ref`'s revision when the cache holds it whole, else None."""
    folder = repo_folder(settings, ref)
    commit = ref.revision
    ref_file = folder / "refs" / ref.revision
    if ref_file.is_file():
        commit = ref_file.read_text().strip()
    snapshot = folder / "snapshots" / commit
    return snapshot if snapshot.is_dir() and files.complete(snapshot) else None


def resolve(
    text: str,
    settings: HubSettings,
    *,
    label: str = "--model",
    refresh: bool = False,
    progress: Callable[[], DownloadProgress] | None = None,
    room: Callable[[Path], int] | None = None,
) -> Path:
    """The directory `text` names: a local path as given, or the cached snapshot of a
    repository, downloaded first when the cache does not hold it whole (`refresh`: ask
    the Hub even then, as `lineage pull` does; `room`: the free-space reading, default
    `free_bytes`). HubError, one line, for each failure."""
    ref = parse_ref(text)
    if ref is None:
        return Path(text).expanduser()
    if not refresh or settings.offline:
        found = cached_snapshot(settings, ref)
        if found is not None:
            return found
    if settings.offline:
        raise HubError(
            f"{_at(label)}{ref} is not in the Hugging Face cache ({settings.cache_dir}) and "
            "HF_HUB_OFFLINE is set: unset it, or `lineage pull` it where the Hub is reachable"
        )
    return _download(ref, settings, label, progress, room)


def _download(ref, settings, label, progress, room) -> Path:
    """Steps 4 to 6 of the module docstring."""
    from huggingface_hub import HfApi, hf_hub_download
    from huggingface_hub.utils import disable_progress_bars, logging

    disable_progress_bars()  # ours watches the bytes (engine.hub.progress)
    logging.set_verbosity_error()  # its retries' warnings: a failure is our one line
    with _hub_errors(ref, settings, label):
        info = HfApi(endpoint=settings.endpoint, token=settings.token).model_info(
            ref.repo, revision=ref.revision, files_metadata=True
        )
    siblings = {s.rfilename: _size(s) for s in info.siblings or ()}
    lfs = {s.rfilename: s.lfs.sha256 for s in info.siblings or () if s.lfs and s.lfs.sha256}
    if files.pytorch_only(siblings):
        raise HubError(
            f"{_at(label)}{ref} holds PyTorch weights only: convert it first, "
            f"`mlx_lm.convert --hf-path {ref.repo} --mlx-path DIR`, and serve DIR"
        )
    wanted = files.needed(siblings)
    if "config.json" not in wanted or not any(n.endswith(".safetensors") for n in wanted):
        raise HubError(f"{_at(label)}{ref} is no MLX model (no config.json or *.safetensors)")
    snapshot = repo_folder(settings, ref) / "snapshots" / str(info.sha)
    missing = [n for n in wanted if not (snapshot / n).is_file()]
    total = sum(siblings[n] for n in missing)
    free = (room or free_bytes)(settings.cache_dir)
    if total * SLACK > free:
        from engine.config.units import format_bytes

        raise HubError(
            f"{_at(label)}{ref} needs {format_bytes(total)} and {settings.cache_dir} has "
            f"{format_bytes(free)} free: make room, or set HF_HUB_CACHE to a larger disk"
        )

    def fetch(name: str) -> Path:
        with _hub_errors(ref, settings, label):
            if name in lfs:
                url = f"{settings.endpoint}/{ref.repo}"
                folder = repo_folder(settings, ref)
                return fetch_blob(
                    folder, url, str(info.sha), name, lfs[name], siblings[name], settings.token
                )
            return Path(
                hf_hub_download(
                    ref.repo,
                    name,
                    revision=str(info.sha),
                    cache_dir=settings.cache_dir,
                    endpoint=settings.endpoint,
                    token=settings.token,
                )
            )

    # 5) config.json first: the architecture, before the weights
    config = json.loads(fetch("config.json").read_text())
    model_type = str(config.get("model_type", ""))
    if not files.architecture_known(model_type):
        raise HubError(
            f"{_at(label)}{ref} is a {model_type or 'model without a model_type'}, an "
            "architecture mlx-lm does not have (upgrade mlx-lm, or pick another model)"
        )
    # 6) the rest, the largest last, watched
    watcher = (progress or DownloadProgress)()
    coming = total - (siblings["config.json"] if "config.json" in missing else 0)
    watcher.start(str(ref), repo_folder(settings, ref) / "blobs", coming)
    try:
        for name in sorted(missing, key=lambda n: siblings[n]):
            if name != "config.json":
                fetch(name)
    finally:
        watcher.stop()
    _write_ref(settings, ref, str(info.sha))
    if not files.complete(snapshot):
        raise HubError(f"{_at(label)}{ref} downloaded, but its snapshot is not a whole model")
    return snapshot


def _write_ref(settings: HubSettings, ref: ModelRef, commit: str) -> None:
    """refs/<revision> -> the commit, as huggingface_hub writes it (a later offline start
    finds the snapshot by the name it was asked by)."""
    if ref.revision == commit:
        return
    path = repo_folder(settings, ref) / "refs" / ref.revision
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.is_file() or path.read_text().strip() != commit:
        path.write_text(commit)


def _at(label: str) -> str:
    """The flag a line names first (`--model: `), or nothing (`lineage pull`)."""
    return f"{label}: " if label else ""


def _size(sibling) -> int:
    lfs = getattr(sibling, "lfs", None)
    return int((lfs.size if lfs else None) or sibling.size or 0)


@contextmanager
def _hub_errors(ref: ModelRef, settings: HubSettings, label: str):
    """huggingface_hub's and the network's errors in the block -> one HubError line."""
    try:
        yield
    except HubError:
        raise
    except Exception as error:  # translated, never hidden: the line names its type
        raise HubError(_line(error, ref, settings, label), _status(error)) from error


def _status(error: Exception) -> int:
    import httpx2

    broke = (httpx2.TransportError, ConnectionError, Corrupt)
    return EXIT_FAILED if isinstance(error, broke) else EXIT_SETUP


def _line(error: Exception, ref: ModelRef, settings: HubSettings, label: str) -> str:
    """What went wrong and what to do, in one line."""
    import httpx2
    from huggingface_hub import errors

    at, where, has_token = _at(label), settings.endpoint, bool(settings.token)
    if isinstance(error, errors.GatedRepoError):
        then = "HF_TOKEN's account has no access yet" if has_token else "set HF_TOKEN"
        then += "" if has_token else " to a token of that account"
        return f"{at}{ref} is gated on {where}: accept its terms there, then {then}"
    code = getattr(getattr(error, "response", None), "status_code", 0)
    if isinstance(error, errors.HfHubHTTPError) and code in (401, 403):
        # the Hub's answer without a token to a missing repository too (huggingface_hub
        # calls it RepositoryNotFoundError on an https endpoint, a bare HTTP error elsewhere)
        then = "HF_TOKEN cannot read it" if has_token else "set HF_TOKEN to a token that can"
        return f"{at}{ref} on {where} does not exist, or is private or gated: {then}"
    if isinstance(error, errors.RepositoryNotFoundError):
        return f"{at}{ref}: no such repository on {where} (check the name)"
    if isinstance(error, errors.RevisionNotFoundError):
        return f"{at}{ref}: no revision {ref.revision!r} in {ref.repo} on {where}"
    if isinstance(error, errors.RemoteEntryNotFoundError):
        return f"{at}{ref}: a file it lists is missing on {where}"
    if isinstance(error, Corrupt):
        return (
            f"{at}a file of {ref} from {where} arrived corrupt ({error}): it was deleted, "
            "run again to fetch it anew"
        )
    if isinstance(error, (httpx2.TransportError, ConnectionError)):
        why = str(error).split(":")[0] or type(error).__name__
        return (
            f"{at}the download of {ref} from {where} was interrupted ({why}): "
            "run again to resume it"
        )
    first = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{at}{ref} from {where}: {type(error).__name__}: {first}"
