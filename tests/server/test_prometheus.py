"""The metrics as a real Prometheus sees them, and the rules we ship (docs/prometheus/).

Debian's `prometheus` (with `promtool`; .ci/run installs it): the rules pass
`promtool check rules` and their unit tests (`promtool test rules`). The session's
real `lineage serve --http-port --metrics-port` (the `served` fixture) is scraped
every second by a Prometheus on a free loopback port, with its own storage and
our rules loaded; PromQL over its HTTP API then finds the engine's series: one
request counted per request (an `n=4` request is one), its tokens, the RAM
tier's budget, the grammar cache's compiles and hits, the memory shares' parts,
and a recording rule's result. Counters are read as their growth over this test's
requests: another test may have used the process before.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import httpx
import pytest

from tests.serve_process import free_port, stop

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "docs" / "prometheus" / "lineage.rules.yml"
pytestmark = pytest.mark.skipif(
    not (shutil.which("prometheus") and shutil.which("promtool")),
    reason="needs Debian's prometheus (prometheus and promtool: apt-get install prometheus)",
)


SCHEMA = {
    "response_format": {
        "type": "json_schema",
        "json_schema": {
            "name": "prime",
            "strict": True,
            "schema": {
                "type": "object",
                "properties": {"n": {"enum": [2, 3, 5, 7]}},
                "required": ["n"],
                "additionalProperties": False,
            },
        },
    }
}


def test_the_rules_we_ship_pass_promtool():
    checked = subprocess.run(
        ["promtool", "check", "rules", str(RULES)], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run(
        ["promtool", "test", "rules", "lineage.rules.test.yml"],
        capture_output=True,
        text=True,
        cwd=RULES.parent,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr


def _until(read, deadline: float, what: str):
    last = None
    while time.monotonic() < deadline:
        last = read()
        if last:
            return last
        time.sleep(1)
    raise AssertionError(f"{what}: {last!r}")


class Prometheus:
    """A Prometheus scraping 127.0.0.1:`target` every second, with our rules, on a free port."""

    def __init__(self, target: int, workdir: Path):
        self.port = free_port()
        config = workdir / "prometheus.yml"
        config.write_text(
            json.dumps(  # YAML is a superset of JSON
                {
                    "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                    "rule_files": [str(RULES)],
                    "scrape_configs": [
                        {
                            "job_name": "lineage",
                            "static_configs": [{"targets": [f"127.0.0.1:{target}"]}],
                        }
                    ],
                }
            )
        )
        command = [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
        ]
        self.log = (workdir / "prometheus.log").open("w+")
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT)

    def query(self, promql: str) -> list:
        """The instant vector of `promql` ([] while Prometheus is starting or it is empty)."""
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode(
            {"query": promql}
        )
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                body = json.loads(r.read())
        except OSError:
            assert self.process.poll() is None, Path(self.log.name).read_text()[-3000:]
            return []
        assert body["status"] == "success", body
        return body["data"]["result"]

    def value(self, promql: str) -> float | None:
        result = self.query(promql)
        return float(result[0]["value"][1]) if result else None

    def stop(self) -> None:
        stop(self.process, signal.SIGTERM)
        self.log.close()


def test_prometheus_scrapes_and_queries_lineage_serve(served, tmp_path):
    prometheus = Prometheus(served.metrics, tmp_path)
    try:
        _queries(prometheus, served.http)
    finally:
        prometheus.stop()


def _queries(prometheus: Prometheus, http: int) -> None:
    up = "up{job='lineage'}"
    _until(lambda: prometheus.value(up) == 1, time.monotonic() + 60, "no scrape")
    requests = "sum(ray_lineage_requests_total)"
    ttfts = "sum(ray_lineage_ttft_ms_count)"
    compiles = "sum(ray_lineage_grammar_compiles_total)"
    hits = "sum(ray_lineage_grammar_hits_total)"
    grammars = "sum(ray_lineage_grammars)"
    before = {q: prometheus.value(q) or 0 for q in (requests, ttfts, compiles, hits, grammars)}

    def grew(q: str) -> float | None:
        value = prometheus.value(q)
        return None if value is None else value - before[q]

    messages = [
        {"role": "system", "content": "You answer in one short sentence."},
        {"role": "user", "content": "Name a prime number."},
    ]
    answered = 0  # the requests that produced a token: a time to first token each
    with httpx.Client(base_url=f"http://127.0.0.1:{http}", timeout=120) as client:
        for n in (1, 4, 1):
            body = {"model": "lineage", "messages": messages, "max_tokens": 4, "n": n}
            reply = client.post("/v1/chat/completions", json=body)
            assert reply.status_code == 200, reply.text
            assert len(reply.json()["choices"]) == n
            answered += reply.json()["usage"]["completion_tokens"] > 0
        for _ in range(2):  # one schema twice: compiled once, then a hit
            body = {"model": "lineage", "messages": messages, "max_tokens": 8}
            reply = client.post("/v1/chat/completions", json={**body, **SCHEMA})
            assert reply.status_code == 200, reply.text
            answered += reply.json()["usage"]["completion_tokens"] > 0
    # Five requests, one of them of four branches: five counted. Each series is exported
    # on its own, so one scrape may hold some of them before the others.
    deadline = time.monotonic() + 90
    _until(lambda: grew(requests) == 5, deadline, "requests_total")
    _until(lambda: grew(ttfts) == answered, deadline, "ttft_ms_count")
    prompt = prometheus.value('sum(ray_lineage_tokens_total{kind="prompt"})')
    cached = prometheus.value('sum(ray_lineage_tokens_total{kind="cached"})')
    assert prompt > 0 and 0 < cached < prompt, (prompt, cached)
    budget = 'sum(ray_lineage_tier_budget_bytes{tier="ram"})'
    assert prometheus.value(budget) == 1 << 30
    _until(lambda: grew(compiles) == 1, deadline, "grammar compiles")
    _until(lambda: grew(hits) == 1, deadline, "grammar hits")
    assert grew(compiles) == 1 and grew(grammars) == 1
    plan = 'ray_lineage_memory_plan_bytes{part="%s"}'
    assert prometheus.value(plan % "ram_tier") == 1 << 30
    assert prometheus.value(plan % "weights") > 0
    assert prometheus.value(plan % "draft") == 0  # no draft model
    ratio = "lineage:cache_hit_ratio:rate5m"  # our recording rule, evaluated
    _until(lambda: prometheus.query(ratio), deadline, "the recording rule")
