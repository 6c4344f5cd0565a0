"""The two-pass rotary embedding against its definition: the same values and gradients to a rounding, fewer passes."""

from __future__ import annotations

import sys

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from progpo.models.rotary import _MARK, _rotation, rotate, transformers_rotary, use_two_pass_rotary


def _definition(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin`` as transformers writes it, ``rotate_half`` spelled out."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def _inputs(dtype: torch.dtype, batch: int = 3, heads: int = 4, length: int = 7, head_dim: int = 16):
    """Queries as a model makes them (a transposed view of [B, L, heads, d]) and tables whose halves differ."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(batch, length, heads, head_dim, generator=generator).to(dtype).transpose(1, 2)
    angles = torch.randn(batch, 1, length, head_dim, generator=generator, dtype=torch.float64)
    return x, angles.cos().to(dtype), angles.sin().to(dtype)


def test_float32_values_are_the_definitions_to_one_rounding_in_its_layout():
    """The fused multiply-add rounds ``x1 c1 - x2 s1`` once where the definition rounds the product too: at most one
    float32 ulp apart, and no further from the exact rotation."""
    x, cos, sin = _inputs(torch.float32, length=64, head_dim=64)
    expected = _definition(x, cos, sin)
    out = rotate(x, cos, sin)
    assert torch.allclose(out, expected, rtol=2.5e-7, atol=2.5e-7)
    exact = _definition(x.double(), cos.double(), sin.double())
    assert (out.double() - exact).abs().mean() <= (expected.double() - exact).abs().mean()
    assert out.stride() == x.stride()  # the projection's layout, as transformers' products keep it


def test_adjoint_is_the_gradient_of_the_definition():
    x, cos, sin = _inputs(torch.float64)
    x.requires_grad_(True)
    grad = torch.randn(x.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    (expected,) = torch.autograd.grad(_definition(x, cos, sin), x, grad)
    assert torch.allclose(rotate(grad, cos, sin, transpose=True), expected, rtol=0, atol=1e-14)
    torch.autograd.gradcheck(lambda t: _rotation(t, cos, sin), (x,))


def test_float32_gradients_match_autograds_through_the_definition():
    x, cos, sin = _inputs(torch.float32)
    x = x.detach().requires_grad_(True)
    grad = torch.randn(x.shape, generator=torch.Generator().manual_seed(2))
    (expected,) = torch.autograd.grad(_definition(x, cos, sin), x, grad)
    (got,) = torch.autograd.grad(_rotation(x, cos, sin), x, grad)
    assert torch.allclose(got, expected, rtol=2.5e-7, atol=2.5e-7)


def test_bf16_rounds_no_worse_than_the_definition_in_bf16():
    x, cos, sin = _inputs(torch.bfloat16, batch=8, length=64, head_dim=64)
    exact = _definition(x.double(), cos.double(), sin.double())
    ours = (rotate(x, cos, sin).double() - exact).abs().mean()
    theirs = (_definition(x, cos, sin).double() - exact).abs().mean()
    assert rotate(x, cos, sin).dtype == torch.bfloat16
    assert ours <= theirs
    assert ours < 4e-3 * exact.abs().mean()  # within bf16 precision of the exact rotation


def test_bf16_queries_with_float32_tables_come_out_float32_and_their_gradient_bf16():
    x, cos, sin = _inputs(torch.bfloat16)
    x = x.detach().requires_grad_(True)
    out = _rotation(x, cos.float(), sin.float())
    assert out.dtype == torch.float32  # as x * cos promotes it
    out.sum().backward()
    assert x.grad.dtype == torch.bfloat16


def _count_ops(fn) -> int:
    """Kernels (aten ops that write memory) run by ``fn``: one elementwise pass each."""
    passes = {"aten::mul", "aten::add", "aten::neg", "aten::cat", "aten::addcmul_", "aten::add_", "aten::copy_",
              "aten::mul_"}
    with torch.profiler.profile() as prof:
        fn()
    return sum(e.count for e in prof.key_averages() if e.key in passes)


def test_fewer_passes_forward_and_backward():
    x, cos, sin = _inputs(torch.float32)
    x = x.detach().requires_grad_(True)

    def through(rotation):
        return lambda: rotation(x, cos, sin).sum().backward()

    assert _count_ops(through(_rotation)) < _count_ops(through(_definition)) - 2


def _qwen2() -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64))


def test_a_model_scores_as_with_transformers_rotation_and_is_patched_once():
    model = _qwen2()
    assert use_two_pass_rotary(model) and use_two_pass_rotary(model)
    module = sys.modules[type(model.model.layers[0].self_attn).__module__]
    original = getattr(module.apply_rotary_pos_emb, _MARK)
    assert not hasattr(original, _MARK)  # wrapped once, not twice
    q, cos, sin = _inputs(torch.float32, length=16, head_dim=8)
    cos, sin = cos[:, 0], sin[:, 0]  # [B, L, d], as the decoder hands them over
    ours, theirs = module.apply_rotary_pos_emb(q, q, cos, sin)[0], original(q, q, cos, sin)[0]
    assert torch.equal(ours, rotate(q, cos.unsqueeze(1), sin.unsqueeze(1))) and not torch.equal(ours, theirs)
    with transformers_rotary():
        assert torch.equal(module.apply_rotary_pos_emb(q, q, cos, sin)[0], theirs)
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(3))
    model.zero_grad()
    logits = model(input_ids=ids).logits
    logits.square().sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    with transformers_rotary():
        reference = model(input_ids=ids).logits
        reference.square().sum().backward()
    assert torch.allclose(logits, reference, rtol=1e-5, atol=1e-6)
    for got, expected in zip(grads, (p.grad for p in model.parameters())):
        assert torch.allclose(got, expected, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("model_type", ["llama", "gpt2"])
def test_other_decoders(model_type):
    if model_type == "llama":
        model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                             num_attention_heads=4, num_key_value_heads=2))
        assert use_two_pass_rotary(model)
        module = sys.modules[type(model.model.layers[0].self_attn).__module__]
        assert hasattr(module.apply_rotary_pos_emb, _MARK)
    else:
        from transformers import GPT2Config, GPT2LMHeadModel

        assert not use_two_pass_rotary(GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=4, vocab_size=64)))
