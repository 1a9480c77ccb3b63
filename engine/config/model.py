"""The model branch of the configuration: which model, and how its batch is scheduled.

Each operator setting is declared once here, beside its field (engine.config.declare).
It checks its own values; engine/runtime applies them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine.config.declare import label_of, setting

# Prefill order of the model actor (engine/runtime/batching/prefill_policy.py); batched is mlx-lm's
# padded prefill batch, kept as the baseline.
SCHEDULES = ("srpt", "fifo", "batched")
PREFILL_EVALS = ("auto", "module", "forward")  # how the prefill worker evaluates a chunk
# Draft sources of speculative decoding (engine/runtime/speculative/speculation.py); auto: what the
# model supports, each sequence's draft length adapted to its acceptance.
SPECULATIVE = ("off", "auto", "lookup", "mtp", "draft")
DRAFTING = ("auto", "draft")  # the modes that use --draft-model


def check_model_dir(path: str, label: str) -> Path:
    """The directory `path` names (with `~` expanded); ValueError naming `label` (the
    flag) when it holds no mlx-lm model: its config.json and model*.safetensors weights."""
    where = Path(path).expanduser()
    if not where.exists():
        raise ValueError(f"{label}: {where} does not exist")
    if not where.is_dir():
        raise ValueError(f"{label}: {where} is not a directory (a model directory is)")
    if not (where / "config.json").is_file():
        raise ValueError(f"{label}: no config.json in {where} (not an mlx-lm model directory)")
    if not any(where.glob("model*.safetensors")):
        raise ValueError(f"{label}: no weights in {where} (no model*.safetensors)")
    return where


def _draft_tokens(value) -> int | None:
    """`auto` (None) or a positive integer."""
    if value is None or isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    text = str(value).strip().lower()
    if text == "auto":
        return None
    if text.isdigit() and int(text) >= 1:
        return int(text)
    raise ValueError(f"{value!r} is neither auto nor a positive integer")


@dataclass(frozen=True)
class ModelConfig:
    """Model, batch and admission, prefill schedule."""

    path: str | None = None  # None: the embedded model; set by --model (engine.config.fleet)
    prefill_step_size: int = setting(
        512, "tokens per prefill chunk of mlx-lm's batch", var="LINEAGE_PREFILL_STEP"
    )
    max_batch: int = setting(8, "concurrent sequences in the batch generator")
    grammar_cache: int = setting(
        64, "compiled grammars (JSON schemas, tool sets) kept per replica, least recently used out"
    )
    max_queue: int = setting(
        256, "requests in flight (batch + waiting); more get RESOURCE_EXHAUSTED"
    )
    max_context: int | None = None  # None: from the model's config
    schedule: str = setting(
        "srpt",
        "prefill order: srpt (shortest remaining first), fifo, or batched (mlx-lm's padded "
        "prefill batch, the baseline)",
        choices=SCHEDULES,
    )
    prefill_budget: int = setting(
        256,
        "most prompt tokens per step under srpt/fifo; a prefill this short runs whole",
        metavar="TOKENS",
    )
    prefill_group: int = setting(
        1, "prefill up to N not-yet-started prompts of similar length in one chunk (srpt, fifo)"
    )
    # srpt/fifo size a chunk in time: these two (engine/runtime/batching/prefill_policy.py).
    prefill_step_factor: float = setting(
        2.5, "srpt/fifo: a step that prefills beside decode aims at X idle decode steps"
    )
    prefill_slice_ms: float = setting(
        50.0,
        "srpt/fifo: a chunk aims at MS milliseconds with nothing decoding, and with "
        "--prefill-overlap beside decoding streams too (their gap budget)",
        metavar="MS",
    )
    prefill_chunk_max: int | None = setting(
        None,
        "srpt/fifo: a long prompt's chunk, sized in time, is never above N tokens",
        shown="--prefill-budget",
    )
    prefill_growth: float = setting(
        10.0,
        "srpt/fifo: a long prompt nobody else waits for grows its chunks until each is X times "
        "their fixed cost (learned); larger: fewer, longer chunks, and a newcomer waits longer "
        "for the one in flight (within --prefill-chunk-max)",
    )
    # 1.1, not 1.25: at 1.25 a cold prompt beside sub-agents' warm turns spent a fifth of its
    # time on their chunks and reached its first token at 0.86x mlx-vlm's rate with MLX's own
    # kernels; at 1.1 at 1.07x, for +7% on the warm turns' median (docs/benchmarks.md).
    prefill_wait_bound: float = setting(
        1.1,
        "srpt: no prompt's prefill ends later than X times first-come-first-served would "
        "end it (counted in prefill tokens plus each chunk's fixed cost and decode step in "
        "tokens' worth, plus one chunk); 1 is fifo, 0 turns the bound off (aging alone)",
    )
    prefill_overlap: bool = setting(
        True,
        "srpt/fifo: run a prefill chunk's forward on a thread of its own beside the decode steps",
    )
    # engine.runtime.batching.prefill_worker; a short prefill run whole is one forward whatever
    # this says.
    prefill_eval: str = setting(
        "auto",
        "with overlap, the worker evaluates a long prefill's chunk module by module (its MLX "
        "queue stays short beside decode) or whole (forward); auto: module on the CPU",
        choices=PREFILL_EVALS,
    )
    speculative: str = setting(
        "off",
        "speculative decoding: drafts verified in one forward inside the batch; lookup "
        "(n-grams of the prompt and the reply), mtp (the model's MTP head), draft (a draft "
        "model), auto (what the model supports, each sequence's draft length adapted)",
        choices=SPECULATIVE,
    )
    num_draft_tokens: int | None = setting(
        None,
        "drafts verified per step and sequence: K, or auto (adapted to each sequence's "
        "recent acceptance, off for a sequence whose drafts don't pay); an MTP head chains "
        "K drafts a step, 1 under auto",
        parse=_draft_tokens,
        metavar="K|auto",
        shown="auto",
    )
    draft_model: str | None = setting(
        None,
        "draft model directory or org/name[@revision] (same tokenizer as the model) for "
        "--speculative draft or auto (the embedded model's: engine/runtime/model/assets/draft)",
        metavar="PATH",
        shown="none",
    )
    # TGI's --max-batch-total-tokens; None: sized by share_memory.
    max_batch_tokens: int | None = setting(
        None,
        "prompt + max_tokens of the running sequences together",
        shown="sized from memory",
    )

    def __post_init__(self):
        if self.schedule not in SCHEDULES:
            raise ValueError(
                f"{label_of(ModelConfig, 'schedule')}: {self.schedule!r} is not one of "
                f"{', '.join(SCHEDULES)}"
            )
        for name in ("prefill_budget", "prefill_group", "prefill_step_size", "max_batch"):
            value = getattr(self, name)
            if value < 1:
                raise ValueError(
                    f"{label_of(ModelConfig, name)} must be a positive number, got {value}"
                )
        if not self.prefill_step_factor > 1:
            raise ValueError(
                f"{label_of(ModelConfig, 'prefill_step_factor')} must be above 1 (a step "
                f"includes the decode), got {self.prefill_step_factor}"
            )
        if self.prefill_eval not in PREFILL_EVALS:
            raise ValueError(
                f"{label_of(ModelConfig, 'prefill_eval')}: {self.prefill_eval!r} is not one of "
                f"{', '.join(PREFILL_EVALS)}"
            )
        if self.speculative not in SPECULATIVE:
            raise ValueError(
                f"{label_of(ModelConfig, 'speculative')}: {self.speculative!r} is not one of "
                f"{', '.join(SPECULATIVE)}"
            )
        if self.speculative == "draft" and not self.draft_model:
            raise ValueError(
                f"{label_of(ModelConfig, 'speculative')}: draft needs "
                f"{label_of(ModelConfig, 'draft_model')} (a same-tokenizer model directory)"
            )
        if self.draft_model and self.speculative not in DRAFTING:
            raise ValueError(
                f"{label_of(ModelConfig, 'draft_model')} is used by "
                f"{label_of(ModelConfig, 'speculative')} draft or auto, not "
                f"{self.speculative}"
            )
        if self.num_draft_tokens is not None and not (
            isinstance(self.num_draft_tokens, int) and self.num_draft_tokens >= 1
        ):
            raise ValueError(
                f"{label_of(ModelConfig, 'num_draft_tokens')}: {self.num_draft_tokens!r} is "
                "neither auto nor a positive integer"
            )
        if self.prefill_chunk_max is not None and self.prefill_chunk_max < 1:
            raise ValueError(
                f"{label_of(ModelConfig, 'prefill_chunk_max')} must be a positive number, "
                f"got {self.prefill_chunk_max}"
            )
        if self.prefill_wait_bound != 0 and not self.prefill_wait_bound >= 1:
            raise ValueError(
                f"{label_of(ModelConfig, 'prefill_wait_bound')} must be 0 (off) or at least 1, "
                f"got {self.prefill_wait_bound}"
            )
        if not self.prefill_growth > 1:
            raise ValueError(
                f"{label_of(ModelConfig, 'prefill_growth')} must be above 1, "
                f"got {self.prefill_growth}"
            )
        if not self.prefill_slice_ms > 0:
            raise ValueError(
                f"{label_of(ModelConfig, 'prefill_slice_ms')} must be positive, "
                f"got {self.prefill_slice_ms}"
            )
