"""What the Hugging Face cache holds: each model revision, its size, what it is; removal.

Read through huggingface_hub's cache scan (the same folders `resolve` fills).
A revision's architecture and whether it is a hybrid come from its config.json;
whether it is served is the caller's (the names the running server reports).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from engine.hub import files
from engine.hub.refs import HubSettings, ModelRef, parse_ref

# model_types whose layers mix recurrent state (Gated DeltaNet, KDA, Mamba) with attention,
# or are recurrent alone: the lineage cache keeps their state snapshots.
HYBRID = (
    "qwen3_next",
    "qwen3_5",
    "qwen3_5_moe",
    "kimi_linear",
    "olmo_hybrid",
    "nemotron_h",
    "falcon_h1",
    "granitemoehybrid",
    "jamba",
    "lfm2",
    "lfm2_moe",
    "mamba",
    "mamba2",
)


@dataclass(frozen=True)
class CachedModel:
    """One revision of one repository in the cache."""

    repo: str
    revision: str  # the commit
    refs: tuple[str, ...]  # the branch or tag names that point at it
    size: int  # bytes on disk
    model_type: str
    complete: bool  # every file an MLX model needs is there
    path: Path

    @property
    def hybrid(self) -> bool:
        return self.model_type in HYBRID


def cached_models(settings: HubSettings) -> list[CachedModel]:
    """Every model revision the cache holds, by repository then commit."""
    from huggingface_hub import scan_cache_dir

    if not settings.cache_dir.is_dir():
        return []
    out = []
    for repo in scan_cache_dir(settings.cache_dir).repos:
        if repo.repo_type != "model":
            continue
        for rev in repo.revisions:
            config = Path(rev.snapshot_path) / "config.json"
            try:
                model_type = str(json.loads(config.read_text()).get("model_type", ""))
            except (OSError, ValueError):
                model_type = ""
            out.append(
                CachedModel(
                    repo=repo.repo_id,
                    revision=rev.commit_hash,
                    refs=tuple(sorted(rev.refs)),
                    size=rev.size_on_disk,
                    model_type=model_type,
                    complete=files.complete(Path(rev.snapshot_path)),
                    path=Path(rev.snapshot_path),
                )
            )
    return sorted(out, key=lambda m: (m.repo, m.revision))


def remove(text: str, settings: HubSettings) -> tuple[list[CachedModel], int]:
    """Delete `org/name` (every revision) or `org/name@rev` (the revision a ref or commit
    names) from the cache: (what was deleted, bytes freed). ValueError when the cache
    holds none of it."""
    from huggingface_hub import scan_cache_dir

    ref = parse_ref(text)
    if ref is None:
        raise ValueError(f"{text!r} is no repository id (org/name[@revision])")
    chosen = [m for m in cached_models(settings) if m.repo == ref.repo and _matches(m, ref, text)]
    if not chosen:
        raise ValueError(f"{text} is not in the Hugging Face cache ({settings.cache_dir})")
    strategy = scan_cache_dir(settings.cache_dir).delete_revisions(*(m.revision for m in chosen))
    strategy.execute()
    return chosen, strategy.expected_freed_size


def _matches(model: CachedModel, ref: ModelRef, text: str) -> bool:
    if "@" not in text:
        return True  # the repository: every revision
    return ref.revision in model.refs or model.revision.startswith(ref.revision)
