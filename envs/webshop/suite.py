"""``make_suite``: the offline WebShop-compatible shop as an ``EnvSuite`` (the default ``env=webshop``)."""

from __future__ import annotations

from envs.base import EnvSuite, Task, tasks_fingerprint
from envs.webshop.catalogue import CATEGORIES, generate_goals, load_products
from envs.webshop.search import SEARCH_RETURN_N
from envs.webshop.shop import WebShopEnvFactory


def make_suite(
    n_products: int = 3000,
    n_train: int = 2000,
    n_eval: int = 100,
    seed: int = 0,
    max_steps: int = 30,
    invalid_penalty: float = 0.1,
    results_per_page: int = 10,
    search_return_n: int = SEARCH_RETURN_N,
    reward: str = "success",
) -> EnvSuite:
    """Build the offline shop: catalogue and goals from ``seed``; goals ``0..n_eval-1`` are held out.

    Mirrors verl-agent's WebShop split (the first goal indices for evaluation, the rest for training) with
    smaller, configurable counts. Every argument is documented in ``conf/env/webshop.yaml``.
    """
    if n_eval < 1:
        raise ValueError(f"env.n_eval must be >= 1 (held-out goals), got {n_eval}")
    if n_train < 1:
        raise ValueError(f"env.n_train must be >= 1 (training goals), got {n_train}")
    factory = WebShopEnvFactory(
        n_products=n_products,
        seed=seed,
        max_steps=max_steps,
        invalid_penalty=invalid_penalty,
        results_per_page=results_per_page,
        search_return_n=search_return_n,
        reward=reward,
    )
    goals = generate_goals(load_products(n_products, seed), n_eval + n_train, seed)
    tasks = [
        Task(task_id=f"webshop-s{seed}-p{n_products}-g{i:05d}", task_type=g["category"], payload={"goal": g})
        for i, g in enumerate(goals)
    ]
    eval_tasks, train_tasks = tasks[:n_eval], tasks[n_eval:]
    return EnvSuite(
        name="webshop",
        env_factory=factory,
        train_tasks=train_tasks,
        eval_tasks=eval_tasks,
        eval_fingerprint=tasks_fingerprint(eval_tasks),
        max_steps=max_steps,
        task_types=CATEGORIES,
    )
