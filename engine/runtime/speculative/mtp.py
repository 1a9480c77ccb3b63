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

DeepSeek-V3/V3.2 and the GLM-4.5/GLM-5 families ship their head the DeepSeek way
(`NextNHead`): one more decoder layer after the last, stored as
`model.layers.{num_hidden_layers}.*` (`enorm`, `hnorm`, `eh_proj`, the decoder layer's
own weights, `shared_head.norm`, `shared_head.head`), which mlx-lm's `sanitize` drops.
The same pairs go in, embedding first: `eh_proj([enorm(embed(token[t+1])), hnorm(h_t)])`,
the decoder layer of the model's own class (its MLA/DSA attention, its cache kind: a
`CacheList` of latent KV and indexer keys under DSA), `shared_head.norm`, then
`shared_head.head` (the model's lm_head where the checkpoint has none). Its layer's
weights go through the model's own `sanitize` (experts stacked, fp8 dequantized), as
if they were layer 0's.

Both heads answer the same calls: `head(h, next_tokens, embed_tokens, cache)` -> the
head's final hidden states, `head.logits(model, x)`, `head.batch_cache(rows)` (the
batch cache of its one layer, `rows` empty rows).

It knows mlx-lm's model layers and safetensors files; it knows nothing of the
engine's batches or speculation (a head's KV cache holds one row per (h_t, token t+1)
pair it has read).
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import qwen3_next
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import BatchKVCache, CacheList, KVCache

from engine.runtime.model.draft_files import MTP_WEIGHTS_FILE

MTP_PREFIX = "mtp."


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

    def logits(self, model: nn.Module, x: mx.array) -> mx.array:
        return lm_logits(model, x)

    def make_cache(self) -> list:
        return [KVCache()]

    def batch_cache(self, rows: int):
        return BatchKVCache([0] * rows)


class NextNHead(nn.Module):
    """A DeepSeek-V3-style MTP layer (module doc): its own norms, projection and head."""

    def __init__(self, model: nn.Module):
        super().__init__()
        args = model.args
        hidden, eps = args.hidden_size, args.rms_norm_eps
        self.enorm = nn.RMSNorm(hidden, eps=eps)
        self.hnorm = nn.RMSNorm(hidden, eps=eps)
        self.eh_proj = nn.Linear(2 * hidden, hidden, bias=False)
        # The model's own decoder layer class, at the index after the last.
        self.layers = [type(model.model.layers[-1])(args, args.num_hidden_layers)]
        self.shared_head = SharedHead(hidden, args.vocab_size, eps)
        self._single_cache = model.make_cache()[-1]  # the layer's cache kind, as a template

    def __call__(self, hidden, next_tokens, embed_tokens, cache=None):
        e = self.enorm(embed_tokens(next_tokens))
        x = self.eh_proj(mx.concatenate([e, self.hnorm(hidden)], axis=-1))
        layer_cache = cache[0] if cache is not None else None
        first = layer_cache[0] if type(layer_cache) is CacheList else layer_cache
        mask = create_attention_mask(x, first, return_array=True)
        x = self.layers[0](x, mask, layer_cache)
        return self.shared_head.norm(x)

    def logits(self, model: nn.Module, x: mx.array) -> mx.array:
        if self.shared_head.head is not None:
            return self.shared_head.head(x)
        return lm_logits(model, x)

    def make_cache(self) -> list:
        kind = self._single_cache
        if type(kind) is CacheList:
            return [CacheList(*(KVCache() for _ in kind.caches))]
        return [KVCache()]

    def batch_cache(self, rows: int):
        kind = self._single_cache
        if type(kind) is CacheList:
            return CacheList(*(BatchKVCache([0] * rows) for _ in kind.caches))
        return BatchKVCache([0] * rows)


class SharedHead(nn.Module):
    """`shared_head`: the final norm and (where the checkpoint has one) the vocabulary head."""

    def __init__(self, hidden: int, vocab: int, eps: float):
        super().__init__()
        self.norm = nn.RMSNorm(hidden, eps=eps)
        self.head = nn.Linear(hidden, vocab, bias=False)


def lm_logits(model: nn.Module, hidden: mx.array) -> mx.array:
    """The main model's lm_head (or tied embedding) applied to final hidden states."""
    if getattr(model.args, "tie_word_embeddings", False):
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


# The model types whose checkpoints carry a DeepSeek-style head (NextNHead).
NEXTN_TYPES = ("deepseek_v3", "deepseek_v32", "glm4_moe", "glm4_moe_lite", "glm_moe_dsa")


def _tensors(model_dir: str | Path, keep) -> dict[str, mx.array]:
    """The tensors `keep` names, from the safetensors files that hold any: each file's
    header is read first, so a sharded checkpoint's other shards are never loaded."""
    found: dict[str, mx.array] = {}
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        if any(keep(name) for name in _names(path)):
            found.update((n, value) for n, value in mx.load(str(path)).items() if keep(n))
    return found


def _names(path: Path) -> list[str]:
    """The tensor names in a safetensors file's header (8 bytes of length, then JSON)."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
    return [name for name in header if name != "__metadata__"]


def load_mtp(model_dir: str | Path, model: nn.Module):
    """The MTP head stored beside `model` (loaded from `model_dir`), or None if there is none.

    qwen3_next: the `mtp.*` tensors of every safetensors file in the directory (MTPHead);
    the DeepSeek/GLM families: `model.layers.{num_hidden_layers}.*` (NextNHead). Raises
    ValueError if the tensors do not fit the model's shape or are quantized."""
    model_type = getattr(model.args, "model_type", "")
    if isinstance(model.args, qwen3_next.ModelArgs):
        found = _tensors(model_dir, lambda name: name.startswith(MTP_PREFIX))
        found = {name[len(MTP_PREFIX) :]: value for name, value in found.items()}
        head = MTPHead(model.args) if found else None
    elif model_type in NEXTN_TYPES:
        found = _nextn_weights(model_dir, model)
        head = NextNHead(model) if found else None
    else:
        found = _tensors(model_dir, lambda name: name.startswith(MTP_PREFIX))
        if found:
            raise ValueError(f"MTP weights found for a {type(model.args).__module__} model")
        return None
    if head is None:
        return None
    if any(name.endswith((".scales", ".biases")) for name in found):
        raise ValueError(f"{model_dir}: quantized MTP weights are not supported")
    if isinstance(head, NextNHead) and "shared_head.head.weight" not in found:
        head.shared_head.head = None  # the model's own lm_head
    try:
        head.load_weights(list(found.items()), strict=True)
    except ValueError as e:
        raise ValueError(f"{model_dir}: MTP weights do not fit the model: {e}") from None
    head.eval()
    mx.eval(head.parameters())
    return head


def _nextn_weights(model_dir: str | Path, model: nn.Module) -> dict[str, mx.array]:
    """A DeepSeek-style head's tensors by NextNHead's names; its decoder layer's weights
    pass through the model's own sanitize (experts stacked, fp8 dequantized) as layer 0's."""
    prefix = f"model.layers.{model.args.num_hidden_layers}."
    raw = _tensors(model_dir, lambda name: name.startswith(prefix))
    own = ("enorm.", "hnorm.", "eh_proj.", "shared_head.", "embed_tokens.")
    head = {}
    layer = {}
    for name, value in raw.items():
        rest = name[len(prefix) :]
        if rest.startswith("embed_tokens."):
            continue  # a copy of the model's embedding: the model's own is used
        if rest.startswith(own):
            head[rest] = value
        else:
            layer["model.layers.0." + rest] = value
    if layer and hasattr(model, "sanitize"):
        layer = model.sanitize(layer)
    head.update(("layers.0." + name[len("model.layers.0.") :], v) for name, v in layer.items())
    return head
