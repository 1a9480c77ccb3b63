"""A corpus of chat templates with the structures the published model families' templates
use, and model directories that serve them.

Each `<name>.jinja` here is written for the tests (not a copy of a published file); it
reproduces what matters to a server of the family's template: where `messages[0]` (or
`messages[-1]`) is read, what is refused with `raise_exception`, where the tools are
rendered, how a past tool call is written (its arguments as a mapping, a string, or
either), how tool results and reasoning are shown. Its leading comment says which.

`FAMILIES` names the family each stands for and the markup its tokenizer holds as
added tokens: the tokenizer of these tests (engine/runtime/model/assets/tokenizer) holds only
`<|endoftext|>`, `<|im_start|>`, `<|im_end|>` (special) and `<tool_call>`,
`</tool_call>`, `<think>`, `</think>` (added), so every other family's markup is plain
text here. `template_model_dir` writes a model directory of random weights whose
tokenizer carries one of these templates, with `<tool_call>`/`</tool_call>` as added
tokens or as plain text (as in tokenizers of Hermes-style fine-tunes).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

TEMPLATES = Path(__file__).parent

# name -> (the families it stands for, the markup their tokenizers hold as added tokens)
FAMILIES = {
    "qwen2_5": ("Qwen2.5 Instruct, QwQ", "<|im_start|> <|im_end|>; <tool_call> </tool_call>"),
    "qwen3": (
        "Qwen3 (hybrid thinking)",
        "<|im_start|> <|im_end|>; <tool_call> </tool_call> <think> </think> <tool_response>",
    ),
    "qwen3_next": (
        "Qwen3-Next, Qwen3-2507 thinking",
        "<|im_start|> <|im_end|>; <tool_call> </tool_call> <think> </think> <tool_response>",
    ),
    "qwen3_coder": (
        "Qwen3-Coder",
        "<|im_start|> <|im_end|>; <tool_call> </tool_call> (<function=…> is text)",
    ),
    "kimi_k2": (
        "Kimi K2 Instruct, Kimi Linear",
        "<|im_system|> <|im_user|> <|im_assistant|> <|im_middle|> <|im_end|> "
        "<|tool_calls_section_begin|> <|tool_calls_section_end|> <|tool_call_begin|> "
        "<|tool_call_argument_begin|> <|tool_call_end|> <|media_start|> …",
    ),
    "kimi_k2_thinking": ("Kimi K2 Thinking", "as kimi_k2, and <think> </think>"),
    "glm4_5": (
        "GLM-4.5, GLM-4.6",
        "[gMASK] <sop> <|system|> <|user|> <|assistant|> <|observation|> <think> </think> "
        "<tool_call> </tool_call> <arg_key> </arg_key> <arg_value> </arg_value> "
        "<tool_response> </tool_response>",
    ),
    "deepseek_v3_1": (
        "DeepSeek-V3.1",
        "<｜begin▁of▁sentence｜> <｜User｜> <｜Assistant｜> <｜tool▁calls▁begin｜> "
        "<｜tool▁call▁begin｜> <｜tool▁sep｜> … <think> </think>",
    ),
    "deepseek_v3_2": (
        "DeepSeek-V3.2",
        "<｜begin▁of▁sentence｜> <｜User｜> <｜Assistant｜> <think> </think> (DSML is text)",
    ),
    "nemotron_nano_v2": (
        "NVIDIA Nemotron Nano v2 (Nemotron-H)",
        "<SPECIAL_10> <SPECIAL_11> <SPECIAL_12>; <think> </think> <TOOLCALL> </TOOLCALL>",
    ),
    "minimax_m2": (
        "MiniMax-M2",
        "]~!b[ ]~b] [e~[ <minimax:tool_call> </minimax:tool_call> <think> </think>",
    ),
    "llama3": (
        "Llama 3.1, 3.2, 3.3",
        "<|begin_of_text|> <|start_header_id|> <|end_header_id|> <|eot_id|> <|eom_id|> "
        "<|python_tag|> (tool calls are JSON text)",
    ),
    "mistral": (
        "Mistral Small 3.x, Mistral Instruct v3",
        "[INST] [/INST] [SYSTEM_PROMPT] [/SYSTEM_PROMPT] [AVAILABLE_TOOLS] "
        "[/AVAILABLE_TOOLS] [TOOL_CALLS] [TOOL_RESULTS] [/TOOL_RESULTS] [IMG]",
    ),
    "gemma3": ("Gemma 2, Gemma 3", "<start_of_turn> <end_of_turn> <start_of_image>"),
}
# The templates whose output format the engine reads as `qwen` (their `<tool_call>`).
QWEN_TEMPLATES = ("qwen2_5", "qwen3", "qwen3_next", "qwen3_coder")
TOOL_TOKENS = ("<tool_call>", "</tool_call>")


def template_text(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text()


def template_model_dir(tmp, template_name: str, special_tool_tokens: bool = True, weights=None):
    """A model directory under `tmp` serving the random-weight tiny qwen3_next with the
    template `template_name` in its tokenizer_config.json. `special_tool_tokens` False:
    `<tool_call>` and `</tool_call>` are not added tokens (their ids stay unused), so the
    tool markup is plain text to the tokenizer. `weights`: a model directory whose
    config.json and weights to copy (default: written once under `tmp`)."""
    from engine.runtime.model.tiny_models import TOKENIZER_DIR, TOKENIZER_FILES, write_model_dir

    tmp = Path(tmp)
    if weights is None:
        weights = tmp / "random-qwen3_next"
        if not (weights / "config.json").exists():
            write_model_dir("qwen3_next", weights)
    suffix = "special" if special_tool_tokens else "plain"
    out = tmp / f"{template_name}-{suffix}"
    if (out / "tokenizer_config.json").exists():
        return out
    out.mkdir(parents=True)
    for f in Path(weights).iterdir():
        if f.is_file() and f.name not in TOKENIZER_FILES:
            shutil.copy(f, out / f.name)
    tokenizer = json.loads((TOKENIZER_DIR / "tokenizer.json").read_text())
    config = json.loads((TOKENIZER_DIR / "tokenizer_config.json").read_text())
    config["chat_template"] = template_text(template_name)
    if not special_tool_tokens:
        tokenizer["added_tokens"] = [
            t for t in tokenizer["added_tokens"] if t["content"] not in TOOL_TOKENS
        ]
        config["added_tokens_decoder"] = {
            k: v
            for k, v in config["added_tokens_decoder"].items()
            if v["content"] not in TOOL_TOKENS
        }
    (out / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False))
    (out / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=1))
    shutil.copy(TOKENIZER_DIR / "special_tokens_map.json", out / "special_tokens_map.json")
    return out
