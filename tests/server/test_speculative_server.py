"""A speculating engine served for real (Ray actors, gRPC) speaks as the plain one.

Prompts that quote the plain engine's own reply make prompt lookup draft (the
random-weight model then rejects most drafts, so rollbacks run in the model
actor); four streams at once, greedy, compared token for token with the
session's plain engine, and the drafts' counts reach the client's final event.
The same with the embedded model's MTP head drafting (`--speculative mtp`).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from tests.server.test_server import PROMPTS, collect, request


@pytest.mark.parametrize("mode", ["lookup", "mtp"])
def test_speculating_engine_streams_what_the_plain_one_streams(ray_session, stub, tmp_path, mode):
    from engine.proto import engine_pb2_grpc
    from engine.server.running.background import BackgroundEngine
    from tests.engines import make_config

    quoted = []
    for prompt in PROMPTS:
        reply = collect(stub, request(prompt_ids=prompt, max_tokens=10))[0]
        quoted.append(prompt + reply + prompt)  # lookup drafts the reply again
    plain = [collect(stub, request(prompt_ids=p, max_tokens=16))[0] for p in quoted]

    config = (
        make_config(tmp_path / "cache")
        .with_model(speculative=mode, num_draft_tokens=3 if mode == "lookup" else 1)
        .with_server(exact_cache_figures=True)
    )
    e = BackgroundEngine(config)
    try:
        with grpc.insecure_channel(e.address) as ch:
            s = engine_pb2_grpc.EngineStub(ch)
            with ThreadPoolExecutor(4) as pool:
                runs = list(
                    pool.map(lambda p: collect(s, request(prompt_ids=p, max_tokens=16)), quoted)
                )
    finally:
        e.stop()
    assert [ids for ids, _, _ in runs] == plain
    assert sum(final.timing.drafted for _, _, final in runs) > 0
