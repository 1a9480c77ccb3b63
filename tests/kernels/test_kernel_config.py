"""The kernels' settings: one frozen tree, CLI flags over environment over defaults."""

from __future__ import annotations

import argparse

import pytest

from clients.cli.args import add_serve_arguments as serve_arguments
from clients.cli.args import config_from_args
from engine.config import EngineConfig, KernelConfig


def _config(argv: list[str], env: dict) -> EngineConfig:
    p = argparse.ArgumentParser()
    serve_arguments(p)
    return config_from_args(p.parse_args(argv), {"LINEAGE_CACHE_DIR": "/tmp", **env})


def test_defaults():
    k = _config([], {}).kernels
    assert k == KernelConfig(True, 128, 512, 64, "auto", True, 1024)


def test_environment_then_flags():
    env = {
        "LINEAGE_SPARSE_KERNELS": "0",
        "LINEAGE_SPARSE_DECODE_MAX": "64",
        "LINEAGE_SPARSE_GATHER_MAX": "256",
        "LINEAGE_SPARSE_BLOCK": "32",
        "LINEAGE_GATED_DELTA": "fast",
        "LINEAGE_DENSE_KERNEL": "off",
        "LINEAGE_DENSE_MIN_KEYS": "4096",
    }
    assert _config([], env).kernels == KernelConfig(False, 64, 256, 32, "fast", False, 4096)
    flags = ["--sparse-kernels", "on", "--sparse-decode-max", "16", "--gated-delta", "ops"]
    flags += ["--dense-kernel", "on", "--dense-min-keys", "512"]
    assert _config(flags, env).kernels == KernelConfig(True, 16, 256, 32, "ops", True, 512)


@pytest.mark.parametrize(
    "env, needle",
    [
        ({"LINEAGE_SPARSE_KERNELS": "maybe"}, "--sparse-kernels"),
        ({"LINEAGE_SPARSE_DECODE_MAX": "600"}, "sparse thresholds"),
        ({"LINEAGE_SPARSE_BLOCK": "0"}, "sparse block"),
        ({"LINEAGE_GATED_DELTA": "turbo"}, "--gated-delta"),
        ({"LINEAGE_DENSE_KERNEL": "sometimes"}, "--dense-kernel"),
        ({"LINEAGE_DENSE_MIN_KEYS": "0"}, "dense min keys"),
        ({"LINEAGE_DENSE_CHUNK_MIN_KEYS": "0"}, "--dense-chunk-min-keys"),
        ({"LINEAGE_HOST_LINEAR_MIN_ROWS": "0"}, "--host-linear-min-rows"),
        ({"LINEAGE_HOST_LINEAR": "maybe"}, "--host-linear"),
        ({"LINEAGE_GATED_DELTA_HOST_MIN_STEPS": "-1"}, "--gated-delta-host-min-steps"),
    ],
)
def test_bad_values_name_the_setting(env, needle):
    with pytest.raises(ValueError, match=needle):
        EngineConfig.from_sources({}, {"LINEAGE_CACHE_DIR": "/tmp", **env})


def test_the_peers_set_turns_every_kernel_off_whatever_the_single_switches_say():
    env = {"LINEAGE_HOST_LINEAR": "on", "LINEAGE_GATED_DELTA": "fast"}
    k = _config(["--kernels", "peers", "--cpu-fusion", "on"], env).kernels
    assert (k.sparse, k.dense, k.host_linear, k.cpu_fusion) == (False,) * 4
    assert k.gated_delta == "ops"
    assert _config([], {"LINEAGE_KERNELS": "peers"}).kernels.host_linear is False
    assert _config([], {}).kernels.host_linear is True
    with pytest.raises(ValueError, match="--kernels"):
        EngineConfig.from_sources({}, {"LINEAGE_CACHE_DIR": "/tmp", "LINEAGE_KERNELS": "theirs"})


def test_the_peers_set_installs_no_kernel_into_the_model(random_model_dir):
    import mlx_lm

    from engine.runtime.model.loader import install_kernels

    model, _ = mlx_lm.load(str(random_model_dir))
    assert install_kernels(model, EngineConfig())  # ours: some are active on this model
    model, _ = mlx_lm.load(str(random_model_dir))
    assert install_kernels(model, EngineConfig(kernels=KernelConfig(kernels="peers"))) == ()
