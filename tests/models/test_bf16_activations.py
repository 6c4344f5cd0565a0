"""``keep_activations_bf16``: under CPU bf16 autocast the norms' outputs are cast once and the rotation runs in bf16."""

from __future__ import annotations

import copy

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from progpo.models.bf16_activations import autocast_activations, keep_activations_bf16
from progpo.models.logprobs import forward_logprobs, pad_prompt_response

HEAD_DIM = 8


def _model() -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return Qwen2ForCausalLM(config)


def _with_bf16_rotary_tables(model: Qwen2ForCausalLM) -> Qwen2ForCausalLM:
    """The rotation in bf16 by definition: the rotary embedding's cos/sin rounded to bf16, nothing else changed."""
    rotary = model.model.rotary_emb
    float_tables = rotary.forward
    rotary.forward = lambda x, position_ids: tuple(t.to(torch.bfloat16) for t in float_tables(x, position_ids))
    return model


def _logprobs_and_grads(model, autocast: bool = True):
    batch = pad_prompt_response([[1, 2, 3, 4, 5], [6, 7, 8]], [[9, 10, 11], [12, 13]], pad_token_id=0)
    model.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False, enabled=autocast):
        out = forward_logprobs(model, batch.input_ids, batch.attention_mask, batch.response_mask)
    out.token_logprobs.sum().backward()
    return out.token_logprobs.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]


def _cast_count(model, last_dim: int) -> int:
    """Float32 -> bf16 casts of tensors whose last dimension is ``last_dim`` in one forward under CPU bf16
    autocast (torch's profiler)."""
    batch = pad_prompt_response([[1, 2, 3, 4, 5]], [[9, 10]], pad_token_id=0)
    with torch.profiler.profile(record_shapes=True) as prof, torch.no_grad(), \
            torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
        forward_logprobs(model, batch.input_ids, batch.attention_mask, batch.response_mask)
    return sum(e.count for e in prof.key_averages(group_by_input_shape=True)
               if e.key == "aten::_to_copy" and e.input_shapes and e.input_shapes[0][-1:] == [last_dim])


def test_hooked_once_and_equal_to_autocast_with_bf16_rotary_tables():
    plain = _model()
    hooked = copy.deepcopy(plain)
    keep_activations_bf16(hooked)
    keep_activations_bf16(hooked)  # a second call adds no second hook
    assert all(len(layer.input_layernorm._forward_hooks) == 1 for layer in hooked.model.layers)
    assert len(hooked.model.rotary_emb._forward_hooks) == 1
    reference_lp, reference_grads = _logprobs_and_grads(_with_bf16_rotary_tables(plain))
    hooked_lp, hooked_grads = _logprobs_and_grads(hooked)
    # the forward: the projections get the very bf16 tensor autocast makes of a norm's output, so with the same
    # bf16 rotation the log-probs are identical
    assert torch.equal(reference_lp, hooked_lp)
    # the backward adds the projections' input gradients in bf16 first: equal to bf16 precision
    for a, b in zip(reference_grads, hooked_grads):
        assert float((a - b).norm()) <= 2e-2 * float(a.norm()) + 1e-8


def test_within_bf16_precision_of_float64():
    plain = _model()
    hooked = copy.deepcopy(plain)
    keep_activations_bf16(hooked)
    exact_lp, exact_grads = _logprobs_and_grads(copy.deepcopy(plain).double(), autocast=False)
    plain_lp, plain_grads = _logprobs_and_grads(plain)
    hooked_lp, hooked_grads = _logprobs_and_grads(hooked)
    plain_error = float((plain_lp.double() - exact_lp).abs().max())
    hooked_error = float((hooked_lp.double() - exact_lp).abs().max())
    assert hooked_error <= 3e-2 and hooked_error <= 2 * plain_error + 1e-3
    for exact, grad in zip(exact_grads, hooked_grads):
        assert float((grad.double() - exact).norm()) <= 5e-2 * float(exact.norm()) + 1e-8


def test_fewer_casts_of_norm_outputs_and_of_queries_and_keys():
    plain = _model()
    hooked = copy.deepcopy(plain)
    keep_activations_bf16(hooked)
    assert _cast_count(hooked, plain.config.hidden_size) < _cast_count(plain, plain.config.hidden_size)
    # queries and keys leave a float32 rotation and are cast back by the attention; a bf16 one needs no cast
    assert _cast_count(hooked, HEAD_DIM) < _cast_count(plain, HEAD_DIM)


def test_under_autocast_the_rotary_tables_are_bf16():
    hooked = _model()
    keep_activations_bf16(hooked)
    hidden, positions = torch.randn(1, 4, 32), torch.arange(4).unsqueeze(0)
    with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
        assert all(t.dtype == torch.bfloat16 for t in hooked.model.rotary_emb(hidden, positions))
    assert all(t.dtype == torch.float32 for t in hooked.model.rotary_emb(hidden, positions))


def test_outside_autocast_everything_is_float32_and_unchanged():
    plain = _model()
    hooked = copy.deepcopy(plain)
    keep_activations_bf16(hooked)
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        assert torch.equal(plain(ids).logits, hooked(ids).logits)
        assert hooked.model.layers[0].input_layernorm(torch.randn(1, 4, 32)).dtype == torch.float32


def test_inside_autocast_activations_the_hooks_step_aside():
    """What ``bench iteration``'s "before" path runs: autocast's own dtypes, the same numbers as an unhooked model."""
    plain = _model()
    hooked = copy.deepcopy(plain)
    keep_activations_bf16(hooked)
    plain_lp, _ = _logprobs_and_grads(plain)
    with autocast_activations():
        aside_lp, _ = _logprobs_and_grads(hooked)
    hooked_lp, _ = _logprobs_and_grads(hooked)
    assert torch.equal(aside_lp, plain_lp)
    assert not torch.equal(hooked_lp, plain_lp)  # and outside it they are on again
