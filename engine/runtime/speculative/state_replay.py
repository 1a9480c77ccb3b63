"""Replaying only the recurrent mixers: what a rollback costs when the layers allow it.

A rollback must leave each recurrent layer's state (GDN, KDA, Mamba: the conv
window and the recurrent matrix) as after the row's kept tokens. The full
replay (engine.runtime.speculative.rollback) runs the whole model again over them. But a
mixer's input at a kept position is the same in the verify forward as in any
replay of it (every layer is causal: positions after it do not reach it), so
it is enough to keep each mixer's input during the verify and, at rollback,
run that mixer alone over its first `keep[r]` positions from the state before
the verify: no attention, no MLP or experts, no output head.

`MixerTaps` finds the mixers once per model: in each layer whose cache is an
`ArraysCache`, the one child module called as `mixer(x, mask, cache)` (mlx-lm's
`linear_attn` of qwen3_next, `mixer` of mamba2, `self_attn` of kimi_linear's
delta layers). Each found mixer's class is swapped for a subclass whose
`__call__` keeps its input while a tap is open and then calls the original
(the parameter tree does not change, as the kernels' swaps). A model where a
state layer has no such mixer, or whose state includes a sliding window,
gets None and keeps the full replay.

It knows mlx-lm's layers and ArraysCache; nothing of drafts or the batch.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import ArraysCache, make_prompt_cache

_TAPPED: dict[type, type] = {}  # a mixer class -> its tapped subclass
_OPEN: dict[int, list] = {}  # id(mixer) -> the inputs it was called with, while a tap is open


def _tapped(cls: type) -> type:
    """`cls` with a `__call__` that keeps its input while a tap is open (`untapped`: cls)."""
    if cls in _TAPPED.values():
        return cls  # tapped already (another engine on the same model)
    sub = _TAPPED.get(cls)
    if sub is None:

        def __call__(self, x, mask=None, cache=None):
            seen = _OPEN.get(id(self))
            if seen is not None:
                seen.append(x)
            return cls.__call__(self, x, mask, cache)

        sub = _TAPPED[cls] = type(cls.__name__, (cls,), {"__call__": __call__, "untapped": cls})
    return sub


def _mixer(layer):
    """The one child of `layer` called as `child(x, mask, cache)`, or None."""
    import inspect

    found = []
    for child in layer.children().values():
        if not isinstance(child, nn.Module):
            continue
        params = list(inspect.signature(type(child).__call__).parameters)
        if params[2:4] == ["mask", "cache"]:
            found.append(child)
    return found[0] if len(found) == 1 else None


class MixerTaps:
    """The recurrent mixers of one model, by cache index, and their inputs while tapped."""

    def __init__(self, mixers: dict[int, object]):
        self.mixers = mixers  # cache index -> mixer module

    @classmethod
    def of(cls, model) -> "MixerTaps | None":
        """The model's mixers, tapped; None when some state layer has none (full replay)."""
        kinds = make_prompt_cache(model)
        layers = list(model.layers)
        if len(kinds) != len(layers):
            return None
        mixers = {}
        for i, (cache, layer) in enumerate(zip(kinds, layers)):
            if isinstance(cache, ArraysCache):
                mixer = _mixer(layer)
                if mixer is None:
                    return None
                mixers[i] = mixer
            elif not _appends(cache):
                return None  # a sliding window or another state kind: the full replay
        for mixer in mixers.values():
            mixer.__class__ = _tapped(type(mixer))
        return cls(mixers) if mixers else None

    def open(self) -> None:
        for mixer in self.mixers.values():
            _OPEN[id(mixer)] = []

    def close(self) -> dict[int, mx.array] | None:
        """Cache index -> the input its mixer saw while open; None unless each mixer was
        called once (another thread's forward on the same model: the full replay)."""
        seen = {i: _OPEN.pop(id(m), []) for i, m in self.mixers.items()}
        if any(len(xs) != 1 for xs in seen.values()):
            return None
        return {i: xs[0] for i, xs in seen.items()}

    def replay(self, caches: list, inputs: dict[int, mx.array], keep: list[int]) -> None:
        """Run each mixer alone over its kept positions from its restored state (its output
        is dropped; each row's cache ends at its `keep`)."""
        longest = max(keep)
        for i, mixer in self.mixers.items():
            cache = caches[i]
            cache.lengths = mx.array(keep)  # its own: the mixer's `advance` subtracts in place
            x = inputs[i][:, :longest]
            type(mixer).untapped.__call__(mixer, x, cache.make_mask(longest), cache)
            cache.lengths = None


def _appends(cache) -> bool:
    from mlx_lm.models.cache import CacheList, KVCache

    if type(cache) is CacheList:
        return all(_appends(c) for c in cache.caches)
    return type(cache) is KVCache
