"""HFEngine on the warm-started tiny model: stops, order, log-probs vs a teacher-forced pass."""

from __future__ import annotations

import pytest
import torch
from toy_env import FakeRoomEnv, fake_room_suite

from progpo.models.logprobs import forward_logprobs, pad_prompt_response
from progpo.rollout.engines import Engine, Generation
from progpo.rollout.engines.hf_engine import HFEngine
from progpo.rollout.projection import project_action
from progpo.rollout.prompt import PromptBuilder


def _prompts(policy, n_tasks=6):
    """Real prompts from the fake env: first and second steps of a few tasks (different lengths)."""
    builder = PromptBuilder(
        policy.tokenizer, history=2, max_prompt_tokens=policy.max_context - 32, style=policy.prompt_style
    )
    env, out = FakeRoomEnv(), []
    for task in fake_room_suite(n_train=n_tasks).train_tasks:
        obs = env.reset(task)
        out.append((builder.build(obs.task_description, obs.text, obs.admissible_actions, []), obs))
        action = env.expert_action()
        nxt, *_ = env.step(action)
        out.append(
            (builder.build(nxt.task_description, nxt.text, nxt.admissible_actions, [(obs.text, action)]), nxt)
        )
    return out


def test_engine_protocol(tiny_policy):
    assert isinstance(HFEngine(tiny_policy), Engine)
    assert HFEngine(tiny_policy).generate([]) == Generation()


def test_greedy_generation_answers_in_format_and_stops_at_the_end_tag(tiny_policy):
    engine = HFEngine(tiny_policy, max_new_tokens=32)
    items = _prompts(tiny_policy)
    gen = engine.generate([p.ids for p, _ in items], greedy=True)
    assert len(gen.texts) == len(items) == len(gen.response_ids) == len(gen.logprobs)
    assert gen.n_generated_tokens == sum(len(r) for r in gen.response_ids)
    tok = tiny_policy.tokenizer
    stopped = 0
    for ids, text, lps in zip(gen.response_ids, gen.texts, gen.logprobs):
        assert len(ids) == len(lps) <= 32
        assert all(lp <= 0 for lp in lps)
        if "</action>" in text:
            stopped += 1
            assert text.endswith("</action>")  # nothing generated after the stop string
            assert "</action>" not in tok.decode(ids[:-1])
    assert stopped == len(items)  # the warm start taught the format
    assert all(project_action(t, obs.admissible_actions).action for t, (_, obs) in zip(gen.texts, items))


def test_multi_token_stop_string_and_max_new_tokens(tiny_policy):
    prompt = _prompts(tiny_policy, 1)[0][0].ids
    gen = HFEngine(tiny_policy, stop=("go to",), max_new_tokens=32).generate([prompt], greedy=True)
    text = tiny_policy.tokenizer.decode(gen.response_ids[0])
    assert text.endswith("go to") or text.endswith("go to ") or "go to" not in text
    short = HFEngine(tiny_policy, stop=(), max_new_tokens=3).generate([prompt] * 2)
    assert all(len(ids) <= 3 for ids in short.response_ids)


def test_order_is_kept_across_sorting_and_batches(tiny_policy):
    items = _prompts(tiny_policy)
    prompts = [p.ids for p, _ in items]
    alone = [HFEngine(tiny_policy).generate([p], greedy=True).texts[0] for p in prompts[:4]]
    batched = HFEngine(tiny_policy, batch_size=3).generate(prompts, greedy=True).texts
    assert batched[:4] == alone


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampling_logprobs_match_teacher_forced_logprobs(tiny_policy, temperature):
    torch.manual_seed(0)
    items = _prompts(tiny_policy)
    prompts = [p.ids for p, _ in items]
    gen = HFEngine(tiny_policy, temperature=temperature, max_new_tokens=24).generate(prompts)
    batch = pad_prompt_response(prompts, gen.response_ids, tiny_policy.tokenizer.pad_token_id)
    with torch.no_grad():
        out = forward_logprobs(
            tiny_policy.model,
            batch.input_ids,
            batch.attention_mask,
            batch.response_mask,
            temperature=temperature,
        )
    for row, (prompt, lps) in enumerate(zip(prompts, gen.logprobs)):
        teacher = out.token_logprobs[row, len(prompt) : len(prompt) + len(lps)]
        torch.testing.assert_close(teacher, torch.tensor(lps), atol=1e-4, rtol=0)


def test_per_call_temperature_overrides_the_engine_temperature(tiny_policy):
    """Sampled evaluation passes its own temperature: log-probs are those of that temperature."""
    torch.manual_seed(0)
    prompts = [p.ids for p, _ in _prompts(tiny_policy)]
    engine = HFEngine(tiny_policy, temperature=1.0, max_new_tokens=24)
    gen = engine.generate(prompts, temperature=0.4)
    batch = pad_prompt_response(prompts, gen.response_ids, tiny_policy.tokenizer.pad_token_id)
    with torch.no_grad():
        cold = forward_logprobs(
            tiny_policy.model, batch.input_ids, batch.attention_mask, batch.response_mask, temperature=0.4
        )
    for row, (prompt, lps) in enumerate(zip(prompts, gen.logprobs)):
        teacher = cold.token_logprobs[row, len(prompt) : len(prompt) + len(lps)]
        torch.testing.assert_close(teacher, torch.tensor(lps), atol=1e-4, rtol=0)
    assert engine.temperature == 1.0  # the override is for one call only
    with pytest.raises(ValueError, match="temperature"):
        engine.generate(prompts[:1], temperature=0.0)


def test_generation_leaves_the_actor_as_it_was(tiny_policy):
    model = tiny_policy.model
    model.train()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    HFEngine(tiny_policy).generate([_prompts(tiny_policy, 1)[0][0].ids])
    assert model.training
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())


def test_too_long_prompt_and_bad_config_raise(tiny_policy):
    engine = HFEngine(tiny_policy, max_new_tokens=32)
    with pytest.raises(ValueError, match="rollout.max_prompt_tokens"):
        engine.generate([[5] * (tiny_policy.max_context - 31)])
    with pytest.raises(ValueError, match="temperature"):
        HFEngine(tiny_policy, temperature=0.0)
    with pytest.raises(ValueError, match="top_p"):
        HFEngine(tiny_policy, top_p=1.5)


def test_the_engine_decodes_auto_batches_by_the_autocast_in_force(tiny_policy, monkeypatch):
    """On an AMX-BF16 CPU the engine's ``auto`` is 64 prompts per call under bf16 autocast and 32 outside it; each
    call decodes its prompts in batches of that many (counted at the decoding loop)."""
    import progpo.hardware
    import progpo.rollout.engines.hf_engine as hf_engine

    amx = frozenset({"avx512_bf16", "amx_bf16"})
    monkeypatch.setattr(progpo.hardware, "cpu_flags", lambda: amx)
    engine = HFEngine(tiny_policy, max_new_tokens=4)
    model = tiny_policy.model
    assert engine.batch_size == "auto" and engine.batch_rows(model) == 32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert engine.batch_rows(model) == 64
    assert HFEngine(tiny_policy, batch_size=5).batch_rows(model) == 5
    monkeypatch.setattr(progpo.hardware, "cpu_flags", lambda: frozenset({"avx512_bf16"}))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert engine.batch_rows(model) == 32

    monkeypatch.setattr(progpo.hardware, "cpu_flags", lambda: amx)
    sizes = []
    decode = hf_engine.decode
    monkeypatch.setattr(hf_engine, "decode", lambda model, prompts, *a, **k: sizes.append(len(prompts))
                        or decode(model, prompts, *a, **k))
    prompts = [[5, 6, 7 + i % 11] for i in range(100)]
    engine.generate(prompts, greedy=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        engine.generate(prompts, greedy=True)
    assert sizes == [32, 32, 32, 4, 64, 36]


def test_the_engine_refuses_a_bad_batch_size(tiny_policy):
    for bad in (0, "big", 1.5):
        with pytest.raises(ValueError, match="rollout.engine.batch_size must be an int >= 1 or auto"):
            HFEngine(tiny_policy, batch_size=bad)
