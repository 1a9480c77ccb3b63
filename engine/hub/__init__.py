"""Models by their Hugging Face name: references, revisions, and the Hugging Face cache.

`--model` (and `NAME=REF`, `--draft-model`) takes a local directory or a
repository id with an optional revision, `org/name[@rev]` (`refs`). A reference
is resolved to a snapshot directory of the standard Hugging Face cache
(`HF_HUB_CACHE`, else `HF_HOME/hub`), downloading only the files an MLX model
needs (`files`), through huggingface_hub, honouring `HF_TOKEN`,
`HF_HUB_OFFLINE` and `HF_ENDPOINT` (`HubSettings`). A snapshot already complete
in the cache is used without the network. Before a download it checks what
the repository lists (PyTorch-only weights, the architecture, the room on the
disk), and every failure is one `HubError` line (`fetch`). While it downloads,
`progress` reports bytes, rate and time left. `cached` lists and removes what
the cache holds.

The one way in: `resolve(ref_text, settings)` -> the model's directory. It
knows names, revisions, files and bytes; it imports neither MLX nor Ray, and
mlx-lm only as files on disk (which architectures it has).
"""

from engine.hub.cached import CachedModel, cached_models, remove
from engine.hub.fetch import HubError, resolve
from engine.hub.refs import HubSettings, ModelRef, parse_ref

__all__ = [
    "CachedModel",
    "HubError",
    "HubSettings",
    "ModelRef",
    "cached_models",
    "parse_ref",
    "remove",
    "resolve",
]
