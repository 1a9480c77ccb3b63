"""End to end: real gRPC on localhost, real Ray actors, real MLX: greedy tokens equal mlx-lm's,
concurrent streams, cancellation, bad input, health and a full queue."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from engine.proto import engine_pb2

pb = engine_pb2


def request(prompt_ids=None, messages=None, max_tokens=12, **sampling):
    req = pb.GenerateRequest(sampling=pb.Sampling(max_tokens=max_tokens, **sampling))
    if prompt_ids is not None:
        req.prompt_ids.ids.extend(prompt_ids)
    for m in messages or ():
        req.messages.append(pb.Message(role=m["role"], content=m["content"]))
    return req


def collect(stub, req, timeout=120):
    """(token ids, text, final event) of one streamed request."""
    ids, text, final = [], "", None
    for ev in stub.Generate(req, timeout=timeout):
        kind = ev.WhichOneof("event")
        if kind == "chunk":
            ids.extend(ev.chunk.ids)
            text += ev.chunk.text
        elif kind == "final":
            final = ev.final
    assert final is not None, "the stream ended without a final event"
    return ids, text, final


def reference_greedy(model_dir, prompt_ids, max_tokens):
    """mlx_lm's own greedy generation for the same prompt (token ids)."""
    import mlx_lm
    from mlx_lm.generate import stream_generate

    model, tokenizer = mlx_lm.load(str(model_dir))
    out = []
    for r in stream_generate(model, tokenizer, prompt_ids, max_tokens=max_tokens):
        if r.token in tokenizer.eos_token_ids:
            break
        out.append(int(r.token))
    return out


PROMPTS = [
    [5, 17, 300, 42, 99, 1000, 7, 8, 9, 10],
    list(range(100, 160)),
    [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9],
]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_matches_mlx_lm_generate(engine, stub, prompt):
    ids, _, final = collect(stub, request(prompt_ids=prompt, max_tokens=10))
    assert ids == reference_greedy(engine.engine.info.path, prompt, 10)
    assert final.usage.prompt_tokens == len(prompt)
    assert final.usage.completion_tokens == len(ids)


def test_greedy_matches_mlx_lm_on_another_architecture(ray_session, tmp_path):
    """A plain llama-style transformer served with --model PATH."""
    from engine.proto import engine_pb2_grpc
    from engine.runtime.model.tiny_models import write_model_dir
    from engine.server.running.background import BackgroundEngine
    from tests.engines import make_config

    model_dir = write_model_dir("llama", tmp_path / "llama")
    config = make_config(tmp_path / "cache").with_model(path=str(model_dir))
    e = BackgroundEngine(config)
    try:
        with grpc.insecure_channel(e.address) as ch:
            s = engine_pb2_grpc.EngineStub(ch)
            prompt = PROMPTS[1]
            ids, _, _ = collect(s, request(prompt_ids=prompt, max_tokens=10))
            assert ids == reference_greedy(model_dir, prompt, 10)
            info = s.ModelInfo(pb.ModelInfoRequest())
            assert info.model_type == "llama" and not info.has_state_layers
    finally:
        e.stop()


def test_eight_concurrent_streams_match_their_solo_output(engine, stub):
    """Batched decode gives each sequence the tokens it gets alone.

    Batching changes only the batch dimension of each matmul (float32); on these
    models the greedy ids agree exactly, which is what is asserted.
    """
    prompts = [[(i * 37 + j * 11) % 2000 + 10 for j in range(8 + 5 * i)] for i in range(8)]
    solo = [collect(stub, request(prompt_ids=p, max_tokens=16))[0] for p in prompts]
    with ThreadPoolExecutor(8) as pool:
        together = list(
            pool.map(lambda p: collect(stub, request(prompt_ids=p, max_tokens=16))[0], prompts)
        )
    assert together == solo


def test_cancelled_stream_frees_its_slot(engine, stub):
    call = stub.Generate(request(prompt_ids=PROMPTS[1], max_tokens=5000))
    seen = 0
    for ev in call:
        if ev.WhichOneof("event") == "chunk":
            seen += 1
            if seen == 3:
                call.cancel()
                break
    deadline = time.time() + 20
    while engine.generator_stats().active and time.time() < deadline:
        time.sleep(0.1)
    assert engine.generator_stats().active == 0, "the cancelled sequence is still in the batch"
    ids, _, final = collect(stub, request(prompt_ids=PROMPTS[0], max_tokens=4))
    assert final.finish_reason in ("length", "stop")


BAD_INPUTS = [
    ("unknown role", request(messages=[{"role": "wizard", "content": "hi"}]), "role"),
    ("empty prompt", request(), "empty"),
    ("empty text", pb.GenerateRequest(prompt_text="", sampling=pb.Sampling(max_tokens=4)), "empty"),
    ("too long", request(prompt_ids=[5] * 40000), "context"),
    ("max_tokens <= 0", request(prompt_ids=[5, 6], max_tokens=0), "max_tokens"),
    ("temperature < 0", request(prompt_ids=[5, 6], temperature=-1.0), "temperature"),
    ("token outside vocab", request(prompt_ids=[5, 10**7]), "vocabulary"),
    ("negative token", request(prompt_ids=[-3]), "vocabulary"),
]


@pytest.mark.parametrize("name,req,needle", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_is_invalid_argument(stub, name, req, needle):
    with pytest.raises(grpc.RpcError) as err:
        collect(stub, req)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert needle in err.value.details().lower()
    ids, _, _ = collect(stub, request(prompt_ids=PROMPTS[0], max_tokens=2))  # still serving
    assert len(ids) >= 1


@pytest.mark.parametrize(
    "tools_json,needle",
    [
        ("{not json", "json"),
        ('{"type": "function"}', "list"),
        ('[{"type": "function", "function": {"description": "x"}}]', "name"),
        ('["just a string"]', "object"),
    ],
)
def test_malformed_tools_are_invalid_argument(stub, tools_json, needle):
    req = request(messages=[{"role": "user", "content": "hello"}])
    req.tools_json = tools_json
    with pytest.raises(grpc.RpcError) as err:
        collect(stub, req)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert needle in err.value.details().lower()


def test_chat_messages_with_tools_and_sampling(stub):
    tools = [
        {
            "type": "function",
            "function": {
                "name": "read_file",
                "description": "Read a file",
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
            },
        }
    ]
    req = request(
        messages=[
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Read setup.py"},
        ],
        max_tokens=8,
        temperature=0.8,
        top_p=0.9,
        top_k=50,
        seed=7,
    )
    req.tools_json = json.dumps(tools)
    a = collect(stub, req)
    b = collect(stub, req)
    assert a[0] == b[0], "a seeded request is reproducible"
    assert a[2].usage.prompt_tokens > 20


def test_stop_strings_and_stop_token_ids(stub):
    ids, text, _ = collect(stub, request(prompt_ids=PROMPTS[1], max_tokens=12))
    assert len(ids) >= 4
    stop_id = ids[2]
    ids2, _, final = collect(
        stub, request(prompt_ids=PROMPTS[1], max_tokens=12, stop_token_ids=[stop_id])
    )
    assert final.finish_reason == "stop" and ids2 == ids[: ids.index(stop_id)]
    if len(text) > 6:
        needle = text[3:6]
        _, text3, final3 = collect(
            stub, request(prompt_ids=PROMPTS[1], max_tokens=12, stop=[needle])
        )
        assert final3.finish_reason == "stop" and needle not in text3
        assert text.startswith(text3)


def test_long_prompt_streams_prefill_progress(stub):
    req = request(prompt_ids=[(i * 7) % 1500 + 20 for i in range(700)], max_tokens=2)
    progress = [
        ev.progress
        for ev in stub.Generate(req, timeout=120)
        if ev.WhichOneof("event") == "progress"
    ]
    assert progress, "no prefill progress for a 700-token prompt"
    assert all(p.total == 700 for p in progress)
    assert [p.done for p in progress] == sorted(p.done for p in progress)


def test_health_and_reflection(engine):
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    with grpc.insecure_channel(engine.address) as ch:
        h = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""))
        assert h.status == health_pb2.HealthCheckResponse.SERVING
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        replies = stub.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")])
        )
        names = [s.name for r in replies for s in r.list_services_response.service]
        assert "lineage.v1.Engine" in names


def test_stop_goes_not_serving_and_ends_streams_unavailable(
    ray_session, model_cache_dir, random_model_dir
):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from engine.proto import engine_pb2_grpc
    from engine.server.running.background import BackgroundEngine
    from tests.engines import make_config

    e = BackgroundEngine(make_config(model_cache_dir, random_model_dir))
    ch = grpc.insecure_channel(e.address)
    s = engine_pb2_grpc.EngineStub(ch)
    call = s.Generate(request(prompt_ids=PROMPTS[0], max_tokens=100000))
    next(iter(call))  # the stream is live
    e.call(_stop_and_probe(e, health_pb2, health_pb2_grpc))
    with pytest.raises(grpc.RpcError) as err:
        for _ in call:
            pass
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert e.health_seen == health_pb2.HealthCheckResponse.NOT_SERVING
    e.background.close()
    ch.close()


async def _stop_and_probe(e, health_pb2, health_pb2_grpc):
    from engine.server.rpc.service import SERVICE

    for name in ("", SERVICE):
        await e.engine.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    async with grpc.aio.insecure_channel(e.address) as ch:
        r = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""))
        e.health_seen = r.status
    await e.engine.stop(grace=1.0)


def test_a_full_queue_is_resource_exhausted_and_the_server_keeps_serving(engine, stub):
    frontend = engine.engine.frontend
    frontend.max_queue = 1
    try:
        busy = stub.Generate(request(prompt_ids=PROMPTS[1], max_tokens=100000))
        next(iter(busy))  # in flight
        with pytest.raises(grpc.RpcError) as err:
            collect(stub, request(prompt_ids=PROMPTS[0], max_tokens=2))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "in flight" in err.value.details()
        busy.cancel()
    finally:
        frontend.max_queue = 256
    deadline = time.time() + 20
    while engine.generator_stats().active and time.time() < deadline:
        time.sleep(0.1)
    ids, _, _ = collect(stub, request(prompt_ids=PROMPTS[0], max_tokens=2))
    assert len(ids) >= 1


def test_health_goes_not_serving_when_the_model_actor_dies(
    ray_session, model_cache_dir, random_model_dir
):
    import ray
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from engine.proto import engine_pb2_grpc
    from engine.server.running.background import BackgroundEngine
    from tests.engines import make_config

    e = BackgroundEngine(make_config(model_cache_dir, random_model_dir))
    try:
        with grpc.insecure_channel(e.address) as ch:
            health = health_pb2_grpc.HealthStub(ch)
            check = health_pb2.HealthCheckRequest(service="")
            assert health.Check(check).status == health_pb2.HealthCheckResponse.SERVING
            ray.kill(e.engine.model)
            deadline = time.time() + 30
            while time.time() < deadline:
                if health.Check(check).status == health_pb2.HealthCheckResponse.NOT_SERVING:
                    break
                time.sleep(0.2)
            assert health.Check(check).status == health_pb2.HealthCheckResponse.NOT_SERVING
            with pytest.raises(grpc.RpcError) as err:
                collect(engine_pb2_grpc.EngineStub(ch), request(prompt_ids=PROMPTS[0]))
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        e.stop()
