"""`--model PATH` serves any mlx-lm model directory: a 4-bit quantized one here.

In process (the server's own Generator and CacheManager), since what is under
test is loading and caching a quantized model, not the transport.
"""

from __future__ import annotations

from mlx_lm import convert

from engine.config import CacheConfig, EngineConfig, ModelConfig
from engine.runtime.local import LocalEngine
from engine.runtime.model.loader import kv_dtype
from engine.runtime.model.tiny_models import write_model_dir


def test_a_quantized_model_serves_and_restores(tmp_path):
    src = write_model_dir("qwen3_next", tmp_path / "src")
    convert(str(src), mlx_path=str(tmp_path / "q4"), quantize=True, q_group_size=32, q_bits=4)
    engine = LocalEngine(
        EngineConfig(
            model=ModelConfig(path=str(tmp_path / "q4")),
            cache=CacheConfig(cache_dir=str(tmp_path / "cache")),
        )
    )
    assert engine.info.has_state_layers
    prompt = list(range(100, 700))
    first = engine.run(prompt, max_tokens=5)
    assert len(first.ids) == 5 and first.final.restore_kind == "none"
    second = engine.run(prompt + first.ids + list(range(50, 80)), max_tokens=5)
    assert second.final.restore_kind == "entry"
    assert second.final.cached_tokens == len(prompt) + len(first.ids)
    resend = engine.run(prompt, max_tokens=5)
    assert resend.ids == first.ids, "a restored quantized model decodes what a cold one does"
    # The fingerprint keys files by the KV cache's dtype, not the packed weights' uint32.
    stored = next(iter(engine.tier.entries.values()))
    kv = next(layer for layer in stored.layers if layer)
    assert kv_dtype(engine.model) == str(kv.keys.dtype) != "mlx.core.uint32"
