"""Structured output: what grammar a request asks for, and one matcher per sequence.

What it knows: `grammar` builds and checks a request's grammar (`Grammar`: a JSON
schema, a tool choice, or Lark text as llguidance reads it), from `schema` (the
Grammar, the keyword checks, llguidance's check), `tools` (a tool choice in the
served family's call markup), `markup` (each family's markup, as a table), `values`
(tool arguments written as parameters in markup) and `tagged` (what the families
whose calls are messages or lists of their own add: Seed-OSS, LFM2, GigaChat, Solar
Open) and `tag_tools` (the families whose calls are tags: Kimi K3, MiniMax-M1/M3, Muse
Glimmer, MiniCPM, Hunyuan 3, Functionary); `matcher` compiles it
against the tokenizer (`Grammars`, cached per model) into one `Matcher` per
constrained sequence (the bitmask of the tokens allowed next, accept, rollback);
`masked_batch` is mlx-lm's generation batch with each constrained row masked by its
own matcher.

One name per stage, across the house: a client asks for a `constraint` (a JSON schema,
a tool choice, Lark text: clients.constraints, the proto's Constraint, read off the
wire's `response_format`, `text.format` or `tool_choice`); the front end builds from it
the `Grammar` the request carries (engine.server.prompts.constraints); the batch keeps
one `Matcher` per constrained sequence; the sampler applies its `mask`.

Its one way in from outside: `grammar` for the front end (building the Grammar a
request carries), `matcher.Grammars` for the generator, `masked_batch` for the
batch generators.

It must not import anything of the engine outside this package: MLX, numpy and
llguidance only (tests/test_layering.py).
"""
