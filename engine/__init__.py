"""The lineage engine: a serving engine for hybrid recurrent/attention LLMs."""

__version__ = "0.1.0"
