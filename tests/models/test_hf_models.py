"""build_hf (the Qwen builders' code path) on a local checkpoint folder, with and without LoRA."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from processes import startup_bound_s
from toy_env import save_random_qwen2

from progpo.algo.loss import ppo_loss
from progpo.models.hf import build_hf, hub_reachable
from progpo.models.logprobs import forward_logprobs, pad_prompt_response
from progpo.models.policy import make_reference
from progpo.rollout.engines.hf_engine import HFEngine
from progpo.rollout.engines.vllm_engine import hf_weights_for_vllm


def test_missing_offline_weights_name_the_fix():
    with pytest.raises(FileNotFoundError, match="model.path=/local/dir"):
        build_hf(hub_id="Qwen/not-a-cached-model", device="cpu", dtype="float32")


REPO = Path(__file__).resolve().parents[2]
CLOSED_PORT = "http://127.0.0.1:9"  # the discard port: nothing listens, a connect is refused at once


@pytest.fixture
def unreachable_hub(monkeypatch):
    """HF_HUB_OFFLINE unset, but the hub cannot be reached (what a machine without network looks like)."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", CLOSED_PORT)
    hub_reachable.cache_clear()
    yield
    hub_reachable.cache_clear()


def test_unreachable_hub_fails_at_once_naming_model_path(unreachable_hub):
    started = time.perf_counter()
    with pytest.raises(FileNotFoundError, match=r"cannot be reached.*model\.path=/local/dir"):
        build_hf(hub_id="Qwen/Qwen2.5-1.5B-Instruct", device="cpu")
    assert time.perf_counter() - started < 5  # one refused connect, no download retries


def test_train_without_weights_stops_in_seconds_naming_model_path(unreachable_hub, tmp_path):
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "progpo.train", "model=qwen2.5-1.5b", "logger=none", f"run_dir={tmp_path}"],
        cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True, timeout=120)
    elapsed = time.perf_counter() - started
    output = done.stdout + done.stderr
    assert done.returncode == 2 and "model.path=/local/dir" in output, output[-3000:]  # a start-up error
    assert "Retrying" not in output and "building environment suite" not in output  # before the env
    assert elapsed < startup_bound_s(), f"took {elapsed:.1f}s, bound {startup_bound_s():.1f}s"


def test_missing_local_path_names_the_field(tmp_path):
    with pytest.raises(FileNotFoundError, match="model.path=.*no config.json"):
        build_hf(path=str(tmp_path), device="cpu")


def test_random_qwen2_checkpoint_loads_in_bf16_with_checkpointing_and_lora(tmp_path):
    pytest.importorskip("peft")
    folder = save_random_qwen2(tmp_path / "qwen")
    lora = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"], "dropout": 0.0}
    policy = build_hf(path=folder, name="qwen-local", device="cpu", dtype="bfloat16", max_context=1024, lora=lora)
    model = policy.model
    assert policy.source == folder and policy.tokenizer.padding_side == "left"
    assert {p.dtype for n, p in model.named_parameters() if "lora_" not in n} == {torch.bfloat16}  # peft keeps
    # the adapters in float32
    base = model.get_base_model()
    assert getattr(base, "is_activation_checkpointing", None) or base.is_gradient_checkpointing
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    batch = pad_prompt_response([[5, 6, 7, 8]], [[9, 10]], policy.tokenizer.pad_token_id)
    model.train()
    out = forward_logprobs(model, batch.input_ids, batch.attention_mask, batch.response_mask)
    out.token_logprobs.sum().backward()  # through the checkpointed layers into the adapters
    assert all(p.grad is not None for n, p in model.named_parameters() if "lora_B" in n)


def test_local_path_loads_with_gradient_checkpointing(tiny_policy):
    policy = build_hf(path=tiny_policy.source, name="local", device="cpu", dtype="float32", max_context=1024)
    assert policy.source == tiny_policy.source and policy.tokenizer.padding_side == "left"
    assert (
        getattr(policy.model, "is_activation_checkpointing", None) or policy.model.is_gradient_checkpointing
    )
    for a, b in zip(policy.model.state_dict().values(), tiny_policy.model.state_dict().values()):
        assert torch.equal(a, b)


def test_lora_trains_only_adapters_and_merges_into_plain_weights_for_vllm(tiny_policy):
    pytest.importorskip("peft")
    lora = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"], "dropout": 0.0}
    policy = build_hf(
        path=tiny_policy.source,
        device="cpu",
        dtype="float32",
        max_context=1024,
        gradient_checkpointing=False,
        lora=lora,
    )
    model = policy.model
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    reference = make_reference(policy)

    prompts, responses = [[5, 6, 7, 8], [9, 10, 11]], [[12, 13], [14, 15, 16]]
    batch = pad_prompt_response(prompts, responses, policy.tokenizer.pad_token_id)
    with torch.no_grad():
        old = forward_logprobs(
            model, batch.input_ids, batch.attention_mask, batch.response_mask
        ).token_logprobs
    # LoRA B starts at zero: the adapted model equals the base model
    with torch.no_grad():
        base = forward_logprobs(tiny_policy.model, batch.input_ids, batch.attention_mask, batch.response_mask)
    torch.testing.assert_close(old, base.token_logprobs, atol=1e-5, rtol=0)

    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model.train()
    for _ in range(3):
        out = forward_logprobs(model, batch.input_ids, batch.attention_mask, batch.response_mask)
        ppo_loss(out.token_logprobs, old, old, torch.tensor([1.0, 1.0]), batch.response_mask).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    with torch.no_grad():
        new = forward_logprobs(
            model, batch.input_ids, batch.attention_mask, batch.response_mask
        ).token_logprobs
    assert ((new - old) * batch.response_mask).sum() > 0

    model.merge_adapter()
    merged = {name: tensor.clone() for name, tensor in hf_weights_for_vllm(model)}  # unmerge works in place
    model.unmerge_adapter()
    plain = tiny_policy.model.state_dict()
    assert set(merged) == set(plain)
    assert not torch.equal(
        merged["model.layers.0.self_attn.q_proj.weight"], plain["model.layers.0.self_attn.q_proj.weight"]
    )
    assert torch.equal(
        merged["model.layers.0.mlp.up_proj.weight"], plain["model.layers.0.mlp.up_proj.weight"]
    )
    # the merged plain weights reproduce the adapted model
    tiny_policy.model.load_state_dict(merged)
    with torch.no_grad():
        again = forward_logprobs(
            tiny_policy.model, batch.input_ids, batch.attention_mask, batch.response_mask
        )
    torch.testing.assert_close(again.token_logprobs, new, atol=1e-4, rtol=0)
    # the reference stayed at the start, and generation works through the peft wrapper
    with torch.no_grad():
        ref = forward_logprobs(
            reference, batch.input_ids, batch.attention_mask, batch.response_mask
        ).token_logprobs
    torch.testing.assert_close(ref, old, atol=1e-5, rtol=0)
    assert len(HFEngine(policy, max_new_tokens=4).generate(prompts).response_ids) == 2
