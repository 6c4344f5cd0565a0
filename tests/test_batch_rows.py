"""``auto`` batch sizes: 64 rows per model call on an AMX-BF16 CPU in bf16, 32 elsewhere (``progpo.hardware``).

``ppo.micro_batch_size=auto`` is resolved at start-up from the resolved precision; ``rollout.engine.batch_size=auto``
by the HF engine at each call, from the autocast in force (the same engine decodes held-out episodes and rollouts).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

import progpo.hardware
from progpo.config import ConfigError, validate_config
from progpo.hardware import auto_batch_rows, is_batch_rows

CONF = str(Path(__file__).resolve().parents[1] / "conf")
AMX = frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})
AVX512_BF16 = frozenset({"avx2", "avx512f", "avx512_bf16"})


def _compose(*overrides: str):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose(config_name="config", overrides=["logger=none", *overrides])


@pytest.mark.parametrize(("flags", "precision", "cuda", "rows"), [
    (AMX, "bf16-mixed", False, 64),
    (AMX, "bf16-true", False, 64),
    (AMX, "32-true", False, 32),  # AMX multiplies bf16 only: float32 calls are not measured to gain
    (AVX512_BF16, "bf16-mixed", False, 32),
    (frozenset({"avx2"}), "32-true", False, 32),
    (AMX, "bf16-mixed", True, 32),  # a GPU: the CPU's flags say nothing
    (None, "bf16-mixed", False, 32),  # flags unreadable
])
def test_auto_is_64_rows_only_on_an_amx_cpu_in_bf16(monkeypatch, flags, precision, cuda, rows):
    monkeypatch.setattr(progpo.hardware, "cpu_flags", lambda: flags)
    assert auto_batch_rows(precision, uses_cuda=cuda) == rows


@pytest.mark.parametrize(("value", "ok"), [("auto", True), (1, True), (64, True), (0, False), (-8, False),
                                           (True, False), ("64", False), ("big", False), (2.0, False)])
def test_batch_rows_are_a_positive_int_or_auto(value, ok):
    assert is_batch_rows(value) is ok


@pytest.mark.parametrize("key", ["ppo.micro_batch_size", "rollout.engine.batch_size"])
@pytest.mark.parametrize("value", ["0", "big"])
def test_a_bad_batch_size_is_refused_naming_the_key_and_auto(key, value):
    with pytest.raises(ConfigError, match=rf"{key} must be an int >= 1 or auto, got .*{value}"):
        validate_config(_compose(f"{key}={value}"))


def test_the_run_resolves_micro_batch_auto_from_the_resolved_precision(tmp_path, monkeypatch):
    from progpo.train import _prepare

    for flags, precision, rows in ((AMX, "auto", 64), (AMX, "32-true", 32), (AVX512_BF16, "auto", 32)):
        monkeypatch.setattr(progpo.hardware, "cpu_flags", lambda flags=flags: flags)
        cfg = _compose("experiment=fast_dev", f"run_dir={tmp_path / precision / str(len(flags))}",
                       f"trainer.precision={precision}", "ppo.micro_batch_size=auto")
        typed, *_ = _prepare(cfg)
        assert typed.ppo.micro_batch_size == rows, (flags, precision)
        assert cfg.ppo.micro_batch_size == "auto"  # the saved config keeps what was asked
    cfg = _compose("experiment=fast_dev", f"run_dir={tmp_path / 'named'}", "ppo.micro_batch_size=48")
    assert _prepare(cfg)[0].ppo.micro_batch_size == 48  # a named size is what it says


def test_the_iteration_refuses_an_unresolved_auto():
    from progpo.algo import RLIteration
    from progpo.config import PPOConfig

    with pytest.raises(ValueError, match="ppo.micro_batch_size=auto must be resolved"):
        RLIteration(None, None, None, None, None, PPOConfig(micro_batch_size="auto"), 0, 2, 1.0, 0)
