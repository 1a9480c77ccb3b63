"""A peer server beside ours: started as a subprocess, driven through its OpenAI API.

`PeerServer(name, argv)` starts any OpenAI-compatible server (`argv` with
`{port}` where its port goes) on a free localhost port and waits until it
answers; `MlxLmServer(model_dir)` is `python -m mlx_lm.server --model DIR`
(the other peers and their venvs: clients.bench.peers); `stream(...)` sends one
streaming chat completion (messages, tools, greedy) and returns what the
client saw: time to first token, the reply text, and the server's usage
(prompt tokens, cached tokens). The benchmarks feed it the same traffic as
ours, concurrently, from one thread per lane. Standard library only.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

START_TIMEOUT_S = 120


@dataclass
class PeerReply:
    """One streamed completion as the client saw it (times from `time.perf_counter`)."""

    t_send: float
    t_first: float | None = None
    t_end: float = 0.0
    chunk_times: list = field(default_factory=list)
    text: str = ""
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completed: bool = False

    @property
    def ttft_ms(self) -> float:
        return ((self.t_first or self.t_end) - self.t_send) * 1000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PeerServer:
    """An OpenAI-compatible server in a subprocess of its own (a context manager)."""

    def __init__(
        self,
        name: str,
        argv: list,
        env: dict | None = None,
        log_path: str | None = None,
        start_timeout_s: float = START_TIMEOUT_S,
        model: str | None = None,
    ):
        self.name, self.port, self.model = name, free_port(), model  # model: sent in each body
        self.start_timeout_s = start_timeout_s
        self.log = open(log_path or "/dev/null", "wb")
        argv = [str(a).replace("{port}", str(self.port)) for a in argv]
        environ = {**os.environ, **(env or {})}
        self.process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT, env=environ
        )
        try:
            self._wait_ready()
        except BaseException:
            self.close()
            raise

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                conn.request("GET", "/v1/models")
                if conn.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.25)
        raise TimeoutError(f"{self.name} did not answer within {self.start_timeout_s} s")

    def stream(
        self, messages: list, tools=None, max_tokens: int = 32, drop_after: int = 0
    ) -> PeerReply:
        """One greedy streaming chat completion; blocks until it ends. With `drop_after`, the
        client hangs up after that many chunks, as a dropped call does (`completed` false)."""
        body = {
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if tools:
            body["tools"] = list(tools)
        if self.model:
            body["model"] = self.model
        reply = PeerReply(t_send=time.perf_counter())
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        try:
            conn.request(
                "POST",
                "/v1/chat/completions",
                json.dumps(body),
                {"Content-Type": "application/json"},
            )
            response = conn.getresponse()
            if response.status != 200:
                raise RuntimeError(f"{self.name} answered {response.status}")
            for raw in response:
                line = raw.decode().strip()
                if not line.startswith("data: "):
                    continue
                data = line[len("data: ") :]
                if data == "[DONE]":
                    break
                self._event(reply, json.loads(data))
                if drop_after and len(reply.chunk_times) >= drop_after:
                    break
        finally:
            conn.close()
        reply.t_end = time.perf_counter()
        reply.completed = not (drop_after and len(reply.chunk_times) >= drop_after)
        return reply

    @staticmethod
    def _event(reply: PeerReply, event: dict) -> None:
        now = time.perf_counter()
        usage = event.get("usage")
        if usage:
            reply.prompt_tokens = int(usage.get("prompt_tokens", 0))
            details = usage.get("prompt_tokens_details") or {}
            reply.cached_tokens = int(details.get("cached_tokens", 0))
        for choice in event.get("choices", ()):
            delta = choice.get("delta") or {}
            reasoning = delta.get("reasoning") or delta.get("reasoning_content") or ""
            text = (delta.get("content") or "") + reasoning
            if text or delta.get("tool_calls"):
                if reply.t_first is None:
                    reply.t_first = now
                reply.chunk_times.append(now)
                reply.text += text

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()

    def __enter__(self) -> "PeerServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class MlxLmServer(PeerServer):
    """mlx_lm.server (this environment's mlx-lm) on the model directory."""

    def __init__(self, model_dir: str, extra_args: tuple = (), log_path: str | None = None):
        argv = [sys.executable, "-m", "mlx_lm.server", "--model", model_dir]
        argv += ["--host", "127.0.0.1", "--port", "{port}", *extra_args]
        super().__init__("mlx_lm.server", argv, log_path=log_path)
