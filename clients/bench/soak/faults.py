"""The faults of a soak, on a schedule, done to the running `lineage serve`.

- `model`, `manager`: SIGKILL of the model actor's (replica 0's) or the cache
  manager's process, found among the serve's processes; survived when another
  process holds the role and the engine serves a request again.
- `disk`: the disk full for `--disk-full` seconds: the cache directory's own
  small filesystem filled to its last byte (clients.bench.soak.disk), filled
  again as the engine's deletes free room, and held full on (up to
  FULL_AT_MOST times as long) until a lost write was reported, then freed;
  survived when the engine reported lost writes during the window and wrote
  an entry file again after it. Where none was lost, it says whether files
  were written meanwhile.
- `disconnect`: a client sends a long prompt nobody sent before over HTTP and
  hangs up while it is still in prefill; survived when the engine serves again.
- `restart`: the whole server stopped with SIGTERM and started again on the
  same cache directory. Before it, a session of its own sends a first turn and
  its entry file is waited for; after it, that session's next turn must restore
  (cached tokens > 0): the server came back warm.

`plan` spreads them over a run: the restart once, in the middle, the others in
turn every `every` seconds, each at least once; the kills only before the
middle, so that the second half is one whole life of every process. `Schedule` runs the plan on a
thread of its own, a fault after the previous one is over; each result says
when it began and ended, so the report can tell errors during a fault from the
rest.
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time

import numpy as np

KINDS = ("model", "disk", "manager", "disconnect")
KILLS = ("model", "manager")  # the faults that end a process of the serve: first half only
FULL_AT_MOST = 4  # the disk stays full this many times --disk-full while no write was lost
ALL = (*KINDS, "restart")


def plan(seconds: float, every: float, kinds=KINDS, restart: bool = True) -> list[tuple]:
    """(at seconds, fault) over a run of `seconds`, evenly spaced about `every` seconds
    apart (closer when needed to fit each fault once, each kill before half way): the
    restart in the slot nearest half way; the kills (`KILLS`) only in the first half, so
    that every process of the serve lives through the second half whole and its memory
    is judged on a life that long (unless no other fault is asked for); the others in
    turn through the whole run."""
    kinds = list(kinds)
    n = len(kinds) if seconds / every < len(kinds) + 2 else int(seconds / every) - 1
    n = n if kinds else 0  # the restart alone, or nothing
    while True:  # more slots (closer) until the first half holds every kill
        total = n + int(restart)
        if not total:
            return []
        step = seconds / (total + 1)
        slots = [step * (k + 1) for k in range(total)]
        mid = min(range(total), key=lambda k: abs(slots[k] - seconds / 2)) if restart else -1
        kills = [k for k in kinds if k in KILLS]
        rest = [k for k in kinds if k not in KILLS]
        early, late = itertools.cycle(kills + rest), itertools.cycle(rest or kills)
        planned = [
            (t, "restart" if k == mid else next(early if t < seconds / 2 else late))
            for k, t in enumerate(slots)
        ]
        if set(kinds) <= {name for _, name in planned}:
            return planned
        n += 1


class Schedule(threading.Thread):
    """Runs `planned` against the soak's serve; `results` as they end."""

    def __init__(self, soak, planned: list[tuple], args):
        super().__init__(name="soak-faults", daemon=True)
        self.soak, self.planned, self.args = soak, planned, args
        self.results: list[dict] = []
        self.current = ""  # the fault under way ("" between faults)
        self.done = threading.Event()
        self._probes = 0

    def run(self) -> None:
        log = self.soak.log
        try:
            for at, name in self.planned:
                while log.now() < at and not self.soak.halt.is_set():
                    time.sleep(0.5)
                if self.soak.halt.is_set():
                    break
                self.current = name
                begin = log.now()
                try:
                    result = getattr(self, f"_{name}")(time.monotonic() + self.args.recovery)
                except Exception as e:  # the soak goes on: a fault that broke is reported
                    result = {"survived": False, "why": f"{type(e).__name__}: {e}"}
                self.results.append({"fault": name, "begin": begin, "end": log.now(), **result})
                self.current = ""
        finally:
            self.current = ""
            self.done.set()

    # ---- the faults ------------------------------------------------------------------

    def _kill(self, role: str, deadline: float) -> dict:
        serve = self.soak.serve
        pid = serve.pid(role)
        if pid is None:
            return {"survived": False, "why": f"no {role} process"}
        os.kill(pid, signal.SIGKILL)
        back = _until(deadline, lambda: serve.pid(role) not in (None, pid))
        if not (back and self._served(deadline)):
            return {"survived": False, "why": f"{role} did not come back and serve"}
        return {"survived": True, "mark": f"{role} pid {pid} -> {serve.pid(role)}"}

    def _model(self, deadline: float) -> dict:
        return self._kill("model-0", deadline)

    def _manager(self, deadline: float) -> dict:
        return self._kill("cache-manager", deadline)

    def _disk(self, deadline: float) -> dict:
        soak, disk = self.soak, self.soak.disk
        if not disk.mounted:
            return {"survived": False, "why": disk.why}
        lost = None  # read before the fault, or the fault proves nothing

        def counted() -> bool:
            nonlocal lost
            lost = _lost_writes(soak.client)
            return lost is not None

        if not _until(min(deadline, time.monotonic() + 30), counted):
            return {"survived": False, "why": "the serve's lost-write count could not be read"}

        def lost_more() -> bool:
            """A write lost and reported since the baseline (an unread count: not yet)."""
            return (_lost_writes(soak.client) or 0) > lost

        before = _newest_file(soak.entries)
        start = time.monotonic()
        shortest = start + self.args.disk_full
        longest = min(deadline, start + FULL_AT_MOST * self.args.disk_full)
        reported = False
        try:
            ballast = disk.fill()  # inside: a fill that fails part way is emptied too
            # Full for `--disk-full` seconds, and on until a lost write was reported (at
            # most FULL_AT_MOST times that): the probes' commits bring writes due, and the
            # room the engine's deletes free is taken back, so a write finds none.
            while time.monotonic() < longest and not (reported and time.monotonic() >= shortest):
                self._served(longest)  # a serve that refuses requests ends the window no later
                ballast += disk.fill()
                time.sleep(0.5)
                reported = lost_more()
            full_s = time.monotonic() - start
            newest = _newest_file(soak.entries)
        finally:
            disk.empty()
        if not reported:  # the last writes' report may still be on its way
            reported = _until(min(deadline, time.monotonic() + self.args.disk_full), lost_more)
        if not reported:
            wrote = "entry files were written" if newest > before else "no entry file was written"
            return {
                "survived": False,
                "why": f"no write was lost (and reported) on the full disk: full {full_s:.0f} s "
                f"({ballast >> 20} MiB of ballast, topped up as files were deleted); {wrote}",
            }

        def written() -> bool:
            """A probe's commit brings a write due (lost too while the writer still pauses
            after the full disk; ordered again after)."""
            self._served(deadline)
            return _newest_file(soak.entries) > newest

        if not _until(deadline, written):
            return {"survived": False, "why": "no entry file was written after the disk had room"}
        now = _lost_writes(soak.client) or lost
        return {
            "survived": True,
            "mark": f"full {full_s:.0f} s, {ballast >> 20} MiB of ballast; {now - lost} writes "
            "lost and reported, files written after",
        }

    def _disconnect(self, deadline: float) -> dict:
        """A raw HTTP request on a socket of its own, closed `--disconnect-after` seconds
        after it was sent: no reply byte read, so the hang-up falls inside the prefill of
        a prompt nobody sent before (unless the server answered that fast: then it says so)."""
        import json
        import socket

        rng = np.random.default_rng(len(self.results))
        words = " ".join(f"w{int(x)}" for x in rng.integers(0, 10**6, self.args.disconnect_words))
        body = json.dumps(
            {
                "model": "lineage",
                "messages": [{"role": "user", "content": f"Summarize: {words}"}],
                "max_tokens": 8,
                "stream": True,
            }
        ).encode()
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        with socket.create_connection(("127.0.0.1", self.soak.serve.http_port), 30) as sock:
            sock.sendall(head + body)
            time.sleep(self.args.disconnect_after)
            sock.setblocking(False)
            try:
                answered = bool(sock.recv(1 << 16))
            except BlockingIOError:
                answered = False
        if not self._served(deadline):
            return {"survived": False, "why": "the engine did not serve after the hang-up"}
        when = "after the reply began" if answered else "before any reply byte (mid-prefill)"
        return {"survived": True, "mark": f"{len(words.split())} words, hung up {when}"}

    def _restart(self, deadline: float) -> dict:
        import httpx

        soak, serve = self.soak, self.soak.serve
        system = {"role": "system", "content": _restart_system(self.args.seed)}
        messages = [system, {"role": "user", "content": "Start the refactor of the parser."}]
        with httpx.Client(base_url=serve.url, timeout=120) as http:
            first = _chat(http, messages)
        if first is None:
            return {"survived": False, "why": "the session's first turn failed before the stop"}
        newest = _newest_file(soak.entries)
        _until(time.monotonic() + 20, lambda: _newest_file(soak.entries) > newest)
        soak.stopping.set()
        try:
            stopped = serve.stop()
            started = serve.start()
        finally:
            soak.stopping.clear()
        messages += [
            {"role": "assistant", "content": first["text"]},
            {"role": "user", "content": "Go on with the next file."},
        ]
        with httpx.Client(base_url=serve.url, timeout=120) as http:
            after = _chat(http, messages)
        if after is None:
            return {"survived": False, "why": "the session's next turn failed after the restart"}
        warm = after["cached"] > 0
        mark = (
            f"stopped in {stopped['seconds']:.1f} s (exit {stopped['returncode']}, "
            f"{stopped['killed']} killed), served again {started:.1f} s after its start; "
            f"the next turn restored {after['cached']} of {after['prompt']} tokens"
        )
        return {
            "survived": warm,
            "mark": mark if warm else "",
            "why": "" if warm else f"cold after the restart: {mark}",
            "stop_s": stopped["seconds"],
            "start_s": started,
            "cached_after": after["cached"],
            "prompt_after": after["prompt"],
        }

    # ---- what they wait for ------------------------------------------------------------

    def _served(self, deadline: float) -> bool:
        """A small request of its own (a namespace nobody else uses) served before `deadline`."""
        from clients.client import LineageError

        while time.monotonic() < deadline:
            self._probes += 1
            ids = np.random.default_rng(self._probes).integers(20, 3000, 40).tolist()
            try:
                self.soak.client.generate(prompt_ids=ids, max_tokens=2, namespace="fault-probe")
                return True
            except LineageError:
                time.sleep(0.5)
        return False


def _lost_writes(client) -> int | None:
    """The serve's count of disk writes lost and reported; None when it cannot be read now
    (a fault's count is read before it: taken as 0, an earlier fault's count would pass it)."""
    try:
        return int(client.cache_stats().get("disk_writes_lost", 0))
    except Exception:
        return None


def _newest_file(entries) -> int:
    """The largest id of an entry file in the directory (ids only grow: a new file)."""
    from engine.storage.file_format import SUFFIX

    try:
        names = os.listdir(entries)
    except FileNotFoundError:
        return 0
    ids = [int(n[: -len(SUFFIX)]) for n in names if n.endswith(SUFFIX) and n[0].isdigit()]
    return max(ids, default=0)


def _until(deadline: float, done) -> bool:
    while time.monotonic() < deadline:
        try:
            if done():
                return True
        except Exception:
            pass
        time.sleep(0.25)
    return False


def _restart_system(seed: int) -> str:
    from clients.bench.agents.agent_text import make_systems, make_tools

    tools = make_tools(300, seed + 77)
    body, _ = make_systems(800, tools, seed + 77)
    return body


def _chat(http, messages: list) -> dict | None:
    """One streamed chat turn: {text, prompt, cached}, None when it failed."""
    from clients.bench.agents import wire_apis

    body = {
        "model": "lineage",
        "messages": messages,
        "max_tokens": 8,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with http.stream("POST", "/v1/chat/completions", json=body) as reply:
        if reply.status_code != 200:
            return None
        got = wire_apis.read_stream("chat", reply)
    return got if got["completed"] else None
