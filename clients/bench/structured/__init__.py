"""`lineage bench structured`: what holding the output to a grammar costs, and `n` branches.

In process (the server's own Generator on the calling thread, no Ray), on the
served model (the embedded one by default), all in one run:

1. decode: ms per batch step and tokens/s of B sequences (batch 1 and 8):
   free; held to the `tool_choice: required` grammar of a 10-tool agent set
   (its calls end, so fewer rows step: `rows`); held to the lazy `auto`
   grammar over the same tools (free text, masked every step: every row held
   in every step); mixed (half `auto`, half free: what the free rows' steps
   cost beside held ones); a warm round, then rounds interleaved, medians; the
   ratios against free are the figures (target: held <= 1.1x free at batch 8);
2. mask time per step: a matcher's mask plus its accept per token, walking the
   tool set's calls (batch 1: one row; batch 8: eight rows at staggered
   positions), at the model's vocabulary and, with `--large-tokenizer`, at a
   ~150k one;
3. compile time of the grammars, cold and cached (a deep copy of the pristine
   matcher);
4. `n = 4` against four requests of the same prompt: prefill tokens and wall
   time (target: one prefill, <= 0.4x the time).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from clients.bench.figures import Column, emit, median, percentile, table
from clients.bench.harness import add_serve_arguments, engine_config

HELP = "structured output: decode held to a tool schema vs free, mask and compile time, n=4 vs 4"
TOOLS_FILE = Path(__file__).with_name("agent_tools.json")  # 10 tools, a call each, an invoice
VARIANTS = ("free", "required", "auto", "mixed")


def agent_set() -> dict:
    return json.loads(TOOLS_FILE.read_text())


def grammars_of(tools: dict) -> dict:
    """The grammars measured, by name (engine.runtime.structured.grammar)."""
    from engine.runtime.structured.grammar import schema_grammar, tool_grammar

    return {
        "required": tool_grammar(tools["tools"], "required", output_format="qwen"),
        "auto": tool_grammar(tools["tools"], "auto", output_format="qwen"),
        "response": schema_grammar(tools["response_schema"], strict=True),
    }


# ---------------------------------------------------------------- decode ----


def decode_round(engine, variant: str, batch: int, steps: int, grammars: dict, seed: int) -> dict:
    """Time `steps` batch steps once all `batch` sequences decode; then cancel them."""
    import numpy as np

    from engine.cache.messages import PlanRequest
    from engine.runtime.events import Finished, Tokens
    from engine.runtime.requests import GenerationRequest, SamplingParams

    g, rng = engine.generator, np.random.default_rng(seed)
    counts: dict[str, int] = {}
    finals: list = []

    def emit_of(rid):
        def emit(event):
            if isinstance(event, Tokens):
                counts[rid] = counts.get(rid, 0) + len(event.ids)
            elif isinstance(event, Finished):
                finals.append(event)

        return emit

    rids = []
    for i in range(batch):
        held = variant != "free" and not (variant == "mixed" and i % 2)
        grammar = grammars["required" if variant == "required" else "auto"] if held else None
        rid = f"s-{variant}-{batch}-{seed}-{i}"
        tokens = [int(t) for t in rng.integers(10, engine.info.vocab_size - 10, size=64)]
        plan = engine.manager.plan(PlanRequest(rid, np.asarray(tokens, np.int32), 0, f"ns-{rid}"))
        sampling = SamplingParams(max_tokens=steps + 64, temperature=1.0, seed=seed + i)
        req = GenerationRequest(rid, f"ns-{rid}", tuple(tokens), plan, sampling, time.time())
        g.submit(req if grammar is None else _held(req, grammar), emit_of(rid))
        rids.append(rid)
    while g.bg.generating + len(finals) < batch:  # every sequence past its prefill
        g.step()
    before, rows, ms = sum(counts.values()), [], []
    for _ in range(steps):
        rows.append(g.bg.generating)
        t0 = time.perf_counter()
        g.step()
        ms.append((time.perf_counter() - t0) * 1000)
    tokens = sum(counts.values()) - before
    for rid in rids:
        g.cancel(rid)
    while g.busy or g.pending:
        g.step()
    return {"ms": ms, "tokens": tokens, "rows": sum(rows) / len(rows)}


def _held(req, grammar):
    import dataclasses

    return dataclasses.replace(req, grammar=grammar)


def decode_figures(engine, batches, steps: int, rounds: int, grammars: dict) -> list[dict]:
    out = []
    for batch in batches:
        runs: dict[str, list] = {v: [] for v in VARIANTS}
        for variant in VARIANTS:  # warm: MLX's compiled graphs, the grammars' first passes
            decode_round(engine, variant, batch, 4, grammars, 99)
        for r in range(rounds):  # interleaved: drift and other jobs hit every variant alike
            for variant in VARIANTS:
                runs[variant].append(decode_round(engine, variant, batch, steps, grammars, r))
        for variant, done in runs.items():
            ms = [m for d in done for m in d["ms"]]
            seconds = sum(sum(d["ms"]) for d in done) / 1000
            out.append(
                {
                    "batch": batch,
                    "variant": variant,
                    "step_p50_ms": median(median(d["ms"]) for d in done),
                    "step_p99_ms": percentile(ms, 99),
                    "step_mean_ms": sum(ms) / len(ms),
                    "tokens_per_s": sum(d["tokens"] for d in done) / seconds,
                    "rows": sum(d["rows"] for d in done) / len(done),
                }
            )
        free = next(r for r in out if r["batch"] == batch and r["variant"] == "free")
        for r in out:
            if r["batch"] == batch:
                r["vs_free"] = r["step_p50_ms"] / free["step_p50_ms"]
    return out


# ------------------------------------------------------------ mask, compile ----


def mask_figures(tokenizer, vocab: int, grammar, documents: list[str], eos: int) -> dict:
    """µs of mask + accept per token: one row walking each document, and 8 rows at staggered
    positions (a row that ends starts the next document on a fresh matcher)."""
    from engine.runtime.structured.matcher import Grammars

    grammars = Grammars(tokenizer, vocab, {eos})
    grammars.matcher(grammar)  # compiled once: the walks are a cached grammar's
    docs = [tokenizer.encode(d, add_special_tokens=False) + [eos] for d in documents]

    refused = [0]  # tokens the grammar refused: a walk off its documents (must stay 0)

    def step(c, token) -> float:
        t0 = time.perf_counter()
        c.mask()
        ok = c.accept(token)
        spent = (time.perf_counter() - t0) * 1e6
        refused[0] += not ok
        return spent

    one = [step(c, t) for d in docs for c in [grammars.matcher(grammar)] for t in d]
    rows = [[grammars.matcher(grammar), i % len(docs), 0] for i in range(8)]
    for i, row in enumerate(rows):  # staggered: row i is i * 7 tokens into its document
        for token in docs[row[1]][: i * 7]:
            row[0].accept(token)
        row[2] = i * 7
    eight = []
    for _ in range(sum(map(len, docs))):
        total = 0.0
        for row in rows:
            c, d, pos = row
            doc = docs[d]
            total += step(c, doc[pos])
            row[2] = pos + 1
            if row[2] == len(doc):  # its end accepted: the next document, a fresh matcher
                row[:] = [grammars.matcher(grammar), (d + 1) % len(docs), 0]
        eight.append(total)
    return {
        "vocab": vocab,
        "tokens": len(one),
        "batch1_p50_us": percentile(one, 50),
        "batch1_p99_us": percentile(one, 99),
        "batch1_mean_us": sum(one) / len(one),
        "batch8_p50_us": percentile(eight, 50),
        "batch8_p99_us": percentile(eight, 99),
        "batch8_mean_us": sum(eight) / len(eight),
        "refused": refused[0],
    }


def compile_figures(tokenizer, vocab: int, grammars: dict, eos: int) -> list[dict]:
    """ms to compile each grammar (a fresh cache: cold) and to take it again (cached)."""
    from engine.runtime.structured.matcher import Grammars

    out = []
    for name, grammar in grammars.items():
        cache = Grammars(tokenizer, vocab, {eos})
        _ = cache.tokenizer  # its tables are the model's, built once at load
        t0 = time.perf_counter()
        cache.matcher(grammar)
        cold = (time.perf_counter() - t0) * 1000
        t0 = time.perf_counter()
        cache.matcher(grammar)
        cached = (time.perf_counter() - t0) * 1000
        out.append({"grammar": name, "vocab": vocab, "cold_ms": cold, "cached_ms": cached})
    return out


# ---------------------------------------------------------------- n = 4 ----


def branches_round(engine, prompt: list[int], n: int, tag: str) -> dict:
    """Wall time and prefill tokens of one request of n branches, or of n requests."""
    import numpy as np

    from engine.cache.messages import PlanRequest
    from engine.runtime.events import Finished
    from engine.runtime.requests import GenerationRequest, SamplingParams

    g, finals = engine.generator, []
    count = 1 if n > 1 else 4
    t0 = time.perf_counter()
    for i in range(count):
        rid, ns = f"b-{tag}-{i}", f"ns-b-{tag}-{i}"
        plan = engine.manager.plan(PlanRequest(rid, np.asarray(prompt, np.int32), 0, ns))
        sampling = SamplingParams(max_tokens=16, temperature=1.0, seed=i, n=n)
        req = GenerationRequest(rid, ns, tuple(prompt), plan, sampling, time.time())
        g.submit(req, lambda e: isinstance(e, Finished) and finals.append(e))
    while g.busy or g.pending:
        g.step()
    wall = time.perf_counter() - t0
    prefilled = sum(f.prompt_tokens - f.cached_tokens for f in finals if f.index == 0)
    return {"wall_s": wall, "prefill_tokens": prefilled, "sequences": len(finals)}


def branch_figures(engine, prompt_tokens: int, rounds: int) -> dict:
    import numpy as np

    rng = np.random.default_rng(7)
    forked, separate = [], []
    for r in range(rounds):
        prompt = [int(t) for t in rng.integers(10, engine.info.vocab_size - 10, prompt_tokens)]
        forked.append(branches_round(engine, prompt, 4, f"n{r}"))
        separate.append(branches_round(engine, prompt, 1, f"s{r}"))
    n4, four = median(d["wall_s"] for d in forked), median(d["wall_s"] for d in separate)
    return {
        "prompt_tokens": prompt_tokens,
        "n4_wall_s": n4,
        "four_wall_s": four,
        "ratio": n4 / four,
        "n4_prefill_tokens": forked[0]["prefill_tokens"],
        "four_prefill_tokens": separate[0]["prefill_tokens"],
        "n4_sequences": forked[0]["sequences"],
    }


# ------------------------------------------------------------------ run ----


def run_bench(config, batches, steps: int, rounds: int, large: str | None, prompt: int) -> dict:
    from engine.runtime.local import LocalEngine

    engine = LocalEngine(config)
    tools = agent_set()
    grammars = grammars_of(tools)
    hf = engine.tokenizer._tokenizer
    eos = engine.tokenizer.eos_token_id
    calls = [f"<tool_call>\n{json.dumps(c)}\n</tool_call>" for c in tools["calls"]]
    vocab = engine.info.vocab_size
    out = {
        "model": engine.info.path,
        "decode": decode_figures(engine, batches, steps, rounds, grammars),
        "mask": [mask_figures(hf, vocab, grammars["required"], calls, eos)],
        "compile": compile_figures(hf, vocab, grammars, eos),
        "branches": branch_figures(engine, prompt, rounds),
    }
    if large:  # a ~150k tokenizer (e.g. one trained with scripts/train_tokenizer.py)
        from transformers import PreTrainedTokenizerFast

        big = PreTrainedTokenizerFast(tokenizer_file=large)
        size, end = len(big), big.convert_tokens_to_ids("<|im_end|>")
        out["mask"].append(mask_figures(big, size, grammars["required"], calls, end))
        out["compile"] += compile_figures(big, size, grammars, end)
    engine.generator.close()  # its prefill worker thread, before the process exits
    return out


def report(out: dict) -> str:
    lines = [f"model {out['model']}", "", "decode (ms per batch step, interleaved rounds):"]
    columns = [
        Column("batch", 5),
        Column("variant", 9),
        Column("p50 ms", 8, ".2f"),
        Column("p99 ms", 8, ".2f"),
        Column("mean ms", 8, ".2f"),
        Column("tokens/s", 9, ".1f"),
        Column("rows", 5, ".1f"),
        Column("vs free", 8, ".3f"),
    ]
    keys = ("batch", "variant", "step_p50_ms", "step_p99_ms", "step_mean_ms", "tokens_per_s")
    rows = [[r[k] for k in keys] + [r["rows"], r["vs_free"]] for r in out["decode"]]
    lines += table(columns, rows, "  ")
    lines += ["", "mask + accept per token (µs, p50 / p99 / mean):"]
    for m in out["mask"]:
        lines.append(
            f"  vocab {m['vocab']:>7}: batch 1 {m['batch1_p50_us']:.1f} / "
            f"{m['batch1_p99_us']:.1f} / {m['batch1_mean_us']:.1f}; 8 rows "
            f"{m['batch8_p50_us']:.1f} / {m['batch8_p99_us']:.1f} / {m['batch8_mean_us']:.1f} "
            f"({m['tokens']} tokens, {m['refused']} refused)"
        )
    lines += ["", "compile (ms): cold / cached"]
    for c in out["compile"]:
        lines.append(
            f"  {c['grammar']:<9} vocab {c['vocab']:>7}: {c['cold_ms']:.2f} / {c['cached_ms']:.3f}"
        )
    b = out["branches"]
    lines += [
        "",
        f"n=4 against four requests, a {b['prompt_tokens']}-token prompt: prefill tokens "
        f"{b['n4_prefill_tokens']} against {b['four_prefill_tokens']}, wall "
        f"{b['n4_wall_s']:.2f} s against {b['four_wall_s']:.2f} s (ratio {b['ratio']:.2f}; "
        f"{b['n4_sequences']} sequences)",
    ]
    return "\n".join(lines)


def add_arguments(p) -> None:
    add_serve_arguments(p)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--steps", type=int, default=32, help="timed decode steps per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prompt-tokens", type=int, default=1024, help="n=4's prompt")
    p.add_argument(
        "--large-tokenizer", help="a tokenizer.json of a ~150k vocabulary: its mask and compile"
    )
    p.add_argument("--json", help="write the figures to this file")


def run(args) -> int:
    config = engine_config(args)
    out = run_bench(
        config, args.batches, args.steps, args.rounds, args.large_tokenizer, args.prompt_tokens
    )
    return emit(out, args, report)
