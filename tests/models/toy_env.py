"""A small fake household env for model and engine tests (named as such: it is not ALFWorld).

ALFWorld-shaped text (``go to X``, ``take O from X``, ``put O in/on X``) with a planner expert, so the
tiny-model build and the warm start can be tested in seconds without the TextWorld engine.
"""

from __future__ import annotations

import random

from envs.base import SUCCESS_REWARD, EnvSuite, Observation, StepInfo, Task

RECEPTACLES = (
    "cabinet 1", "cabinet 2", "drawer 1", "drawer 2", "fridge 1", "countertop 1", "shelf 1", "sinkbasin 1",
)  # fmt: skip
OBJECTS = ("apple", "mug", "book", "pen", "egg", "plate")


class FakeRoomEnv:
    """Put one object into a target receptacle; the layout is derived from the task id."""

    def __init__(self, max_steps: int = 12) -> None:
        self.max_steps = max_steps

    def reset(self, task: Task) -> Observation:
        rng = random.Random(task.task_id)
        self.places = rng.sample(RECEPTACLES, 5)
        self.obj = f"{rng.choice(OBJECTS)} 1"
        self.source, self.target = rng.sample(self.places, 2)
        self.location: str | None = None
        self.holding = False
        self.done = False
        self.steps = 0
        self.goal = f"put some {self.obj[:-2]} in {self.target}."
        seen = ", ".join(f"a {p}" for p in self.places)
        return self._obs(f"You are in the middle of a room. Looking quickly around you, you see {seen}.")

    def _admissible(self) -> tuple[str, ...]:
        acts = [f"go to {p}" for p in self.places if p != self.location] + ["look", "inventory"]
        if self.location is not None:
            if not self.holding and self.location == self.source:
                acts.append(f"take {self.obj} from {self.location}")
            if self.holding:
                acts.append(f"put {self.obj} in/on {self.location}")
        return tuple(sorted(acts))

    def _obs(self, text: str) -> Observation:
        return Observation(text, self._admissible(), self.goal, "pick_and_place_simple")

    def step(self, action: str):
        self.steps += 1
        won = False
        if action not in self._admissible():
            text, valid = "Nothing happens.", False
        else:
            valid = True
            if action.startswith("go to "):
                self.location = action[len("go to ") :]
                here = self.obj if (self.location == self.source and not self.holding) else None
                text = f"You arrive at {self.location}. On the {self.location}, you see " + (
                    f"a {here}." if here else "nothing."
                )
            elif action.startswith("take "):
                self.holding = True
                text = f"You pick up the {self.obj} from the {self.location}."
            elif action.startswith("put "):
                self.holding = False
                won = self.location == self.target
                text = f"You put the {self.obj} in/on the {self.location}."
                if not won:
                    self.source = self.location
            elif action == "inventory":
                text = (
                    f"You are carrying: a {self.obj}." if self.holding else "You are not carrying anything."
                )
            else:
                text = f"You are facing the {self.location or 'middle of the room'}."
        self.done = won or self.steps >= self.max_steps
        reward = SUCCESS_REWARD if won else 0.0
        return self._obs(text), reward, self.done, StepInfo(won=won, valid=valid)

    def expert_action(self) -> str | None:
        if self.done:
            return None
        if not self.holding:
            return (
                f"go to {self.source}"
                if self.location != self.source
                else f"take {self.obj} from {self.source}"
            )
        return (
            f"go to {self.target}" if self.location != self.target else f"put {self.obj} in/on {self.target}"
        )

    def close(self) -> None:
        pass


def fake_room_suite(n_train: int = 64, n_eval: int = 16, max_steps: int = 12) -> EnvSuite:
    from envs.base import tasks_fingerprint

    train = [Task(f"room-{i}", "pick_and_place_simple") for i in range(n_train)]
    evals = [Task(f"room-eval-{i}", "pick_and_place_simple") for i in range(n_eval)]
    return EnvSuite(
        name="fake-room",
        env_factory=FakeRoomEnv,
        train_tasks=train,
        eval_tasks=evals,
        eval_fingerprint=tasks_fingerprint(evals),
        max_steps=max_steps,
        task_types=("pick_and_place_simple",),
    )


# A smaller shape than the default (hidden 128, 2 layers) and a warm start that teaches the answer format:
# ~30-60 s once per test session on two shared cores.
TEST_SHAPE = {
    "hidden_size": 128,
    "num_layers": 2,
    "num_heads": 4,
    "intermediate_size": 344,
    "max_context": 1024,
}
TEST_WARM_START = {"n_episodes": 32, "epochs": 4, "batch_size": 16, "lr": 3e-3, "action_noise": 0.2}


def build_test_tiny():
    """The tiny policy on the fake suite, built once per test session (cached in PROGPO_CACHE_DIR)."""
    from progpo.warmstart.tiny import build_tiny

    return build_tiny(fake_room_suite(), device="cpu", warm_start=TEST_WARM_START, **TEST_SHAPE)


def make_test_tokenizer(vocab_size: int = 512):
    """A real byte-level BPE tokenizer with a chat template, trained in well under a second."""
    from progpo.models.tiny import train_tokenizer
    from progpo.rollout.prompt import render_user_message

    env = FakeRoomEnv()
    corpus = []
    for task in fake_room_suite(n_train=16).train_tasks:
        obs = env.reset(task)
        past = []
        while (action := env.expert_action()) is not None:
            corpus.append(
                render_user_message(
                    obs.task_description, obs.text, obs.admissible_actions, past[-2:], len(past)
                )
            )
            corpus.append(f"<action>{action}</action>")
            past.append((obs.text, action))
            obs, _, done, _ = env.step(action)
            if done:
                break
    return train_tokenizer(corpus, vocab_size=vocab_size, max_context=1024)


def save_random_qwen2(folder) -> str:
    """A randomly initialised Qwen2 checkpoint shaped like Qwen2.5 (grouped-query attention, biased q/k/v, tied
    embeddings), with the test tokenizer, saved as a plain transformers folder: what ``model.path`` points at.
    Head dim 32: vLLM's CPU attention has no kernel for 16."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = make_test_tokenizer()
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)
