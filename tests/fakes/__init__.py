"""Fakes for the cache policy's tests: a model actor shaped like a hybrid model, and a driver.

One place for them, three modules: `model_actor` (the hybrid layout's sizes, the
token helpers and FakeModelActor, which holds entries by id and obeys Orders),
`driver` (Driver: requests through a real CacheManager and the fake actor,
every invariant checked after every call, Orders that may travel late through
HeldLink) and `disk` (real entry files with a dummy body, FakeDiskActor and
DiskDriver with the disk tier on in a directory of their own). Tests import
every name from here.
"""

from tests.fakes.disk import DiskDriver, FakeDiskActor, write_fake_file
from tests.fakes.driver import Driver, HeldLink
from tests.fakes.model_actor import (
    KVPT,
    LAYOUT,
    STATE,
    FakeModelActor,
    HybridLayout,
    Stored,
    entry_bytes,
    tokens,
)

__all__ = [
    "KVPT",
    "LAYOUT",
    "STATE",
    "DiskDriver",
    "Driver",
    "FakeDiskActor",
    "FakeModelActor",
    "HeldLink",
    "HybridLayout",
    "Stored",
    "entry_bytes",
    "tokens",
    "write_fake_file",
]
