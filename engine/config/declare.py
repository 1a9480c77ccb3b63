"""One operator setting, declared once, beside the configuration field it fills.

A field the operator may set carries a `Setting` in its metadata
(`setting(default, help, ...)`): its flag, its environment variable, how a value
is parsed and checked, its default as people read it, and its help. Everything
else is generated from it: the CLI's options (clients.cli.args), the lookup of
`EngineConfig.from_sources` (a flag wins over its variable, which wins over the
default), and the table in docs/serving.md (engine.config.catalog). Every
refusal names the flag and the variable. It knows no argparse and no particular
setting.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from engine.config.units import format_bytes, parse_bytes


class _Unset:
    """What a setting reads when nothing sets it (None is a value some settings take)."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()
_KEY = "settings"  # the metadata key of a field's settings


def parse_bool(value) -> bool:
    """on/off, true/false, 1/0 (any case) -> bool; ValueError for anything else."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("on", "true", "1"):
        return True
    if text in ("off", "false", "0"):
        return False
    raise ValueError(f"{value!r} is not on/off (or true/false, 1/0)")


def parse_int(value) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    try:
        return int(str(value).strip())
    except ValueError:
        raise ValueError(f"{value!r} is not an integer") from None


def parse_float(value) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    try:
        return float(str(value).strip())
    except ValueError:
        raise ValueError(f"{value!r} is not a number") from None


def parse_str(value) -> str:
    return str(value)


_PARSERS = {bool: parse_bool, int: parse_int, float: parse_float, str: parse_str}
_METAVARS = {parse_int: "N", parse_float: "X", parse_bytes: "SIZE", parse_bool: "on|off"}


@dataclass(frozen=True)
class Setting:
    """A setting's flag, variable, parser, default and help. Empty attributes are derived
    from the field (`settings_of`): the name from its name, `--name`, `LINEAGE_NAME`, the
    parser from its type, the default from its default."""

    help: str
    name: str = ""  # the key in from_sources' flags and the argparse dest
    field: str = ""  # the configuration field it fills
    flag: str | None = ""  # None: a variable only, no flag
    var: str = ""
    parse: Callable[[Any], Any] | None = None  # text (or a value already parsed) -> value
    choices: tuple[str, ...] = ()
    metavar: str | None = None
    default: Any = UNSET  # what from_sources gives when neither flag nor variable is set
    shown: str = ""  # the default as people read it (help, docs)
    switch: bool = False  # a flag without a value (on when given); its variable reads on/off
    # A flag given once per value; its variable holds one value a line. The field is the
    # tuple of its default's values followed by the given ones (given values add, never
    # replace).
    repeat: bool = False

    @property
    def label(self) -> str:
        """How refusals name it: `--flag (VARIABLE)`."""
        return f"{self.flag} ({self.var})" if self.flag else self.var

    def read(self, flags: Mapping[str, object], env: Mapping[str, str]):
        """Its value from `flags` (None: not given), else from `env` (empty: unset), parsed;
        UNSET when neither sets it."""
        given = flags.get(self.name)
        if given is None:
            given = env.get(self.var) or None
        return UNSET if given is None else self.parse_value(given)

    def parse_value(self, value):
        """One value, parsed and checked (a repeated setting: a tuple of them, from a sequence
        or from text with one a line); ValueError naming the flag and the variable."""
        if self.repeat:
            items = value.splitlines() if isinstance(value, str) else list(value)
            return tuple(self._parse_one(v) for v in items if v != "")
        return self._parse_one(value)

    def _parse_one(self, value):
        try:
            parsed = self.parse(value)
        except (TypeError, ValueError) as error:
            raise ValueError(f"{self.label}: {error}") from None
        if self.choices and parsed not in self.choices:
            raise ValueError(f"{self.label}: {parsed!r} is not one of {', '.join(self.choices)}")
        return parsed

    def default_text(self) -> str:
        if self.shown:
            return self.shown
        if self.repeat:
            return ", ".join(f"`{v}`" for v in self.default) or "none"
        if isinstance(self.default, bool):
            return "on" if self.default else "off"
        if self.parse is parse_bytes:
            return format_bytes(self.default)
        if isinstance(self.default, float):
            return f"{self.default:g}"
        return str(self.default)


def setting(field_default, help: str, /, **attributes) -> Any:
    """A dataclass field with its default and its `Setting` (attributes as Setting's; its
    `default`, when given, is what from_sources gives instead of the field's)."""
    metadata = {_KEY: (Setting(help, **attributes),)}
    return dataclasses.field(default=field_default, metadata=metadata)


def sourced(default, *settings: Setting) -> Any:
    """A dataclass field that several settings fill together (`from_sources` combines them)."""
    return dataclasses.field(default=default, metadata={_KEY: settings})


def _named(s: Setting, field: dataclasses.Field) -> Setting:
    """`s` with its name, field, flag and variable filled in."""
    name = s.name or field.name
    flag = "--" + name.replace("_", "-") if s.flag == "" else s.flag
    return dataclasses.replace(
        s, name=name, field=field.name, flag=flag, var=s.var or "LINEAGE_" + name.upper()
    )


def label_of(cls: type, field_name: str) -> str:
    """`--flag (VARIABLE)` of a field's setting (for the class's own checks)."""
    field = next(f for f in dataclasses.fields(cls) if f.name == field_name)
    return _named(field.metadata[_KEY][0], field).label


@functools.cache
def settings_of(cls: type) -> tuple[Setting, ...]:
    """The settings of a configuration class, complete, in field order."""
    hints = typing.get_type_hints(cls)
    out = []
    for field in dataclasses.fields(cls):
        for s in field.metadata.get(_KEY, ()):
            s = _named(s, field)
            parse = s.parse or _PARSERS.get(_plain(hints[field.name]))
            assert parse is not None, f"{cls.__name__}.{field.name}: give the setting a parser"
            default = field.default if s.default is UNSET else s.default
            assert default is not dataclasses.MISSING, (
                f"{cls.__name__}.{field.name}: give it a default"
            )
            assert default is not None or s.shown, f"{s.name}: say what its default None means"
            metavar = s.metavar or "|".join(s.choices) or _METAVARS.get(parse)
            out.append(
                dataclasses.replace(
                    s, parse=parse, default=default, metavar=None if s.switch else metavar
                )
            )
    return tuple(out)


def read_settings(cls: type, flags: Mapping[str, object], env: Mapping[str, str]) -> dict:
    """Field -> value of every field one setting fills: its flag, else its variable, else its
    setting's default. Fields that several settings fill are left to the caller."""
    counts = collections.Counter(s.field for s in settings_of(cls))
    values = {}
    for s in settings_of(cls):
        if counts[s.field] == 1:
            value = s.read(flags, env)
            if s.repeat and value is not UNSET:
                value = tuple(s.default) + value  # given values add to the default's
            values[s.field] = s.default if value is UNSET else value
    return values


def setting_named(cls: type, name: str) -> Setting:
    return next(s for s in settings_of(cls) if s.name == name)


def _plain(annotation) -> type | None:
    """int for `int` and `int | None`; None for anything else."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        rest = [a for a in typing.get_args(annotation) if a is not type(None)]
        return rest[0] if len(rest) == 1 and isinstance(rest[0], type) else None
    return annotation if isinstance(annotation, type) else None
