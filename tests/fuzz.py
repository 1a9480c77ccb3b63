"""Shared by the fuzz tests: a well-formed stream that runs beside the fuzzing.

`Witness` repeats one greedy request on its own channel while the fuzz cases
run, and records every answer that differs from the first one: a hostile
request must not change another tenant's tokens.
"""

from __future__ import annotations

import threading

import grpc

from engine.proto import engine_pb2 as pb
from engine.proto import engine_pb2_grpc

WITNESS_PROMPT = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4]


def witness_request() -> pb.GenerateRequest:
    req = pb.GenerateRequest(sampling=pb.Sampling(max_tokens=12), namespace="witness")
    req.prompt_ids.ids.extend(WITNESS_PROMPT)
    return req


def tokens_of(stub, req, timeout: float = 120) -> list[int]:
    ids = []
    for ev in stub.Generate(req, timeout=timeout):
        if ev.WhichOneof("event") == "chunk":
            ids.extend(ev.chunk.ids)
    return ids


class Witness:
    """The well-formed stream, repeated on a thread until stop()."""

    def __init__(self, address: str):
        self.channel = grpc.insecure_channel(address)
        self.stub = engine_pb2_grpc.EngineStub(self.channel)
        self.expected = tokens_of(self.stub, witness_request())
        self.runs, self.wrong, self.errors = 0, [], []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="witness", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                got = tokens_of(self.stub, witness_request())
            except grpc.RpcError as e:
                self.errors.append(f"{e.code()}: {e.details()}")
                continue
            self.runs += 1
            if got != self.expected:
                self.wrong.append(got)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(120)
        self.channel.close()

    def check(self) -> None:
        assert self.expected, "the witness produced no tokens"
        assert self.runs >= 1, "the witness never finished while the fuzz ran"
        assert not self.errors, self.errors[:3]
        assert not self.wrong, f"{len(self.wrong)} of {self.runs} witness runs changed"
