"""``cast_norm_outputs``: one bf16 cast per norm under CPU bf16 autocast, the numbers autocast would give."""

from __future__ import annotations

import copy

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from progpo.models.logprobs import forward_logprobs, pad_prompt_response
from progpo.models.norm_cast import cast_norm_outputs


def _model() -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return Qwen2ForCausalLM(config)


def _logprobs_and_grads(model):
    batch = pad_prompt_response([[1, 2, 3, 4, 5], [6, 7, 8]], [[9, 10, 11], [12, 13]], pad_token_id=0)
    model.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
        out = forward_logprobs(model, batch.input_ids, batch.attention_mask, batch.response_mask)
    out.token_logprobs.sum().backward()
    return out.token_logprobs.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]


def _cast_count(model) -> int:
    """Float32 -> bf16 casts in one forward under CPU bf16 autocast (torch's profiler)."""
    batch = pad_prompt_response([[1, 2, 3, 4, 5]], [[9, 10]], pad_token_id=0)
    with torch.profiler.profile(record_shapes=True) as prof, torch.no_grad(), \
            torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
        forward_logprobs(model, batch.input_ids, batch.attention_mask, batch.response_mask)
    hidden = model.config.hidden_size
    return sum(e.count for e in prof.key_averages(group_by_input_shape=True)
               if e.key == "aten::_to_copy" and e.input_shapes and e.input_shapes[0][-1:] == [hidden])


def test_norm_outputs_are_cast_once_with_the_numbers_autocast_gives():
    plain = _model()
    hooked = copy.deepcopy(plain)
    cast_norm_outputs(hooked)
    cast_norm_outputs(hooked)  # a second call adds no second hook
    assert all(len(layer.input_layernorm._forward_hooks) == 1 for layer in hooked.model.layers)
    plain_lp, plain_grads = _logprobs_and_grads(plain)
    hooked_lp, hooked_grads = _logprobs_and_grads(hooked)
    # the forward: the projections get the very bf16 tensor autocast makes, so the log-probs are identical
    assert torch.equal(plain_lp, hooked_lp)
    # the backward adds the projections' input gradients in bf16 first: equal to bf16 precision
    for a, b in zip(plain_grads, hooked_grads):
        assert float((a - b).norm()) <= 2e-2 * float(a.norm()) + 1e-8
    assert _cast_count(hooked) < _cast_count(plain)


def test_outside_autocast_the_norms_output_float32_unchanged():
    plain = _model()
    hooked = copy.deepcopy(plain)
    cast_norm_outputs(hooked)
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        assert torch.equal(plain(ids).logits, hooked(ids).logits)
        assert hooked.model.layers[0].input_layernorm(torch.randn(1, 4, 32)).dtype == torch.float32
