"""The next-next-token (MTP) head of a qwen3_next model, the way Qwen3-Next ships one.

At position t the head reads the model's final hidden state h_t (after the final
norm) and the embedding of token t+1, and predicts token t+2 through the model's own
lm_head:

    x = fc([pre_fc_norm_embedding(embed(token[t+1])), pre_fc_norm_hidden(h_t)])
    x = layers[0](x)            # one full-attention decoder layer, causal, its own KV
    logits[t+2] = lm_head(norm(x))

Its weights carry the names Qwen3-Next checkpoints give them (`mtp.fc.weight`,
`mtp.pre_fc_norm_embedding.weight`, `mtp.pre_fc_norm_hidden.weight`, `mtp.layers.0.*`,
`mtp.norm.weight`; vLLM's `qwen3_next_mtp.py` reads the same names). mlx-lm's loader
never builds them: its qwen3_next drops `mtp.*` for MoE checkpoints and, for a dense one,
would reject them as unknown weights. So the embedded model keeps them in a file of
their own, `mtp.safetensors`, that `mlx_lm.load` does not read (it reads
`model*.safetensors`), and `load_mtp` reads `mtp.*` from every safetensors file of a
model directory, a checkpoint's shards included. Norm weights are read as stored (the
MLX form, as mlx-lm writes a converted model); a raw Hugging Face checkpoint stores
Qwen3-Next norms zero-centred (weight - 1), which its own loader would have to undo.

It knows mlx-lm's qwen3_next layers and safetensors files; it knows nothing of the
engine's batches, caches or speculation (the head's KV cache is a plain `KVCache`,
one row per (h_t, token t+1) pair it has read, at rope offset t).
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import qwen3_next
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import KVCache

MTP_PREFIX = "mtp."
MTP_WEIGHTS_FILE = "mtp.safetensors"


class MTPHead(nn.Module):
    """One Qwen3-Next MTP layer; shares the main model's embedding and lm_head."""

    def __init__(self, args: qwen3_next.ModelArgs):
        super().__init__()
        hidden, eps = args.hidden_size, args.rms_norm_eps
        self.pre_fc_norm_embedding = nn.RMSNorm(hidden, eps=eps)
        self.pre_fc_norm_hidden = nn.RMSNorm(hidden, eps=eps)
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        # A full-attention layer: qwen3_next makes layer i attention when
        # (i + 1) % full_attention_interval == 0.
        self.layers = [qwen3_next.Qwen3NextDecoderLayer(args, args.full_attention_interval - 1)]
        assert not self.layers[0].is_linear
        self.norm = nn.RMSNorm(hidden, eps=eps)

    def __call__(
        self,
        hidden: mx.array,
        next_tokens: mx.array,
        embed_tokens: nn.Embedding,
        cache: list | None = None,
    ) -> mx.array:
        """Final hidden states for tokens t+2, from h_t [B, L, H] and tokens t+1 [B, L]."""
        e = self.pre_fc_norm_embedding(embed_tokens(next_tokens))
        x = self.fc(mx.concatenate([e, self.pre_fc_norm_hidden(hidden)], axis=-1))
        layer_cache = cache[0] if cache is not None else None
        x = self.layers[0](x, create_attention_mask(x, layer_cache), layer_cache)
        return self.norm(x)

    def make_cache(self) -> list:
        return [KVCache()]


def lm_logits(model: nn.Module, hidden: mx.array) -> mx.array:
    """The main model's lm_head (or tied embedding) applied to final hidden states."""
    if model.args.tie_word_embeddings:
        return model.model.embed_tokens.as_linear(hidden)
    return model.lm_head(hidden)


def next_next_logits(model: nn.Module, head: MTPHead, tokens: mx.array) -> mx.array:
    """Teacher-forced MTP logits over a whole sequence: row t predicts tokens[:, t + 2].

    tokens [B, L] gives [B, L - 1, V]; the last row predicts the token after the
    sequence's end."""
    hidden = model.model(tokens)
    return lm_logits(model, head(hidden[:, :-1], tokens[:, 1:], model.model.embed_tokens))


def mtp_weights(head: MTPHead) -> dict[str, mx.array]:
    """The head's parameters under their checkpoint names (`mtp.` + the module path)."""
    from mlx.utils import tree_flatten

    return {MTP_PREFIX + name: value for name, value in tree_flatten(head.parameters())}


def save_mtp(head: MTPHead, model_dir: str | Path) -> Path:
    """Write the head's weights to `<model_dir>/mtp.safetensors`."""
    path = Path(model_dir) / MTP_WEIGHTS_FILE
    mx.save_safetensors(str(path), mtp_weights(head), metadata={"format": "mlx"})
    return path


def load_mtp(model_dir: str | Path, model: nn.Module) -> MTPHead | None:
    """The MTP head stored beside `model` (loaded from `model_dir`), or None if there is none.

    Reads the `mtp.*` tensors of every safetensors file in the directory. Raises
    ValueError if the model is not a qwen3_next one or the tensors do not fit its shape.
    """
    found: dict[str, mx.array] = {}
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        found.update(
            (name[len(MTP_PREFIX) :], value)
            for name, value in mx.load(str(path)).items()
            if name.startswith(MTP_PREFIX)
        )
    if not found:
        return None
    if not isinstance(model.args, qwen3_next.ModelArgs):
        raise ValueError(f"MTP weights found for a {type(model.args).__module__} model")
    head = MTPHead(model.args)
    try:
        head.load_weights(list(found.items()), strict=True)
    except ValueError as e:
        raise ValueError(f"{model_dir}: MTP weights do not fit the model: {e}") from None
    head.eval()
    mx.eval(head.parameters())
    return head
