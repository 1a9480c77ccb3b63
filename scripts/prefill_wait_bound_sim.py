"""The prefill policy's wait bound on a simulated prompt stream: its cost at the median TTFT
and its gain for the long prompts, in the policy's own time (prompt tokens of chunks run:
no cost is measured here, so its clock counts tokens).

`python scripts/prefill_wait_bound_sim.py`: a seeded stream of prompts (nine in ten
80-300 tokens, one in ten 1,500-5,500), offered at 0.7 and 0.9 of what one 256-token
chunk per step prefills, nothing decoding; each prompt's wait from arrival to its
prefill's end, under fifo, srpt with aging alone (`--prefill-wait-bound 0`) and srpt
with the bound at 2 and 4. Pure Python on engine.runtime.batching.prefill_policy: no
MLX, no clock, a few seconds. The engine's own figures come from `lineage bench
concurrency` (runs srpt and srpt-unbounded).
"""

from __future__ import annotations

import random
import statistics

from engine.runtime.batching.prefill_policy import Candidate, PrefillScheduler

BUDGET, STEPS, SEEDS, LONG = 256, 6000, 5, 1500


def stream(seed: int, load: float) -> dict:
    rng, arrivals, uid = random.Random(seed), {}, 0
    for step in range(STEPS):
        if rng.random() < load * BUDGET / 700:  # 700: the mean prompt
            uid += 1
            tokens = rng.randint(1500, 5500) if rng.random() < 0.1 else rng.randint(80, 300)
            arrivals.setdefault(step, []).append((uid, tokens))
    return arrivals


def waits(s: PrefillScheduler, arrivals: dict) -> list[tuple[int, int]]:
    """(work from arrival to prefill end, prompt tokens) of each prompt that ended."""
    live, out = {}, []
    for step in range(STEPS):
        for uid, tokens in arrivals.get(step, ()):
            live[uid] = {"left": tokens, "arrived": step, "at": s.clock, "tokens": tokens}
            live[uid].update(cohort=None, since=None)
        waiting = [
            Candidate(u, v["left"], v["left"], v["arrived"], v["cohort"], waiting_since=v["since"])
            for u, v in live.items()
        ]
        chunk = s.next_chunk(waiting, step)
        if chunk is None:
            s.clock += BUDGET  # an idle step passes
            continue
        for uid in chunk.uids:
            v = live[uid]
            v["left"] -= chunk.tokens
            v["cohort"], v["since"] = uid, step
            if v["left"] <= 0:
                out.append((s.clock - v["at"], v["tokens"]))
                del live[uid]
    return out


def main() -> None:
    policies = {
        "fifo": dict(schedule="fifo"),
        "srpt, aging alone": dict(schedule="srpt", wait_bound=0),
        "srpt, bound 2": dict(schedule="srpt", wait_bound=2.0),
        "srpt, bound 4": dict(schedule="srpt", wait_bound=4.0),
    }
    for load in (0.7, 0.9):
        for name, kwargs in policies.items():
            p50, worst = [], []
            for seed in range(SEEDS):
                got = waits(PrefillScheduler(budget=BUDGET, **kwargs), stream(seed, load))
                p50.append(statistics.median(w for w, _ in got))
                worst.append(max(w for w, n in got if n >= LONG))
            print(
                f"load {load}  {name:<18} wait p50 {statistics.median(p50):6.0f}  "
                f"longest prompts' worst {statistics.median(worst):6.0f}  (prompt tokens run)"
            )


if __name__ == "__main__":
    main()
