"""The model names the bridge answers to: served names, and alias patterns.

Agent clients ask for the model they were built for (`claude-sonnet-4-5`,
`gpt-5-codex`); the bridge serves one model. A requested name reaches it when it
is a served name (`--served-model-name`, repeatable; by default `lineage` and the
model directory's name) or matches an alias pattern (`--model-alias`, repeatable,
fnmatch, case-sensitive: `claude-*`). A request that names no model gets the
first served name. Any other name is `ModelNotFound`, which each wire format
answers 404, naming the served models. Replies carry the name the client asked
for. It knows names and `/v1/models`' listing; nothing of HTTP or the engine.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

DEFAULT_NAME = "lineage"


class ModelNotFound(LookupError):
    """A requested model name that is neither served nor matched by an alias."""

    def __init__(self, requested: str, served: tuple[str, ...], aliases: tuple[str, ...]):
        known = f"served models: {', '.join(served)}"
        if aliases:
            known += f"; aliases: {', '.join(aliases)}"
        super().__init__(f"model {requested!r} is not served here ({known})")
        self.requested = requested


@dataclass(frozen=True)
class ServedModels:
    """The served names (empty: the defaults) and the alias patterns."""

    names: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()

    def served(self, model_id: str) -> tuple[str, ...]:
        """The served names, given the model's own id (its directory's name)."""
        return self.names or tuple(dict.fromkeys((DEFAULT_NAME, model_id)))

    def resolve(self, requested: str | None, model_id: str) -> str:
        """The name a reply carries: `requested` when it is served or aliased, the first
        served name when none is given; ModelNotFound otherwise."""
        names = self.served(model_id)
        if not requested:
            return names[0]
        if requested in names or any(fnmatch.fnmatchcase(requested, p) for p in self.aliases):
            return requested
        raise ModelNotFound(requested, names, self.aliases)

    def listing(self, info: dict) -> dict:
        """`GET /v1/models`: each served name, then each alias pattern, as a model object
        that both OpenAI's and Anthropic's SDKs read."""
        entries = [(name, False) for name in self.served(info["id"])]
        entries += [(pattern, True) for pattern in self.aliases]
        data = [
            {
                "id": name,
                "object": "model",
                "type": "model",
                "created": 0,
                "created_at": "1970-01-01T00:00:00Z",
                "display_name": name,
                "owned_by": "lineage",
                "max_model_len": info["max_context"],
                "root": info["reply"]["model"],
                "alias": alias,
            }
            for name, alias in entries
        ]
        return {
            "object": "list",
            "data": data,
            "has_more": False,
            "first_id": data[0]["id"],
            "last_id": data[-1]["id"],
        }
