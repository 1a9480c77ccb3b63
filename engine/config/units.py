"""Byte sizes, read and written in one unit system: binary (48G = 48 GiB = 48 << 30).

`parse_bytes` reads what an operator types ('48G', '512M', '1T', '48 GiB', '1024');
`format_bytes` writes what a person reads ('48.0 GiB'), and `parse_bytes` reads
that back. Nothing else: it knows no setting and no memory shares.
"""

from __future__ import annotations

GB = 1 << 30
_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_bytes(text: str | int) -> int:
    """'48G', '512M', '1T', '48.0 GiB', '1024' -> bytes. ValueError naming the text."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    s = str(text).strip().upper().replace(" ", "").removesuffix("B").removesuffix("I")
    try:
        if s and s[-1] in _UNITS:
            return int(float(s[:-1]) * _UNITS[s[-1]])
        return int(s)
    except ValueError:
        raise ValueError(f"not a byte size: {text!r} (use e.g. 48G, 512M, 1T)")


def format_bytes(n: float) -> str:
    """Bytes for people, in the units `parse_bytes` reads: 512 B, 1.5 KiB, 48.0 GiB, 2.0 TiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
