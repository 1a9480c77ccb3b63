"""Tokenizer directories the tests make from the embedded one: the same BPE, with the chat
template of another family, or with markup that is plain text instead of added tokens (as
in Hermes-style fine-tunes and many converted models, where `<tool_call>` is spelled in
ordinary pieces)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "engine" / "runtime" / "model" / "assets" / "tokenizer"
MARKUP = ("<tool_call>", "</tool_call>", "<think>", "</think>")


def tokenizer_dir(dst: Path, template: str | None = None, text_markup=()) -> Path:
    """A copy of the embedded tokenizer in `dst`: its chat template replaced by `template`
    (if given), and the added tokens named in `text_markup` removed (they become text)."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in ASSETS.iterdir():
        shutil.copy(f, dst / f.name)
    drop = set(text_markup)
    tj = json.loads((dst / "tokenizer.json").read_text())
    tj["added_tokens"] = [t for t in tj["added_tokens"] if t["content"] not in drop]
    (dst / "tokenizer.json").write_text(json.dumps(tj))
    tc = json.loads((dst / "tokenizer_config.json").read_text())
    decoder = tc["added_tokens_decoder"]
    tc["added_tokens_decoder"] = {k: v for k, v in decoder.items() if v["content"] not in drop}
    if template is not None:
        tc["chat_template"] = template
    (dst / "tokenizer_config.json").write_text(json.dumps(tc))
    return dst
