"""The iteration benchmark's FLOP count, checked against torch's own FLOP counter on a real forward pass."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import Qwen2Config, Qwen2ForCausalLM

import progpo.bench.iteration as bench_iteration
from progpo.bench.cli import main as bench_main
from progpo.bench.iteration import ModelShape, PhaseTimes
from progpo.rollout.collector import RolloutCollector


def _model() -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, intermediate_size=160, max_position_embeddings=256,
                                        attn_implementation="eager"))  # attention as matmuls torch can count


def test_forward_flops_match_torchs_flop_counter():
    model = _model().eval()
    shape = ModelShape.of(model)
    length, head_positions = 48, 12
    ids = torch.randint(0, 512, (1, length))
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        hidden = model.get_decoder()(input_ids=ids).last_hidden_state
        model.get_output_embeddings()(hidden[:, -head_positions:])
    linear_and_head = 2.0 * shape.decoder_matmul_params * length + 2.0 * shape.vocab * shape.hidden * head_positions
    attention = counter.get_total_flops() - linear_and_head  # QK^T and AV, the eager matmuls
    assert attention == 4.0 * shape.layers * shape.hidden * length * length
    # torch counts the full T x T score matrix; a causal pass needs the (T + 1) / 2T share of it
    causal = 2.0 * shape.layers * shape.hidden * length * (length + 1)
    assert attention * (length + 1) / (2 * length) == causal
    assert shape.forward_flops(length, head_positions) == linear_and_head + causal


def test_window_flops_count_the_last_layer_at_the_window_only():
    model = _model().eval()
    shape = ModelShape.of(model)
    length, window = 40, 6
    full = shape.forward_flops(length, window)
    windowed = shape.forward_flops(length, window, window=window)
    per_layer = shape.decoder_matmul_params / shape.layers
    # the last layer's q, o and MLP at 34 fewer positions; its queries' attention over their keys only
    saved_linear = 2.0 * (per_layer - shape.key_value_params) * (length - window)
    saved_attention = 4.0 * shape.hidden * sum(t + 1 for t in range(length - window))
    assert full - windowed == saved_linear + saved_attention
    assert shape.forward_flops(length, window, window=length) == full  # a window over every position is the pass


@pytest.mark.slow
def test_bench_iteration_command_reports_every_phase_for_every_path(capsys, monkeypatch):
    import progpo.hardware as hardware
    import progpo.models.attention as attention
    import progpo.models.shapes as shapes

    monkeypatch.setattr(attention, "SDPA_WITHOUT_GRAD", False)  # the label checked below, on every host
    monkeypatch.setattr(shapes, "PAD_SHAPES", False)
    calls = []
    for name in ("warm_up", "collect"):
        method = getattr(RolloutCollector, name)
        monkeypatch.setattr(RolloutCollector, name,
                            lambda self, *a, _m=method, _n=name, **k: calls.append(_n) or _m(self, *a, **k))
    # every step in the update, so the reference pass has steps to score even when the tiny warm start wins nothing
    bench_main(["iteration", "experiment=fast_dev", "ppo.skip_zero_advantage=false", "--repeats", "1", "--bf16", "on"])
    out = capsys.readouterr().out
    # an untimed warm-up iteration, then the workers start on the repeat's games before any path is timed
    assert calls == ["collect", "warm_up", "collect", "collect", "collect"]
    assert "untimed warm-up iterations on bf16 new before the repeats: 1" in out
    assert "env workers warmed up before each repeat's paths" in out
    assert "matmul peak" in out and "float32" in out and "bf16" in out
    header = next(line for line in out.splitlines() if line.startswith("| phase |"))
    assert "float32 before s" in header and "bf16 before s" in header and "bf16 new s" in header
    for phase in ("| rollout |", "| score, recompute (actor + ref, all steps) |", "| score, reuse (ref, updated steps) |",
                  "| update, each step its own forward (before) |", "| update (identical turns share a forward) |"):
        row = next(line for line in out.splitlines() if line.startswith(phase))
        assert "GFLOP/s" not in row and row.count("%") == 3  # a measured rate against the peak on every path
    assert "old path (float32, recompute old log-probs, every step its own update forward)" in out
    assert out.count("faster than the old path") == 3
    assert ("bf16 new (bf16, attention bf16_matmul, response window, bf16 norm outputs and rotary tables, rotary "
            "embeddings in two passes on a CPU, ") in out
    # fast_dev names 8 steps per pass; the engine's auto follows the machine's rule on the new path only
    rows = 64 if hardware.cpu_has_amx() else 32
    assert f"bf16 new (bf16, attention bf16_matmul, response window, bf16 norm outputs and rotary tables, rotary " \
           f"embeddings in two passes on a CPU, {rows} prompts per decoding call, 8 steps per scoring and update " \
           f"pass)" in out
    assert "bf16 before (bf16, attention sdpa, every position, 32 prompts per decoding call, 8 steps" in out
    assert "new path against bf16 before:" in out


@pytest.mark.slow
def test_no_path_is_always_measured_first(capsys, monkeypatch):
    """The warm-up iterations run the new path untimed; then each repeat measures the paths, reversed on odd
    repeats, every repeat on its own tasks (the warm-up on the first repeat's, with other sampling seeds)."""
    measured = []

    def record(rl, tasks, optimizer_factory, shape, path, seed, auto_micro):
        measured.append((path.name, seed, tuple(id(t) for t in tasks)))
        return PhaseTimes(*([1.0] * 6), 10, 10, *([1e9] * 5), 0.0)

    monkeypatch.setattr(bench_iteration, "measure", record)
    bench_main(["iteration", "experiment=fast_dev", "--repeats", "3", "--warm-up", "2", "--bf16", "on"])
    paths = ["float32 before", "bf16 before", "bf16 new"]
    assert [(name, seed) for name, seed, _ in measured] == (
        [("bf16 new", 3), ("bf16 new", 4)]
        + [(p, 0) for p in paths] + [(p, 1) for p in reversed(paths)] + [(p, 2) for p in paths])
    tasks = [t for _, _, t in measured]
    assert tasks[0] == tasks[1] == tasks[2] and len({tasks[2], tasks[5], tasks[8]}) == 3
    assert "untimed warm-up iterations on bf16 new before the repeats: 2" in capsys.readouterr().out


@pytest.mark.parametrize("amx", [False, True])
def test_the_new_paths_label_says_what_an_amx_cpu_changes(monkeypatch, amx):
    """There passes without gradients run SDPA and scoring and update batches are padded to a few shapes."""
    import progpo.models.attention as attention
    import progpo.models.shapes as shapes
    from progpo.bench.iteration import _report, bench_paths

    monkeypatch.setattr(attention, "SDPA_WITHOUT_GRAD", amx)
    monkeypatch.setattr(shapes, "PAD_SHAPES", amx)
    times = PhaseTimes(*([1.0] * 6), 10, 10, *([1e9] * 5), 0.0)
    out = _report("medians", {path: [times] for path in bench_paths(True, "bf16_matmul")},
                  {"float32": 100.0, "bf16": 200.0})
    label = "bf16 new (bf16, attention bf16_matmul (SDPA without gradients, as on every AMX-BF16 CPU), response window"
    assert (label in out) == amx
    assert ("rotary tables, batches padded to a few shapes (AMX-BF16), rotary embeddings" in out) == amx
    assert "bf16 before (bf16, attention sdpa, every position, 32 prompts" in out  # neither: the path before both
    assert [p.padded_shapes for p in bench_paths(True, "bf16_matmul")] == [False, False, True]
    assert [p.two_pass_rotary for p in bench_paths(True, "bf16_matmul")] == [False, False, True]


def test_the_paths_before_run_32_rows_where_the_config_says_auto(monkeypatch):
    """The new path's batch sizes follow the machine's rule; the paths before keep 32 where the config says auto and
    the configured size where it names one; the run's own sizes come back afterwards."""
    from types import SimpleNamespace

    import progpo.hardware as hardware
    from progpo.bench.iteration import _batch_rows, bench_paths
    from progpo.config import PPOConfig

    monkeypatch.setattr(hardware, "cpu_has_amx", lambda: True)
    before, new = bench_paths(True, "bf16_matmul")[1:]
    for auto_micro, micro in ((True, 64), (False, 4)):
        engine = SimpleNamespace(batch_size="auto")
        rl = SimpleNamespace(engine=engine, ppo=PPOConfig(micro_batch_size=micro))
        with _batch_rows(rl, before, auto_micro):
            assert (engine.batch_size, rl.ppo.micro_batch_size) == (32, 32 if auto_micro else 4)
        assert (engine.batch_size, rl.ppo.micro_batch_size) == ("auto", micro)
        with _batch_rows(rl, new, auto_micro):
            assert (engine.batch_size, rl.ppo.micro_batch_size) == ("auto", micro)
