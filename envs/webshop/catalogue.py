"""The offline shop's product catalogue and goals, generated deterministically from a seed.

Products carry WebShop's fields (``asin``, ``name``/``Title``, ``category``, ``query``, ``product_category``,
``Description``, ``BulletPoints``, ``Attributes``, ``options``, ``pricing``, ``Price``, ``Rating``, ``Reviews``)
so the reward code reads them exactly as WebShop's does. Goals follow ``get_synthetic_goals``: one product,
some of its attributes, one value per option group, and a price bound from ``PRICE_RANGE``.

Only ``random.Random`` with int or str seeds and ordered sequences are used, so a seed gives the same catalogue
and goals on any machine and under any ``PYTHONHASHSEED``. The catalogue is cached as JSON under
``$PROGPO_CACHE_DIR/webshop`` (else ``~/.cache/progpo/webshop``) and loaded once per process.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import random
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from envs.base import cache_root
from envs.webshop.products import (  # noqa: F401 - CATEGORIES, NOUN_WORDS, PRODUCT_TYPES are re-exported
    ASIN_CHARS,
    BENEFITS,
    BRANDS,
    CATEGORIES,
    CATEGORY_ROOTS,
    INSTRUCTION_TEMPLATES,
    NOUN_WORDS,
    PRODUCT_TYPES,
    REVIEW_BODIES,
    REVIEW_TITLES,
    SENTENCES,
    ProductType,
)
from envs.webshop.reward import normalize_color, price_upper_for

log = logging.getLogger(__name__)

CATALOGUE_VERSION = 1  # bump when generation changes, so stale caches are not reused


def _title_case(text: str) -> str:
    return " ".join(w[:1].upper() + w[1:] for w in text.split())


def _product_text(product: Mapping[str, Any]) -> str:
    return " ".join([product["Title"], " ".join(product["BulletPoints"]), product["Description"]]).lower()


def _make_product(rng: random.Random, asin: str, ptype: ProductType) -> dict[str, Any]:
    brand = rng.choice(BRANDS)
    model = rng.choice(ptype.models)
    n_attrs = rng.randint(3, min(5, len(ptype.attributes)))
    attributes = rng.sample(ptype.attributes, n_attrs)
    title = f"{brand} {_title_case(model)} {ptype.noun}"
    if rng.random() < 0.5:
        title += f", {_title_case(attributes[0])}"
    description = (
        f"The {brand} {model} {ptype.noun.lower()} is {' and '.join(attributes[:2])}. "
        f"{rng.choice(SENTENCES)} {rng.choice(SENTENCES)}"
    )
    bullets = [f"{a[:1].upper()}{a[1:]}: {rng.choice(BENEFITS)}" for a in attributes]
    product: dict[str, Any] = {
        "asin": asin,
        "name": title,
        "Title": title,
        "category": ptype.category,
        "query": ptype.query,
        "product_category": f"{CATEGORY_ROOTS[ptype.category]} › {ptype.path}",
        "Description": description,
        "BulletPoints": bullets,
        "Attributes": attributes,
    }
    # Options: a subset of each pool, minus values the reward would match anyway (their normalised form
    # appears in the product's text), so that choosing the wrong option costs exactly one option match.
    text = _product_text(product)
    options: dict[str, list[str]] = {}
    for name, pool in ptype.options:
        k = rng.randint(2, min(5, len(pool)))
        values = [v for v in rng.sample(pool, k) if normalize_color(v) not in text]
        if values:
            options[name] = values
    product["options"] = options
    price = round(rng.uniform(*ptype.price), 2)
    product["pricing"] = [price]
    product["Price"] = f"${price:.2f}"
    product["Rating"] = rng.choice(("N.A.", "N.A.", "3.5", "4.0", "4.5", "5.0"))
    product["Reviews"] = [
        {"title": rng.choice(REVIEW_TITLES), "score": rng.randint(1, 5), "body": rng.choice(REVIEW_BODIES)}
        for _ in range(rng.randint(0, 2))
    ]
    return product


def generate_products(n_products: int, seed: int) -> list[dict[str, Any]]:
    """``n_products`` products, spread evenly over ``PRODUCT_TYPES`` in a seeded random order."""
    rng = random.Random(f"progpo-webshop-catalogue-{seed}")
    types = [PRODUCT_TYPES[i % len(PRODUCT_TYPES)] for i in range(n_products)]
    rng.shuffle(types)
    asins: set[str] = set()
    products = []
    for ptype in types:
        asin = "B0" + "".join(rng.choices(ASIN_CHARS, k=8))
        while asin in asins:
            asin = "B0" + "".join(rng.choices(ASIN_CHARS, k=8))
        asins.add(asin)
        products.append(_make_product(rng, asin, ptype))
    return products


def cache_dir() -> Path:
    """``$PROGPO_CACHE_DIR/webshop`` if set, else ``~/.cache/progpo/webshop``."""
    return cache_root() / "webshop"


@functools.lru_cache(maxsize=4)
def load_products(n_products: int, seed: int) -> tuple[dict[str, Any], ...]:
    """The catalogue for ``(n_products, seed)``: from the cache file, else generated and cached (atomically)."""
    path = cache_dir() / f"catalogue-v{CATALOGUE_VERSION}-seed{seed}-n{n_products}.json"
    if path.is_file():
        with path.open(encoding="utf-8") as f:
            return tuple(json.load(f)["products"])
    products = generate_products(n_products, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(
            {"version": CATALOGUE_VERSION, "seed": seed, "n_products": n_products, "products": products}, f
        )
    os.replace(tmp, path)  # concurrent writers produce identical files; the last rename wins
    log.info("generated WebShop catalogue (%d products, seed %d) at %s", n_products, seed, path)
    return tuple(products)


def make_goal(rng: random.Random, product: Mapping[str, Any]) -> dict[str, Any]:
    """One goal for ``product`` in the shape of WebShop's synthetic goals."""
    n_attrs = rng.randint(1, min(3, len(product["Attributes"])))
    attributes = rng.sample(product["Attributes"], n_attrs)
    goal_options = {name: rng.choice(product["options"][name]) for name in sorted(product["options"])}
    price_upper, price_text = price_upper_for(product["pricing"][0], rng)
    base = rng.choice(INSTRUCTION_TEMPLATES).format(
        query=product["query"], attrs_and=" and ".join(attributes), attrs_comma=", ".join(attributes)
    )
    option_text = ", and ".join(f"{k}: {v}" for k, v in goal_options.items())
    option_text = " with " + option_text if option_text else ""
    return {
        "asin": product["asin"],
        "category": product["category"],
        "query": product["query"],
        "name": product["Title"],
        "product_category": product["product_category"],
        "instruction_text": f"{base}{option_text}{price_text}",
        "attributes": attributes,
        "price_upper": price_upper,
        "goal_options": goal_options,
    }


def generate_goals(products: tuple[dict[str, Any], ...], n_goals: int, seed: int) -> list[dict[str, Any]]:
    """``n_goals`` distinct goals drawn from ``products`` (distinct in product, attributes and options)."""
    rng = random.Random(f"progpo-webshop-goals-{seed}")
    goals: list[dict[str, Any]] = []
    seen: set[str] = set()
    attempts = 0
    while len(goals) < n_goals:
        attempts += 1
        if attempts > 20 * n_goals + 1000:
            raise ValueError(
                f"could not draw {n_goals} distinct goals from {len(products)} products; "
                "raise n_products or lower n_train/n_eval"
            )
        goal = make_goal(rng, products[rng.randrange(len(products))])
        key = json.dumps([goal["asin"], sorted(goal["attributes"]), goal["goal_options"]])
        if key in seen:
            continue
        seen.add(key)
        goals.append(goal)
    return goals
