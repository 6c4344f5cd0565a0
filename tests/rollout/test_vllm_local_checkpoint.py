"""vLLM on a ``model.path`` checkpoint loaded by ``build_hf`` (the Qwen builders' code path): a random Qwen2 shaped
like Qwen2.5, bf16, gradient checkpointing and LoRA; vLLM starts from the folder and serves the adapted weights."""

from __future__ import annotations

import pytest
import torch
from toy_env import save_random_qwen2

from progpo.models.hf import build_hf
from progpo.models.logprobs import forward_logprobs, pad_prompt_response

pytestmark = pytest.mark.vllm


def test_vllm_serves_a_local_qwen2_checkpoint_with_trained_lora_adapters(tmp_path):
    pytest.importorskip("peft")
    from progpo.rollout.engines.vllm_engine import VLLMEngine

    folder = save_random_qwen2(tmp_path / "qwen")
    lora = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"], "dropout": 0.0}
    policy = build_hf(path=folder, name="qwen-local", device="cpu", dtype="bfloat16", max_context=512, lora=lora)
    with torch.no_grad():  # "trained" adapters: LoRA B starts at 0, which would make the merge a no-op
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.5)
    engine = VLLMEngine(policy, temperature=1.0, max_new_tokens=8, gpu_memory_utilization=0.2, dtype="bfloat16")
    try:
        prompts = [policy.tokenizer(t, add_special_tokens=False)["input_ids"]
                   for t in ("go to the kitchen", "take the mug from the table", "look")]
        gen = engine.generate(prompts)
    finally:
        engine.close()
    assert all(len(r) >= 1 for r in gen.response_ids)
    batch = pad_prompt_response(prompts, gen.response_ids, policy.tokenizer.pad_token_id)
    with torch.no_grad():
        adapted = forward_logprobs(policy.model.eval(), batch.input_ids, batch.attention_mask, batch.response_mask)
    served = torch.tensor([lp for row in gen.logprobs for lp in row])
    mask = batch.response_mask.bool()
    # bf16 on both sides, different kernels: agreement to a few 1e-2 nats; the base model is farther away
    assert (served - adapted.token_logprobs[mask]).abs().mean() < 0.05
    with policy.model.disable_adapter():
        base = forward_logprobs(policy.model, batch.input_ids, batch.attention_mask, batch.response_mask)
    assert (served - base.token_logprobs[mask]).abs().mean() > 0.05
