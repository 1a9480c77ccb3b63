"""Tiny models built with mlx-lm's own model classes: seeded random ones and the embedded one.

Each architecture is one HF-style ``config.json`` dict that ``mlx_lm.load`` accepts.
- Random weights (the architecture tests): from the layer constructors under a fixed
  MLX seed, so the same (arch, size, seed) gives bit-identical weights in every process
  (``build_model``, ``write_model_dir``).
- The embedded default model (``ensure_default_model``, what ``lineage serve`` serves
  without ``--model``): a qwen3_next of size "embedded" trained by
  ``scripts/train_tiny.py``, shipped in ``engine/runtime/model/assets/model`` with its MTP
  head (``mtp.safetensors``, see ``engine.runtime.speculative.mtp``), float32 as it is served.

This module knows model shapes and files. It knows nothing about caches, serving or
requests; the tokenizer it writes next to the weights is the committed one in
``engine/runtime/model/assets/tokenizer`` (see ``scripts/train_tokenizer.py``).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from engine.runtime.model.draft_files import MTP_WEIGHTS_FILE

ARCHS = ("qwen3_next", "kimi_linear", "mamba2", "llama", "glm_moe_dsa", "gemma3_text")
SIZES = ("tiny", "bench", "embedded", "draft")
BENCH_ARCHS = ("qwen3_next", "glm_moe_dsa")  # the archs with a "bench" size
# "embedded": the shape of the trained default model (scripts/train_tiny.py).
EMBEDDED_ARCHS = ("qwen3_next",)
DEFAULT_SEED = 0

# The committed tokenizer has exactly this many ids, special tokens included.
VOCAB_SIZE = 4096
TOKENIZER_DIR = Path(__file__).parent / "assets" / "tokenizer"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
# Ids fixed by the tokenizer trainer: special tokens come first, in this order.
ENDOFTEXT_ID = 0
IM_END_ID = 2

WEIGHTS_FILE = "model.safetensors"
# The trained default model as shipped (scripts/train_tiny.py writes it).
EMBEDDED_DIR = Path(__file__).parent / "assets" / "model"
# Its trained draft model (`--draft-model`, scripts/train_tiny.py --shape draft), tokenizer
# included: mlx_lm.load reads the directory as it is.
DRAFT_DIR = Path(__file__).parent / "assets" / "draft"
EMBEDDED_FILES = ("config.json", WEIGHTS_FILE, MTP_WEIGHTS_FILE)


def _qwen3_next(size: str) -> dict:
    if size == "embedded":
        return _qwen3_next_embedded()
    if size == "draft":
        return _qwen3_next_draft()
    bench = size == "bench"
    return {
        "hidden_size": 512 if bench else 64,
        "num_hidden_layers": 8 if bench else 4,
        # Layer i is attention when (i + 1) % interval == 0, else Gated DeltaNet.
        "full_attention_interval": 4 if bench else 2,
        "intermediate_size": 1024 if bench else 128,
        "num_attention_heads": 8 if bench else 4,
        "num_key_value_heads": 2,
        "head_dim": 64 if bench else 16,
        "partial_rotary_factor": 0.25,
        "linear_num_key_heads": 4 if bench else 2,
        "linear_num_value_heads": 8 if bench else 4,
        "linear_key_head_dim": 64 if bench else 16,
        "linear_value_head_dim": 64 if bench else 16,
        "linear_conv_kernel_dim": 4,
        # Dense MLP everywhere: num_experts 0 makes every layer a Qwen3NextMLP.
        "num_experts": 0,
        "num_experts_per_tok": 0,
        "decoder_sparse_step": 1,
        "shared_expert_intermediate_size": 0,
        "moe_intermediate_size": 0,
        "mlp_only_layers": [],
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000000.0 if bench else 10000.0,
        "max_position_embeddings": 131072 if bench else 32768,
        "tie_word_embeddings": False,
        "attention_bias": False,
    }


def _qwen3_next_embedded() -> dict:
    """The trained default: twice the tiny width, the same 2 GDN + 2 GQA layers, and
    one MTP layer (the Qwen3-Next config key; mlx-lm ignores it)."""
    return {
        **_qwen3_next("tiny"),
        "hidden_size": 128,
        "intermediate_size": 256,
        "head_dim": 32,
        "linear_key_head_dim": 32,
        "linear_value_head_dim": 32,
        "num_nextn_predict_layers": 1,
        "tie_word_embeddings": True,
    }


def _qwen3_next_draft() -> dict:
    """The embedded model's trained draft (--draft-model): the tiny width, one GDN and one
    attention layer (the fewest that still copy: a previous-token head, then induction),
    tied embeddings, no MTP layer."""
    return {
        **_qwen3_next("tiny"),
        "num_hidden_layers": 2,
        "tie_word_embeddings": True,
    }


def _kimi_linear(size: str) -> dict:
    return {
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "head_dim": 16,
        "intermediate_size": 128,
        # 1-based: layers 0-2 are KDA, layer 3 is MLA (the real model's 3:1).
        "linear_attn_config": {
            "kda_layers": [1, 2, 3],
            "full_attn_layers": [4],
            "num_heads": 4,
            "head_dim": 16,
            "short_conv_kernel_size": 4,
        },
        "kv_lora_rank": 32,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8,
        "v_head_dim": 16,
        "mla_use_nope": True,
        "num_experts": 0,
        "moe_intermediate_size": 0,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-6,
        "model_max_length": 32768,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": False,
    }


def _mamba2(size: str) -> dict:
    return {
        "hidden_size": 64,
        "num_hidden_layers": 3,
        "num_heads": 4,
        "head_dim": 32,
        "intermediate_size": 128,
        "state_size": 16,
        "n_groups": 1,
        "conv_kernel": 4,
        "layer_norm_epsilon": 1e-5,
        "use_bias": False,
        "use_conv_bias": True,
        "time_step_limit": [0.0, 100.0],
        "time_step_rank": "auto",
        "max_position_embeddings": 32768,
        "tie_word_embeddings": True,
    }


def _llama(size: str) -> dict:
    return {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 128,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": False,
    }


def _glm_moe_dsa(size: str) -> dict:
    # "bench": attention dims in a real DSA layer's proportions (latent 256,
    # 8 heads over 4 indexer heads), small enough for a CPU at 4-8k tokens.
    bench = size == "bench"
    return {
        "hidden_size": 256 if bench else 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 8 if bench else 4,
        "num_key_value_heads": 8 if bench else 4,
        "intermediate_size": 512 if bench else 128,
        # DSA: each query attends to the index_topk keys its indexer scores
        # highest, once the context is longer than index_topk.
        "index_head_dim": 64 if bench else 16,
        "index_n_heads": 4 if bench else 2,
        "index_topk": 256 if bench else 8,
        "q_lora_rank": 128 if bench else 32,
        "kv_lora_rank": 256 if bench else 32,
        "qk_nope_head_dim": 64 if bench else 16,
        "qk_rope_head_dim": 32 if bench else 8,
        "v_head_dim": 64 if bench else 16,
        # Dense MLP in every layer: the first first_k_dense_replace layers are
        # dense, which is all of them. The expert fields only have to be valid
        # (transformers' GlmMoeDsaConfig, read while loading the tokenizer,
        # rejects None).
        "n_routed_experts": 4,
        "n_shared_experts": 1,
        "moe_intermediate_size": 32,
        "num_experts_per_tok": 2,
        "routed_scaling_factor": 1.0,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "norm_topk_prob": True,
        "n_group": 1,
        "topk_group": 1,
        "moe_layer_freq": 1,
        "first_k_dense_replace": 2,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "attention_bias": False,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": False,
    }


def _gemma3_text(size: str) -> dict:
    return {
        "hidden_size": 64,
        # Layer i is global when i % pattern == pattern - 1: layers 0, 1 slide
        # over a 16-token window (RotatingKVCache), layer 2 is global.
        "num_hidden_layers": 3,
        "sliding_window": 16,
        "sliding_window_pattern": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "query_pre_attn_scalar": 16,
        "intermediate_size": 128,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": False,
    }


_CONFIGS = {
    "qwen3_next": _qwen3_next,
    "kimi_linear": _kimi_linear,
    "mamba2": _mamba2,
    "llama": _llama,
    "glm_moe_dsa": _glm_moe_dsa,
    "gemma3_text": _gemma3_text,
}


def config_for(arch: str, size: str = "tiny", vocab_size: int = VOCAB_SIZE) -> dict:
    """The HF-style config.json dict (with "model_type") of a tiny model.

    "bench" exists for qwen3_next and glm_moe_dsa only, "embedded" and "draft" (its
    trained draft model) for qwen3_next.
    Raises ValueError for an unknown arch or size.
    """
    if arch not in _CONFIGS:
        raise ValueError(f"unknown arch {arch!r}; known: {', '.join(ARCHS)}")
    if (
        size not in SIZES
        or (size == "bench" and arch not in BENCH_ARCHS)
        or (size in ("embedded", "draft") and arch not in EMBEDDED_ARCHS)
    ):
        raise ValueError(f"no size {size!r} for arch {arch!r}")
    return {
        "model_type": arch,
        "architectures": [f"tiny-{arch}"],
        "vocab_size": vocab_size,
        "eos_token_id": [IM_END_ID, ENDOFTEXT_ID],
        "bos_token_id": None,
        "pad_token_id": ENDOFTEXT_ID,
        "torch_dtype": "float32",
        **_CONFIGS[arch](size),
    }


def _model_classes(arch: str):
    """(Model, ModelArgs) of mlx-lm's module named after the model_type."""
    module = importlib.import_module(f"mlx_lm.models.{arch}")
    return module.Model, module.ModelArgs


def build_model(
    arch: str, size: str = "tiny", seed: int = DEFAULT_SEED, dtype: mx.Dtype = mx.float32
) -> nn.Module:
    """A random-weight mlx-lm model, evaluated, in eval mode.

    Same (arch, size, seed, dtype) -> bit-identical weights in any process.
    Reseeds MLX's global random state (the layer constructors draw from it).
    """
    model_class, args_class = _model_classes(arch)
    args = args_class.from_dict(config_for(arch, size))
    mx.random.seed(seed)
    model = model_class(args)
    if dtype != mx.float32:
        model.set_dtype(dtype)
    model.eval()
    mx.eval(model.parameters())
    return model


def model_weights(model: nn.Module) -> dict[str, mx.array]:
    """The flat name -> array dict that ``mlx_lm.load`` reads back unchanged."""
    from mlx.utils import tree_flatten

    return dict(tree_flatten(model.parameters()))


def copy_tokenizer(path: Path) -> None:
    """Copy the committed tokenizer files into the directory ``path``."""
    for name in TOKENIZER_FILES:
        shutil.copyfile(TOKENIZER_DIR / name, path / name)


def write_model_dir(
    arch: str, path: str | Path, size: str = "tiny", seed: int = DEFAULT_SEED
) -> Path:
    """Write config.json, model.safetensors and the tokenizer into ``path``.

    ``mlx_lm.load(str(path))`` then returns (model, tokenizer) with weights
    identical to ``build_model(arch, size, seed)``. The directory is created
    if missing; existing files of the same names are overwritten.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model = build_model(arch, size, seed)
    weights = model_weights(model)
    # The loader passes the file's weights through sanitize(); ours are
    # already in the class's own layout, which sanitize must leave alone.
    assert set(model.sanitize(dict(weights))) == set(weights), arch
    mx.save_safetensors(str(path / WEIGHTS_FILE), weights, metadata={"format": "mlx"})
    (path / "config.json").write_text(json.dumps(config_for(arch, size), indent=2))
    copy_tokenizer(path)
    return path


def write_embedded_model_dir(path: str | Path) -> Path:
    """Copy the shipped trained model (config, weights, MTP head) and the tokenizer into
    ``path`` (created if missing); ``mlx_lm.load(str(path))`` then loads it."""
    _require_embedded_files()
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    for name in EMBEDDED_FILES:
        shutil.copyfile(EMBEDDED_DIR / name, path / name)
    copy_tokenizer(path)
    return path


def _require_embedded_files() -> None:
    """Raise FileNotFoundError, saying how to make them, if a shipped file is missing."""
    missing = [name for name in EMBEDDED_FILES if not (EMBEDDED_DIR / name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"the embedded model's {', '.join(missing)} missing from {EMBEDDED_DIR}: "
            "reinstall the package, or regenerate them with `python -m scripts.train_tiny`"
        )


def default_model_key() -> str:
    """Directory name of the installed embedded model: a hash of the shipped bytes."""
    _require_embedded_files()
    digest = hashlib.sha256()
    for source in [EMBEDDED_DIR / n for n in EMBEDDED_FILES] + [
        TOKENIZER_DIR / n for n in TOKENIZER_FILES
    ]:
        digest.update(source.name.encode())
        digest.update(source.read_bytes())
    return f"qwen3_next-embedded-{digest.hexdigest()[:12]}"


def ensure_default_model(cache_dir: Path | None = None) -> Path:
    """The embedded default model's directory, installed from the package on first use.

    Lives at ``<cache_dir>/models/qwen3_next-embedded-<hash>`` (cache_dir defaults to
    ``engine.config.default_cache_dir()``); the hash covers the shipped files, so new
    weights get a new directory, new mtimes and so a new model fingerprint. Copied into
    a temporary sibling and renamed into place, so a reader never sees a half-written
    directory and a concurrent installer that loses the race just discards its copy. An
    existing directory is returned untouched (its files' mtimes are part of the prompt
    cache's model fingerprint).
    """
    if cache_dir is None:
        from engine.config import default_cache_dir

        cache_dir = default_cache_dir()
    models = Path(cache_dir) / "models"
    final = models / default_model_key()
    if final.is_dir():
        return final
    models.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=models))
    try:
        write_embedded_model_dir(tmp)
        os.rename(tmp, final)
    except OSError:
        if not final.is_dir():
            raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final
