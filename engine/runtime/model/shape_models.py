"""Shape-true models: published configs, cut in depth and experts, built with mlx-lm's classes.

Each shape is a JSON file in ``engine/runtime/model/shapes/``: the published config's
numbers (``config``, as the model's config.json gives them), the cut applied to them
(``cut``: whole periods of the layer pattern, a few experts instead of hundreds, the
vocabulary of the committed tokenizer), what was cut in words (``cut_note``) and where the
numbers come from (``source``). The per-layer widths are never cut, so a cut model's
caches hold, layer for layer, what the published model's do. `narrowed` also makes the
widths no cache depends on small (hidden and MLP 256, the query's low rank 128, and a pure
MLA model's head counts): its caches are byte for byte the full-width cut model's, and it
builds and runs in a fraction of the time.

It also knows each architecture's cache arithmetic (`expected`): the bytes one
state layer's checkpoint and one attention layer's token of KV take, from the config
alone, as mlx-lm's caches keep them (Gated DeltaNet, KDA and Mamba2 states in float32,
conv windows and KV in the weights' dtype), and how many layers of each kind the published
depth has. Figures that scale with depth are given at both depths.

It knows model configs and files; nothing about the engine's caches or serving.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx

from engine.runtime.model import shape_names

SHAPES_DIR = Path(__file__).parent / "shapes"
DTYPES = {"bfloat16": mx.bfloat16, "float16": mx.float16, "float32": mx.float32}


@dataclass(frozen=True)
class Shape:
    name: str
    source: str
    cut_note: str
    period: int  # layers in one period of the layer pattern
    published: dict  # the published config's numbers
    cut: dict  # what replaces them in the cut model

    @property
    def config(self) -> dict:
        """The cut model's config.json dict (mlx_lm.load reads it)."""
        return {**self.published, **self.cut}

    @property
    def dtype(self) -> mx.Dtype:
        return DTYPES[self.published.get("torch_dtype", "bfloat16")]


def load_shape(name: str) -> Shape:
    """The shape of `name` (a file stem of shapes/); ValueError naming the known ones."""
    path = SHAPES_DIR / f"{name}.json"
    if not path.is_file():
        raise ValueError(f"no shape {name!r}; known: {', '.join(shape_names())}")
    data = json.loads(path.read_text())
    return Shape(
        data["name"], data["source"], data["cut_note"], data["period"], data["config"], data["cut"]
    )


def narrowed(shape: Shape) -> Shape:
    """The shape with the widths no cache depends on made small: every head count and head
    width stays the published one, so its checkpoints and KV are the full-width cut model's,
    byte for byte (tests/runtime/model/test_shape_models.py checks them against `expected`)."""
    cut = {**shape.cut, "hidden_size": 256, "intermediate_size": 256}
    if shape.published.get("q_lora_rank"):
        cut["q_lora_rank"] = 128
    if shape.published["model_type"] in ("deepseek_v32", "glm_moe_dsa"):
        # Pure MLA: a token's KV is the latent, the rope key and the indexer's key, whatever
        # the head counts (the query heads expand the latent on every chunk: the slow part).
        cut.update(num_attention_heads=8, num_key_value_heads=8, index_n_heads=4)
    return Shape(shape.name, shape.source, shape.cut_note, shape.period, shape.published, cut)


# --- the cache arithmetic, from the config alone ---------------------------------------------


def layer_kinds(config: dict) -> list[str]:
    """Per layer: "state" (a recurrent layer), "kv" (attention), "both" (a parallel hybrid
    layer) or "none" (an MLP-only layer), for the config's depth."""
    kind = config["model_type"]
    n = config["num_hidden_layers"]
    if kind in ("qwen3_next", "qwen3_5", "qwen3_5_moe"):
        k = config["full_attention_interval"]
        return ["kv" if (i + 1) % k == 0 else "state" for i in range(n)]
    if kind == "kimi_linear":
        kda = set(config["linear_attn_config"]["kda_layers"])  # 1-based
        return ["state" if i + 1 in kda else "kv" for i in range(n)]
    if kind == "nemotron_h":
        names = {"M": "state", "*": "kv", "-": "none", "E": "none"}
        return [names[c] for c in config["hybrid_override_pattern"][:n]]
    if kind == "falcon_h1":
        return ["both"] * n
    if kind in ("deepseek_v32", "glm_moe_dsa"):
        return ["kv"] * n
    raise ValueError(f"no cache arithmetic for model type {kind!r}")


def state_layer_bytes(config: dict, dtype_bytes: int = 2) -> int:
    """Bytes of one recurrent layer's checkpoint: its state (float32, as mlx-lm's kernels keep
    it) and its conv window (the weights' dtype, `dtype_bytes`)."""
    kind = config["model_type"]
    if kind in ("qwen3_next", "qwen3_5", "qwen3_5_moe"):
        hk, hv = config["linear_num_key_heads"], config["linear_num_value_heads"]
        dk, dv = config["linear_key_head_dim"], config["linear_value_head_dim"]
        conv = (config["linear_conv_kernel_dim"] - 1) * (2 * hk * dk + hv * dv)
        return hv * dv * dk * 4 + conv * dtype_bytes
    if kind == "kimi_linear":
        lin = config["linear_attn_config"]
        h, d = lin["num_heads"], lin["head_dim"]
        conv = 3 * (lin["short_conv_kernel_size"] - 1) * h * d  # q, k and v windows
        return h * d * d * 4 + conv * dtype_bytes
    if kind == "nemotron_h":
        heads, hd, n = config["mamba_num_heads"], config["mamba_head_dim"], config["ssm_state_size"]
        conv = (config["conv_kernel"] - 1) * (heads * hd + 2 * config["n_groups"] * n)
        return heads * hd * n * 4 + conv * dtype_bytes
    if kind in ("deepseek_v32", "glm_moe_dsa"):
        return 0
    raise ValueError(f"no cache arithmetic for model type {kind!r}")


def kv_layer_bytes(config: dict, dtype_bytes: int = 2) -> int:
    """Bytes one token of KV takes in one attention layer."""
    kind = config["model_type"]
    if kind in ("qwen3_next", "qwen3_5", "qwen3_5_moe", "nemotron_h"):
        return 2 * config["num_key_value_heads"] * config["head_dim"] * dtype_bytes
    if kind == "kimi_linear":  # MLA: the latent and the shared rope key
        return (config["kv_lora_rank"] + config["qk_rope_head_dim"]) * dtype_bytes
    if kind in ("deepseek_v32", "glm_moe_dsa"):
        # MLA latent + rope key, and the indexer's keys (mlx-lm stores a zero value row
        # of the same width beside each indexer key).
        mla = config["kv_lora_rank"] + config["qk_rope_head_dim"]
        return (mla + 2 * config["index_head_dim"]) * dtype_bytes
    raise ValueError(f"no cache arithmetic for model type {kind!r}")


def expected(config: dict, dtype_bytes: int = 2) -> dict:
    """A checkpoint's bytes and a token's KV bytes for `config`'s depth, from its widths."""
    kinds = layer_kinds(config)
    state_layers = sum(k in ("state", "both") for k in kinds)
    kv_layers = sum(k in ("kv", "both") for k in kinds)
    return {
        "layers": len(kinds),
        "state_layers": state_layers,
        "kv_layers": kv_layers,
        "checkpoint_bytes": state_layers * state_layer_bytes(config, dtype_bytes),
        "kv_bytes_per_token": kv_layers * kv_layer_bytes(config, dtype_bytes),
    }


def full_depth(shape: Shape, per_state_layer: float, per_kv_layer: float) -> dict:
    """Figures measured on the cut model, per layer, scaled to the published depth."""
    full = expected(shape.published)
    return {
        "layers": full["layers"],
        "state_layers": full["state_layers"],
        "kv_layers": full["kv_layers"],
        "checkpoint_bytes": round(per_state_layer * full["state_layers"]),
        "kv_bytes_per_token": round(per_kv_layer * full["kv_layers"]),
    }


# --- building --------------------------------------------------------------------------------


def build_shape_model(shape: Shape, seed: int = 0):
    """The cut model with random weights in the published dtype, evaluated, in eval mode."""
    import importlib

    from mlx_lm.utils import _get_classes

    config = shape.config
    model_class, args_class = _get_classes(config)
    importlib.import_module(model_class.__module__)
    mx.random.seed(seed)
    model = model_class(args_class.from_dict(config))
    model.set_dtype(shape.dtype)
    model.eval()
    mx.eval(model.parameters())
    return model


def write_shape_dir(shape: Shape, path: str | Path, seed: int = 0) -> Path:
    """config.json, model.safetensors and the committed tokenizer into `path`: a directory
    `lineage serve --model` (and mlx_lm.load) serves. Kept when already written."""
    from mlx.utils import tree_flatten

    from engine.runtime.model.tiny_models import WEIGHTS_FILE, copy_tokenizer

    path = Path(path)
    config = {**shape.config, "architectures": [f"shape-{shape.name}"], "eos_token_id": [2, 0]}
    if (path / WEIGHTS_FILE).is_file() and (path / "config.json").is_file():
        if json.loads((path / "config.json").read_text()) == config:
            return path
    path.mkdir(parents=True, exist_ok=True)
    model = build_shape_model(shape, seed)
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(path / WEIGHTS_FILE), weights, metadata={"format": "mlx"})
    (path / "config.json").write_text(json.dumps(config, indent=2))
    copy_tokenizer(path)
    return path
