"""Train the embedded default model's byte-level BPE tokenizer.

Regenerate the committed files with (from the repository root):

    . .venv/bin/activate && python scripts/train_tokenizer.py

which writes ``engine/runtime/model/assets/tokenizer/{tokenizer.json, tokenizer_config.json,
special_tokens_map.json}``. The corpus is text that ships with Python itself
(``pydoc_data/topics.py`` plus a fixed list of standard-library modules, read
in a fixed order), so no download is needed and the same Python minor version
gives byte-identical output. The files were made with CPython 3.11.

Ids 0-2 are the ChatML special tokens (``<|endoftext|>``, ``<|im_start|>``,
``<|im_end|>``), then the 256 byte symbols and the learned merges; the last
four ids are ``<tool_call>``, ``</tool_call>``, ``<think>``, ``</think>``:
atomic added tokens, not special (as in Qwen3), so decoding keeps them in the
text that tool-call and reasoning parsers read. 4096 ids in all; no BOS.
"""

from __future__ import annotations

import argparse
import json
import sysconfig
from pathlib import Path

from tokenizers import (
    AddedToken,
    Tokenizer,
    decoders,
    models,
    pre_tokenizers,
    processors,
    trainers,
)

VOCAB_SIZE = 4096
CHATML_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MARKUP_TOKENS = ["<tool_call>", "</tool_call>", "<think>", "</think>"]
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"

# Standard-library files, relative to the stdlib directory, in training order.
CORPUS_FILES = (
    "pydoc_data/topics.py",
    "LICENSE.txt",
    "argparse.py",
    "dataclasses.py",
    "json/__init__.py",
    "json/decoder.py",
    "json/encoder.py",
    "textwrap.py",
    "typing.py",
    "inspect.py",
    "functools.py",
    "pathlib.py",
    "subprocess.py",
    "asyncio/base_events.py",
    "asyncio/tasks.py",
    "http/client.py",
    "email/message.py",
    "logging/__init__.py",
    "unittest/case.py",
    "collections/__init__.py",
)

# Renders the tools, then the leading system messages' text, in one system
# block; every later message is one ChatML block. The system block closes the
# same way whatever follows it, so rendering (leading system messages + tools)
# alone gives an exact textual prefix of rendering the whole conversation.
CHAT_TEMPLATE = (
    "{%- macro text(content) -%}"
    "{%- if content is none -%}"
    "{%- elif content is string -%}{{- content -}}"
    "{%- else -%}{%- for part in content -%}"
    "{%- if part.type == 'text' -%}{{- part.text -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}"
    "{%- set ns = namespace(lead=0, system='') -%}"
    "{%- for message in messages -%}"
    "{%- if message.role == 'system' and loop.index0 == ns.lead -%}"
    "{%- if ns.lead > 0 -%}{%- set ns.system = ns.system ~ '\\n\\n' -%}{%- endif -%}"
    "{%- set ns.system = ns.system ~ text(message.content) -%}"
    "{%- set ns.lead = ns.lead + 1 -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if tools or ns.lead > 0 -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if tools -%}"
    "{{- '# Tools\\n\\nYou may call one or more of these functions. Each line is one "
    "function signature in JSON:\\n' -}}"
    "{%- for tool in tools -%}{{- tool | tojson -}}{{- '\\n' -}}{%- endfor -%}"
    '{{- \'\\nTo call a function, reply with <tool_call>\\n{"name": <function-name>, '
    '"arguments": <args-json-object>}\\n</tool_call>\' -}}'
    "{%- if ns.lead > 0 -%}{{- '\\n\\n' -}}{%- endif -%}"
    "{%- endif -%}"
    "{{- ns.system -}}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages[ns.lead:] -%}"
    "{{- '<|im_start|>' ~ message.role ~ '\\n' -}}"
    "{%- if message.role == 'assistant' and message.reasoning_content -%}"
    "{{- '<think>\\n' ~ message.reasoning_content ~ '\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{{- text(message.content) -}}"
    "{%- if message.role == 'assistant' and message.tool_calls -%}"
    "{%- for call in message.tool_calls -%}"
    "{%- set fn = call.function if call.function is defined else call -%}"
    "{%- if not loop.first or text(message.content) -%}{{- '\\n' -}}{%- endif -%}"
    "{{- '<tool_call>\\n{\"name\": ' ~ (fn.name | tojson) ~ ', \"arguments\": ' -}}"
    "{%- if fn.arguments is string -%}{{- fn.arguments -}}"
    "{%- else -%}{{- fn.arguments | tojson -}}{%- endif -%}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def corpus_paths() -> list[Path]:
    """The training files, in order. Raises FileNotFoundError naming a missing one."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    paths = [stdlib / name for name in CORPUS_FILES]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"corpus files missing: {missing}")
    return paths


def corpus_lines(paths: list[Path]):
    """Every line of every file, in order (the trainer's input iterator)."""
    for path in paths:
        yield from path.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)


def train(paths: list[Path]) -> Tokenizer:
    """A byte-level BPE with VOCAB_SIZE ids, special and markup tokens included."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(MARKUP_TOKENS),
        min_frequency=2,
        special_tokens=CHATML_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus_lines(paths), trainer=trainer)
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    assert size == VOCAB_SIZE, f"trained {size} ids, wanted {VOCAB_SIZE}"
    return tokenizer


def tokenizer_config(tokenizer: Tokenizer) -> dict:
    """The transformers-side tokenizer_config.json."""
    added = {
        str(tokenizer.token_to_id(t)): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": t in CHATML_TOKENS,
        }
        for t in CHATML_TOKENS + MARKUP_TOKENS
    }
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "bos_token": None,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "unk_token": None,
        "add_bos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 131072,
        "chat_template": CHAT_TEMPLATE,
    }


def special_tokens_map() -> dict:
    return {"eos_token": EOS_TOKEN, "pad_token": PAD_TOKEN}


def write(tokenizer: Tokenizer, out: Path) -> None:
    """Write the three tokenizer files into ``out`` (created if missing)."""
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / "tokenizer.json"), pretty=False)
    dump = lambda obj: json.dumps(obj, indent=2, ensure_ascii=False) + "\n"  # noqa: E731
    (out / "tokenizer_config.json").write_text(dump(tokenizer_config(tokenizer)), encoding="utf-8")
    (out / "special_tokens_map.json").write_text(dump(special_tokens_map()), encoding="utf-8")


def main() -> None:
    root = Path(__file__).resolve().parent.parent
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=root / "engine" / "runtime" / "model" / "assets" / "tokenizer"
    )
    args = parser.parse_args()
    write(train(corpus_paths()), args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
