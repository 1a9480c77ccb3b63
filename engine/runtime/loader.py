"""Loading the served model: its directory, the MLX model and tokenizer, and what it is.

It knows mlx-lm's loader and the model's config; it knows nothing about
actors or the server. `ModelInfo` is what the rest of the engine learns about
the model (the front end sizes prompts by it, the cache keys files by its
fingerprint).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine.config import EngineConfig


@dataclass(frozen=True)
class ModelInfo:
    path: str
    model_type: str
    vocab_size: int
    max_context: int
    fingerprint: str
    has_state_layers: bool
    eos_token_ids: tuple[int, ...]


def resolve_model_path(config: EngineConfig) -> Path:
    """The served model's directory; the embedded default is built on first use."""
    if config.model.path:
        path = Path(config.model.path).expanduser()
        if not (path / "config.json").exists():
            raise ValueError(
                f"--model {path}: no config.json there (not an mlx-lm model directory)"
            )
        return path
    from engine.runtime.tiny_models import ensure_default_model

    return ensure_default_model(config.cache.resolved_cache_dir)


def load_model(config: EngineConfig):
    """(model, tokenizer, ModelInfo) for the configured model."""
    import mlx_lm
    from mlx.utils import tree_flatten

    from engine.runtime import layer_caches
    from engine.runtime.fingerprint import model_fingerprint

    path = resolve_model_path(config)
    model, tokenizer, raw = mlx_lm.load(str(path), return_config=True)
    kinds = [layer_caches.layer_kind(c) for c in model.make_cache()]
    dtype = str(next(iter(v for _, v in tree_flatten(model.parameters()))).dtype)
    max_context = config.model.max_context or int(
        raw.get("max_position_embeddings") or raw.get("max_seq_len") or 32768
    )
    info = ModelInfo(
        path=str(path),
        model_type=str(raw.get("model_type", "")),
        vocab_size=int(raw.get("vocab_size") or len(tokenizer._tokenizer)),
        max_context=max_context,
        # The KV cache is the model dtype: mlx-lm's batch cannot merge a quantized
        # KV cache, so KV quantization is not offered (the fingerprint would key it).
        fingerprint=model_fingerprint(path, dtype),
        has_state_layers=any(k != "append" for k in kinds),
        eos_token_ids=tuple(sorted(int(t) for t in tokenizer.eos_token_ids)),
    )
    return model, tokenizer, info
