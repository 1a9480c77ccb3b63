"""`lineage bench soak`: its schedule and report on plain values, and a short soak of a real
`lineage serve` (every fault once) held to the bounds."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from clients.bench.soak import faults, report
from clients.bench.soak.users import Event, Probes, Rounds
from tests.serve_process import start_serve

ROOT = Path(__file__).resolve().parents[3]


def test_the_plan_holds_every_fault_once_and_the_restart_half_way():
    short = faults.plan(150, 240)
    assert sorted(name for _, name in short) == sorted(faults.ALL)
    assert (75.0, "restart") in short
    assert all(0 < t < 150 for t, _ in short)
    hour = faults.plan(3600, 240)
    assert [name for _, name in hour].count("restart") == 1
    assert {name for _, name in hour} == set(faults.ALL)
    assert len(hour) == 1 + 14  # a fault every 4 minutes, and the restart


def test_the_kills_come_before_half_way_so_the_second_half_is_one_life_of_each_process():
    for seconds in (150, 3600):
        planned = faults.plan(seconds, 240)
        kills = [t for t, name in planned if name in faults.KILLS]
        assert {name for _, name in planned if name in faults.KILLS} == set(faults.KILLS)
        assert max(kills) < seconds / 2
        assert [name for t, name in planned if t > seconds / 2 + 1] != []  # faults go on after


@pytest.mark.parametrize(
    "kinds", [("model", "manager", "disk"), ("model", "manager", "disconnect"), ("manager", "disk")]
)
@pytest.mark.parametrize("restart", [True, False])
def test_a_plan_of_some_faults_holds_each_of_them_with_the_kills_before_half_way(kinds, restart):
    for seconds in (150, 600, 3600):
        planned = faults.plan(seconds, 240, kinds, restart)
        assert {name for _, name in planned} == set(kinds) | ({"restart"} if restart else set())
        assert max(t for t, name in planned if name in faults.KILLS) < seconds / 2


def test_a_plan_of_the_restart_alone_is_the_restart_alone():
    assert faults.plan(3600, 240, (), True) == [(1800.0, "restart")]
    assert faults.plan(3600, 240, (), False) == []


def _sample(t, processes, disk_bytes=0, stats_bytes=0):
    return {
        "t": t,
        "load": (1.0, 1.0, 1.0),
        "processes": processes,
        "object_store_bytes": 0,
        "disk": {"bytes": disk_bytes, "files": 1, "temps": 0, "stats_bytes": stats_bytes},
        "logs": {"serve_log_bytes": 10 * t, "ray_log_bytes": 0},
        "window": {"ttft_p50_ms": 1.0, "ttft_p99_ms": 2.0},
        "fault": "",
    }


def _proc(pid, rss, fds=40, threads=20):
    return {"pid": pid, "rss": rss, "fds": fds, "threads": threads}


def test_a_growing_process_is_told_from_a_flat_one_after_warm_up():
    mb = 1 << 20
    samples = [
        _sample(
            t,
            {
                # grows 10 MiB an hour on 100 MiB: 10% an hour; a warm-up spike before 600 s
                "model-0": _proc(7, 100 * mb + (50 * mb if t < 600 else 0) + t * 10 * mb // 3600),
                "frontend": _proc(5, 200 * mb + (t % 20) * 1000),  # flat, noisy
            },
        )
        for t in range(0, 3600, 10)
    ]
    slopes = report.process_slopes(samples, warmup=600, span=3590)
    assert slopes["model-0"]["pct_per_hour"] == pytest.approx(10.0, rel=0.1)
    assert abs(slopes["frontend"]["pct_per_hour"]) < 0.1
    assert slopes["model-0"]["judged"] and slopes["model-0"]["from_s"] >= 600


def test_the_longest_lived_process_of_a_role_is_the_one_judged():
    samples = [_sample(t, {"model-0": _proc(1 if t < 100 else 2, 1000 + t)}) for t in range(300)]
    slopes = report.process_slopes(samples, warmup=10, span=299)
    assert slopes["model-0"]["pid"] == 2 and slopes["model-0"]["incarnations"] == 2


def test_each_life_shows_its_last_stretch_a_fill_that_levels_apart_from_a_leak():
    mb = 1 << 20

    def gcs(t):  # fills 6 MiB of code pages over its first 20 minutes, then flat
        files = 20 * mb + 6 * mb * min(t, 1200) // 1200
        return {"pid": 3, "rss": 30 * mb + files, "rss_file": files, "fds": 9, "threads": 9}

    def raylet(t):  # its own memory grows 3 MiB an hour for as long as it lives
        own = 10 * mb + t * 3 * mb // 3600
        return {
            "pid": 4 if t < 1800 else 5,
            "rss": 20 * mb + own,
            "rss_file": 20 * mb,
            "fds": 9,
            "threads": 9,
        }

    samples = [_sample(t, {"gcs": gcs(t), "raylet": raylet(t)}) for t in range(0, 3600, 10)]
    lives = report.life_slopes(samples, warmup=300)
    # the judged slope (from warm-up on) still sees the fill; the life's last stretch does not
    assert report.process_slopes(samples, 300, 3590)["gcs"]["pct_per_hour"] > 5
    (gcs_life,) = lives["gcs"]
    assert gcs_life["tail"]["from_s"] == 3590 - report.TAIL
    assert abs(gcs_life["tail"]["pct_per_hour"]) < 0.1
    assert [life["pid"] for life in lives["raylet"]] == [4, 5]
    for life in lives["raylet"]:
        x = life["tail"]
        assert x["slope_bytes_per_hour"] == pytest.approx(3 * mb, rel=0.02)
        assert x["own_slope_bytes_per_hour"] == pytest.approx(3 * mb, rel=0.02)


def test_errors_during_a_fault_are_its_own_and_an_error_without_a_message_is_unclean():
    events = [
        Event(10, "u", "chat", "user", error="transport ConnectError", message="refused"),
        Event(50, "u", "chat", "user", error="http 503 unavailable", message="restarting"),
        Event(200, "u", "chat", "user", error="stream ended early"),
        Event(300, "u", "chat", "user"),
    ]
    fault = [{"fault": "restart", "begin": 5, "end": 40}]
    e = report.error_figures(events, fault)
    assert e["by_fault"] == {"restart": 2}
    assert e["outside_faults"] == 1 and e["unclean"] == 1


def test_the_disk_peak_is_the_files_and_the_gap_is_against_the_engines_count():
    samples = [_sample(0, {}, 100, 100), _sample(5, {}, 300, 200), _sample(10, {}, 50, None)]
    d = report.disk_figures(samples, budget=250)
    assert d["peak_bytes"] == 300 > d["budget_bytes"] and d["largest_gap_bytes"] == 100


@pytest.mark.ray
def test_a_short_soak_survives_every_fault_within_the_bounds(tmp_path):
    """Two minutes of traffic on a real `lineage serve`, every fault once (the restart half
    way): faults survived, the disk within its budget, no orphaned file, no wrong reply,
    every error clean, warm after the restart. (The rates, RSS slopes and TTFT drift, are
    the long run's: two minutes cannot tell a slope.)"""
    out = tmp_path / "soak.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "LINEAGE_"))}
    env["PYTHONPATH"] = str(ROOT)
    command = [sys.executable, "-m", "clients.cli", "bench", "soak", "--minutes", "2"]
    command += ["--work-dir", str(tmp_path / "work"), "--json", str(out)]
    command += ["--sample-every", "2", "--disk-full", "4", "--long-sessions", "1"]
    command += ["--agents", "2", "--max-tokens", "8", "--probe-every", "10"]
    kinds = list(faults.ALL)
    if os.geteuid() != 0:  # the disk-full fault needs a filesystem of its own (a tmpfs)
        kinds.remove("disk")
    command += ["--faults", ",".join(kinds)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1200)
    assert out.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    f = json.loads(out.read_text())
    checks = f["verdict"]["checks"]
    assert sorted(x["fault"] for x in f["faults"]) == sorted(kinds)
    assert all(checks.values()), (checks, f["final"], f["faults"])
    assert done.returncode == 0
    assert f["probes"]["checked"] > len(f["probes"]["wrong"]) == 0
    assert f["final"]["files"] > 0
    samples = [
        json.loads(s) for s in (tmp_path / "work" / "samples.jsonl").read_text().split("\n") if s
    ]
    # the model actor was followed (the last samples may fall in the final stop, after it)
    assert len(samples) >= 20 and sum("model-0" in s["processes"] for s in samples) >= 10
    # and its compiled grammars read from the running engine (the agents' tools compile
    # some), never more than the soak's --grammar-cache (8) lets it keep
    assert 0 < f["grammars_held"]["max"] <= 8


FINAL = {
    "stop": {"seconds": 1.0, "returncode": 0, "killed": 0},
    "files": 3,
    "counted": 3,
    "orphaned": 0,
    "temps_left": [],
    "disk": {},
    "stats_disk_bytes": 100,
    "bytes_gap": 0,
    "cache": {},
}


def _soak():
    return SimpleNamespace(
        disk_budget=1000, serve=SimpleNamespace(starts=1, failed_starts=[]), sample_errors=[]
    )


def _args(minutes: float):
    return SimpleNamespace(
        minutes=minutes,
        warmup=None,
        window=None,
        ram_budget="8M",
        disk_budget="1K",
        scale=0.1,
        agents=2,
        tool_sets=16,
        grammar_cache=8,
        long_sessions=1,
        seed=0,
    )


def test_the_verdict_fails_on_an_orphaned_file_a_wrong_reply_or_a_disk_over_budget():
    samples = [_sample(t, {"model-0": _proc(7, 100 << 20)}, 100, 100) for t in range(0, 120, 2)]
    events = [Event(t, "u", "chat", "user", ttft_ms=50, prompt=100, cached=80) for t in range(120)]
    final, soak, args = FINAL, _soak(), _args(minutes=2)
    clean = report.figures(samples, events, [], Probes(), final, soak, args)
    assert clean["verdict"]["ok"], clean["verdict"]
    text = report.format_report(clean)
    assert "lineage bench soak" in text and "per life, its last 15 minutes" in text
    assert [life["pid"] for life in clean["lives"]["model-0"]] == [7]
    orphan = report.figures(samples, events, [], Probes(), final | {"orphaned": 1}, soak, args)
    assert not orphan["verdict"]["checks"]["no_orphaned_files"]
    wrong = Probes(wrong=[{"t": 5, "probe": 0, "got": [1], "want": [2]}])
    assert not report.figures(samples, events, [], wrong, final, soak, args)["verdict"]["ok"]
    full = [_sample(t, {}, 2000, 2000) for t in range(0, 120, 2)]
    over = report.figures(full, events, [], Probes(), final, soak, args)
    assert not over["verdict"]["checks"]["disk_within_budget"]


def test_the_rounds_draw_their_tools_from_a_few_sets_in_turn_with_new_system_prompts():
    from clients.bench.agents.traffic import build_traffic

    def seeds(tool_sets):
        rounds = Rounds("http://x", None, None, 10, 0.1, 2, 8, tool_sets)
        out = []
        for n in range(7):
            rounds.round = n
            out.append(rounds.tools_seed())
        return out

    assert seeds(3) == [10, 11, 12, 10, 11, 12, 10]
    assert seeds(0) == [10, 11, 12, 13, 14, 15, 16]  # every round's tools its own
    again = build_traffic(seed=13, scale=0.1, agents=2, tools_seed=10)
    first = build_traffic(seed=10, scale=0.1, agents=2)
    assert again.tools == first.tools  # the same installed agent's tools
    assert again.systems["main"] != first.systems["main"]  # a new team's system prompt
    assert build_traffic(seed=13, scale=0.1, agents=2).tools != first.tools


def test_the_grammars_the_replicas_hold_are_reported_first_last_and_most():
    samples = [_sample(t, {"model-0": _proc(7, 100 << 20)}) for t in range(0, 120, 2)]
    for s, held in zip(samples, [None, 0, 3, 5, 4] + [6] * 55):
        if held is not None:
            s["replicas"] = [{"name": "model-0", "grammars_held": held, "mlx_active_bytes": 1}]
    events = [Event(t, "u", "chat", "user", ttft_ms=50, prompt=100, cached=80) for t in range(120)]
    f = report.figures(samples, events, [], Probes(), FINAL, _soak(), _args(minutes=2))
    assert f["grammars_held"] == {"first": 0, "last": 6, "max": 6}
    assert re.search(r"grammars held +0 -> 6 \(max 6 of the 8 ", report.format_report(f))
    assert f["settings"]["tool_sets"] == 16 and f["verdict"]["checks"]["grammars_within_cache"]
    small = SimpleNamespace(**vars(_args(minutes=2)) | {"grammar_cache": 5})
    over = report.figures(samples, events, [], Probes(), FINAL, _soak(), small)
    assert not over["verdict"]["checks"]["grammars_within_cache"]  # 6 held, 5 kept at most


class _SlowInspect:
    """A client whose Inspect does not answer (a replica restarting after a kill: its
    stats call waits for the new life) until the call's own deadline, else `hangs` s."""

    def __init__(self, hangs: float):
        self.hangs = hangs

    def cache_stats(self) -> dict:
        return {"disk_bytes": 0}

    def inspect(self, recent: int = 20, model: str = "", timeout: float | None = None):
        time.sleep(self.hangs if timeout is None else min(timeout, self.hangs))
        raise RuntimeError("DEADLINE_EXCEEDED")


def test_a_replica_that_does_not_answer_inspect_delays_a_sample_by_one_interval_at_most(
    tmp_path,
):
    from clients.bench.soak.samples import Sampler
    from clients.bench.soak.users import Log

    soak = SimpleNamespace(
        log=Log(time.monotonic()),
        stopping=threading.Event(),
        client=_SlowInspect(hangs=8.0),
        entries=tmp_path / "entries",
        cache_dir=tmp_path,
        serve=SimpleNamespace(
            processes=lambda: {}, object_store_bytes=lambda: 0, log_bytes=lambda: {}
        ),
        probes=Probes(),
        schedule=None,
    )
    sampler = Sampler(soak, tmp_path / "samples.jsonl", every=0.5)
    t0 = time.monotonic()
    sample = sampler.sample(0.0)
    # the processes' RSS is read within about an interval of the sample's time, not after
    # the replica's restart; its grammars unread this time
    assert time.monotonic() - t0 < 2.0
    assert sample["replicas"] == []


def test_the_drift_holds_the_engine_to_the_bound_with_the_machines_own_speed_taken_out():
    def run(machine_slows: float, engine_slows: float) -> dict:
        samples = [
            _sample(t, {}) | {"reference_ms": 10.0 * (machine_slows if t >= 1800 else 1.0)}
            for t in range(0, 3600, 5)
        ]
        events = [
            Event(
                t,
                "u",
                "chat",
                "user",
                ttft_ms=200 * (machine_slows * engine_slows if t >= 1800 else 1),
            )
            for t in range(3600)
        ]
        return report.ttft_drift(events, 300, 3599, samples)

    machine = run(machine_slows=1.3, engine_slows=1.0)  # the same work, a slower machine
    assert machine["ratio"] == pytest.approx(1.3) and machine["reference_ratio"] == pytest.approx(
        1.3
    )
    assert machine["engine_ratio"] == pytest.approx(1.0)
    engine = run(machine_slows=1.0, engine_slows=1.3)  # the machine as fast, the engine slower
    assert engine["engine_ratio"] == pytest.approx(1.3) and 1.3 > report.DRIFT_BOUND
    bare = report.ttft_drift(  # no reference timed: the ratio itself is held to the bound
        [Event(t, "u", "chat", "user", ttft_ms=100 + t) for t in range(3600)], 300, 3599
    )
    assert bare["reference_ratio"] is None and bare["engine_ratio"] == bare["ratio"] > 1


def test_the_reference_work_is_timed_in_a_child_of_its_own():
    from clients.bench.soak.reference import Reference

    reference = Reference()
    try:
        times = [reference.time() for _ in range(3)]
    finally:
        reference.close()
    assert all(t is not None and 0 < t < 10_000 for t in times), times
    assert reference.process.returncode == 0  # it ends when its stdin closes
    assert reference.time() is None  # and says so when asked after


def test_a_reference_child_that_stalls_is_ended_and_the_sampler_goes_on(monkeypatch):
    import sys
    import threading

    from clients.bench.soak import reference

    monkeypatch.setattr(reference, "ANSWER_S", 1.0)
    stalled = reference.Reference([sys.executable, "-c", "import time; time.sleep(120)"])
    answers = []
    asking = threading.Thread(target=lambda: answers.append(stalled.time()), daemon=True)
    asking.start()
    asking.join(15)
    try:
        assert not asking.is_alive(), "the sampler waits on a stalled child for good"
        assert answers == [None] and stalled.process.poll() is not None
        assert stalled.time() is None  # and it stays gone
    finally:
        stalled.process.kill()
        stalled.close()


def test_a_run_long_enough_to_judge_rates_judges_each_of_the_engines_processes():
    mb = 1 << 20

    def samples(model_pid) -> list[dict]:
        return [
            _sample(
                t,
                {"frontend": _proc(5, 100 * mb), "cache-manager": _proc(6, 100 * mb)}
                | {"model-0": _proc(model_pid(t), 100 * mb)},
            )
            for t in range(0, 3600, 10)
        ]

    args = _args(minutes=60)
    whole = report.figures(samples(lambda t: 7), [], [], Probes(), FINAL, _soak(), args)
    assert whole["verdict"]["rates_judged"] and whole["verdict"]["ok"], whole["verdict"]
    # the model actor killed every 10 minutes: no life of it is long enough to judge
    killed = report.figures(samples(lambda t: 7 + t // 600), [], [], Probes(), FINAL, _soak(), args)
    assert killed["verdict"]["unjudged"] == ["model-0"]
    assert not killed["verdict"]["checks"]["engine_processes_judged"]
    assert not killed["verdict"]["ok"]


# A driver on the serve's Ray options (no metrics) holding 8 MiB in its object store.
HOLDER = """
import sys
import numpy as np, ray
from engine.config import EngineConfig
from engine.server.running.serve import ray_options
ray.init(**ray_options(EngineConfig().with_server(num_cpus=1, ray_namespace="soak-store")))
held = ray.put(np.ones(8 << 20, dtype=np.uint8))
print("held", flush=True)
sys.stdin.read()
"""


@pytest.mark.ray
def test_the_object_store_is_read_from_the_raylet_of_a_ray_without_metrics(tmp_path):
    from clients.bench.soak.serve import Serve

    serve = Serve(tmp_path, tmp_path / "cache", [], "soak-store")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "LINEAGE_"))}
    env.update(PYTHONPATH=str(ROOT), RAY_USAGE_STATS_ENABLED="0")
    serve.process = subprocess.Popen(
        [sys.executable, "-c", HOLDER],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert serve.process.stdout.readline().strip() == "held"
        assert "--metrics-port" not in serve.command()
        assert 8 << 20 <= serve.object_store_bytes() < 9 << 20
        channel = serve._store[1]  # one channel for the run, not one a sample
        assert 8 << 20 <= serve.object_store_bytes() < 9 << 20 and serve._store[1] is channel
    finally:
        serve.process.stdin.close()
        serve.kill()


def test_the_channel_to_the_raylet_is_closed_when_the_serve_stops(tmp_path):
    """The run's end (kill) and a restart's stop close the object-store reader's channel."""
    import grpc
    from ray.core.generated import node_manager_pb2

    from clients.bench.soak.serve import Serve, free_port

    serve = Serve(tmp_path, tmp_path / "cache", [], "soak-store")
    request = node_manager_pb2.GetNodeStatsRequest(include_memory_info=False)
    for end in (serve.kill, serve.stop):
        port = free_port()  # nobody listens: open, a call is refused by the peer
        serve._store = (port, *Serve._open_store(port))
        stub = serve._store[2]
        with pytest.raises(grpc.RpcError):
            stub.GetNodeStats(request, timeout=5)
        end()
        assert serve._store is None, "the channel was left open"  # (its repr holds the token)
        with pytest.raises(ValueError, match="closed channel"):
            stub.GetNodeStats(request, timeout=5)


@pytest.mark.ray
def test_the_front_ends_heap_is_compared_between_two_snapshots(model_cache_dir, tmp_path):
    """A real `lineage serve` with its heap traced writes a snapshot on SIGUSR2 (and keeps
    serving); two of them compare by line beside the RSS between them."""
    import threading

    from clients.bench.soak.heap import HeapTrace, format_growth
    from tests.serve_process import SERVING, stop

    trace = HeapTrace(SimpleNamespace(process=None), [0, 0], tmp_path / "heap", threading.Event())
    serve, log = start_serve(model_cache_dir, tmp_path, ready=(SERVING,), env=trace.environment())
    try:
        taken = [trace.take(serve.pid, minute) for minute in (0.5, 1.0)]
        trace.lives[serve.pid] = taken
        assert serve.poll() is None, log.read_text()[-3000:]
        (life,) = trace.growth()
    finally:
        stop(serve)
    assert life["traced_bytes"][0] > 1 << 20 and len(life["top"]) == 25
    assert life["malloc"]["arena"][0] > 0 and life["malloc"]["uordblks"][1] > 0
    assert life["gc"][1]["objects"][2] > 10_000 and len(life["gc"][1]["stats"]) == 3
    assert re.search(r"\.py:\d+$", life["top"][0]["line"]), life["top"][0]
    assert f"front end {serve.pid}" in format_growth([life])[0]


class _InProcess:
    """The two calls the disk fault makes of the soak's client, answered by an engine in
    this process (real MLX, manager and disk tier) as the server answers them. `room`: a
    file its first request deletes, as the engine's evictions free room on the full disk.
    `serve`: False, no request is served; "refused", each is refused with an error."""

    def __init__(self, engine, store, room: Path, serve: bool = True):
        self.engine, self.store, self.room, self.serve = engine, store, room, serve

    def generate(self, prompt_ids, max_tokens, namespace):
        from clients.client import LineageError

        self.room.unlink(missing_ok=True)
        if self.serve == "refused":  # as a server answers a request it cannot serve
            raise LineageError("UNAVAILABLE", "the engine refused the request")
        if self.serve:
            self.engine.run(prompt_ids, max_tokens=max_tokens, namespace=namespace)

    def cache_stats(self) -> dict:
        self.store.flush(5)
        self.engine.report_lost()
        return {"disk_writes_lost": self.engine.manager.stats().disk_writes_lost}


def test_a_disk_fault_whose_lost_write_count_cannot_be_read_first_is_not_survived(tmp_path):
    """The count read before the fault is its baseline: read as 0 when the serve does not
    answer, an earlier fault's lost writes would pass this one. The disk is never filled."""
    import time

    class Unreadable:
        def cache_stats(self):
            raise ConnectionError("the serve is restarting")

    class Untouched:
        mounted = True

        def fill(self):
            raise AssertionError("the disk was filled without a baseline")

    soak = SimpleNamespace(disk=Untouched(), client=Unreadable(), entries=tmp_path)
    start = time.monotonic()
    result = faults.Schedule(soak, [], SimpleNamespace(disk_full=1.0))._disk(start + 1.5)
    assert not result["survived"] and "could not be read" in result["why"], result
    assert time.monotonic() - start < 3


@pytest.mark.skipif(os.geteuid() != 0, reason="the disk-full fault mounts a tmpfs (as root)")
def test_the_disk_fault_keeps_the_disk_full_until_a_lost_write_is_reported(
    model_cache_dir, random_model_dir, tmp_path
):
    """Room freed on the full disk after it was filled (8 MiB, more than the window's
    writes need) is taken back, so the probes' writes are lost and reported; where no
    write comes due (or the serve refuses every request) the fault ends within its bound
    and says so."""
    import time

    from clients.bench.soak.disk import SmallDisk
    from tests.storage.full_disk import loaded, open_engine

    disk = SmallDisk(tmp_path / "cache", 64 << 20)
    assert disk.mount(), disk.why
    try:
        config, model = loaded(model_cache_dir, random_model_dir, disk.path)
        engine, store, _ = open_engine(config, model)
        args = SimpleNamespace(disk_full=1.0)
        for serve in (True, False, "refused"):
            room = disk.path / "room"
            room.write_bytes(b"\0" * (8 << 20))
            client = _InProcess(engine, store, room, serve)
            soak = SimpleNamespace(disk=disk, client=client, entries=store.directory)
            start = time.monotonic()
            result = faults.Schedule(soak, [], args)._disk(start + 60)
            if serve is True:
                assert result["survived"], result
            else:
                assert not result["survived"] and "no entry file was written" in result["why"]
                assert time.monotonic() - start < faults.FULL_AT_MOST + 3, result
        store.close(5)
    finally:
        disk.unmount()


@pytest.mark.skipif(os.geteuid() != 0, reason="the disk-full fault mounts a tmpfs (as root)")
def test_the_ballast_never_fills_the_disk_under_the_small_one_once_unmounted(tmp_path):
    """A fault still topping up its ballast as the soak ends (and unmounts the small disk)
    writes nothing: the directory is then the disk beneath it (here a tmpfs of its own)."""
    from clients.bench.soak.disk import BALLAST, SmallDisk

    beneath = SmallDisk(tmp_path / "beneath", 32 << 20)
    assert beneath.mount(), beneath.why
    try:
        disk = SmallDisk(beneath.path / "cache", 8 << 20)
        assert disk.mount(), disk.why
        assert 7 << 20 <= disk.fill() <= 8 << 20
        disk.empty()
        disk.unmount()
        assert disk.fill() == 0 and not (disk.path / BALLAST).exists()
        assert beneath.free() > 30 << 20
    finally:
        beneath.unmount()
