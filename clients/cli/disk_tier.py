"""The disk tier's state as `lineage stats` and `lineage top` show it.

From an Inspect reply (a dict): whether each replica's disk tier is writing or
paused after a full disk, the writes it lost by cause, and the bytes the disk
budget holds against the bytes of the files in the cache directory (they
differ only while writes are queued; a difference that lasts is a leak). It
knows the reply's fields, nothing of the engine.
"""

from __future__ import annotations

from engine.config import format_bytes

CAUSES = ("queue_full", "disk_full", "failed", "not_held")


def budget_text(cache: dict) -> str:
    """The budget's bytes held against the files' bytes, and the room left on the disk."""
    held, files = cache.get("disk_bytes", 0), cache.get("disk_file_bytes", 0)
    text = f"budget holds {format_bytes(held)}, files on disk {format_bytes(files)}"
    if held != files:
        text += f" (differ by {format_bytes(abs(held - files))}: writes queued, or a leak)"
    return text + f", {format_bytes(cache.get('disk_free_bytes', 0))} free"


def state_text(r: dict) -> str:
    """A replica's disk tier: writing, paused (and for how long), or off."""
    state = r.get("disk_state") or "off"
    if state == "paused":
        return f"PAUSED (disk full) {r.get('disk_paused_s', 0.0):.0f} s more"
    return state


def lost_text(r: dict) -> str:
    """A replica's lost writes by cause ("-" when none)."""
    lost = r.get("disk_writes_lost") or {}
    return ", ".join(f"{c} {lost[c]}" for c in CAUSES if lost.get(c)) or "-"


def disk_lines(snap: dict) -> list[str]:
    """`lineage stats`' lines for the disk tier (none when no replica has one)."""
    replicas = [r for r in snap.get("replicas", ()) if (r.get("disk_state") or "off") != "off"]
    if not replicas:
        return []
    lines = [f"{'disk tier':<16} {budget_text(snap.get('cache', {}))}"]
    for r in replicas:
        lines.append(
            f"{'disk ' + r['name']:<16} {state_text(r)}, "
            f"{r.get('disk_files_written', 0)} files written, writes lost: {lost_text(r)}"
        )
    return lines
