"""`lineage bench agents`: one agent traffic against every cache policy, beside the oracle.

In one run, the same seeded traffic (clients.bench.agents.traffic) goes to
- the real server and model in `lineage`, `exact` and `off` cache modes: three
  engines started in this process one after the other, each with a fresh
  cache directory, driven through `Client` with one thread per lane
  (clients.bench.agents.engines);
- mlx-lm's own server prompt cache (`LRUPromptCache`, same model, same byte
  budget), driven as mlx_lm.server's batch path drives it: fetch_nearest_cache
  at admission, the system segment stored when its prefill ends, the rest
  prefilled, greedy decode, insert_cache of prompt + completion
  (clients.bench.agents.mlx_lm_cache);
- a real `mlx_lm.server` subprocess on the same model directory
  (clients.bench.peer), fed the same messages and tools through its OpenAI
  HTTP API, one thread per lane (a dropped stream hangs up after its drop
  point, as ours is cancelled there); and so mlx-vlm's server (`mlx_vlm`, its
  prefix cache on; asked by name, and by default under `--kernels peers`;
  clients.bench.peers makes its venv), skipped with its reason where it cannot run;
- with `--api chat,messages,responses`, instead of the above: the lineage engine
  behind the HTTP bridge, once per wire format (clients.bench.agents.wire_apis);
- the oracle (clients.bench.agents.observed): for each request, the longest prefix
  its prompt shares with the prompt of any request of an earlier step, or
  with prompt + completion of any earlier completed one (capped at the prompt
  length minus 1).

Requests of one step run concurrently; a step starts when the previous one has
ended, so "earlier" is the same for every policy. Replies are appended to the
conversations as each policy's model produced them, so each policy has its own
oracle; they coincide when the replies do. Prompt ids are rendered and
tokenized in this process exactly as the front end does
(clients.bench.agents.prompt_ids), and checked against the engine's
`usage.prompt_tokens`.

The flags, and the BenchOptions read from them, are in clients.bench.agents.options;
the records are clients.bench.agents.observed's, the figures clients.bench.agents.report's.
This module runs the policies in turn (`run_bench`) and is the command's way in
(`add_arguments`, `run`).
Cheap to import: MLX, mlx-lm, Ray and matplotlib are imported inside the functions.
"""

from __future__ import annotations

import os
import tempfile

from clients.bench.agents.drive import drive
from clients.bench.agents.engines import engine_config, run_engine
from clients.bench.agents.observed import PEER_SERVERS, POLICIES, Observed, PolicyRun
from clients.bench.agents.options import BenchOptions, add_arguments, options_from_args
from clients.bench.agents.prompt_ids import PromptIds
from clients.bench.agents.report import format_table, plot, summarize
from clients.bench.agents.traffic import Traffic, build_traffic
from clients.bench.figures import emit, plot_ready
from clients.bench.harness import own_ray

HELP = "agent traffic against lineage, exact, off and mlx-lm's prompt cache, beside the oracle"


# ------------------------------------------------------- mlx-lm and peers ----


def run_peer_server(
    name: str, traffic: Traffic, opts: BenchOptions, ids: PromptIds
) -> PolicyRun | str:
    """The traffic against a real peer server subprocess (`mlx_lm_server`, `mlx_vlm`:
    clients.bench.peers), concurrently per step; or why that peer cannot run here."""
    from concurrent.futures import ThreadPoolExecutor

    from clients.bench.concurrency.senders import PEER_RUNS
    from clients.bench.peers import start_or_reason

    server, reason = start_or_reason(PEER_RUNS[name], opts.model)
    if reason:
        return reason
    with server, ThreadPoolExecutor(max(1, traffic.agents)) as pool:

        def send(spec, messages):
            return server.stream(messages, traffic.tools, spec.max_tokens, spec.drop_after)

        def serve(batch):
            futures = [pool.submit(send, spec, messages) for spec, messages, _ in batch]
            for (spec, _, prompt), future in zip(batch, futures):
                reply = future.result()
                done = reply.completed
                completion = ids.tokenizer.encode(reply.text, add_special_tokens=False)
                ob = Observed(spec.rid, spec.step, spec.lane, spec.kind, prompt, completion, done)
                if done:
                    ob.cached, ob.ttft_ms = reply.cached_tokens, reply.ttft_ms
                yield ob, reply.text

        def sample():  # its cache figures are not exposed: only the replies' usage
            return {"ram_bytes": 0, "disk_bytes": 0, "evictions": 0, "disk_bytes_written": 0}

        return drive(name, traffic, ids, serve, sample)


def run_mlx_lm(traffic: Traffic, opts: BenchOptions, ids: PromptIds) -> PolicyRun:
    """The traffic against mlx-lm's LRUPromptCache, in this process, as its server drives it
    (clients.bench.agents.mlx_lm_cache)."""
    from clients.bench.agents.mlx_lm_cache import MlxLmPromptCache

    policy = MlxLmPromptCache(opts.model, opts.ram_budget, opts.prefill_step_size)

    def system_end(messages, prompt):
        return ids.system_end(messages, traffic.tools, prompt)

    return drive("mlx_lm", traffic, ids, lambda b: policy.serve(b, system_end), policy.sample)


# --------------------------------------------------------------------- run ----


def run_bench(opts: BenchOptions) -> dict:
    """Every policy on the same traffic; the report (JSON-ready). Ray must be initialized
    when an engine policy is asked for."""
    import shutil

    from clients.bench.agents import wire_apis
    from clients.bench.agents.replicas import parse

    unknown = [p for p in opts.policies if p not in POLICIES + PEER_SERVERS and not parse(p)]
    unknown += [a for a in opts.apis if a not in wire_apis.APIS]
    if unknown:
        raise ValueError(
            f"unknown policies or APIs {unknown} (use some of {', '.join(POLICIES)}; "
            f"--api: {', '.join(wire_apis.APIS)})"
        )
    traffic = build_traffic(opts.seed, opts.scale, opts.agents, opts.variants, opts.message_edits)
    ids = PromptIds(opts.model)
    runs, chain, skipped = {}, None, {}
    work = tempfile.mkdtemp(prefix="lineage-bench-agents-", dir=opts.work_dir)
    try:
        for api in opts.apis:  # one fresh engine and bridge per wire format
            path = os.path.join(work, api)
            config = engine_config("lineage", opts, path, 1)
            runs[f"lineage_{api}"] = wire_apis.run_api(
                api, traffic, ids, config, os.path.join(path, "responses")
            )
        if "responses" in opts.apis:
            path = os.path.join(work, "chain")
            config = engine_config("lineage", opts, path, 1)
            chain = wire_apis.chain_figures(traffic, ids, config, os.path.join(path, "responses"))
        for name in () if opts.apis else opts.policies:
            if name == "mlx_lm":
                runs[name] = run_mlx_lm(traffic, opts, ids)
            elif name in PEER_SERVERS:
                got = run_peer_server(name, traffic, opts, ids)
                if isinstance(got, str):
                    print(f"{name}: skipped: {got}", flush=True)
                    skipped[name] = got
                else:
                    runs[name] = got
            else:
                mode, count = parse(name) or (name, 1)
                path = os.path.join(work, name)
                runs[name] = run_engine(mode, traffic, opts, ids, path, count)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    phases = {r.rid: r.phase for r in traffic.requests if r.phase}
    policies = {name: summarize(run, phases) for name, run in runs.items()}
    first = next(iter(policies.values()))
    replies = {
        name: {o.rid: o.completion for o in run.observed if o.completed}
        for name, run in runs.items()
    }
    base = next(iter(replies.values()))
    apis = {}
    if opts.apis:
        shares = {api: policies[f"lineage_{api}"]["oracle_fraction"] for api in opts.apis}
        apis = {"oracle_fraction": shares, "spread": max(shares.values()) - min(shares.values())}
        apis |= {"chain": chain} if chain else {}
    return {
        "traffic": traffic.summary(),
        "model": opts.model,
        "ram_budget": opts.ram_budget,
        "oracle": {
            "cached_tokens": policies.get("lineage", first)["oracle_cached_tokens"],
            "per_policy": {n: p["oracle_cached_tokens"] for n, p in policies.items()},
            # Replies are the model's own: a policy whose replies differ has its own oracle.
            "replies_differ": [
                n for n, r in replies.items() if any(r.get(k, v) != v for k, v in base.items())
            ],
        },
        "policies": policies,
        **({"skipped": skipped} if skipped else {}),
        **({"apis": apis} if apis else {}),
    }


def run(args) -> int:
    """`lineage bench agents`: print the table; write --json and --plot when asked."""
    if not plot_ready(args, "lineage bench agents"):
        return 1
    opts = options_from_args(args)
    engines = opts.apis or [p for p in opts.policies if p != "mlx_lm" and p not in PEER_SERVERS]
    with own_ray(needed=bool(engines)):
        report = run_bench(opts)
    return emit(report, args, format_report, plot)


def format_report(report: dict) -> str:
    """The policies' table, then with --api the wire formats' spread and the chain's turns."""
    text = format_table(report)
    apis = report.get("apis")
    if not apis:
        return text
    from clients.bench.agents.wire_apis import format_chain

    shares = ", ".join(f"{a} {f:.2%}" for a, f in apis["oracle_fraction"].items())
    text += f"\ncached share of the oracle by wire format: {shares}; spread {apis['spread']:.2%}"
    return text + ("\n" + format_chain(apis["chain"]) if apis.get("chain") else "")


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="lineage bench agents", description=HELP)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
