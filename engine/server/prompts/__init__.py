"""Prompts from requests: what the model reads, and what its output is held to.

`prompt.PromptBuilder` validates a request, removes volatile lines (`volatile`),
renders the chat template (`renders`: the client's render and the engine's own;
`sandbox`: a second render for a template transformers' sandbox refuses for changing
its own lists; `variables`: what published templates read that no request defines),
finds the layout and the anchor boundary (`layout`); `output_format` decides at load
which markup the model writes; `constraints` turns a request's constraint into its
grammar. Its way in: `prompt.PromptBuilder`.

It imports `security` (limits) and `errors`; nothing of the front end above it.
"""
