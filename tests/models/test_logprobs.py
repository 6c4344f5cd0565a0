"""forward_logprobs against a plain per-row loop over full logits; one PPO step on a real tiny model."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from progpo.algo.loss import ppo_loss
from progpo.models.logprobs import forward_logprobs, pad_prompt_response
from progpo.models.policy import make_reference
from progpo.types import Policy

PAD = 0


@pytest.fixture(scope="module")
def random_model():
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True, pad_token_id=PAD,
    )  # fmt: skip
    return Qwen2ForCausalLM(config).eval()


def _rows(seed=0):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(1, 97, (n,), generator=g).tolist() for n in (5, 9, 3, 7)]
    responses = [torch.randint(1, 97, (n,), generator=g).tolist() for n in (4, 1, 6, 0)]
    return prompts, responses


def test_pad_prompt_response_layout():
    batch = pad_prompt_response([[5, 6], [7]], [[8], [9, 10, 11]], pad_token_id=PAD)
    assert batch.input_ids.tolist() == [[5, 6, 8, 0], [7, 9, 10, 11]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    assert batch.response_mask.tolist() == [[0, 0, 1, 0], [0, 1, 1, 1]]
    with pytest.raises(ValueError, match="prompt"):
        pad_prompt_response([[]], [[1]], PAD)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_forward_logprobs_matches_a_per_row_loop(random_model, temperature):
    prompts, responses = _rows()
    batch = pad_prompt_response(prompts, responses, PAD)
    with torch.no_grad():
        out = forward_logprobs(
            random_model, batch.input_ids, batch.attention_mask, batch.response_mask,
            return_last_prompt_hidden=True, temperature=temperature, return_entropy=True, chunk_size=3,
        )  # fmt: skip
        for b, (p, r) in enumerate(zip(prompts, responses)):
            ids = torch.tensor([p + r])
            full = random_model(ids, output_hidden_states=True)
            logp_all = torch.log_softmax(full.logits[0].float() / temperature, dim=-1)
            for j, tok in enumerate(r):
                pos = len(p) + j
                assert out.token_logprobs[b, pos].item() == pytest.approx(
                    logp_all[pos - 1, tok].item(), abs=1e-5
                )
                ent = -(logp_all[pos - 1].exp() * logp_all[pos - 1]).sum()
                assert out.entropy[b, pos].item() == pytest.approx(ent.item(), abs=1e-5)
            not_response = batch.response_mask[b] == 0
            assert torch.all(out.token_logprobs[b][not_response] == 0)
            hidden = full.hidden_states[-1][0, len(p) - 1]
            torch.testing.assert_close(out.last_prompt_hidden[b], hidden, atol=1e-5, rtol=1e-5)


def test_forward_logprobs_rejects_bad_input(random_model):
    ids = torch.ones(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="response_mask"):
        forward_logprobs(random_model, ids, torch.ones_like(ids), torch.tensor([[1, 1, 0, 0]]))
    with pytest.raises(ValueError, match="temperature"):
        forward_logprobs(random_model, ids, torch.ones_like(ids), torch.zeros_like(ids), temperature=0.0)


def test_gradient_step_with_ppo_loss_changes_parameters_and_moves_logprobs(random_model):
    model = Qwen2ForCausalLM(random_model.config)
    model.load_state_dict(random_model.state_dict())
    model.train()
    reference = make_reference(Policy(model, None, "t", 256, "mem"))
    prompts, responses = _rows(seed=1)
    batch = pad_prompt_response(prompts, responses, PAD)
    advantages = torch.tensor([1.0, -1.0, 1.0, 0.5])
    with torch.no_grad():
        old = forward_logprobs(
            model, batch.input_ids, batch.attention_mask, batch.response_mask
        ).token_logprobs
        ref = forward_logprobs(
            reference, batch.input_ids, batch.attention_mask, batch.response_mask
        ).token_logprobs
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    out = forward_logprobs(
        model, batch.input_ids, batch.attention_mask, batch.response_mask, return_entropy=True
    )
    loss = ppo_loss(out.token_logprobs, old, ref, advantages, batch.response_mask, entropy=out.entropy)
    loss.loss.backward()
    optimizer.step()
    changed = [n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])]
    assert len(changed) == len(before)
    with torch.no_grad():
        new = forward_logprobs(
            model, batch.input_ids, batch.attention_mask, batch.response_mask
        ).token_logprobs
    seq_delta = ((new - old) * batch.response_mask).sum(1)
    assert seq_delta[0] > 0 and seq_delta[2] > 0  # positive advantage: more likely
    assert seq_delta[1] < 0  # negative advantage: less likely
    # the reference is a frozen copy: untouched by the step
    assert all(not p.requires_grad for p in reference.parameters())
    for name, p in reference.named_parameters():
        assert torch.equal(p, before[name])


def test_left_padded_rows_give_the_same_logprobs(random_model):
    prompts, responses = _rows()
    right = pad_prompt_response(prompts, responses, PAD)
    width = right.input_ids.shape[1]
    lengths = right.attention_mask.sum(1)
    left_ids = torch.full_like(right.input_ids, PAD)
    left_attn, left_resp = torch.zeros_like(right.attention_mask), torch.zeros_like(right.response_mask)
    for b, n in enumerate(lengths.tolist()):
        left_ids[b, width - n :] = right.input_ids[b, :n]
        left_attn[b, width - n :] = 1
        left_resp[b, width - n :] = right.response_mask[b, :n]
    with torch.no_grad():
        a = forward_logprobs(random_model, right.input_ids, right.attention_mask, right.response_mask, True)
        b = forward_logprobs(random_model, left_ids, left_attn, left_resp, True)
    for row, n in enumerate(lengths.tolist()):
        torch.testing.assert_close(
            a.token_logprobs[row, :n], b.token_logprobs[row, width - n :], atol=1e-5, rtol=0
        )
    torch.testing.assert_close(a.last_prompt_hidden, b.last_prompt_hidden, atol=1e-5, rtol=1e-5)


def test_constrained_logprobs_and_entropy_match_a_loop_over_the_allowed_ids(random_model):
    """``allowed=`` renormalises over each position's allowed ids (the policy that acted), row by row."""
    prompts, responses = _rows(3)
    g = torch.Generator().manual_seed(5)
    allowed = []
    for k, response in enumerate(responses):
        if k == 1:
            allowed.append(None)  # a free row next to constrained ones
            continue
        positions = []
        for token in response:
            others = torch.randint(1, 97, (int(torch.randint(0, 4, (1,), generator=g)),), generator=g).tolist()
            positions.append(sorted({token, *others}))
        allowed.append(positions)
    batch = pad_prompt_response(prompts, responses, PAD)
    with torch.no_grad():
        out = forward_logprobs(
            random_model, batch.input_ids, batch.attention_mask, batch.response_mask,
            return_entropy=True, allowed=allowed,
        )  # fmt: skip
        for row, (prompt, response) in enumerate(zip(prompts, responses)):
            logits = random_model(torch.tensor([prompt + response])).logits[0]
            for t, token in enumerate(response):
                full = logits[len(prompt) + t - 1].double()
                ids = allowed[row][t] if allowed[row] is not None else list(range(97))
                logp = torch.log_softmax(full[ids], dim=-1)
                expected = float(logp[ids.index(token)])
                entropy = float(-(logp.exp() * logp).sum())
                assert abs(float(out.token_logprobs[row, len(prompt) + t]) - expected) < 1e-5
                assert abs(float(out.entropy[row, len(prompt) + t]) - entropy) < 1e-5
                if len(ids) == 1:
                    assert float(out.token_logprobs[row, len(prompt) + t]) == 0.0  # a forced token costs nothing
    bad = [list(a) if a is not None else None for a in allowed]
    bad[0] = [[i for i in range(1, 97) if i != responses[0][0]]] + allowed[0][1:]
    with pytest.raises(ValueError, match="not among the allowed"):
        forward_logprobs(random_model, batch.input_ids, batch.attention_mask, batch.response_mask, allowed=bad)
    with pytest.raises(ValueError, match="positions"):
        forward_logprobs(
            random_model, batch.input_ids, batch.attention_mask, batch.response_mask,
            allowed=[allowed[0][:-1], None, None, None],
        )  # fmt: skip


def test_constrained_entropy_has_a_finite_gradient(random_model):
    """An entropy bonus on a constrained policy must not turn masked ids' 0 * -inf into NaN gradients."""
    prompts, responses = [[3, 4, 5]], [[7, 8]]
    batch = pad_prompt_response(prompts, responses, PAD)
    model = random_model.train()
    out = forward_logprobs(
        model, batch.input_ids, batch.attention_mask, batch.response_mask,
        return_entropy=True, allowed=[[[7, 9, 11], [8]]],
    )  # fmt: skip
    (out.entropy.sum() + out.token_logprobs.sum()).backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(bool(torch.isfinite(g).all()) for g in grads)
    assert any(float(g.abs().sum()) > 0 for g in grads)
    model.zero_grad(set_to_none=True)
    model.eval()
