"""The iteration benchmark's FLOP count, checked against torch's own FLOP counter on a real forward pass."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import Qwen2Config, Qwen2ForCausalLM

from progpo.bench.cli import main as bench_main
from progpo.bench.iteration import ModelShape
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
    calls = []
    for name in ("warm_up", "collect"):
        method = getattr(RolloutCollector, name)
        monkeypatch.setattr(RolloutCollector, name,
                            lambda self, *a, _m=method, _n=name, **k: calls.append(_n) or _m(self, *a, **k))
    # every step in the update, so the reference pass has steps to score even when the tiny warm start wins nothing
    bench_main(["iteration", "experiment=fast_dev", "ppo.skip_zero_advantage=false", "--repeats", "1", "--bf16", "on"])
    out = capsys.readouterr().out
    assert calls == ["warm_up", "collect", "collect", "collect"]  # the workers start before any path is timed
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
    assert "bf16 new (bf16, attention bf16_matmul, response window, bf16 norm outputs and rotary tables)" in out
    assert "new path against bf16 before:" in out
