"""The supervision handshake's answer, shared by both actors (no Ray, no MLX)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Hello:
    """An actor's answer to the supervisor: which incarnation, synchronised to which epoch."""

    incarnation: str  # new at every (re)start of the actor
    epoch: int  # the epoch of the last resync (-1: none yet)
    pid: int
    loop_ok: bool = True  # the model loop answered within the deadline
