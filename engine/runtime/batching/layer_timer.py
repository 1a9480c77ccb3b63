"""A per-layer forward timer, switched on at run time by a flag file.

Off, it costs one `os.path.exists` per admitted request and nothing per
forward: the model's layers are untouched. When the flag file exists at
admission, the next N requests run with each layer wrapped: the wrapper
evaluates the layer's output and times it, and one log line per forward gives
every layer's milliseconds (this is how a sparse-attention path that expands
the whole latent KV on every chunk shows itself).
"""

from __future__ import annotations

import logging
import os
import time

import mlx.core as mx

log = logging.getLogger("lineage.layers")


class _TimedLayer:
    """Delegates to a layer; evaluates and times each call."""

    def __init__(self, layer, index: int, timer: "LayerTimer"):
        self._layer, self._index, self._timer = layer, index, timer

    def __call__(self, *args, **kwargs):
        t0 = time.perf_counter()
        out = self._layer(*args, **kwargs)
        mx.eval(out)
        self._timer.record(self._index, type(self._layer).__name__, time.perf_counter() - t0)
        return out

    def __getattr__(self, name):
        return getattr(self._layer, name)


def _layer_list(model) -> list:
    inner = getattr(model, "model", None) or getattr(model, "backbone", None) or model
    layers = getattr(inner, "layers", None)
    if not isinstance(layers, list):
        raise ValueError(f"{type(model).__name__}: no list of layers to time")
    return layers


class LayerTimer:
    """Wraps the model's layers while timed requests are in flight."""

    def __init__(self, model, flag_path: str | None, requests: int = 4):
        self.model = model
        self.flag_path = flag_path
        self.budget = requests
        self.timed: set[str] = set()
        self.remaining = 0
        self.originals: list | None = None
        self.current: list[tuple[int, str, float]] = []

    @property
    def on(self) -> bool:
        return self.originals is not None

    def on_admit(self, request_id: str) -> None:
        if self.flag_path is None:
            return
        if self.remaining == 0 and not os.path.exists(self.flag_path):
            return
        if self.remaining == 0:
            self.remaining = self.budget
        self.remaining -= 1
        self.timed.add(request_id)
        self._wrap()

    def on_finish(self, request_id: str) -> None:
        self.timed.discard(request_id)
        if not self.timed and self.remaining == 0:
            self._unwrap()

    def record(self, index: int, name: str, seconds: float) -> None:
        self.current.append((index, name, seconds))
        if index == len(self.originals) - 1:
            total = sum(s for _, _, s in self.current)
            parts = " ".join(f"{i}:{n}={s * 1000:.2f}" for i, n, s in self.current)
            log.info(
                "layer_timer requests=%s total_ms=%.2f %s",
                ",".join(sorted(self.timed)),
                total * 1000,
                parts,
            )
            self.current = []

    def _wrap(self) -> None:
        if self.on:
            return
        layers = _layer_list(self.model)
        self.originals = list(layers)
        for i, layer in enumerate(self.originals):
            layers[i] = _TimedLayer(layer, i, self)

    def _unwrap(self) -> None:
        if not self.on:
            return
        layers = _layer_list(self.model)
        layers[:] = self.originals
        self.originals = None
        self.current = []
