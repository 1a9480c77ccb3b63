"""The cache policy: which prompt prefixes to keep, where to capture state, what to evict.

Pure Python plus numpy. The policy sees a stored snapshot through a few
numbers (token ids, lengths, kinds, bytes) and never through a tensor, and it
imports neither MLX nor Ray: the model actor holds the tensors and obeys the
Orders this package hands out (docs/architecture.md, "The cache contract").
"""

from engine.cache.manager import CacheManager

__all__ = ["CacheManager"]
