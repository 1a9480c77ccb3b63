"""The model names the bridge answers to: served names, and alias patterns.

Agent clients ask for the model they were built for (`claude-sonnet-4-5`,
`gpt-5-codex`); the bridge serves one model. A requested name reaches it when it
is a served name (`--served-model-name`, repeatable; by default `lineage` and the
model directory's name) or matches an alias pattern (`--model-alias`, repeatable,
fnmatch, case-sensitive: `claude-*`). A request that names no model gets the
first served name. Any other name is `ModelNotFound`, which each wire format
answers 404, naming the served models. Replies carry the name the client asked
for. With several models behind the engine (ModelInfo lists them), `route` finds
the one a name goes to (its name, or an alias the engine routes to it) and the
call names it; `/v1/models` lists each with its state. It knows names and
`/v1/models`' listing; nothing of HTTP or the engine.
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

    def route(self, requested: str | None, info: dict) -> tuple[str, dict]:
        """(the name a reply carries, the ModelInfo of the model the call goes to, with
        `engine_model`: the name the call gives the engine, "" with one model)."""
        models = info["reply"].get("models") or ()
        if not models:
            return self.resolve(requested, info["id"]), dict(info, engine_model="")
        entry = _routed(requested, models)
        if entry is None:
            aliases = tuple(p for m in models for p in m["aliases"])
            raise ModelNotFound(requested, tuple(m["name"] for m in models), aliases)
        routed = dict(
            info,
            engine_model=entry["name"],
            output_format=entry["output_format"] or info["output_format"],
            max_context=entry["max_context"] or info["max_context"],
        )
        return requested or entry["name"], routed

    def listing(self, info: dict) -> dict:
        """`GET /v1/models`: each served name, then each alias pattern, as a model object
        that both OpenAI's and Anthropic's SDKs read; with several models, each model
        (with its `state`: loaded, loading, unloaded) and the patterns routed to it."""
        models = info["reply"].get("models") or ()
        if models:
            entries = [(m["name"], False, m) for m in models]
            entries += [(p, True, m) for m in models for p in m["aliases"]]
        else:
            entries = [(name, False, None) for name in self.served(info["id"])]
            entries += [(pattern, True, None) for pattern in self.aliases]
        data = [
            {
                "id": name,
                "object": "model",
                "type": "model",
                "created": 0,
                "created_at": "1970-01-01T00:00:00Z",
                "display_name": name,
                "owned_by": "lineage",
                "max_model_len": (m and m["max_context"]) or info["max_context"],
                "root": m["model"] if m else info["reply"]["model"],
                "alias": alias,
                **({"state": m["state"], "routes_to": m["name"]} if m else {}),
            }
            for name, alias, m in entries
        ]
        return {
            "object": "list",
            "data": data,
            "has_more": False,
            "first_id": data[0]["id"],
            "last_id": data[-1]["id"],
        }


def _routed(requested: str | None, models) -> dict | None:
    """The ModelInfo entry a name goes to, as the engine routes it (engine.config.fleet)."""
    from engine.config.fleet import routed

    by_name = {m["name"]: m for m in models}
    patterns = [(p, m["name"]) for m in models for p in m["aliases"]]
    name = routed(requested or "", by_name, patterns)
    return None if name is None else by_name[name]
