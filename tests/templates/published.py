"""The published chat templates (tests/templates/published.toml): where they are, and
renders of a past tool call in each, as the engine would hand the template its messages.

The files are not in the repository: scripts/published_templates.sh downloads the pinned
llama-cpp-python sdist from PyPI and extracts llama.cpp's vendored `models/templates`
into .cache/templates/published. The manifest names each file with its sha256, the
output family the engine picks for it, whether it writes tool calls (one, or parallel
ones), and the strings a model of it stops on (its end of turn).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = Path(__file__).parent / "published.toml"
FOLDER = ROOT / ".cache" / "templates" / "published"
SCRIPT = "scripts/published_templates.sh"


def manifest() -> dict[str, dict]:
    """File name -> its entry (sha256, family, calls, stop, source)."""
    return tomllib.loads(MANIFEST.read_text())["templates"]


def published_text(name: str) -> str:
    """The template's text, its sha256 checked; skips (naming the script) when the
    published templates are not installed."""
    path = FOLDER / name
    if not path.exists():
        pytest.skip(f"the published templates are not installed: run {SCRIPT}")
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    assert digest == manifest()[name]["sha256"], f"{name}: sha256 {digest} is not the manifest's"
    return data.decode()


# docs/api.md's table of the published templates is this manifest's, between these lines:
TABLE_BEGIN = "<!-- published templates: python -m tests.templates.published -->"
TABLE_END = "<!-- end of published templates -->"


def docs_table() -> str:
    """The manifest as docs/api.md's table: each template, the output format the engine
    picks for it on the tests' tokenizer, and its round trip."""
    lines = ["| published template | output format | round trip |", "|---|---|---|"]
    for name, entry in sorted(manifest().items()):
        if "unread" in entry:
            status = f"no: writes `{entry['unread']}`, which no family reads"
        elif "skip" in entry:
            status = f"not run here: {entry['skip']}"
        else:
            status = {
                "none": "no call: the template shows no past calls",
                "one": "yes, whole and streamed (the template writes one call a turn)",
                "parallel": "yes, whole and streamed, and two calls in one turn",
            }[entry["calls"]]
        status = status.replace("|", "\\|")  # a table cell's own bars
        lines.append(f"| `{name.removesuffix('.jinja')}` | `{entry['family']}` | {status} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(TABLE_BEGIN, docs_table(), TABLE_END, sep="\n")
