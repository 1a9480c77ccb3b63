"""A model reference: a local directory, or a Hugging Face repository id and revision.

`org/name` or `org/name@rev` (a branch, a tag or a commit) names a repository
when no local path of that name exists; anything else is a local directory, as
`--model` always took. `HubSettings` is what the environment says about the
Hub: its address, the cache, the token and whether to stay offline.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")
DEFAULT_ENDPOINT = "https://huggingface.co"
DEFAULT_REVISION = "main"
TRUE = ("1", "true", "yes", "on")


@dataclass(frozen=True)
class ModelRef:
    """A repository on the Hub and the revision asked for."""

    repo: str
    revision: str = DEFAULT_REVISION

    def __str__(self) -> str:
        return self.repo if self.revision == DEFAULT_REVISION else f"{self.repo}@{self.revision}"


def parse_ref(text: str | None) -> ModelRef | None:
    """The repository `text` names, or None when it is a local path (one that exists, or
    one that does not look like `org/name[@rev]`: `./x`, `/x`, `~/x`, `a/b/c`)."""
    if not text:
        return None
    text = str(text).strip()
    if text.startswith((".", "/", "~")) or Path(text).expanduser().exists():
        return None
    repo, _, revision = text.partition("@")
    if not REPO.match(repo) or (revision and not REVISION.match(revision)):
        return None
    return ModelRef(repo, revision or DEFAULT_REVISION)


@dataclass(frozen=True)
class HubSettings:
    """Where the Hub is, where its cache lies, the token and offline mode, from the
    environment as huggingface_hub reads it."""

    endpoint: str = DEFAULT_ENDPOINT
    cache_dir: Path = Path("~/.cache/huggingface/hub").expanduser()
    token: str | None = None
    offline: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "HubSettings":
        env = os.environ if env is None else env
        home = Path(
            env.get("HF_HOME") or Path(env.get("XDG_CACHE_HOME") or "~/.cache") / "huggingface"
        )
        cache = Path(env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE") or home / "hub")
        return cls(
            endpoint=(env.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/"),
            cache_dir=cache.expanduser(),
            token=env.get("HF_TOKEN") or env.get("HUGGING_FACE_HUB_TOKEN") or None,
            offline=str(env.get("HF_HUB_OFFLINE", "")).strip().lower() in TRUE,
        )
