"""How many cases a randomized test runs: a few in CI, many in a deep run.

`LINEAGE_DEEP_TESTS=1` turns on the deep run (for example the fuzz tests'
>= 10,000 requests); unset, each test runs its CI count.
"""

from __future__ import annotations

import os


def deep() -> bool:
    return os.environ.get("LINEAGE_DEEP_TESTS", "").lower() in ("1", "true", "yes")


def examples(ci: int, deep_count: int) -> int:
    """The number of cases to run now."""
    return deep_count if deep() else ci
