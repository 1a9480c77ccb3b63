"""The served model: its directory, loading it, its fingerprint, and the tiny models.

What it knows: `loader` resolves the model's directory, loads the MLX model and
tokenizer (installing the engine's kernels) and says what the rest of the engine
learns about it (`ModelInfo`); `draft_files` loads and checks the draft model's
directory and names the MTP head's file; `fingerprint` is what makes a stored cache
valid for it; `tiny_models` builds the random-weight models the tests run and the embedded
default model (its files in `assets/`).

Its one way in from outside: `loader.load_model(config)` (the model actor, the
in-process engine, benchmarks); tests and benchmarks use `tiny_models`.

It must not import `batching`, `structured`, `speculative` (which imports it), the
`tier`, the generator or anything above the runtime; it uses `layer_caches` and the
kernels (tests/test_layering.py).
"""


def shape_names() -> list[str]:
    """The shape-true models' names (files of shapes/; engine.runtime.model.shape_models
    builds them): read without MLX, for a parser's choices."""
    from pathlib import Path

    return sorted(p.stem for p in (Path(__file__).parent / "shapes").glob("*.json"))
