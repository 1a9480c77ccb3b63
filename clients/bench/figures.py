"""What the benchmarks print and write: percentiles, text tables, JSON, plots.

One percentile for every benchmark (numpy's linear interpolation; 0.0 for no
values), fixed-width and markdown tables, labelled lines, the JSON file and
the figure. Knows numbers, dicts and paths; knows nothing about engines,
traffic or Ray. matplotlib is imported inside `pyplot`, only when a figure is
drawn; `plot_ready` tells a `--plot` run before it starts that it is missing.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

PLOT_EXTRA = "pip install -e '.[bench]'"


# ------------------------------------------------------------- percentiles ----


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (linear interpolation between samples); 0.0 for no values."""
    return float(np.percentile(values, q)) if len(values) else 0.0


def median(values: Iterable[float]) -> float:
    """The 50th percentile; 0.0 for no values."""
    return percentile(list(values), 50)


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    """Median ms of `repeats` calls of fn (each must evaluate what it computes)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return median(times)


# ------------------------------------------------------------------ tables ----


@dataclass(frozen=True)
class Column:
    """One column of a fixed-width table: its title, width, value format and alignment.

    `spec` formats a value (`format(value, spec)`: ",", ".1f", ...); the text is
    then aligned in `width` characters. `gap` spaces come before the column
    (not before the first: the table's `indent` does).
    """

    title: str
    width: int = 0
    spec: str = ""
    align: str = ">"
    gap: int = 1

    def cell(self, text: str) -> str:
        return format(text, f"{self.align}{self.width}" if self.width else "")


def table_header(columns: Sequence[Column], indent: str = "") -> str:
    """The columns' titles, aligned as their values are."""
    return _table_line(columns, [c.title for c in columns], indent)


def table_row(columns: Sequence[Column], values: Sequence, indent: str = "") -> str:
    """One row of values, each formatted by its column's spec."""
    return _table_line(columns, [format(v, c.spec) for c, v in zip(columns, values)], indent)


def table(columns: Sequence[Column], rows: Iterable[Sequence], indent: str = "") -> list[str]:
    """The header line and one line per row of values."""
    return [table_header(columns, indent)] + [table_row(columns, r, indent) for r in rows]


def _table_line(columns: Sequence[Column], texts: Sequence[str], indent: str) -> str:
    cells = [" " * c.gap * (i > 0) + c.cell(t) for i, (c, t) in enumerate(zip(columns, texts))]
    return indent + "".join(cells)


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """A markdown table of preformatted cells."""

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(cells) + " |"

    return [line(header), "|---" * len(header) + "|"] + [line(row) for row in rows]


def labelled(rows: Iterable[tuple[str, str]], width: int, indent: str = "") -> list[str]:
    """One line per (label, text): the labels padded to `width`, the texts aligned after."""
    return [f"{indent}{label:<{width}}{text}" for label, text in rows]


# ------------------------------------------------------------ JSON, plots ----


def write_json(path: str | Path, figures: dict) -> None:
    """The figures as a JSON file (the form runs are compared in)."""
    Path(path).write_text(json.dumps(figures, indent=2))


def plot_ready(args: argparse.Namespace, command: str) -> bool:
    """False, after one line naming the extra, when --plot is asked and matplotlib is absent."""
    if getattr(args, "plot", None) and importlib.util.find_spec("matplotlib") is None:
        print(f"{command}: --plot needs matplotlib ({PLOT_EXTRA})")
        return False
    return True


def pyplot():
    """matplotlib.pyplot on the file-only backend (imported here, when a figure is drawn)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str, dpi: int = 110) -> None:
    """Lay out, write and close a figure."""
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)


def emit(
    figures: dict,
    args: argparse.Namespace,
    format_table: Callable[[dict], str],
    plot: Callable[[dict, str], None] | None = None,
) -> int:
    """Print the figures' table and the kernel set they ran with; write --json (with the
    kernel set) and --plot when asked."""
    from clients.bench.harness import kernel_set

    figures = {"kernels": kernel_set(), **figures}
    print(format_table(figures))
    print(f"kernels: {figures['kernels']} (lineage bench NAME --kernels ours|peers)")
    if getattr(args, "json", None):
        write_json(args.json, figures)
    if plot is not None and getattr(args, "plot", None):
        plot(figures, args.plot)
    return 0
