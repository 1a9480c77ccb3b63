"""House rules the code itself can be checked for: no issue numbers in code or tests.

A test or module says what it checks or does; the tracker's numbers are history, kept in
git. Pure file reads, no model.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
ISSUE_NUMBER = re.compile(r"\bissues? #?\d+|\(#\d+\)", re.IGNORECASE)


@pytest.mark.parametrize("package", ["engine", "clients", "scripts", "tests"])
def test_no_issue_numbers_in_code_or_tests(package):
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in sorted((ROOT / package).rglob("*.py"))
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if ISSUE_NUMBER.search(line)
    ]
    assert not found, "issue numbers (say what the code checks instead):\n" + "\n".join(found)
