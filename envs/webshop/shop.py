"""The offline WebShop-compatible shop: WebShop's page flow, text observations, action grammar and score.

Pages and buttons follow WebShop's text mode (``observation_mode="text"``, the templates that verl-agent ships):
search page -> results (``Page 1 (Total results: 50)``, 10 per page, ``< Prev``/``Next >``, ``Back to Search``)
-> item page (options, ``Description``/``Features``/``Reviews``, ``Buy Now``) -> sub-pages (``< Prev``).
Observations are the page's visible texts joined by `` [SEP] ``, like WebShop's ``convert_html_to_text``; an item
page opens with ``You have clicked <value>.`` for each option chosen, as WebShop's text mode prefixes it (so an option
click changes the state that the policy and the credit estimators see).
Reward (``reward="success"``, the paper's and verl-agent's): ``SUCCESS_REWARD`` when the purchase scores exactly 1.0,
else 0; ``reward="score"``: ``SUCCESS_REWARD`` x the purchase score (WebShop's own reward, on the same scale). Invalid
actions cost ``invalid_penalty`` and leave the page unchanged. WebShop's score is ``StepInfo.extra["task_score"]``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from envs.base import SUCCESS_REWARD, Observation, StepInfo, Task
from envs.webshop.actions import admissible_actions, resolve_action
from envs.webshop.catalogue import NOUN_WORDS, load_products
from envs.webshop.reward import PurchaseScore, get_option_reward, get_reward
from envs.webshop.search import SEARCH_RETURN_N, search_engine_for

END_BUTTON = "Buy Now"
NEXT_PAGE = "Next >"
PREV_PAGE = "< Prev"
BACK_TO_SEARCH = "Back to Search"
SUB_PAGES = ("Description", "Features", "Reviews")
SEP = " [SEP] "
REWARD_MODES = ("success", "score")

_GOAL_KEYS = ("asin", "category", "query", "name", "product_category", "instruction_text", "attributes",
              "price_upper", "goal_options")  # fmt: skip


@dataclass(frozen=True)
class WebShopEnvFactory:
    """Picklable zero-argument builder of ``WebShopEnv`` (what pool workers call).

    n_products: catalogue size (the catalogue is generated from ``seed`` and cached).
    seed: catalogue seed; goals in task payloads must come from the same ``(n_products, seed)``.
    max_steps: the episode ends after this many actions (WebShop setup: 30).
    invalid_penalty: reward subtracted for an action that is not admissible on the page.
    results_per_page: results shown per page (WebShop: 10).
    search_return_n: hits a search returns (WebShop: 50).
    reward: ``"success"`` pays ``SUCCESS_REWARD`` only for a purchase scoring exactly 1.0 (paper); ``"score"`` pays
        ``SUCCESS_REWARD`` x the purchase score, so a near miss earns more than a wrong product (a denser signal for
        a weak policy whose groups would otherwise all fail alike). Success is ``score == 1.0`` in both.
    """

    n_products: int = 3000
    seed: int = 0
    max_steps: int = 30
    invalid_penalty: float = 0.1
    results_per_page: int = 10
    search_return_n: int = SEARCH_RETURN_N
    reward: str = "success"

    def __post_init__(self) -> None:
        if self.reward not in REWARD_MODES:
            raise ValueError(
                f"WebShop env: reward must be one of {REWARD_MODES} (success: 10 for a purchase scoring 1.0, as the "
                f"paper; score: 10 x the purchase score), got {self.reward!r}"
            )
        for name in ("n_products", "max_steps", "results_per_page", "search_return_n"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"WebShop env: {name} must be >= 1, got {getattr(self, name)}")
        if self.invalid_penalty < 0:
            raise ValueError(
                f"WebShop env: invalid_penalty must be >= 0 (it is subtracted), got {self.invalid_penalty}"
            )

    def __call__(self) -> WebShopEnv:
        return WebShopEnv(self)


@functools.lru_cache(maxsize=4)
def _asin_index(n_products: int, seed: int) -> dict[str, int]:
    return {p["asin"]: i for i, p in enumerate(load_products(n_products, seed))}


class WebShopEnv:
    """One shopping session at a time over the shared (per-process) catalogue and search index."""

    def __init__(self, config: WebShopEnvFactory | None = None) -> None:
        self.config = config or WebShopEnvFactory()
        self.products = load_products(self.config.n_products, self.config.seed)
        self.search_engine = search_engine_for(self.config.n_products, self.config.seed)
        self._asin_to_idx = _asin_index(self.config.n_products, self.config.seed)
        self._goal: dict[str, Any] | None = None
        self._done = True

    # ---------------------------------------------------------------- Env protocol
    def reset(self, task: Task) -> Observation:
        goal = task.payload.get("goal") if isinstance(task.payload, Mapping) else None
        if not isinstance(goal, Mapping) or any(k not in goal for k in _GOAL_KEYS):
            raise ValueError(
                f"Task {task.task_id!r}: payload['goal'] must be a WebShop goal dict with keys {_GOAL_KEYS}; "
                "build tasks with envs.webshop.make_suite"
            )
        if goal["asin"] not in self._asin_to_idx:
            raise ValueError(
                f"Task {task.task_id!r}: goal product {goal['asin']} is not in this catalogue "
                f"(n_products={self.config.n_products}, seed={self.config.seed}); build the env factory and the "
                "tasks from the same make_suite call"
            )
        self._goal = dict(goal)
        self._page = "search"
        self._keywords: list[str] = []
        self._results: list[int] = []
        self._page_num = 1
        self._item: int | None = None
        self._options: dict[str, str] = {}
        self._sub_page = ""
        self._score: PurchaseScore | None = None
        self._steps = 0
        self._done = False
        self._expert_plan: tuple[tuple[str, ...], int, dict[str, str], float] | None = None
        self._expert_searches: list[str] = []
        return self._observation()

    def step(self, action: str) -> tuple[Observation, float, bool, StepInfo]:
        if self._goal is None or self._done:
            raise RuntimeError(
                "WebShopEnv.step called before reset() or after the episode ended; call reset(task)"
            )
        self._steps += 1
        has_search_bar, clickables = self._available()
        canonical = resolve_action(action, has_search_bar, clickables)
        if canonical is None:
            reward, valid = -float(self.config.invalid_penalty), False
        else:
            self._apply(canonical)
            valid = True
            reward = self._purchase_reward()
        truncated = self._score is None and self._steps >= self.config.max_steps
        self._done = self._score is not None or truncated
        extra: dict[str, Any] = {"task_score": self._task_score, "page": self._page, "truncated": truncated}
        if self._score is not None:  # this step bought: the score's parts, as WebShop's verbose reward info
            purchased = {"asin": self.products[self._item]["asin"], "options": dict(self._options)}
            extra["purchase"] = {**purchased, **self._score.as_dict()}
            extra["episode_metrics"] = self._score.match_metrics()
        return self._observation(), reward, self._done, StepInfo(won=self._won, valid=valid, extra=extra)

    def close(self) -> None:
        self._goal = None
        self._done = True

    # ---------------------------------------------------------------- WebShop-style interface
    def get_available_actions(self) -> dict[str, Any]:
        """WebShop's ``get_available_actions``: ``{"has_search_bar": bool, "clickables": [...]}``."""
        has_search_bar, clickables = self._available()
        return {"has_search_bar": has_search_bar, "clickables": list(clickables)}

    @property
    def page_kind(self) -> str:
        """The page shown now: ``search``, ``results``, ``item``, ``sub`` (description/features/reviews) or
        ``done`` (what ``warm_start.focus_pages`` names)."""
        return self._page

    @property
    def instruction_text(self) -> str:
        return self._goal["instruction_text"] if self._goal else ""

    def _purchase_reward(self) -> float:
        if self.config.reward == "score":
            return SUCCESS_REWARD * self._task_score
        return SUCCESS_REWARD if self._won else 0.0

    @property
    def _won(self) -> bool:
        return self._score is not None and self._score.total == 1.0

    @property
    def _task_score(self) -> float:
        return float(self._score.total) if self._score is not None else 0.0

    # ---------------------------------------------------------------- pages
    def _page_products(self) -> list[int]:
        per = self.config.results_per_page
        return self._results[(self._page_num - 1) * per : self._page_num * per]

    def _has_next(self) -> bool:
        return self._page_num * self.config.results_per_page < len(self._results)

    def _available(self) -> tuple[bool, tuple[str, ...]]:
        page = self._page
        if page == "search":
            return True, ()
        if page == "results":
            buttons = (
                [BACK_TO_SEARCH]
                + ([PREV_PAGE] if self._page_num > 1 else [])
                + ([NEXT_PAGE] if self._has_next() else [])
            )
            links = [self.products[i]["asin"] for i in self._page_products()]
            return False, tuple(b.lower() for b in buttons + links)
        if page == "item":
            buttons = [BACK_TO_SEARCH, PREV_PAGE, *SUB_PAGES, END_BUTTON]
            values = [v for vs in self.products[self._item]["options"].values() for v in vs]
            return False, tuple(b.lower() for b in buttons) + tuple(values)
        if page == "sub":
            return False, (BACK_TO_SEARCH.lower(), PREV_PAGE.lower())
        return False, ()  # done

    def _observation(self) -> Observation:
        has_search_bar, clickables = self._available()
        return Observation(
            text=self._render(),
            admissible_actions=admissible_actions(has_search_bar, clickables),
            task_description=self._goal["instruction_text"],
            task_type=self._goal["category"],
        )

    def _render(self) -> str:
        instruction = self._goal["instruction_text"]
        if self._page == "search":
            return SEP.join(["WebShop", "Instruction:", instruction, "Search"])
        if self._page == "done":
            return SEP.join(
                ["Thank you for shopping with us!", "Your score (min 0.0, max 1.0)", f"{self._task_score}"]
            )
        clicked = [f"You have clicked {v}." for v in self._options.values()] if self._page == "item" else []
        parts = [*clicked, "Instruction:", instruction, BACK_TO_SEARCH]
        if self._page == "results":
            parts.append(f"Page {self._page_num} (Total results: {len(self._results)})")
            parts += ([PREV_PAGE] if self._page_num > 1 else []) + ([NEXT_PAGE] if self._has_next() else [])
            for i in self._page_products():
                p = self.products[i]
                parts += [p["asin"], p["Title"], p["Price"]]
            return SEP.join(parts)
        product = self.products[self._item]
        parts.append(PREV_PAGE)
        if self._page == "item":
            for name, values in product["options"].items():
                parts += [name, *values]
            parts += [product["Title"], f"Price: {product['Price']}", f"Rating: {product['Rating']}"]
            parts += [*SUB_PAGES, END_BUTTON]
        elif self._sub_page == "Description":
            parts.append(product["Description"])
        elif self._sub_page == "Features":
            parts += product["BulletPoints"]
        else:  # Reviews
            for review in product["Reviews"]:
                parts += [f'"{review["title"]}"', str(review["score"]), review["body"]]
        return SEP.join(parts)

    # ---------------------------------------------------------------- transitions
    def _apply(self, action: str) -> None:
        """Apply a canonical, admissible action (see ``resolve_action``), following WebShop's ``receive``."""
        verb, arg = action.split("[", 1)
        arg = arg[:-1]
        if verb == "search":
            self._keywords = arg.split()
            self._results = self.search_engine.search(" ".join(self._keywords), k=self.config.search_return_n)
            self._show_results(1)
        elif arg == END_BUTTON.lower():
            product = self.products[self._item]
            self._score = get_reward(product, self._goal, product["pricing"][0], self._options, NOUN_WORDS)
            self._page = "done"
        elif arg == BACK_TO_SEARCH.lower():
            self._page, self._keywords, self._results, self._item, self._options = "search", [], [], None, {}
        elif arg == NEXT_PAGE.lower() and self._page == "results":
            self._show_results(self._page_num + 1)
        elif arg == PREV_PAGE.lower() and self._page == "results":
            self._show_results(self._page_num - 1)
        elif arg == PREV_PAGE.lower() and self._page == "sub":
            self._page = "item"
        elif arg == PREV_PAGE.lower() and self._page == "item":
            self._show_results(self._page_num)
        elif arg in (s.lower() for s in SUB_PAGES):
            self._page, self._sub_page = "sub", next(s for s in SUB_PAGES if s.lower() == arg)
        elif self._page == "results":  # a product link
            self._item = next(i for i in self._page_products() if self.products[i]["asin"].lower() == arg)
            self._page = "item"
        else:  # an option on the item page
            for name, values in self.products[self._item]["options"].items():
                if arg in values:
                    self._options[name] = arg

    def _show_results(self, page_num: int) -> None:
        self._page, self._page_num, self._item, self._options = "results", page_num, None, {}

    # ---------------------------------------------------------------- expert
    def _best_options(self, product: Mapping[str, Any]) -> dict[str, str]:
        goal_values = list(self._goal["goal_options"].values())
        chosen = {}
        for name, values in product["options"].items():
            hits = [v for v in values if get_option_reward(product, goal_values, {name: v})[1] > 0]
            chosen[name] = hits[0] if hits else values[0]
        return chosen

    def _expert_queries(self) -> list[str]:
        goal = self._goal
        return [" ".join([*goal["attributes"], goal["query"]]), goal["query"]]

    def expert_action(self) -> str | None:
        """The next action of a scripted shopper that knows the goal and can read every product's data.

        It searches with the goal's attributes and product type, picks the result with the best reachable score
        (paging if needed; searching once more with the type alone if nothing scores 1.0), chooses the goal's
        options and buys.
        """
        if self._goal is None or self._done:
            return None
        if self._page == "search":
            queries = self._expert_queries()
            query = next((q for q in queries if q not in self._expert_searches), queries[-1])
            self._expert_searches.append(query)
            return f"search[{query}]"
        if self._page == "sub":
            return f"click[{PREV_PAGE.lower()}]"
        if self._page == "results":
            plan = self._plan_for_results()
            if plan is None:
                return f"click[{BACK_TO_SEARCH.lower()}]"
            _, rank, _, best = plan
            if best < 1.0 and len(self._expert_searches) < len(self._expert_queries()):
                return f"click[{BACK_TO_SEARCH.lower()}]"
            target_page = rank // self.config.results_per_page + 1
            if target_page > self._page_num:
                return f"click[{NEXT_PAGE.lower()}]"
            if target_page < self._page_num:
                return f"click[{PREV_PAGE.lower()}]"
            return f"click[{self.products[self._results[rank]]['asin'].lower()}]"
        if self._page == "item":
            plan = self._plan_for_results()
            if plan is None or self._item != self._results[plan[1]]:
                return f"click[{PREV_PAGE.lower()}]"
            for name, value in plan[2].items():
                if self._options.get(name) != value:
                    return f"click[{value}]"
            return f"click[{END_BUTTON.lower()}]"
        return None

    def _plan_for_results(self) -> tuple[tuple[str, ...], int, dict[str, str], float] | None:
        """(keywords, rank of the best result, its options, its score), cached per search."""
        if not self._results:
            return None
        key = tuple(self._keywords)
        if self._expert_plan is None or self._expert_plan[0] != key:
            best = (-1.0, 0, {})
            for rank, idx in enumerate(self._results):
                product = self.products[idx]
                options = self._best_options(product)
                score = get_reward(product, self._goal, product["pricing"][0], options, NOUN_WORDS).total
                if score > best[0]:
                    best = (score, rank, options)
                if score == 1.0:
                    break
            self._expert_plan = (key, best[1], best[2], best[0])
        return self._expert_plan
