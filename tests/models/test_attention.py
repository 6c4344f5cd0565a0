"""``attn_implementation="bf16_matmul"`` against attention written from its definition, and on a whole model."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward

import progpo.models.attention as attention
from progpo.models.attention import LOWEST, _mask_bias, bf16_matmul_attention, use_attention
from progpo.models.logprobs import forward_logprobs, pad_prompt_response


@pytest.fixture(autouse=True)
def matmuls_without_grad_too(monkeypatch):
    """These tests check the matmul path, on every host: passes without gradients keep it (AMX hosts give them
    to SDPA; the tests of that switch turn it on themselves)."""
    monkeypatch.setattr(attention, "SDPA_WITHOUT_GRAD", False)


class _Module(torch.nn.Module):
    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


def _definition(query, key, value, allowed, scale):
    """Per batch row, head and query: softmax over the allowed keys of q.k * scale, times v (float64 loops)."""
    batch, heads, q_len, dim = query.shape
    groups = heads // key.shape[1]
    out = torch.zeros(batch, q_len, heads, dim, dtype=torch.float64)
    for b in range(batch):
        for h in range(heads):
            for i in range(q_len):
                keys = [j for j in range(key.shape[2]) if allowed[b][i][j]]
                scores = [float(query[b, h, i].double() @ key[b, h // groups, j].double()) * scale for j in keys]
                if not keys:  # no allowed key: a uniform average, not NaN
                    keys, scores = list(range(key.shape[2])), [0.0] * key.shape[2]
                top = max(scores)
                weights = [math.exp(s - top) for s in scores]
                total = sum(weights)
                out[b, i, h] = sum(w / total * value[b, h // groups, j].double() for w, j in zip(weights, keys))
    return out


def _qkv(batch=2, heads=4, kv_heads=2, q_len=5, kv_len=9, dim=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, heads, q_len, dim, generator=g), torch.randn(batch, kv_heads, kv_len, dim, generator=g),
            torch.randn(batch, kv_heads, kv_len, dim, generator=g))


@pytest.mark.parametrize("case", ["causal prefill", "decode with a cache", "boolean mask", "additive mask"])
def test_bf16_matmul_attention_equals_its_definition(case):
    q_len = 9 if case == "causal prefill" else 3
    query, key, value = _qkv(q_len=q_len)
    kv_len = key.shape[2]
    causal = [[[j <= kv_len - q_len + i for j in range(kv_len)] for i in range(q_len)]] * 2
    mask, allowed = None, causal
    if case in ("boolean mask", "additive mask"):
        g = torch.Generator().manual_seed(1)
        allowed_t = torch.rand(2, 1, q_len, kv_len, generator=g) > 0.4
        allowed_t[0, 0, 1] = False  # a query with no allowed key
        allowed = allowed_t[:, 0].tolist()
        mask = allowed_t if case == "boolean mask" else torch.zeros(allowed_t.shape).masked_fill(
            ~allowed_t, torch.finfo(torch.float32).min)
    out, _ = bf16_matmul_attention(_Module(groups=2), query.bfloat16(), key.bfloat16(), value.bfloat16(), mask,
                                   scaling=0.3)
    assert out.dtype == torch.bfloat16 and out.shape == (2, q_len, 4, 8)
    assert torch.isfinite(out.float()).all()
    expected = _definition(query.bfloat16().float(), key.bfloat16().float(), value.bfloat16().float(), allowed, 0.3)
    # bf16: the scores, the probabilities and the output each rounded to 8 significant bits
    torch.testing.assert_close(out.double(), expected, atol=3e-2, rtol=2e-2)


@pytest.mark.parametrize("case", ["causal prefill", "boolean mask"])
def test_bf16_matmul_attention_gradients_match_float64_attention(case):
    """The backward runs through the bf16 softmax: its gradients agree with float64 attention to bf16 precision."""
    query, key, value = (x.bfloat16().float().requires_grad_() for x in _qkv(batch=3, q_len=12, kv_len=12, dim=16))
    allowed = torch.ones(12, 12, dtype=torch.bool).tril().expand(3, 1, 12, 12)
    if case == "boolean mask":
        allowed = allowed & (torch.rand(3, 1, 12, 12, generator=torch.Generator().manual_seed(2)) > 0.3)
        allowed = allowed | torch.eye(12, dtype=torch.bool)  # every query keeps a key
    g = torch.Generator().manual_seed(3)
    upstream = torch.randn(3, 12, 4, 16, generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
        out, _ = bf16_matmul_attention(_Module(groups=2), query, key, value, None if case == "causal prefill" else allowed,
                                       scaling=0.25)
    got = torch.autograd.grad(out.float(), (query, key, value), upstream)
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (query, key, value))
    scores = (q64 @ k64.repeat_interleave(2, dim=1).transpose(-1, -2) * 0.25).masked_fill(~allowed, -torch.inf)
    reference = (torch.softmax(scores, dim=-1) @ v64.repeat_interleave(2, dim=1)).transpose(1, 2)
    expected = torch.autograd.grad(reference, (q64, k64, v64), upstream.double())
    for name, a, b in zip("qkv", got, expected):
        relative = float((a.double() - b).norm() / b.norm())
        assert relative < 1.5e-2, f"d{name}: relative error {relative:.2e}"


def test_adding_the_mask_bias_masks_bf16_scores_exactly_as_masked_fill():
    torch.manual_seed(0)
    scores = (torch.randn(3, 2, 9, 9) * torch.tensor([1.0, 1e3, 1e30])[:, None, None, None]).to(torch.bfloat16)
    allowed = torch.rand(3, 1, 9, 9) > 0.4
    allowed[0, 0, 2] = False  # a query with no allowed key
    filled = scores.clone().masked_fill_(~allowed, LOWEST)
    assert torch.equal(scores.clone().add_(_mask_bias(allowed)), filled)
    assert torch.equal(torch.softmax(scores + _mask_bias(allowed), -1), torch.softmax(filled, -1))


def test_bf16_matmul_attention_is_sdpa_outside_a_cpu_in_bf16():
    query, key, value = _qkv()
    module = _Module(groups=2)
    ours, _ = bf16_matmul_attention(module, query, key, value, None, scaling=0.3)
    sdpa, _ = sdpa_attention_forward(module, query, key, value, None, scaling=0.3)
    assert torch.equal(ours, sdpa)


def test_a_model_on_bf16_matmul_scores_as_on_sdpa_under_bf16_autocast():
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=101, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=256, pad_token_id=0)).eval()
    g = torch.Generator().manual_seed(0)
    batch = pad_prompt_response([torch.randint(1, 101, (n,), generator=g).tolist() for n in (30, 12, 45)],
                                [torch.randint(1, 101, (n,), generator=g).tolist() for n in (6, 9, 3)], 0)

    def logprobs(attention: str, bf16: bool) -> torch.Tensor:
        use_attention(model, attention)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16, cache_enabled=False):
            return forward_logprobs(model, batch.input_ids, batch.attention_mask, batch.response_mask).token_logprobs

    exact = logprobs("sdpa", bf16=False)
    ours, sdpa = logprobs("bf16_matmul", bf16=True), logprobs("sdpa", bf16=True)
    mask = batch.response_mask.bool()
    # each bf16 path is as far from float32 as the other: the bf16 rounding, not the kernel, sets the error
    assert (ours - exact)[mask].abs().mean() < 2 * (sdpa - exact)[mask].abs().mean() + 1e-3
    assert (ours - exact)[mask].abs().max() < 0.1
    assert torch.equal(logprobs("bf16_matmul", bf16=False), exact)  # float32: SDPA itself


def test_an_unknown_attention_implementation_is_refused_with_the_choices():
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=11, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2))
    with pytest.raises(ValueError, match="attn_implementation='flash'.*bf16_matmul"):
        use_attention(model, "flash")


def test_the_mask_bias_is_built_once_per_forward_and_scores_as_built_in_each_layer(monkeypatch):
    """Under CPU bf16 a padded batch's mask (a prefill's left padding) arrives at the layers as the bf16 bias: the
    same numbers as the boolean mask turned into the bias by each layer's attention, from one bias per forward
    instead of one per layer, in the full pass and in the window's (whose last layer gathers the bias's rows)."""
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    from progpo.models.window import window_hidden

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=101, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0)).eval()
    use_attention(model, "bf16_matmul")
    lengths = torch.tensor([30, 12, 45])
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(1, 101, (3, 45), generator=g)
    mask = (torch.arange(45) >= 45 - lengths.unsqueeze(1)).long()  # left padding, as the engine prefills
    position_ids = (mask.cumsum(1) - 1).clamp(min=0)
    positions = torch.full((3, 1), 44)
    built = []
    monkeypatch.setattr(attention, "_mask_bias", lambda allowed: built.append(allowed.shape) or _mask_bias(allowed))

    def passes(bf16: bool = True) -> tuple[torch.Tensor, torch.Tensor, int]:
        built.clear()
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16, cache_enabled=False):
            logits = model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids).logits
            window = window_hidden(model, input_ids, positions, attention_mask=mask, position_ids=position_ids)
        return logits, window, len(built)

    logits, window, once = passes()
    assert once == 2  # one bias per forward: the full pass's and the window pass's
    AttentionMaskInterface.register(attention.NAME, sdpa_mask)  # the boolean mask, a bias built in every layer
    try:
        logits_per_layer, window_per_layer, per_layer = passes()
    finally:
        AttentionMaskInterface.register(attention.NAME, attention.bf16_matmul_mask)
    assert per_layer == 4 + 4
    assert torch.equal(logits, logits_per_layer) and torch.equal(window, window_per_layer)
    float32_logits, _, float32_built = passes(bf16=False)  # float32: SDPA with the boolean mask, no bias
    assert float32_built == 0 and float32_logits.dtype == torch.float32


def _small_qwen2(seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(Qwen2Config(
        vocab_size=101, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0)).eval()


def test_on_amx_a_pass_without_gradients_is_sdpa_and_a_pass_with_them_keeps_the_matmuls(monkeypatch):
    """The AMX switch (``SDPA_WITHOUT_GRAD``) under CPU bf16: without gradients the attention and its mask are
    SDPA's, bit for bit as the model on ``sdpa``; with gradients the logits are the matmul path's, bit for bit as
    with the switch off. Off, a pass without gradients is the matmul path's too."""
    model = _small_qwen2()
    lengths = torch.tensor([30, 12, 45])
    input_ids = torch.randint(1, 101, (3, 45), generator=torch.Generator().manual_seed(1))
    mask = (torch.arange(45) >= 45 - lengths.unsqueeze(1)).long()  # left padding, as the engine prefills
    position_ids = (mask.cumsum(1) - 1).clamp(min=0)

    def logits(implementation: str, switch: bool, grad: bool) -> torch.Tensor:
        monkeypatch.setattr(attention, "SDPA_WITHOUT_GRAD", switch)
        use_attention(model, implementation)
        with torch.set_grad_enabled(grad), torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
            return model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids).logits.detach()

    sdpa = logits("sdpa", switch=False, grad=False)
    matmuls = logits("bf16_matmul", switch=False, grad=True)
    assert not torch.equal(sdpa, matmuls)  # the two kernels round differently: the comparisons below can fail
    assert torch.equal(logits("bf16_matmul", switch=True, grad=False), sdpa)
    assert torch.equal(logits("bf16_matmul", switch=True, grad=True), matmuls)
    assert torch.equal(logits("bf16_matmul", switch=False, grad=False), matmuls)


def test_on_amx_the_mask_is_sdpas_without_gradients_and_the_bias_with_them(monkeypatch):
    from transformers.masking_utils import sdpa_mask

    monkeypatch.setattr(attention, "SDPA_WITHOUT_GRAD", True)
    padding = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    kwargs = dict(batch_size=2, q_length=4, kv_length=4, attention_mask=padding.bool())
    with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
        with torch.no_grad():
            without = attention.bf16_matmul_mask(**kwargs)
        with_grad = attention.bf16_matmul_mask(**kwargs)
    expected = sdpa_mask(**kwargs)
    assert without.dtype == torch.bool and torch.equal(without, expected)
    assert with_grad.dtype == torch.bfloat16 and torch.equal(with_grad, _mask_bias(expected))


def test_the_amx_switch_follows_the_cpu_flags(monkeypatch):
    import progpo.hardware as hardware

    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset({"avx512f", "avx512_bf16", "amx_bf16"}))
    assert hardware.cpu_has_amx()
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset({"avx512f", "avx512_bf16"}))
    assert not hardware.cpu_has_amx()
    monkeypatch.setattr(hardware, "cpu_flags", lambda: None)  # not Linux: unknown, so no switch
    assert not hardware.cpu_has_amx()
