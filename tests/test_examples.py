"""The examples never put a token on a command line.

Every user of a machine reads every process's arguments (`ps`, /proc), so the
examples give the engine its tokens in a file and clients theirs through the
environment, read from a file.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = [
    "cluster.yaml",
    "README.md",
    *sorted(p.relative_to(ROOT) for p in ROOT.glob("docs/**/*.md")),
]
# A literal token: after --auth-token (the flag, not --auth-token-file), or assigned
# to LINEAGE_AUTH_TOKEN other than from a file or another variable.
ON_A_COMMAND_LINE = re.compile(
    r"--auth-token[ =](?!FILE|TOKEN\b)[A-Za-z0-9_$-]|LINEAGE_AUTH_TOKEN=(?![\"']?\$\()[A-Za-z0-9_]"
)


@pytest.mark.parametrize("name", [str(e) for e in EXAMPLES])
def test_no_example_puts_a_token_on_a_command_line(name):
    text = (ROOT / name).read_text()
    found = [m.group(0) for m in ON_A_COMMAND_LINE.finditer(text)]
    assert not found, found
