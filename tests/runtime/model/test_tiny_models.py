"""Tiny random-weight models, the embedded model's install, the committed tokenizer and its
chat template (what the embedded model has learned: test_trained_model.py).

Real MLX on tiny shapes: every test here runs in well under a second or two
on a laptop CPU.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import mlx_lm
import pytest
from mlx_lm.models.cache import ArraysCache, CacheList, KVCache, RotatingKVCache
from transformers import AutoTokenizer
from transformers.utils.chat_template_utils import render_jinja_template

from engine.runtime.model import tiny_models as tm

REPO = Path(__file__).resolve().parents[3]
PROMPT = mx.array([[(7 + 37 * i) % 4000 for i in range(96)]])

# arch -> the cache class of each layer, in order (what make_cache returns).
CACHE_LAYOUTS = {
    "qwen3_next": [ArraysCache, KVCache, ArraysCache, KVCache],
    "kimi_linear": [ArraysCache, ArraysCache, ArraysCache, KVCache],
    "mamba2": [ArraysCache, ArraysCache, ArraysCache],
    "llama": [KVCache, KVCache],
    "glm_moe_dsa": [CacheList, CacheList],
    "gemma3_text": [RotatingKVCache, RotatingKVCache, KVCache],
}


@pytest.fixture(scope="module")
def models():
    """One tiny model per arch, shared by the module's tests (read-only)."""
    return {arch: tm.build_model(arch) for arch in tm.ARCHS}


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(str(tm.TOKENIZER_DIR))


def weights_digest(model) -> str:
    digest = hashlib.sha256()
    for name, value in sorted(tm.model_weights(model).items()):
        digest.update(name.encode())
        digest.update(memoryview(value))
    return digest.hexdigest()


# ---------------------------------------------------------------- models


def test_archs_cover_every_config():
    assert set(tm.ARCHS) == set(CACHE_LAYOUTS)
    for arch in tm.ARCHS:
        config = tm.config_for(arch)
        assert config["model_type"] == arch
        assert config["vocab_size"] == tm.VOCAB_SIZE
        assert config["hidden_size"] <= 128


@pytest.mark.parametrize(
    "arch, size",
    [("nope", "tiny"), ("llama", "bench"), ("llama", "embedded"), ("qwen3_next", "huge")],
)
def test_config_for_rejects_unknown(arch, size):
    with pytest.raises(ValueError, match=repr(arch) if arch == "nope" else repr(size)):
        tm.config_for(arch, size)


def test_qwen3_next_mixes_gdn_and_gqa_attention():
    config = tm.config_for("qwen3_next")
    assert config["num_key_value_heads"] < config["num_attention_heads"]
    assert config["num_experts"] == 0
    bench = tm.config_for("qwen3_next", "bench")
    assert bench["hidden_size"] == 512 and bench["num_hidden_layers"] == 8
    assert bench["max_position_embeddings"] >= 128 * 1024


@pytest.mark.parametrize("arch", tm.ARCHS)
def test_model_gives_finite_varied_logits(models, arch):
    logits = models[arch](PROMPT)
    assert logits.shape == (1, PROMPT.shape[1], tm.VOCAB_SIZE)
    assert mx.isfinite(logits).all().item()
    # Not degenerate: the distribution varies over the vocabulary and over positions.
    assert logits[0, -1].std().item() > 0.1
    assert (logits[0, 3] - logits[0, -1]).abs().max().item() > 0.1


@pytest.mark.parametrize("arch", tm.ARCHS)
def test_cache_layout_and_chunked_prefill_match_one_shot(models, arch):
    model = models[arch]
    cache = model.make_cache()
    assert [type(c) for c in cache] == CACHE_LAYOUTS[arch]
    spans = [(0, 40), (40, 90)] + [(i, i + 1) for i in range(90, PROMPT.shape[1])]
    chunked = mx.concatenate([model(PROMPT[:, a:b], cache=cache) for a, b in spans], axis=1)
    assert mx.allclose(chunked, model(PROMPT), atol=1e-4).item()


def test_sliding_window_cache_really_rotates(models):
    cache = models["gemma3_text"].make_cache()
    models["gemma3_text"](PROMPT, cache=cache)
    models["gemma3_text"](PROMPT[:, :1], cache=cache)  # one decode step
    window = tm.config_for("gemma3_text")["sliding_window"]
    assert PROMPT.shape[1] > window
    # A prefill chunk is kept whole for its own attention; the next step trims.
    assert cache[0].keys.shape[2] == window
    assert cache[2].offset == PROMPT.shape[1] + 1


def test_recurrent_layers_stay_finite_over_hundreds_of_tokens(models):
    long_prompt = mx.array([[(11 + 53 * i) % 4000 for i in range(400)]])
    for arch in ("qwen3_next", "kimi_linear", "mamba2"):
        assert mx.isfinite(models[arch](long_prompt)).all().item(), arch


def test_build_is_deterministic_and_seeded():
    a = tm.build_model("qwen3_next", seed=0)
    b = tm.build_model("qwen3_next", seed=0)
    c = tm.build_model("qwen3_next", seed=1)
    assert weights_digest(a) == weights_digest(b) != weights_digest(c)


def test_build_is_deterministic_across_processes():
    code = (
        "import hashlib\n"
        "from engine.runtime.model import tiny_models as tm\n"
        "digest = hashlib.sha256()\n"
        "for name, value in sorted(tm.model_weights(tm.build_model('qwen3_next')).items()):\n"
        "    digest.update(name.encode())\n"
        "    digest.update(memoryview(value))\n"
        "print(digest.hexdigest())\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == weights_digest(tm.build_model("qwen3_next", seed=0))


def test_other_dtype_builds_finite():
    model = tm.build_model("qwen3_next", dtype=mx.bfloat16)
    logits = model(PROMPT)
    assert logits.dtype == mx.bfloat16 and mx.isfinite(logits).all().item()


@pytest.mark.parametrize("arch", tm.ARCHS)
def test_write_model_dir_round_trips_through_mlx_lm_load(models, tmp_path, arch):
    path = tm.write_model_dir(arch, tmp_path / arch)
    assert sorted(p.name for p in path.iterdir()) == sorted(
        ["config.json", tm.WEIGHTS_FILE, *tm.TOKENIZER_FILES]
    )
    loaded, tokenizer = mlx_lm.load(str(path))
    assert weights_digest(loaded) == weights_digest(models[arch])
    assert mx.array_equal(loaded(PROMPT), models[arch](PROMPT)).item()
    assert tokenizer.eos_token_ids == {tm.IM_END_ID, tm.ENDOFTEXT_ID}


# ---------------------------------------------------------------- default model


def test_ensure_default_model_builds_once_then_reuses(tmp_path):
    path = tm.ensure_default_model(tmp_path)
    assert path.parent == tmp_path / "models"
    assert path.name.startswith("qwen3_next-embedded-")
    stamps = {p.name: p.stat().st_mtime_ns for p in path.iterdir()}
    assert tm.ensure_default_model(tmp_path) == path
    assert {p.name: p.stat().st_mtime_ns for p in path.iterdir()} == stamps
    assert [p.name for p in (tmp_path / "models").iterdir()] == [path.name]


def test_ensure_default_model_tolerates_losing_the_race(tmp_path, monkeypatch):
    real_write = tm.write_embedded_model_dir
    final = tmp_path / "models" / tm.default_model_key()

    def write_then_get_beaten(path):
        real_write(path)
        real_write(final)  # another process finishes first

    monkeypatch.setattr(tm, "write_embedded_model_dir", write_then_get_beaten)
    assert tm.ensure_default_model(tmp_path) == final
    assert [p.name for p in (tmp_path / "models").iterdir()] == [final.name]


def test_ensure_default_model_names_a_missing_shipped_file(tmp_path, monkeypatch):
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    for name in tm.EMBEDDED_FILES:
        if name != tm.WEIGHTS_FILE:
            (shipped / name).write_bytes((tm.EMBEDDED_DIR / name).read_bytes())
    monkeypatch.setattr(tm, "EMBEDDED_DIR", shipped)
    with pytest.raises(FileNotFoundError, match=f"{tm.WEIGHTS_FILE} missing.*train_tiny"):
        tm.ensure_default_model(tmp_path / "cache")
    assert not (tmp_path / "cache").exists()  # nothing half-installed


def test_default_model_generates(tmp_path):
    model, tokenizer = mlx_lm.load(str(tm.ensure_default_model(tmp_path)))
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hello"}], add_generation_prompt=True
    )
    text = mlx_lm.generate(model, tokenizer, prompt, max_tokens=24, verbose=False)
    assert isinstance(text, str) and text


# ---------------------------------------------------------------- tokenizer


def test_tokenizer_size_fits_the_models(tokenizer):
    assert len(tokenizer) == tm.VOCAB_SIZE
    assert max(tokenizer.get_vocab().values()) < tm.VOCAB_SIZE


@pytest.mark.parametrize(
    "text",
    [
        "def lookup(entry, tokens):\n    return entry.tokens[:n]  # common prefix\n",
        "  leading spaces,\ttabs and trailing newline\n\n",
        "unicode: naïve café, 日本語, emoji 🚀",
        "",
    ],
)
def test_tokenizer_round_trips_text(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text
    assert tokenizer.encode(text) == ids  # no BOS, nothing added


@pytest.mark.parametrize(
    "token, token_id, special",
    [
        ("<|endoftext|>", tm.ENDOFTEXT_ID, True),
        ("<|im_start|>", 1, True),
        ("<|im_end|>", tm.IM_END_ID, True),
        ("<tool_call>", 4092, False),
        ("</tool_call>", 4093, False),
        ("<think>", 4094, False),
        ("</think>", 4095, False),
    ],
)
def test_special_tokens_are_single_ids(tokenizer, token, token_id, special):
    text = f"a{token}b"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert token_id in ids and len(ids) == 3
    assert tokenizer.decode(ids) == text
    # ChatML markers vanish with skip_special_tokens; tool/think markup stays.
    assert (token in tokenizer.decode(ids, skip_special_tokens=True)) != special


def test_eos_and_no_bos(tokenizer):
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.bos_token is None


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="corpus is CPython 3.11's stdlib")
def test_committed_tokenizer_matches_the_training_script(tmp_path):
    script = REPO / "scripts" / "train_tokenizer.py"
    command = [sys.executable, str(script), "--out", str(tmp_path)]
    subprocess.run(command, check=True, capture_output=True)
    for name in tm.TOKENIZER_FILES:
        assert (tmp_path / name).read_bytes() == (tm.TOKENIZER_DIR / name).read_bytes(), name


# ---------------------------------------------------------------- chat template

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    },
    {"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}},
]
SYSTEM = {"role": "system", "content": "You are a coding agent."}
SYSTEM_2 = {"role": "system", "content": "Answer briefly."}
USER = {"role": "user", "content": "List the files."}
CALL_DICT = {
    "role": "assistant",
    "content": "",
    "tool_calls": [{"type": "function", "function": {"name": "ls", "arguments": {"dir": "."}}}],
}
CALL_STRING = {
    "role": "assistant",
    "content": "Reading it.",
    "tool_calls": [
        {"type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.py"}'}}
    ],
}
TOOL_RESULT = {"role": "tool", "content": "a.py\nb.py"}
REPLY = {"role": "assistant", "content": "Two files."}


def render(tokenizer, messages, tools=None, add_generation_prompt=False) -> str:
    """The template's text; also for an empty message list, which transformers'
    apply_chat_template refuses (the anchor of a tools-only prompt needs it)."""
    rendered, _ = render_jinja_template(
        conversations=[messages],
        tools=tools,
        chat_template=tokenizer.chat_template,
        add_generation_prompt=add_generation_prompt,
    )
    return rendered[0]


def leading_system(messages):
    n = 0
    while n < len(messages) and messages[n]["role"] == "system":
        n += 1
    return messages[:n]


CONVERSATIONS = {
    "system+tools": ([SYSTEM, USER], TOOLS),
    "two systems+tools, tool round": (
        [SYSTEM, SYSTEM_2, USER, CALL_DICT, TOOL_RESULT, REPLY],
        TOOLS,
    ),
    "tools only": ([USER, CALL_STRING, TOOL_RESULT], TOOLS),
    "system only": ([SYSTEM, USER, REPLY], None),
    "neither": ([USER, REPLY], None),
    "late system message": ([SYSTEM, USER, REPLY, SYSTEM_2, USER], TOOLS),
}


@pytest.mark.parametrize("add_generation_prompt", [False, True])
@pytest.mark.parametrize("case", sorted(CONVERSATIONS))
def test_system_and_tools_render_as_a_textual_prefix(tokenizer, case, add_generation_prompt):
    messages, tools = CONVERSATIONS[case]
    full = render(tokenizer, messages, tools, add_generation_prompt)
    prefix = render(tokenizer, leading_system(messages), tools, False)
    assert full.startswith(prefix)
    assert (prefix == "") == (not tools and not leading_system(messages))
    assert full == tokenizer.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt
    )


def test_tools_come_before_the_system_text(tokenizer):
    text = render(tokenizer, [SYSTEM, SYSTEM_2, USER], TOOLS)
    assert text.startswith("<|im_start|>system\n# Tools\n")
    assert text.count("<|im_start|>system\n") == 1
    lines = text.splitlines()
    for tool in TOOLS:
        assert json.dumps(tool) in lines
    assert text.index(json.dumps(TOOLS[-1])) < text.index(SYSTEM["content"])
    assert text.index(SYSTEM["content"]) < text.index(SYSTEM_2["content"])
    assert text.endswith("<|im_end|>\n<|im_start|>user\nList the files.<|im_end|>\n")


@pytest.mark.parametrize(
    "message, expected",
    [
        (
            CALL_DICT,
            '<|im_start|>assistant\n<tool_call>\n{"name": "ls", "arguments": {"dir": "."}}'
            "\n</tool_call><|im_end|>\n",
        ),
        (
            CALL_STRING,
            '<|im_start|>assistant\nReading it.\n<tool_call>\n{"name": "read_file", '
            '"arguments": {"path": "a.py"}}\n</tool_call><|im_end|>\n',
        ),
        (TOOL_RESULT, "<|im_start|>tool\na.py\nb.py<|im_end|>\n"),
    ],
)
def test_tool_calls_and_results_render(tokenizer, message, expected):
    assert render(tokenizer, [USER, message]).endswith(expected)


@pytest.mark.parametrize(
    "messages, expected",
    [
        ([USER], "<|im_start|>user\nList the files.<|im_end|>\n<|im_start|>assistant\n"),
        ([], "<|im_start|>assistant\n"),
    ],
)
def test_generation_prompt(tokenizer, messages, expected):
    assert render(tokenizer, messages, add_generation_prompt=True) == expected
