"""How much of the engine's own analysis survives on each chat template of the test corpus.

    python -m scripts.template_analysis [--templates tests/templates]

For each template (with the embedded BPE, its tool and reasoning markup as plain
text), three conversations (system + tools, tools only, system without tools) are
built as the front end builds them. Printed per template: the output family, the
anchor (tokens; 0 = none) and the message starts found (distinct starts after the
first, of the messages after the first), with the engine's fallback (placeholder
messages) and without it (the head's own render alone), and the conversations the
template itself refuses (the client's render: a 400 with its message).
docs/templates.md sums up what it prints.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from engine.server.prompts.prompt import PromptBuilder, PromptInput
from tests.tokenizers import MARKUP, ROOT, tokenizer_dir

TOOLS = (
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    },
)
SYSTEM = {"role": "system", "content": "You are a coding agent. Be brief."}
ASK = {"role": "user", "content": "Open a.py please."}
CALL = {
    "role": "assistant",
    "content": "",
    "reasoning_content": "I need to read it.",
    "tool_calls": [
        {
            "id": "call00001",
            "type": "function",
            "function": {"name": "read_file", "arguments": {"path": "a.py"}},
        }
    ],
}
RESULT = {"role": "tool", "tool_call_id": "call00001", "name": "read_file", "content": "x = 1"}
NEXT = {"role": "user", "content": "Thanks, now explain it."}
CONVERSATIONS = {
    "system+tools": ((SYSTEM, ASK, CALL, RESULT, NEXT), TOOLS),
    "tools only": ((ASK, CALL, RESULT, NEXT), TOOLS),
    "system, no tools": ((SYSTEM, ASK, {"role": "assistant", "content": "Done."}, NEXT), None),
}


def analyse(builder: PromptBuilder, messages, tools) -> str:
    try:
        p = builder.build(PromptInput(messages=tuple(messages), tools=tools))
    except Exception as e:
        return f"refused ({str(e).split(':', 1)[-1].strip()[:40]})"
    starts = p.layout.starts
    found = len(set(starts[1:]) - {starts[0]}) if starts else 0
    return f"anchor {p.anchor_len}, starts {found}/{len(messages) - 1}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--templates", type=Path, default=ROOT / "tests" / "templates")
    args = parser.parse_args()
    from mlx_lm.utils import load_tokenizer

    out = Path(tempfile.mkdtemp(prefix="template-analysis-"))
    print("| template | family | conversation | with the fallback | own render alone |")
    print("|---|---|---|---|---|")
    for path in sorted(args.templates.glob("*.jinja")):
        tok_dir = tokenizer_dir(out / path.stem, path.read_text(), text_markup=MARKUP)
        tokenizer = load_tokenizer(tok_dir)
        builder = PromptBuilder(tokenizer, 1 << 20, 1 << 20)
        bare = PromptBuilder(tokenizer, 1 << 20, 1 << 20)
        bare.renders.placeholders = False  # the head's own render alone
        for name, (messages, tools) in CONVERSATIONS.items():
            row = [path.stem, builder.output_format, name]
            row += [analyse(builder, messages, tools), analyse(bare, messages, tools)]
            print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
