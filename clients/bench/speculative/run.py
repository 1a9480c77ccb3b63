"""The run of `bench speculative`: in-process engines per draft mode, the traffics in turn.

One model is loaded once and served by one LocalEngine per mode (`off` and
each speculative mode asked), in this process, so the figures are the model
loop's own (no transport). For each traffic and stream count every mode runs
the same prompts one after the other, so each ratio to `off` compares runs
seconds apart. Greedy: each mode's token ids are compared with `off`'s. A
traffic with a schema (`tool_schema`) sends it as each request's constraint,
so `off` is masked plain decoding and the others speculate under the matcher.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from clients.bench.decode.layers import LayerRun, StreamFigures
from clients.bench.harness import engine_config, model_path
from clients.bench.speculative.traffic import prompt, schema


def measure(args: argparse.Namespace) -> dict:
    from engine.runtime.local import LocalEngine
    from engine.runtime.model.loader import load_model

    # --draft-model is the modes' (the serve config refuses it beside --speculative off)
    draft_model, args.draft_model = args.draft_model, None
    config = engine_config(args)
    model_dir = model_path(config.model.path)
    config = dataclasses.replace(config, model=dataclasses.replace(config.model, path=model_dir))
    loaded = load_model(config)
    tokenizer = loaded[1]
    if draft_model is None and "draft" in args.modes:
        draft_model = _default_draft(config)
    if draft_model is not None:
        from engine.runtime.model.draft_files import check_draft

        check_draft(draft_model, tokenizer)
    engines = {}
    for mode in ["off", *args.modes]:
        speculative = mode.removesuffix("-whole")
        # lookup, mtp, draft: K fixed (--lookup-k, --mtp-k, --draft-k); auto: K adapted per
        # sequence and step
        k = {"lookup": args.lookup_k, "mtp": args.mtp_k, "draft": args.draft_k}.get(speculative)
        model = dataclasses.replace(
            config.model,
            speculative=speculative,
            num_draft_tokens=k,
            draft_model=draft_model if speculative in ("draft", "auto") else None,
        )
        engines[mode] = LocalEngine(dataclasses.replace(config, model=model), loaded=loaded)
        if mode.endswith("-whole"):  # its rollbacks replay the whole model, not the mixers
            engines[mode].generator.bg._generation_batch.taps = None
    try:
        rows = _traffics(args, tokenizer, engines)
    finally:
        for engine in engines.values():
            engine.generator.close()
    _ratios(rows)
    return {
        "model": model_dir,
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "tokens": args.tokens,
        "lookup_k": args.lookup_k,
        "mtp_k": args.mtp_k,
        "draft_k": args.draft_k,
        "draft_model": draft_model,
        "runs": rows,
    }


def _default_draft(config) -> str:
    """The embedded model's trained draft (engine/runtime/model/assets/draft), for it only."""
    from engine.runtime.model.tiny_models import DRAFT_DIR

    if not (DRAFT_DIR / "config.json").exists():
        raise ValueError(f"--draft-model: none given and none shipped at {DRAFT_DIR}")
    return str(DRAFT_DIR)


def _traffics(args: argparse.Namespace, tokenizer, engines: dict) -> list:
    """Per traffic and stream count, every mode on the same prompts, `off` first."""
    rows = []
    for traffic in args.traffic:
        prompts = [
            tokenizer.encode(prompt(traffic, i), add_special_tokens=False)
            for i in range(max(args.streams))
        ]
        held = schema(traffic)
        if held is not None:
            from engine.runtime.structured.grammar import schema_grammar

            held = schema_grammar(held, strict=True)
        for k in args.streams:
            replies = {}
            for mode, engine in engines.items():
                before = _batch_stats(engine)
                run, ids, drafts = _run(engine, prompts[:k], args.tokens, held)
                replies[mode] = ids
                row = _row(traffic, k, mode, run, drafts, ids == replies["off"])
                row["steps"] = _steps(before, _batch_stats(engine))
                rows.append(row)
                print(
                    f"  {traffic:<9} {k} x {args.tokens} {mode:<12} "
                    f"{run.per_stream_tps:7.1f} tok/s/stream {run.aggregate_tps:7.1f} aggregate",
                    flush=True,
                )
    return rows


def _run(engine, prompts: list, tokens: int, grammar=None):
    """Every prompt as one request (held to `grammar`, if one) on the engine's Generator,
    stepped here until all end."""
    import numpy as np

    from engine.cache.messages import PlanRequest
    from engine.runtime.events import Finished, Tokens
    from engine.runtime.requests import GenerationRequest, SamplingParams

    g = engine.generator
    n = len(prompts)
    times: list[list[float]] = [[] for _ in range(n)]
    ids: list[list[int]] = [[] for _ in range(n)]
    finals: list = [None] * n
    since = time.perf_counter()
    for i, p in enumerate(prompts):
        rid = f"spec-{time.monotonic_ns()}-{i}"
        plan = engine.manager.plan(PlanRequest(rid, np.asarray(p, dtype=np.int32), 0, rid))

        def emit(event, i=i) -> None:
            if isinstance(event, Tokens) and event.ids:
                times[i].append(time.perf_counter())
                ids[i].extend(event.ids)
            elif isinstance(event, Finished):
                finals[i] = event

        sampling = SamplingParams(max_tokens=tokens)
        request = GenerationRequest(
            rid, rid, tuple(p), plan, sampling, time.time(), grammar=grammar
        )
        g.submit(request, emit)
    while g.busy or g.pending:
        g.step()
    wall = time.perf_counter() - since
    figures = [StreamFigures(len(ids[i]), times[i][0], times[i][-1], since) for i in range(n)]
    drafted = sum(f.timing.drafted for f in finals)
    accepted = sum(f.timing.accepted for f in finals)
    steps = sum(f.timing.draft_steps for f in finals)
    complete = all(f.finish_reason.value == "stop" and not f.incomplete for f in finals)
    return LayerRun("loop", figures, wall_s=wall), ids, (drafted, accepted, steps, complete)


def _batch_stats(engine) -> dict:
    """The speculating batch's counters now (empty under `off`)."""
    stats = getattr(engine.generator.bg._generation_batch, "stats", None)
    if stats is None:
        return {}
    keys = (
        "verify_steps",
        "plain_steps",
        "replays",
        "verify_ms",
        "replay_ms",
        "plain_ms",
        "matcher_ms",
        "grammar_cut",
        "head_ms",
    )
    return {key: getattr(stats, key) for key in keys}


def _steps(before: dict, after: dict) -> dict:
    """Mean ms of a verify forward, a rollback's replay and a plain step during one run."""
    if not after:
        return {}
    d = {key: after[key] - before[key] for key in after}
    return {
        "verify_steps": d["verify_steps"],
        "plain_steps": d["plain_steps"],
        "replays": d["replays"],
        "verify_ms": round(d["verify_ms"] / d["verify_steps"], 3) if d["verify_steps"] else 0.0,
        "replay_ms": round(d["replay_ms"] / d["replays"], 3) if d["replays"] else 0.0,
        "plain_ms": round(d["plain_ms"] / d["plain_steps"], 3) if d["plain_steps"] else 0.0,
        # the MTP head's forward after each verify (its drafts for the next step)
        "head_ms": round(d["head_ms"] / d["verify_steps"], 3) if d["verify_steps"] else 0.0,
        # constrained rows' matcher work (masks, rollbacks) within a verify step
        "matcher_ms": round(d["matcher_ms"] / d["verify_steps"], 3) if d["verify_steps"] else 0.0,
        "grammar_cut": d["grammar_cut"],
    }


def _row(traffic: str, k: int, mode: str, run: LayerRun, drafts, identical: bool) -> dict:
    drafted, accepted, steps, complete = drafts
    return {
        "traffic": traffic,
        "mode": mode,
        "streams": k,
        "tokens_received": [s.tokens for s in run.streams],
        "per_stream_tps": round(run.per_stream_tps, 1),
        "aggregate_tps": round(run.aggregate_tps, 1),
        "wall_s": round(run.wall_s, 3),
        "drafted": drafted,
        "accepted": accepted,
        "acceptance": round(accepted / drafted, 3) if drafted else 0.0,
        # tokens a verify step emits per stream: the current one and the accepted drafts
        "mean_accepted_length": round(1 + accepted / steps, 2) if steps else 0.0,
        "identical_to_off": identical,
        # every reply ended by its own end (a held reply: complete for its grammar)
        "complete": complete,
    }


def _ratios(rows: list) -> None:
    off = {(r["traffic"], r["streams"]): r for r in rows if r["mode"] == "off"}
    for r in rows:
        base = off[(r["traffic"], r["streams"])]
        for key in ("per_stream_tps", "aggregate_tps"):
            r[f"{key}_vs_off"] = round(r[key] / base[key], 3) if base[key] else 0.0
