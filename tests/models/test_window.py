"""The response window (``progpo.models.window``) against the full pass: log-probs, entropies, embeddings, gradients."""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

import progpo.models.logprobs as logprobs
from progpo.models.logprobs import forward_logprobs, pad_prompt_response
from progpo.models.window import full_pass, supports_window, window_hidden, window_positions

PAD = 0
VOCAB = 97


def _qwen2(attention: str = "sdpa") -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True, pad_token_id=PAD,
        attn_implementation=attention))


def _llama(attention: str = "sdpa") -> LlamaForCausalLM:
    torch.manual_seed(1)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=6,
        num_key_value_heads=2, max_position_embeddings=256, pad_token_id=PAD, attn_implementation=attention))


def _batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(1, VOCAB, (n,), generator=g).tolist() for n in (5, 19, 3, 11, 8)]
    responses = [torch.randint(1, VOCAB, (n,), generator=g).tolist() for n in (4, 1, 7, 0, 3)]
    return pad_prompt_response(prompts, responses, PAD)


def _run(model, batch, window: bool):
    with nullcontext() if window else full_pass():
        return forward_logprobs(model, batch.input_ids, batch.attention_mask, batch.response_mask,
                                return_last_prompt_hidden=True, return_entropy=True)


@pytest.mark.parametrize("make", [_qwen2, _llama], ids=["qwen2", "llama"])
@pytest.mark.parametrize("attention", ["sdpa", "bf16_matmul"])
def test_window_equals_the_full_pass_values_and_gradients(make, attention):
    model = make(attention).train()
    assert supports_window(model)
    batch = _batch()
    grads = []
    outs = []
    for window in (True, False):
        model.zero_grad()
        out = _run(model, batch, window)
        (out.token_logprobs.sum() + out.entropy.sum()).backward()
        outs.append(out)
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    fast, full = outs
    torch.testing.assert_close(fast.token_logprobs, full.token_logprobs, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fast.entropy, full.entropy, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fast.last_prompt_hidden, full.last_prompt_hidden, atol=1e-5, rtol=1e-5)
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 0
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], atol=1e-5, rtol=1e-4, msg=name)


def test_window_hidden_equals_the_decoders_last_hidden_state_at_the_positions():
    model = _qwen2().eval()
    batch = _batch(seed=3)
    prompt = (batch.attention_mask.bool() & ~batch.response_mask.bool()).sum(1)
    positions = window_positions(prompt, batch.response_mask.sum(1), batch.input_ids.shape[1])
    assert positions.shape == (5, 7)  # the longest response
    assert positions[:, 0].tolist() == (prompt - 1).tolist()  # the last prompt token starts every window
    with torch.no_grad():
        full = model.get_decoder()(input_ids=batch.input_ids).last_hidden_state
        window = window_hidden(model, batch.input_ids, positions)
    expected = torch.stack([full[b, positions[b]] for b in range(len(positions))])
    torch.testing.assert_close(window, expected, atol=1e-5, rtol=1e-5)


def test_the_window_is_used_where_it_applies_and_the_full_pass_elsewhere(monkeypatch):
    calls = []
    monkeypatch.setattr(logprobs, "window_hidden", lambda *a: calls.append(1) or window_hidden(*a))
    batch = _batch()
    model = _qwen2()
    forward_logprobs(model, batch.input_ids, batch.attention_mask, batch.response_mask)
    assert len(calls) == 1
    with full_pass():
        assert not supports_window(model)
        forward_logprobs(model, batch.input_ids, batch.attention_mask, batch.response_mask)
    assert len(calls) == 1
    # eager attention takes an additive mask, not the window's boolean one: the full pass, the same numbers
    eager = _qwen2("eager")
    assert not supports_window(eager)
    with torch.no_grad():
        a = forward_logprobs(eager, batch.input_ids, batch.attention_mask, batch.response_mask).token_logprobs
        b = forward_logprobs(model, batch.input_ids, batch.attention_mask, batch.response_mask).token_logprobs
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    # left padding is not the window's layout: the full pass (positions counted from the first real token)
    left = torch.tensor([[PAD, PAD, 5, 6, 7], [1, 2, 3, 4, 5]])
    attention_mask = (left != PAD).long()
    response_mask = torch.tensor([[0, 0, 0, 1, 1], [0, 0, 0, 1, 1]])
    calls.clear()
    with torch.no_grad():
        out = forward_logprobs(model, left, attention_mask, response_mask)
    assert not calls and out.token_logprobs[:, 3:].lt(0).all()


def test_a_model_with_fsdp_modules_runs_the_full_pass():
    """FSDP gathers a wrapped layer's parameters in its forward, which the window's last layer does not call."""
    from torch.distributed.fsdp import FSDPModule

    model = _qwen2()
    assert supports_window(model)
    last = model.get_decoder().layers[-1]
    last.__class__ = type("FSDPQwen2DecoderLayer", (FSDPModule, type(last)), {})  # what fully_shard makes of it
    assert not supports_window(model)
