"""The model fingerprint: what makes a stored cache valid for a served model.

Each weight file's name, size and mtime (no hashing of multi-GB files), the
tokenizer's identity (a hash of its files' bytes: they are small), the KV dtype
(of the KV cache the model actually fills, not of its weights) and the KV
quantization, and the versions of what produced the stored tensors and reads
them back: mlx, mlx-lm and the entry format. A changed weight file, another
tokenizer, another KV layout or another library gives another fingerprint: a
miss, never a wrong hit.
"""

from __future__ import annotations

import hashlib
import json
from importlib import metadata
from pathlib import Path

from engine.cache.messages import ENTRY_FORMAT_VERSION

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
)


def library_versions() -> dict[str, str]:
    """The versions a stored entry depends on: mlx, mlx-lm and the entry format."""

    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "unknown"

    return {
        "mlx": version("mlx"),
        "mlx_lm": version("mlx-lm"),
        "entry_format": str(ENTRY_FORMAT_VERSION),
    }


def model_fingerprint(
    model_dir: str | Path,
    kv_dtype: str,
    kv_bits: int | None = None,
    kv_group_size: int = 64,
    versions: dict[str, str] | None = None,
) -> str:
    """A short hex digest of the weights' stat, the tokenizer bytes, the KV layout and the
    library and format versions (`versions`, default `library_versions()`)."""
    root = Path(model_dir)
    weights = sorted(p for p in root.glob("*.safetensors"))
    parts = {
        "weights": [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in weights],
        "tokenizer": {
            name: hashlib.sha256((root / name).read_bytes()).hexdigest()
            for name in TOKENIZER_FILES
            if (root / name).exists()
        },
        "config": hashlib.sha256((root / "config.json").read_bytes()).hexdigest()
        if (root / "config.json").exists()
        else "",
        "kv_dtype": kv_dtype,
        "kv_quant": [kv_bits, kv_group_size] if kv_bits else None,
        "versions": versions if versions is not None else library_versions(),
    }
    blob = json.dumps(parts, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:20]
