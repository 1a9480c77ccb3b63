"""A prompt's ids as the server builds them, in the benchmark's own process.

`PromptIds` renders and tokenizes messages exactly as the front end does (through
the wire format: clients.client.build_request, engine.server.rpc.requests), so each
policy's prompt can be checked against the engine's `usage.prompt_tokens` and the
oracle reads the same ids; `system_end` finds where mlx_lm.server's "system"
segment ends. It knows the tokenizer and the prompt builder; nothing of a policy.
Cheap to import: mlx-lm is imported when a PromptIds is built.
"""

from __future__ import annotations

import numpy as np


class PromptIds:
    """The front end's rendering and tokenization, in this process."""

    def __init__(self, model_path: str):
        from pathlib import Path

        from mlx_lm.utils import load_tokenizer

        from engine.server.prompts.prompt import PromptBuilder

        self.tokenizer = load_tokenizer(Path(model_path))
        self.builder = PromptBuilder(self.tokenizer, 1 << 30, 1 << 30)

    def encode(self, messages: list, tools) -> np.ndarray:
        """Prompt ids as the server builds them (through the wire format)."""
        from clients.client import build_request
        from engine.server.rpc.requests import to_prompt_input

        inp = to_prompt_input(build_request(messages=messages, tools=list(tools), max_tokens=1))
        return np.asarray(self.builder.build(inp).tokens, dtype=np.int32)

    def system_end(self, messages: list, tools, prompt: np.ndarray) -> int:
        """Where mlx_lm.server's "system" segment ends (0: none), as its _tokenize finds it."""
        lead = 0
        while lead < len(messages) and messages[lead]["role"] == "system":
            lead += 1
        if not lead or messages[-1]["role"] != "user":
            return 0
        text = self.builder.render(
            messages[:lead] + [{"role": "user", "content": ""}], tools, add_generation_prompt=False
        )
        head = self.tokenizer.encode(text, add_special_tokens=False)
        end = next((i for i, (a, b) in enumerate(zip(head, prompt.tolist())) if a != b), 0)
        return end if 0 < end < len(prompt) else 0
