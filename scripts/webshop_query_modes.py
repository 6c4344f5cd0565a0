"""Constrained search: the first step (the search) of held-out shop goals under query=instruction vs query=free.

    PYTHONPATH=. python scripts/webshop_query_modes.py $PROGPO_CACHE_DIR   # after a run built the tiny model there

Prints, per mode, the share of valid searches and of searches whose hits hold the goal product (top 10, top 50).
"""
import glob
import sys

import torch

from envs.webshop import make_suite
from progpo.models.tiny import load_tiny
from progpo.rollout.engines.hf_engine import HFEngine
from progpo.rollout.projection import project_action
from progpo.rollout.prompt import PromptBuilder

folder = sorted(glob.glob(sys.argv[1] + "/models/tiny-*[0-9a-f]"))[0]
policy = load_tiny(folder)
suite = make_suite(n_products=3000, n_train=2000, n_eval=40, seed=0, max_steps=15)
env = suite.env_factory()
builder = PromptBuilder(policy.tokenizer, history=1, max_prompt_tokens=2000, style="compact")
obs = [env.reset(t) for t in suite.eval_tasks]
prompts = [builder.build(o.task_description, o.text, o.admissible_actions, []).ids for o in obs]
for mode in ("instruction", "free"):
    engine = HFEngine(policy, max_new_tokens=32, constrain_to_admissible=True, query=mode)
    valid = top10 = top50 = n = 0
    for rep in range(2):
        torch.manual_seed(rep)
        gen = engine.generate(prompts, admissible=[o.admissible_actions for o in obs],
                              task_texts=[o.task_description for o in obs])
        for task, o, text in zip(suite.eval_tasks, obs, gen.texts):
            env.reset(task)
            action = project_action(text, o.admissible_actions).action or ""
            _, _, _, info = env.step(action)
            n += 1
            valid += info.valid
            asin = task.payload["goal"]["asin"]
            ranks = [env.products[i]["asin"] for i in env._results]
            top10 += asin in ranks[:10]
            top50 += asin in ranks
        if rep == 0:
            print(mode, "examples:", gen.texts[:3])  # noqa: T201
    print(f"{mode}: valid search {valid / n:.2f}, goal product in top 10 {top10 / n:.2f}, "  # noqa: T201
          f"in top 50 {top50 / n:.2f} (n={n})")
