"""The files drafts come from, beside the served model: a draft model's directory, the MTP head's.

`load_draft` loads the `--draft-model` directory once per process and `check_draft`
refuses it at startup when its tokenizer's vocabulary is not the served model's;
`MTP_WEIGHTS_FILE` is the name of the MTP head's weights in the served model's
directory. It knows model directories and tokenizers; how drafts are made and
verified is `engine.runtime.speculative`'s, which imports this (never the other way).
"""

from __future__ import annotations

import functools
from pathlib import Path

FLAG = "--draft-model"
MTP_WEIGHTS_FILE = "mtp.safetensors"


@functools.cache
def load_draft(path: str):
    """(model, tokenizer) of the draft model at `path`, loaded once per process."""
    import mlx_lm

    where = Path(path).expanduser()
    if not (where / "config.json").exists():
        raise ValueError(f"{FLAG} {path}: no config.json there (not an mlx-lm model directory)")
    return mlx_lm.load(str(where))


def check_draft(path: str, tokenizer) -> None:
    """Refuse a draft model whose tokenizer's vocabulary is not `tokenizer`'s (the served
    model's): its token ids would mean other text. Loads it (once)."""
    _, draft_tokenizer = load_draft(path)
    ours, theirs = tokenizer.get_vocab(), draft_tokenizer.get_vocab()
    if ours == theirs:
        return
    differ = sorted(set(ours.items()) ^ set(theirs.items()), key=lambda kv: kv[1])[:3]
    raise ValueError(
        f"{FLAG} {path}: its tokenizer's vocabulary is not the served model's "
        f"({len(theirs)} tokens vs {len(ours)}; differing entries include {differ}); "
        "a draft model must share the tokenizer"
    )
