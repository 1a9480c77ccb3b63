"""Every operator setting of the engine in one list, and docs/serving.md's table made from it.

The settings are declared beside their fields (engine.config.declare); this module
walks the tree's branches in order (model, cache, server, prompt, kernels, limits) and
lists them, and writes them as the table between the markers in docs/serving.md:

    python -m engine.config.catalog --write docs/serving.md   # or --markdown: print it

tests/config/test_settings.py fails when the file and the code differ. It knows no
argparse (clients.cli.args makes the options from the same list).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import typing
from pathlib import Path

from engine.config.declare import Setting, settings_of
from engine.config.tree import EngineConfig

BEGIN, END = "<!-- settings:begin -->", "<!-- settings:end -->"


def branches() -> tuple[type, ...]:
    """The configuration classes of the tree, in its order."""
    hints = typing.get_type_hints(EngineConfig)
    return tuple(hints[f.name] for f in dataclasses.fields(EngineConfig))


SETTINGS: tuple[Setting, ...] = tuple(s for cls in branches() for s in settings_of(cls))


def markdown() -> str:
    """The settings as Markdown: one table per branch, each under its class's first line."""
    out = []
    for cls in branches():
        caption = cls.__doc__.strip().splitlines()[0].rstrip(".")
        out += [f"**{caption}**", "", "| Flag | Variable | Default | What it sets |"]
        out.append("|---|---|---|---|")
        out += [_row(s) for s in settings_of(cls)]
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


def _row(s: Setting) -> str:
    if s.flag is None:
        flag = "(none)"
    elif s.switch:
        flag = f"`{s.flag}`"
    else:
        flag = f"`{s.flag} {s.metavar or s.name.upper()}`"
    var = f"`{s.var}`"
    if s.repeat:
        flag, var = f"{flag} (repeatable)", f"{var} (comma-separated)"
    cells = (flag, var, s.default_text(), s.help)
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def with_table(text: str) -> str:
    """`text` with the table between its markers replaced by the current one."""
    head, begin, rest = text.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise ValueError(f"no {BEGIN} ... {END} markers")
    return f"{head}{BEGIN}\n{markdown()}{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.config.catalog", description=__doc__)
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--markdown", action="store_true", help="print the table")
    action.add_argument("--write", metavar="FILE", help="rewrite the table between the markers")
    args = parser.parse_args(argv)
    if args.markdown:
        sys.stdout.write(markdown())
        return 0
    path = Path(args.write)
    path.write_text(with_table(path.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
