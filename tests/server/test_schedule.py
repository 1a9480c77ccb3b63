"""The prefill scheduler through the server: a short warm turn does not wait for a long prompt."""

from __future__ import annotations

import threading

from tests.server.test_server import collect, request


def test_a_short_warm_turn_overtakes_a_long_cold_prefill_that_arrived_first(engine, stub):
    assert engine.config.model.schedule == "srpt"
    base = [(i * 37) % 3000 + 20 for i in range(300)]
    reply, _, _ = collect(stub, request(prompt_ids=base, max_tokens=2))
    long_prompt = [(i * 53) % 3900 + 30 for i in range(6000)]
    firsts: list[str] = []
    prefilling = threading.Event()

    def long_request():
        for ev in stub.Generate(request(prompt_ids=long_prompt, max_tokens=1), timeout=300):
            kind = ev.WhichOneof("event")
            if kind == "progress":
                prefilling.set()
            elif kind == "chunk" and "long" not in firsts:
                firsts.append("long")
        prefilling.set()

    thread = threading.Thread(target=long_request)
    thread.start()
    assert prefilling.wait(120), "the long prompt never started prefilling"
    _, _, warm = collect(stub, request(prompt_ids=base + reply + list(range(40, 80)), max_tokens=1))
    firsts.append("warm")
    thread.join(300)
    assert warm.usage.cached_tokens >= len(base), "the short turn was not warm"
    assert firsts == ["warm", "long"], "the short warm turn waited for the long prefill"
