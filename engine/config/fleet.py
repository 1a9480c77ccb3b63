"""The fleet branch of the configuration: the models one server serves, and when they load.

`--model` is repeatable. `--model PATH` alone keeps its old meaning (one model);
a PATH may be a Hugging Face repository, `org/name[@rev]`, which `lineage serve`
resolves to its snapshot directory before anything starts (engine.hub);
`--model NAME=PATH[,KEY=VALUE...]` declares a named model, its options after
commas: `output_format=`, `speculative=`, `draft_model=` (as the flags of the
same names, for this model only) and `resource=NAME[:AMOUNT]` (a Ray custom
resource its actors need, repeatable: it places the model on a cluster's
nodes). An empty PATH (`small=`) is the embedded model. `--model-alias
PATTERN=NAME` sends the names matching PATTERN to model NAME
(engine.config.server; the longest matching pattern wins: `routed`). Each
model gets its own cache directory under the cache directory (`fleet/NAME`)
and its own Ray namespace (the server's, a dash, its name);
`EngineConfig.for_model` derives its configuration.

`--idle-unload SECONDS` unloads a model nobody used for that long; `--pin NAME`
keeps one loaded. It checks names and values; engine.server.running.fleet applies them.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

from engine.config.declare import label_of, parse_str, setting

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")  # a directory and Ray name part
OPTIONS = ("output_format", "speculative", "draft_model", "resource")


@dataclass(frozen=True)
class ModelSpec:
    """One declared model: its name, directory (None: the embedded model) and options."""

    name: str  # "" for a bare PATH: the one model, served as before
    path: str | None = None
    output_format: str | None = None  # None: --output-format
    speculative: str | None = None  # None: --speculative
    draft_model: str | None = None
    resources: tuple[tuple[str, float], ...] = ()  # Ray custom resources its actors need


def parse_model_spec(value) -> ModelSpec:
    """`PATH`, or `NAME=PATH[,KEY=VALUE...]` -> ModelSpec; ValueError naming what is wrong."""
    if isinstance(value, ModelSpec):
        return value
    text = str(value).strip()
    name, sep, rest = text.partition("=")
    if not sep or "/" in name or "," in name:  # a bare PATH (a path may hold '=' after a '/')
        return ModelSpec("", text or None)
    if not NAME.match(name):
        raise ValueError(f"model name {name!r}: letters, digits, '.', '_' or '-', at most 64")
    path, *options = rest.split(",")
    fields: dict = {}
    resources = []
    for option in options:
        key, sep, val = option.partition("=")
        if not sep or key not in OPTIONS:
            raise ValueError(f"model {name}: {option!r} is not KEY=VALUE with KEY one of {OPTIONS}")
        if key == "resource":
            resource, _, amount = val.partition(":")
            resources.append((resource, float(amount or 1)))
        else:
            fields[key] = val
    return ModelSpec(name, path or None, resources=tuple(resources), **fields)


def _seconds(value) -> float | None:
    """A positive number of seconds, or off/none/0 (None: never)."""
    if value is None:
        return None
    text = str(value).strip().lower()
    if text in ("off", "none", "never", "0"):
        return None
    seconds = float(text)
    if seconds <= 0:
        raise ValueError(f"{value!r} is not a positive number of seconds")
    return seconds


@dataclass(frozen=True)
class FleetConfig:
    """Models served together: their names and directories, idle unload, pins."""

    models: tuple[ModelSpec, ...] = setting(
        (),
        "a model directory or a Hugging Face repository, org/name[@revision] (taken from "
        "the HF cache, downloaded there first if need be); NAME=PATH[,output_format=F,"
        "speculative=S,draft_model=P,resource=R[:N]] declares one of several, served by "
        "NAME (empty PATH: the embedded model)",
        name="model",
        repeat=True,
        parse=parse_model_spec,
        metavar="[NAME=]PATH",
        shown="the embedded tiny model",
    )
    idle_unload: float | None = setting(
        None,
        "unload a model nobody asked for in SECONDS (its RAM tier goes to disk first)",
        parse=_seconds,
        metavar="SECONDS",
        shown="never",
    )
    pin: tuple[str, ...] = setting(
        (),
        "a model kept loaded (never unloaded for idleness or room)",
        parse=parse_str,
        repeat=True,
        metavar="NAME",
        shown="none",
    )

    def __post_init__(self):
        names = [m.name for m in self.models]
        if len(self.models) > 1 and "" in names:
            raise ValueError(
                f"{label_of(FleetConfig, 'models')}: with several models, name each (NAME=PATH)"
            )
        if len(set(names)) != len(names):
            raise ValueError(f"{label_of(FleetConfig, 'models')}: a model name is given twice")
        for pinned in self.pin:
            if pinned not in names:
                raise ValueError(
                    f"{label_of(FleetConfig, 'pin')}: {pinned!r} is not a declared model "
                    f"({', '.join(n for n in names if n) or 'none named'})"
                )

    @property
    def several(self) -> bool:
        """Whether named models are declared (routing by name), not one model as before."""
        return any(m.name for m in self.models)

    def named(self, name: str) -> ModelSpec:
        return next(m for m in self.models if m.name == name)


def alias_targets(patterns: tuple[str, ...], names: tuple[str, ...]) -> dict[str, str]:
    """`--model-alias` patterns -> the model each sends to: `PATTERN=NAME`, or a bare
    PATTERN to the first model. ValueError for a NAME that is not declared."""
    out = {}
    for text in patterns:
        pattern, sep, target = text.rpartition("=")
        if not sep:
            pattern, target = text, names[0]
        if target not in names:
            raise ValueError(f"--model-alias {text!r}: {target!r} is not a declared model")
        out[pattern] = target
    return out


def routed(requested: str, names, patterns) -> str | None:
    """The model a requested name goes to: the first model when none is named, a model's
    own name, else the target of the longest `(pattern, target)` pattern that matches it
    (`claude-*haiku*` before `claude-*`; ties: the first given); None when none does."""
    if not requested:
        return next(iter(names), None)
    if requested in names:
        return requested
    matching = [(p, t) for p, t in patterns if fnmatch.fnmatchcase(requested, p)]
    return max(matching, key=lambda pt: len(pt[0]))[1] if matching else None
