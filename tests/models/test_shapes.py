"""Batches padded to a few shapes (``progpo.models.shapes``): the same numbers as the batch as it came, fewer shapes."""

from __future__ import annotations

import pytest
import torch
from test_window import PAD, VOCAB, _batch, _qwen2

import progpo.models.logprobs as logprobs
from progpo.models import shapes
from progpo.models.logprobs import forward_logprobs, pad_prompt_response
from progpo.models.shapes import (
    HEAD_ROW_MULTIPLE,
    LENGTH_MULTIPLE,
    ROW_MULTIPLE,
    batches_as_they_come,
    pad_batch,
    pad_head_rows,
    padding_active,
    round_up,
)


def _allowed(batch) -> list:
    """Per row and response position: the target and two other ids (the constrained decoding's renormalisation)."""
    out = []
    for ids, mask in zip(batch.input_ids.tolist(), batch.response_mask.tolist()):
        out.append([[t, (t + 1) % VOCAB or 1, (t + 7) % VOCAB or 2] for t, m in zip(ids, mask) if m])
    return out


def test_round_up():
    assert [round_up(n, 8) for n in (1, 7, 8, 9, 16, 17)] == [8, 8, 8, 16, 16, 24]


def _wide_batch():
    """10 rows (more than ``ROW_MULTIPLE``, so the rows are padded too) of 20 tokens (not a ``LENGTH_MULTIPLE``)."""
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(1, VOCAB, (n,), generator=g).tolist() for n in (5, 19, 3, 11, 8, 7, 2, 14, 9, 4)]
    responses = [torch.randint(1, VOCAB, (n,), generator=g).tolist() for n in (4, 1, 7, 0, 3, 6, 2, 5, 1, 3)]
    return pad_prompt_response(prompts, responses, PAD)


def test_pad_batch_adds_padding_columns_and_copies_of_the_last_row():
    batch = _wide_batch()
    rows, length = batch.input_ids.shape
    allowed = _allowed(batch)
    ids, attention, response, padded_allowed = pad_batch(batch.input_ids, batch.attention_mask, batch.response_mask,
                                                          allowed)
    assert rows == 10 and length % LENGTH_MULTIPLE
    assert ids.shape == attention.shape == response.shape == (round_up(rows, ROW_MULTIPLE),
                                                               round_up(length, LENGTH_MULTIPLE))
    assert torch.equal(ids[:rows, :length], batch.input_ids)
    assert torch.equal(response[:rows, :length], batch.response_mask)
    assert not attention[:, length:].any() and not response[:, length:].any()  # new columns: outside both masks
    for row in range(rows, ids.shape[0]):
        assert torch.equal(ids[row], ids[rows - 1]) and torch.equal(attention[row], attention[rows - 1])
    assert padded_allowed[:rows] == allowed and all(a == allowed[-1] for a in padded_allowed[rows:])


def test_a_batch_of_fewer_rows_than_the_multiple_keeps_its_rows():
    batch = _batch()  # 5 rows: padding them to 8 would add 60% more work
    ids, attention, response, allowed = pad_batch(batch.input_ids, batch.attention_mask, batch.response_mask, None)
    assert ids.shape == (5, round_up(batch.input_ids.shape[1], LENGTH_MULTIPLE)) and allowed is None


def test_pad_head_rows_adds_zero_states_that_allow_every_id():
    hidden, targets = torch.randn(70, 8), torch.randint(0, 5, (70,))
    allowed = torch.zeros(70, 5, dtype=torch.bool)
    h, t, a = pad_head_rows(hidden, targets, allowed)
    assert 70 < h.shape[0] == t.shape[0] == a.shape[0] == round_up(70, HEAD_ROW_MULTIPLE)
    assert torch.equal(h[:70], hidden) and not h[70:].any() and a[70:].all() and not a[:70].any()


def test_padding_is_active_under_cpu_bf16_autocast_only_where_switched_on(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setattr(shapes, "PAD_SHAPES", True)
    assert not padding_active(cpu)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert padding_active(cpu)
        with batches_as_they_come():
            assert not padding_active(cpu)
        assert padding_active(cpu)
    monkeypatch.setattr(shapes, "PAD_SHAPES", False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not padding_active(cpu)


def _values_and_grads(model, batch, allowed):
    model.zero_grad()
    out = forward_logprobs(model, batch.input_ids, batch.attention_mask, batch.response_mask,
                           return_last_prompt_hidden=True, return_entropy=True, allowed=allowed)
    (out.token_logprobs.sum() + out.entropy.sum()).backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("attention", ["sdpa", "bf16_matmul"])
def test_padded_batches_give_the_values_and_gradients_of_the_batch_as_it_came(monkeypatch, attention):
    """float32, padding forced on: every output and gradient equal to the unpadded pass up to float round-off."""
    model = _qwen2(attention).train()
    batch = _wide_batch()
    allowed = _allowed(batch)
    plain, plain_grads = _values_and_grads(model, batch, allowed)
    monkeypatch.setattr(logprobs, "padding_active", lambda device: True)
    padded, padded_grads = _values_and_grads(model, batch, allowed)
    for name in ("token_logprobs", "entropy", "last_prompt_hidden"):
        assert getattr(padded, name).shape == getattr(plain, name).shape
        torch.testing.assert_close(getattr(padded, name), getattr(plain, name), rtol=1e-5, atol=1e-5)
    for name, grad in plain_grads.items():
        torch.testing.assert_close(padded_grads[name], grad, rtol=1e-4, atol=1e-6)


def test_under_bf16_every_matmul_meets_a_padded_row_count_and_the_values_stay_within_bf16(monkeypatch):
    model = _qwen2("bf16_matmul").train()
    batch = _wide_batch()
    allowed = _allowed(batch)
    rows: list[int] = []
    hooks = [m.register_forward_pre_hook(lambda m, args: rows.append(args[0].shape[:-1].numel()))
             for m in model.modules() if isinstance(m, torch.nn.Linear)]
    monkeypatch.setattr(shapes, "PAD_SHAPES", True)
    with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
        padded = forward_logprobs(model, batch.input_ids, batch.attention_mask, batch.response_mask, allowed=allowed)
        assert rows and all(n % 16 == 0 for n in rows), rows  # 16 rows x (16 positions or a window of 4); head: 16
        rows.clear()
        with batches_as_they_come():
            plain = forward_logprobs(model, batch.input_ids, batch.attention_mask, batch.response_mask,
                                     allowed=allowed)
        assert any(n % 16 for n in rows)  # the check above can fail: unpadded, the row counts are the batch's own
    for hook in hooks:
        hook.remove()
    mask = batch.response_mask.bool()
    assert (padded.token_logprobs[~mask] == 0).all()
    torch.testing.assert_close(padded.token_logprobs, plain.token_logprobs, rtol=0, atol=3e-2)
