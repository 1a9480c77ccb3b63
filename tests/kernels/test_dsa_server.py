"""Through the server: a warm turn on a tiny glm_moe_dsa model, sparse paths on.

The warm turn restores the first turn's cache and prefills a few dozen new
tokens: with the context past index_topk that chunk takes the decode shape.
Its greedy tokens equal mlx-lm's own generation on the stock model, and the
ModelInfo the server loaded says which kernels are active.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import grpc

from engine.kernels import cpu_fusion as cf
from engine.kernels import dense_attention as da
from engine.kernels import host_linear as hl
from engine.kernels import sparse_attention as sa
from engine.proto import engine_pb2, engine_pb2_grpc
from engine.runtime.model.tiny_models import write_model_dir
from engine.server.running.background import BackgroundEngine
from tests.engines import make_config
from tests.server.test_server import collect, reference_greedy, request


def test_warm_turn_greedy_tokens_equal_the_stock_path(ray_session, tmp_path):
    model_dir = write_model_dir("glm_moe_dsa", tmp_path / "dsa")
    config = make_config(tmp_path / "cache").with_model(path=str(model_dir))
    first = [(i * 53) % 3000 + 10 for i in range(120)]
    e = BackgroundEngine(config)
    try:
        assert sa.DECODE_SHAPE in e.engine.info.kernels
        with grpc.insecure_channel(e.address) as ch:
            stub = engine_pb2_grpc.EngineStub(ch)
            info = stub.ModelInfo(engine_pb2.ModelInfoRequest())
            assert list(info.kernels) == [
                sa.DECODE_SHAPE,
                sa.BLOCK_GATHER,
                da.NAME,
                cf.NAME,
                hl.NAME,
            ]
            reply, _, _ = collect(stub, request(prompt_ids=first, max_tokens=6))
            warm = first + reply + [(i * 31) % 3000 + 10 for i in range(40)]
            ids, _, final = collect(stub, request(prompt_ids=warm, max_tokens=8))
            # Two warm turns of different lengths at once: batched, left-padded.
            both = [
                warm[:-40] + [(i * 7 + j) % 3000 + 10 for i in range(n)]
                for j, n in ((1, 9), (2, 70))
            ]
            with ThreadPoolExecutor(2) as pool:
                together = list(
                    pool.map(lambda p: collect(stub, request(prompt_ids=p, max_tokens=6)), both)
                )
    finally:
        e.stop()
    assert final.usage.cached_tokens >= len(first)  # a warm turn: only the new tokens prefill
    assert ids == reference_greedy(model_dir, warm, 8)
    for prompt, (got, _, fin) in zip(both, together):
        assert fin.usage.cached_tokens >= len(first)
        assert got == reference_greedy(model_dir, prompt, 6)


def test_the_switch_off_loads_no_kernel(tmp_path):
    """LINEAGE_SPARSE_KERNELS=0, LINEAGE_DENSE_KERNEL=0, LINEAGE_CPU_FUSION=0 and
    LINEAGE_HOST_LINEAR=0: mlx-lm's attention, norms and linear layers stay."""
    from engine.config import EngineConfig
    from engine.runtime.model.loader import load_model

    model_dir = write_model_dir("glm_moe_dsa", tmp_path / "dsa")
    env = {
        "LINEAGE_SPARSE_KERNELS": "0",
        "LINEAGE_DENSE_KERNEL": "0",
        "LINEAGE_CPU_FUSION": "0",
        "LINEAGE_HOST_LINEAR": "0",
        "LINEAGE_CACHE_DIR": str(tmp_path),
    }
    config = EngineConfig.from_sources({"model": str(model_dir)}, env)
    model, _, info = load_model(config)
    assert info.kernels == ()
    assert type(model.model.layers[0].self_attn).__name__ == "DeepseekV32Attention"
    on = EngineConfig.from_sources({"model": str(model_dir)}, {"LINEAGE_CACHE_DIR": str(tmp_path)})
    model, _, info = load_model(on)
    assert info.kernels == (sa.DECODE_SHAPE, sa.BLOCK_GATHER, da.NAME, cf.NAME, hl.NAME)
    assert type(model.model.layers[0].self_attn).__name__ == "SparseDeepseekV32Attention"
    da.uninstall(model)
    hl.uninstall(model)
