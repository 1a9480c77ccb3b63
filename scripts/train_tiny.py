"""Train the embedded default model: a small qwen3_next hybrid and its MTP head.

Regenerate the shipped weights with (from the repository root, CPython 3.11):

    . .venv/bin/activate && python -m scripts.train_tiny

which writes ``engine/runtime/model/assets/model/{config.json, model.safetensors,
mtp.safetensors, training.json}``; ``python -m scripts.train_tiny --shape draft`` trains
its draft model (``--draft-model``: 2 layers at the tiny width, shorter phases) into
``engine/runtime/model/assets/draft/``. The model is mlx-lm's own
``mlx_lm.models.qwen3_next.Model`` at the shape ``tiny_models.config_for("qwen3_next",
"embedded")``; the tokenizer is the committed one; the corpus is the tokenizer's
(``scripts/tiny_corpus.py``: CPython's own files, 5% of each held out). A fixed seed,
corpus and step count: the same Python minor version, MLX and numpy give the same
weights (docs/model.md says what was verified).

Training runs mlx-lm's own layers with two stand-ins that compute the same values
(tests/scripts holds them to mlx-lm's): the matrix products on numpy's BLAS, one
thread (``scripts/host_ops.py``: MLX's CPU backend ships the reference BLAS, ~12x
slower here), and the gated delta recurrence in chunks (``scripts/chunked_delta.py``).
The MTP head trains beside the model, sharing its (tied) embedding and lm_head, its
loss weighted by ``Plan.mtp_weight`` (DeepSeek-V3's 0.3) and its gradient reaching the
trunk, as the large hybrids train theirs. Training runs in two phases (PHASES), and
three initializations differ from mlx-lm's constructors (``build``), each said why.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from threadpoolctl import threadpool_limits

from engine.runtime.model import tiny_models
from engine.runtime.speculative.mtp import MTPHead, save_mtp
from scripts import chunked_delta, host_ops, tiny_corpus, tiny_eval

ROOT = Path(__file__).resolve().parent.parent
QK_TEMPERATURE = 3.0
OUT = ROOT / "engine" / "runtime" / "model" / "assets" / "model"
DRAFT_OUT = ROOT / "engine" / "runtime" / "model" / "assets" / "draft"


@dataclass(frozen=True)
class Phase:
    """A stretch of training with one sequence shape and one mix of kinds."""

    steps: int
    batch: int
    length: int  # tokens per training sequence
    mix: tiny_corpus.Mix


# 1) Induction first, at a constant learning rate: spans of random ids repeated in short
#    sequences, where copying the earlier span is the only thing to learn. The circuit
#    that does it (init_shift_head's previous-token head, then an attention head that
#    finds the earlier position whose previous token is the current one) forms after a
#    plateau of ~500 steps. Diluted among text it had not formed after 600.
# 2) Then text, text repeats, noise repeats and chat copies at full length, the
#    learning rate decaying (cosine) to a tenth.
PHASES = (
    Phase(900, 16, 64, (("noise", 1.0),)),
    Phase(900, 8, 256, (("text", 0.4), ("repeat", 0.15), ("noise", 0.1), ("chat", 0.35))),
)
# The draft model (`--shape draft`, tiny_models' "draft" size) in ~10 minutes: the same
# two phases, shorter.
DRAFT_PHASES = (
    Phase(500, 16, 64, (("noise", 1.0),)),
    Phase(500, 8, 256, (("text", 0.4), ("repeat", 0.15), ("noise", 0.1), ("chat", 0.35))),
)
SHAPES = {"embedded": PHASES, "draft": DRAFT_PHASES}  # tiny_models size -> its phases


@dataclass(frozen=True)
class Plan:
    """Everything that fixes the weights, besides the corpus and the library versions."""

    seed: int = 0
    shape: str = "embedded"  # the tiny_models qwen3_next size trained
    phases: tuple[Phase, ...] = PHASES
    lr: float = 3e-3
    warmup: int = 50
    final_lr_fraction: float = 0.1
    weight_decay: float = 0.01
    clip: float = 1.0
    mtp_weight: float = 0.3

    @property
    def steps(self) -> int:
        return sum(phase.steps for phase in self.phases)


# ---------------------------------------------------------------- model and loss


class Trainee(nn.Module):
    """The model and its MTP head, one parameter tree for the optimizer."""

    def __init__(self, model: nn.Module, mtp: MTPHead):
        super().__init__()
        self.model = model
        self.mtp = mtp


def build(seed: int, shape: str = "embedded") -> Trainee:
    """The untrained model and head, from mlx-lm's layer constructors under `seed`."""
    from mlx_lm.models import qwen3_next

    args = qwen3_next.ModelArgs.from_dict(tiny_models.config_for("qwen3_next", shape))
    mx.random.seed(seed)
    trainee = Trainee(qwen3_next.Model(args), MTPHead(args))
    for layer in [*trainee.model.layers, *trainee.mtp.layers]:
        if layer.is_linear:
            init_time_steps(layer.linear_attn)
        else:
            init_attention_temperature(layer.self_attn, QK_TEMPERATURE)
    init_shift_head(trainee.model.layers[0].linear_attn, trainee.model.model.embed_tokens)
    mx.eval(trainee.parameters())
    return trainee


def init_attention_temperature(attention: nn.Module, temperature: float) -> None:
    """Start the attention scores of QK-normed heads sharper (Henry et al., "Query-Key
    Normalization for Transformers": a learnable temperature started high). qwen3_next
    RMS-normalizes q and k per head, so a score is at most sqrt(head_dim) (5.7 at 32
    dims) while the norm weights are ones, too soft to single out the one earlier
    position an induction head must find; both norms start at sqrt(temperature)."""
    attention.q_norm.weight = mx.full(attention.q_norm.weight.shape, temperature**0.5)
    attention.k_norm.weight = mx.full(attention.k_norm.weight.shape, temperature**0.5)


SHIFT_CONST = 0.3  # the embedding's constant coordinate
SHIFT_GATE = 3.0  # the shift head's output gate z, read from that coordinate


def init_shift_head(gdn: nn.Module, embed: nn.Embedding, key_head: int = 0) -> None:
    """Start one key head of the first Gated DeltaNet layer (and its value heads) as a
    previous-token head: its output at t is a fixed function of token t-1 alone.

    Copying needs that feature (an attention head then finds the earlier position whose
    previous token is the current one). The layer can learn it, but through its
    nonlinear gates it learned a version that worked for the few tokens it was trained
    on and for no other. So, at initialization only:
    - the short convolution reads q and k at lag 0 and v at lag 1;
    - k's projection equals q's, so q.k is the same for every token;
    - beta = 1/2 and the decay rate ~34 per token (the state is the last write only);
    - the output gate z reads a coordinate that every embedding holds at SHIFT_CONST
      (harmless to the tied unembedding: it adds one constant to every logit).
    Then the head outputs ~ norm(silu(W_v x_{t-1})) for every token alike."""
    dk, dv = gdn.head_k_dim, gdn.head_v_dim
    heads_k, per = gdn.num_k_heads, gdn.num_v_heads // gdn.num_k_heads
    values = slice(key_head * per, (key_head + 1) * per)
    # in_proj_qkvz rows, per key head: q (dk), k (dk), v (per * dv), z (per * dv).
    base = key_head * (2 * dk + 2 * per * dv)
    q, k = slice(base, base + dk), slice(base + dk, base + 2 * dk)
    z = slice(base + 2 * dk + per * dv, base + 2 * dk + 2 * per * dv)
    w = np.array(gdn.in_proj_qkvz.weight)
    w[k] = w[q]
    w[z] = 0.0
    rms = np.sqrt((SHIFT_CONST**2 + 1.0) / w.shape[1])  # an embedding's RMS, about
    w[z, 0] = SHIFT_GATE * rms / SHIFT_CONST
    gdn.in_proj_qkvz.weight = mx.array(w)
    # Conv channels: q of every key head, k of every key head, v of every value head;
    # taps oldest first, so tap -1 is lag 0 and tap -2 lag 1.
    conv = np.array(gdn.conv1d.weight)
    for channels, tap in (
        (slice(key_head * dk, (key_head + 1) * dk), -1),
        (slice((heads_k + key_head) * dk, (heads_k + key_head + 1) * dk), -1),
        (slice(2 * heads_k * dk + values.start * dv, 2 * heads_k * dk + values.stop * dv), -2),
    ):
        conv[channels] = 0.0
        conv[channels, tap] = 1.0
    gdn.conv1d.weight = mx.array(conv)
    ba = np.array(gdn.in_proj_ba.weight)  # rows per key head: b (per), a (per)
    ba[key_head * 2 * per : (key_head + 1) * 2 * per] = 0.0
    gdn.in_proj_ba.weight = mx.array(ba)
    gdn.A_log = gdn.A_log.at[values].add(np.log(16.0) - gdn.A_log[values])
    gdn.dt_bias = gdn.dt_bias.at[values].add(2.0 - gdn.dt_bias[values])
    weight = np.array(embed.weight)
    weight[:, 0] = SHIFT_CONST
    embed.weight = mx.array(weight)


def init_time_steps(gdn: nn.Module, low: float = 1e-3, high: float = 1e-1) -> None:
    """Gated DeltaNet's reference initialization of dt_bias (as Mamba's): each head's step
    dt log-uniform in [low, high], stored as softplus^-1(dt). mlx-lm's constructor sets
    dt_bias to ones, a placeholder for loaded weights: with A in [0, 16] it makes nearly
    every head forget within a token or two, and a head that remembers is what copying
    needs. With these steps the decays exp(-A dt) span one token to thousands."""
    heads = gdn.dt_bias.shape[0]
    dt = mx.exp(mx.random.uniform(np.log(low), np.log(high), (heads,)))
    gdn.dt_bias = dt + mx.log(-mx.expm1(-dt))  # softplus^-1(dt)


def lm_head_weight(model: nn.Module) -> mx.array:
    """[vocab, hidden]: the lm_head's, or the embedding's when the two are tied."""
    if model.args.tie_word_embeddings:
        return model.model.embed_tokens.weight
    return model.lm_head.weight


def losses(trainee: Trainee, tokens: mx.array) -> tuple[mx.array, mx.array]:
    """(next-token loss, next-next-token loss) over tokens [B, L + 1]."""
    model = trainee.model
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    hidden = model.model(inputs)
    weight = lm_head_weight(model)
    main = host_ops.host_cross_entropy(hidden, weight, targets)
    # Row t reads h_t and token t+1 and predicts token t+2.
    mtp_hidden = trainee.mtp(hidden[:, :-1], inputs[:, 1:], model.model.embed_tokens)
    return main, host_ops.host_cross_entropy(mtp_hidden, weight, targets[:, 1:])


def lr_schedule(plan: Plan):
    """Linear warm-up, constant through the first phase, cosine decay over the rest."""
    first = plan.phases[0].steps
    warm = optim.linear_schedule(plan.lr / plan.warmup, plan.lr, plan.warmup)
    steady = optim.linear_schedule(plan.lr, plan.lr, 1)
    rest = max(1, plan.steps - first)
    decay = optim.cosine_decay(plan.lr, rest, plan.lr * plan.final_lr_fraction)
    return optim.join_schedules([warm, steady, decay], [plan.warmup, first])


def train(plan: Plan, corpus, tokenizer, log=print) -> tuple[Trainee, list[dict]]:
    """Run `plan.steps` steps; returns the trained pair and the loss curve (every 25 steps)."""
    trainee = build(plan.seed, plan.shape)
    trainee.train()
    optimizer = optim.AdamW(lr_schedule(plan), betas=[0.9, 0.95], weight_decay=plan.weight_decay)

    def objective(trainee, tokens):
        main, mtp = losses(trainee, tokens)
        return main + plan.mtp_weight * mtp, (main, mtp)

    step = nn.value_and_grad(trainee, objective)
    rng = np.random.default_rng(plan.seed)
    schedule = [phase for phase in plan.phases for _ in range(phase.steps)]
    curve, sums, start = [], np.zeros(2), time.perf_counter()
    with host_ops.install(trainee), chunked_delta.install():
        for i, phase in enumerate(schedule, start=1):
            # 1) A batch of fresh sequences from the seeded stream.
            batch = tiny_corpus.batch(
                rng, corpus, tokenizer, phase.batch, phase.length + 1, phase.mix
            )
            # 2) Forward, backward, clip, update.
            (_, (main, mtp)), grads = step(trainee, mx.array(batch))
            grads, _ = optim.clip_grad_norm(grads, plan.clip)
            optimizer.update(trainee, grads)
            mx.eval(trainee.parameters(), optimizer.state, main, mtp)
            # 3) Record: the mean losses of every 25 steps.
            sums += (main.item(), mtp.item())
            if i % 25 == 0 or i == len(schedule):
                n = (i - 1) % 25 + 1
                point = {"step": i, "loss": sums[0] / n, "mtp_loss": sums[1] / n}
                curve.append(point | {"seconds": round(time.perf_counter() - start, 1)})
                sums[:] = 0
                log(json.dumps(curve[-1]))
    trainee.eval()
    return trainee, curve


# ---------------------------------------------------------------- output


def versions() -> dict[str, str]:
    return {
        "python": platform.python_version(),
        **{name: metadata.version(name) for name in ("mlx", "mlx-lm", "numpy", "tokenizers")},
    }


def write(trainee: Trainee, out: Path, record: dict, shape: str = "embedded") -> None:
    """config.json, model.safetensors, mtp.safetensors and training.json into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    config = tiny_models.config_for("qwen3_next", shape)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    weights = tiny_models.model_weights(trainee.model)
    mx.save_safetensors(str(out / tiny_models.WEIGHTS_FILE), weights, metadata={"format": "mlx"})
    save_mtp(trainee.mtp, out)
    if shape == "draft":  # loaded as it is by --draft-model: its tokenizer beside it
        tiny_models.copy_tokenizer(out)
    (out / "training.json").write_text(json.dumps(record, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help=f"default: {OUT} ({DRAFT_OUT} for a draft)")
    parser.add_argument("--seed", type=int, default=Plan.seed)
    parser.add_argument(
        "--shape", choices=SHAPES, default="embedded", help="draft: the --draft-model for it"
    )
    args = parser.parse_args()
    plan = Plan(seed=args.seed, shape=args.shape, phases=SHAPES[args.shape])
    out = args.out or (DRAFT_OUT if args.shape == "draft" else OUT)
    tokenizer = tiny_corpus.load_tokenizer()
    corpus = tiny_corpus.load_corpus(tokenizer)
    start = time.perf_counter()
    with threadpool_limits(limits=1):  # one BLAS thread: the same sums in the same order
        trainee, curve = train(plan, corpus, tokenizer)
    seconds = time.perf_counter() - start
    metrics = tiny_eval.evaluate(trainee.model, trainee.mtp, corpus, tokenizer)
    print(json.dumps(metrics, indent=2))
    record = {
        "plan": asdict(plan),
        "versions": versions(),
        "train_seconds": round(seconds, 1),
        "curve": curve,
        "metrics": metrics,
    }
    write(trainee, out, record, plan.shape)
    print(f"wrote {out} ({seconds / 60:.1f} min of training)")


if __name__ == "__main__":
    main()
