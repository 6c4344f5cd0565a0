"""The tiny model: tokenizer, build, warm start, cache re-use and the cache lock."""

from __future__ import annotations

import inspect
import json
import logging
import multiprocessing
import shutil
import time
from pathlib import Path

import pytest
import torch
from toy_env import TEST_SHAPE, FakeRoomEnv, fake_room_suite
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

from progpo.models.cache import COMPLETE, cached_build
from progpo.models.policy import make_reference
from progpo.models.tiny import check_reload, count_parameters, train_tokenizer
from progpo.warmstart import WarmStartConfig, collect_demos
from progpo.warmstart.tiny import build_tiny


def test_tiny_policy_is_a_complete_reloadable_model(tiny_policy):
    policy = tiny_policy
    assert policy.name == "tiny" and policy.max_context == 1024
    assert 300_000 < count_parameters(policy.model) < 1_000_000  # the small test shape
    tok = policy.tokenizer
    assert tok.padding_side == "left" and tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert tok.pad_token_id != tok.eos_token_id
    assert len(tok("</action>", add_special_tokens=False)["input_ids"]) == 1
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    source = Path(policy.source)
    assert (source / "config.json").exists() and (source / "tokenizer.json").exists()
    # a plain transformers folder: what vLLM (or anyone) loads
    again = AutoModelForCausalLM.from_pretrained(source)
    assert type(again).__name__ == "Qwen2ForCausalLM"
    assert AutoTokenizer.from_pretrained(source).chat_template == tok.chat_template


def test_default_shape_has_a_few_million_parameters():
    config = Qwen2Config(
        vocab_size=4096, hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=4, tie_word_embeddings=True,
    )  # fmt: skip
    with torch.device("meta"):
        model = Qwen2ForCausalLM(config)
    assert 4_000_000 < count_parameters(model) < 5_000_000
    defaults = inspect.signature(build_tiny).parameters
    assert (defaults["hidden_size"].default, defaults["num_layers"].default, defaults["vocab_size"].default) == (
        256, 4, 4096,
    )  # fmt: skip


def test_warm_start_learned_from_the_demos(tiny_policy):
    summary = json.loads((Path(tiny_policy.source) / COMPLETE).read_text())["summary"]
    assert summary["sft_demo_steps"] > 50 and summary["demo_won"] > 0
    assert summary["sft_final_loss"] < 0.5 * summary["sft_first_loss"]


def test_collect_demos_labels_are_expert_actions_and_noise_diverts(fake_suite):
    demos, stats = collect_demos(fake_suite, WarmStartConfig(n_episodes=10, action_noise=0.3, seed=3))
    assert stats.episodes == 10 and stats.steps == len(demos) > 0
    assert 0 < stats.noisy_steps < stats.steps
    for demo in demos:
        assert demo.expert_action in demo.admissible
    # within an episode, each step's history ends with the previous observation and the action executed there;
    # the executed action differs from the expert label only on the noisy steps
    diverted = 0
    for prev, nxt in zip(demos, demos[1:]):
        if nxt.episode != prev.episode or len(nxt.past) != len(prev.past) + 1:
            continue
        assert nxt.past[-1][0] == prev.observation
        diverted += nxt.past[-1][1] != prev.expert_action
    assert 0 < diverted <= stats.noisy_steps + stats.invalid_steps
    # invalid noise executes stale commands: the demos show the env's answer and the expert's way on
    assert stats.invalid_steps > 0
    assert any(d.observation == "Nothing happens." for d in demos)


def test_build_is_cached_and_reused_with_identical_weights(caplog):
    suite = fake_room_suite(n_train=20)
    kwargs = dict(
        **{**TEST_SHAPE, "max_context": 512},
        seed=1,
        warm_start={"n_episodes": 16, "epochs": 1, "max_steps": 2},
    )
    started = time.perf_counter()
    first = build_tiny(suite, **kwargs)
    first_seconds = time.perf_counter() - started
    with caplog.at_level(logging.INFO, logger="progpo.models.cache"):
        started = time.perf_counter()
        second = build_tiny(suite, **kwargs)
        second_seconds = time.perf_counter() - started
    assert "re-using cached tiny model" in caplog.text
    assert second.source == first.source
    assert second_seconds < first_seconds / 2
    for (name, a), (_, b) in zip(first.model.state_dict().items(), second.model.state_dict().items()):
        assert torch.equal(a, b), name
    # a different env (other training tasks) is a different model
    other = build_tiny(fake_room_suite(n_train=21), **{**kwargs, "warm_start": {"n_episodes": 0}})
    assert other.source != first.source


def test_bf16_warm_start_runs_the_sft_under_autocast_keeps_float32_weights_and_is_cached_apart(monkeypatch):
    import progpo.hardware
    import progpo.warmstart.sft as sft

    suite = fake_room_suite(n_train=20)
    ws = {"n_episodes": 16, "epochs": 1, "max_steps": 3}
    kwargs = dict(**{**TEST_SHAPE, "max_context": 512}, seed=2)
    float32 = build_tiny(suite, **kwargs, warm_start=ws)
    head_dtypes: set[torch.dtype] = set()
    real = sft.forward_logprobs

    def spying(model, *args, **kw):
        handle = model.get_output_embeddings().register_forward_hook(lambda m, a, out: head_dtypes.add(out.dtype))
        try:
            return real(model, *args, **kw)
        finally:
            handle.remove()

    monkeypatch.setattr(sft, "forward_logprobs", spying)
    bf16 = build_tiny(suite, **kwargs, warm_start={**ws, "precision": "bf16-mixed"})
    assert head_dtypes == {torch.bfloat16}  # every SFT forward ran under bf16 autocast
    assert bf16.source != float32.source  # another policy, another cache entry
    assert {p.dtype for p in bf16.model.parameters()} == {torch.float32}
    assert any(not torch.equal(a, b) for a, b in zip(bf16.model.parameters(), float32.model.parameters()))
    # auto: the bf16 build where the CPU has native bf16, the float32 one elsewhere (both cached by now)
    for flags, expected in (({"avx512_bf16"}, bf16.source), ({"avx2"}, float32.source)):
        monkeypatch.setattr(progpo.hardware, "cpu_flags", lambda flags=flags: frozenset(flags))
        assert build_tiny(suite, **kwargs, warm_start={**ws, "precision": "auto"}).source == expected


def _build_in_process(root: str, out: multiprocessing.Queue) -> None:
    import os

    os.environ["PROGPO_CACHE_DIR"] = root

    def slow_build(folder: Path) -> dict:
        with open(Path(root) / "builds.txt", "a") as f:
            f.write("built\n")
        time.sleep(0.5)
        (folder / "weights.bin").write_bytes(b"x")
        return {}

    out.put(str(cached_build("lock-test", {"a": 1}, slow_build)))


def test_two_processes_build_once(tmp_path):
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_build_in_process, args=(str(tmp_path), queue)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    paths = {queue.get(timeout=5) for _ in procs}
    assert len(paths) == 1
    assert (tmp_path / "builds.txt").read_text().count("built") == 1
    assert (Path(paths.pop()) / "weights.bin").exists()


def test_failed_build_leaves_no_cache_entry(tmp_path, monkeypatch):
    monkeypatch.setenv("PROGPO_CACHE_DIR", str(tmp_path))

    def broken(folder: Path) -> dict:
        (folder / "partial").write_text("half")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        cached_build("broken", {"a": 1}, broken)
    assert [p.name for p in (tmp_path / "models").iterdir() if not p.name.endswith(".lock")] == []


def test_make_reference_is_a_frozen_copy(tiny_policy):
    reference = make_reference(tiny_policy)
    assert not reference.training and all(not p.requires_grad for p in reference.parameters())
    with torch.no_grad():
        tiny_policy.model.model.norm.weight.add_(1.0)
    assert not torch.equal(reference.model.norm.weight, tiny_policy.model.model.norm.weight)
    assert any(p.requires_grad for p in tiny_policy.model.parameters())


@pytest.mark.parametrize(
    "kwargs", [{"n_episodes": -1}, {"lr": 0.0}, {"action_noise": 1.0}, {"batch_size": 0}, {"epochs": -1},
               {"precision": "fp8"}]
)
def test_warm_start_config_rejects_bad_values(kwargs):
    with pytest.raises(ValueError, match=r"warm_start\."):
        WarmStartConfig(**kwargs)


def test_leftovers_of_a_killed_build_are_removed(tmp_path, monkeypatch):
    monkeypatch.setenv("PROGPO_CACHE_DIR", str(tmp_path))
    calls = []

    def build(folder: Path) -> dict:
        calls.append(folder)
        (folder / "weights.bin").write_bytes(b"x")
        return {}

    first = cached_build("killed", {"a": 1}, build)
    shutil.rmtree(first)  # as if the process died before the rename...
    stale = first.parent / f".{first.name}.abc123"
    stale.mkdir()  # ...leaving its temporary folder behind
    again = cached_build("killed", {"a": 1}, build)
    assert again == first and len(calls) == 2 and not stale.exists()


def test_tokenizer_is_the_same_after_reload_as_during_the_warm_start(tiny_policy, tmp_path):
    # the build trains on the in-memory tokenizer; rollouts and vLLM use the one reloaded from the folder
    texts = [
        "<action>go to drawer 12</action>",
        "Task: put some mug in shelf 1.\nNow: You arrive at fridge 1.",
    ]
    reloaded = AutoTokenizer.from_pretrained(tiny_policy.source)
    assert type(reloaded).__name__ == type(tiny_policy.tokenizer).__name__ == "Qwen2Tokenizer"
    check_reload(tiny_policy.tokenizer, Path(tiny_policy.source), texts)
    # a tokenizer that splits differently is caught
    other = train_tokenizer(["completely different words 7 8 9"] * 20, vocab_size=300, max_context=64)
    with pytest.raises(RuntimeError, match="changes on reload"):
        check_reload(other, Path(tiny_policy.source), texts)


def test_length_bucketed_batches_cover_every_row_once_with_similar_lengths():
    import torch

    from progpo.warmstart import length_bucketed_batches

    lengths = [int(x) for x in torch.randint(50, 320, (1000,), generator=torch.Generator().manual_seed(1))]
    batches = length_bucketed_batches(lengths, 32, torch.Generator().manual_seed(0), bucket_batches=8)
    rows = [i for b in batches for i in b]
    assert sorted(rows) == list(range(1000))  # every row exactly once per epoch
    assert all(1 <= len(b) <= 32 for b in batches)
    # padding waste vs random batches of the same size: sorted buckets pad far less
    waste = sum(max(lengths[i] for i in b) * len(b) - sum(lengths[i] for i in b) for b in batches)
    shuffled = torch.randperm(1000, generator=torch.Generator().manual_seed(0)).tolist()
    random_batches = [shuffled[k : k + 32] for k in range(0, 1000, 32)]
    random_waste = sum(max(lengths[i] for i in b) * len(b) - sum(lengths[i] for i in b) for b in random_batches)
    assert waste < 0.25 * random_waste
    # the order is random (not globally sorted) and depends on the generator
    firsts = [lengths[b[0]] for b in batches]
    assert firsts != sorted(firsts)
    again = length_bucketed_batches(lengths, 32, torch.Generator().manual_seed(0), bucket_batches=8)
    assert again == batches
    other = length_bucketed_batches(lengths, 32, torch.Generator().manual_seed(1), bucket_batches=8)
    assert other != batches


class _PagedRoom(FakeRoomEnv):
    """The toy room with pages: ``holding`` once the object is picked up, else ``looking`` (for focus demos)."""

    @property
    def page_kind(self) -> str:
        return "holding" if self.holding else "looking"


def test_focus_stage_is_cached_on_top_of_the_first_stage_and_trains_on_the_named_pages(caplog):
    from dataclasses import replace as dc_replace

    from progpo.warmstart.demos import collect_focus_demos

    suite = dc_replace(fake_room_suite(n_train=24), env_factory=_PagedRoom)
    ws = {"n_episodes": 8, "epochs": 1, "max_steps": 2}
    kwargs = dict(**{**TEST_SHAPE, "max_context": 512}, seed=2)
    first = build_tiny(suite, **kwargs, warm_start=ws)
    focus_ws = {**ws, "focus_episodes": 6, "focus_pages": ["holding"], "focus_epochs": 1, "focus_replay_episodes": 2}
    with caplog.at_level(logging.INFO, logger="progpo.models.cache"):
        focused = build_tiny(suite, **kwargs, warm_start=focus_ws)
    assert f"re-using cached tiny model from {first.source}" in caplog.text  # the first stage is not built again
    assert focused.source != first.source
    summary = json.loads((Path(focused.source) / "progpo-build.json").read_text())
    assert summary["params"]["focus"]["focus_pages"] == ["holding"] and summary["summary"]["base"] == Path(first.source).name
    expected, _ = collect_focus_demos(suite, WarmStartConfig(**focus_ws))
    assert summary["summary"]["focus_demo_steps"] == len(expected) > 0
    assert all(d.expert_action.startswith(("go to", "put")) for d in expected)  # only while holding the object
    changed = [n for (n, a), (_, b) in zip(first.model.state_dict().items(), focused.model.state_dict().items())
               if not torch.equal(a, b)]
    assert changed  # the second stage trained the first stage's weights further
    assert focused.tokenizer.get_vocab() == first.tokenizer.get_vocab()
