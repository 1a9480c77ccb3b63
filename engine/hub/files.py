"""Which of a repository's files an MLX model needs, and what its file list says about it.

mlx-lm loads a directory of config.json, model*.safetensors (with their index),
the tokenizer's files, the chat template and the generation config; nothing
else in a repository (README, images, PyTorch weights, ONNX exports) is
fetched. A repository whose only weights are PyTorch's (*.bin, *.pt, *.pth)
needs `mlx_lm.convert` first. Whether mlx-lm has an architecture is read from
its installed files (a module per model_type, and its remapping table),
without importing it.
"""

from __future__ import annotations

import ast
import fnmatch
import importlib.util
import json
from functools import lru_cache
from pathlib import Path, PurePosixPath

NEEDED = (
    "config.json",
    "generation_config.json",
    "model*.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "*.tiktoken",
    "chat_template.jinja",
    "chat_template.json",
)
PYTORCH = ("*.bin", "*.pt", "*.pth")
TOKENIZERS = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


def needed(names) -> list[str]:
    """The names among `names` (paths in the repository) that an MLX model needs: files at
    its top level only."""
    return sorted(
        n for n in names if "/" not in n and any(fnmatch.fnmatchcase(n, p) for p in NEEDED)
    )


def pytorch_only(names) -> bool:
    """Whether the repository's weights are PyTorch's alone (no safetensors at all)."""
    names = [PurePosixPath(n).name for n in names]
    has_torch = any(fnmatch.fnmatchcase(n, p) for n in names for p in PYTORCH)
    return has_torch and not any(n.endswith(".safetensors") for n in names)


def complete(snapshot: Path) -> bool:
    """Whether `snapshot` holds a whole model: its config, every weight file its index names
    (or a model*.safetensors), and a tokenizer. A file still downloading is absent from a
    snapshot (it is an .incomplete blob until whole), so a cut download is never complete."""
    if not (snapshot / "config.json").is_file():
        return False
    index = snapshot / "model.safetensors.index.json"
    if index.is_file():
        weights = set(json.loads(index.read_text()).get("weight_map", {}).values())
        if not weights or not all((snapshot / w).is_file() for w in weights):
            return False
    elif not any(p.is_file() for p in snapshot.glob("model*.safetensors")):
        return False
    return any((snapshot / t).is_file() for t in TOKENIZERS)


@lru_cache(maxsize=1)
def _mlx_lm_models() -> tuple[Path | None, dict]:
    """mlx-lm's models folder and its model_type remapping, read from its files."""
    try:
        spec = importlib.util.find_spec("mlx_lm")  # a top-level package: found, not imported
    except ImportError:
        return None, {}
    if spec is None or not spec.submodule_search_locations:
        return None, {}
    root = Path(next(iter(spec.submodule_search_locations)))
    remap: dict = {}
    utils = root / "utils.py"
    if utils.is_file():
        for node in ast.parse(utils.read_text()).body:
            targets = getattr(node, "targets", None) or [getattr(node, "target", None)]
            if any(getattr(t, "id", None) == "MODEL_REMAPPING" for t in targets):
                remap = ast.literal_eval(node.value)
    return root / "models", remap


def architecture_known(model_type: str) -> bool:
    """Whether mlx-lm has a model for `model_type` (after its remapping); True when mlx-lm
    is not installed where this can see it (the load then says)."""
    models, remap = _mlx_lm_models()
    if models is None:
        return True
    name = remap.get(model_type, model_type)
    return bool(name) and (models / f"{name}.py").is_file()
