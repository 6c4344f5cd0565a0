"""WebShop's purchase score, ported from ``web_agent_site/engine/goal.py`` (``get_reward`` and helpers).

The structure, thresholds and quirks follow the original: attributes and non-size options match with
``fuzz.token_set_ratio > 85`` or by appearing in the title, features or description; sizes match exactly;
option values pass through ``normalize_color`` first; the total is
``r_type * (n_att_matches + n_option_matches + r_price) / (n_att + n_options + 1)``.

One deliberate substitution: WebShop finds the nouns of a title with spaCy's ``en_core_web_lg`` tagger, which
is not installable here. The offline catalogue is generated from known word lists, so ``title_nouns`` uses the
catalogue's noun vocabulary as a stand-in for the tagger (see ``catalogue.NOUN_WORDS``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from thefuzz import fuzz

EXACT_MATCH_OPTS = ("size",)
PRICE_RANGE = [10.0 * i for i in range(1, 100)]
FUZZY_THRESHOLD = 85
NO_PRICE_LIMIT = 1000000.0  # WebShop's "no bound" when a product is too expensive for PRICE_RANGE

# WebShop's web_agent_site/engine/normalize.py, in its order (the first hit wins).
COLOR_SET = (
    "alabaster", "apricot", "aqua", "ash", "asphalt", "azure", "banana", "beige", "black", "blue", "blush",
    "bordeaux", "bronze", "brown", "burgundy", "camel", "camo", "caramel", "champagne", "charcoal", "cheetah",
    "chestnut", "chocolate", "christmas", "coffee", "cognac", "copper", "coral", "cranberry", "cream", "crystal",
    "dark", "denim", "eggplant", "elephant", "espresso", "fuchsia", "gold", "granite", "grape", "graphite",
    "grass", "gray", "green", "grey", "heather", "indigo", "ivory", "ivy", "khaki", "lavender", "lemon",
    "leopard", "light", "lilac", "lime", "magenta", "maroon", "mauve", "merlot", "midnight", "mint", "mocha",
    "multicolor", "mushroom", "mustard", "natural", "navy", "nude", "olive", "orange", "peach", "pewter", "pink",
    "plum", "purple", "rainbow", "red", "rose", "royal", "rust", "sand", "sapphire", "seashell", "silver",
    "skull", "slate", "steel", "stone", "stonewash", "sunflower", "tan", "taupe", "teal", "tiger", "turquoise",
    "violet", "walnut", "wheat", "white", "wine", "yellow",
)  # fmt: skip

_WORD = re.compile(r"[a-z0-9]+")


def normalize_color(color_string: str) -> str:
    """WebShop's ``normalize_color``: the first ``COLOR_SET`` entry contained in the string, else the string."""
    for norm_color in COLOR_SET:
        if norm_color in color_string:
            return norm_color
    return color_string


def fuzzy_match(a: str, b: str) -> bool:
    """WebShop's fuzzy equality: ``fuzz.token_set_ratio(a, b) > 85``."""
    return fuzz.token_set_ratio(a, b) > FUZZY_THRESHOLD


def price_upper_for(price: float, rng) -> tuple[float, str]:
    """WebShop's goal price bound: the larger of two of the four ``PRICE_RANGE`` steps above the price.

    ``rng`` is a ``random.Random``; returns ``(price_upper, price_text)`` (text empty when unbounded).
    """
    price_range = [p for p in PRICE_RANGE if p > price][:4]
    if len(price_range) >= 2:
        _, price_upper = sorted(rng.sample(price_range, 2))
        return price_upper, f", and price lower than {price_upper:.2f} dollars"
    return NO_PRICE_LIMIT, ""


def title_nouns(title: str, noun_words: frozenset[str]) -> list[str]:
    """The nouns of a title (stand-in for spaCy's POS filter ``pos_ in ('PNOUN', 'NOUN', 'PROPN')``)."""
    return [t for t in _WORD.findall(title.lower()) if t in noun_words]


@dataclass(frozen=True)
class TypeReward:
    r_type: float
    query_match: bool
    category_match: bool
    title_score: float


@dataclass(frozen=True)
class PurchaseScore:
    """The score of one purchase and its parts, as WebShop's ``get_reward(..., verbose=True)`` reports them."""

    total: float  # task_score in [0, 1]
    r_type: float
    r_att: float
    r_option: float | None  # None when the goal has no options
    r_price: bool | None  # None when the goal has no price bound (price_upper <= 0)
    num_attr_matches: int
    num_option_matches: int
    query_match: bool
    category_match: bool
    title_score: float

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    def match_metrics(self) -> dict[str, float]:
        """The parts that tell why a purchase missed 1.0: product type, the goal's attributes, its options (only when
        the goal has options) and its price bound (only when it has one)."""
        out = {"type_match": float(self.r_type), "attribute_match": float(self.r_att)}
        if self.r_option is not None:
            out["option_match"] = float(self.r_option)
        if self.r_price is not None:
            out["price_match"] = float(self.r_price)
        return out


def get_type_reward(purchased_product: Mapping, goal: Mapping, noun_words: frozenset[str]) -> TypeReward:
    """Whether the purchased product is the same kind of thing: same query, category path or title nouns."""
    query_match = purchased_product["query"] == goal["query"]

    purchased_product_category = [x.strip() for x in purchased_product["product_category"].split("›")]
    goal_product_category = [x.strip() for x in goal["product_category"].split("›")]
    category_match = len(set(purchased_product_category) & set(goal_product_category)) >= 2

    purchased_type_parse = title_nouns(purchased_product["name"], noun_words)
    desired_type_parse = title_nouns(goal["name"], noun_words)
    n_intersect_type = len(set(purchased_type_parse) & set(desired_type_parse))
    if len(desired_type_parse) == 0:
        title_score = 0.2
    else:
        title_score = n_intersect_type / len(desired_type_parse)

    r_type = 1.0
    match = query_match or category_match or title_score > 0.2
    if not match:
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return TypeReward(r_type, query_match, category_match, title_score)


def _in_product_text(value: str, purchased_product: Mapping) -> bool:
    return (
        value in purchased_product["Title"].lower()
        or value in " ".join(purchased_product["BulletPoints"]).lower()
        or value in purchased_product["Description"].lower()
    )


def get_attribute_reward(purchased_product: Mapping, goal: Mapping) -> tuple[float, int]:
    """Fraction and count of goal attributes the product has (attribute list, else its text)."""
    purchased_attrs = purchased_product["Attributes"]
    goal_attrs = goal["attributes"]
    num_attr_matches = 0
    for g_attr in goal_attrs:
        matched = False
        for p_attr in purchased_attrs:
            if fuzzy_match(p_attr, g_attr):
                num_attr_matches += 1
                matched = True
                break
        if not matched and _in_product_text(g_attr, purchased_product):
            num_attr_matches += 1
    r_attr = num_attr_matches / len(goal_attrs)
    return r_attr, num_attr_matches


def get_option_reward(
    purchased_product: Mapping, goal_options: Iterable[str], purchased_options: Mapping[str, str]
) -> tuple[float | None, int]:
    """Fraction and count of chosen options that hit a goal option (sizes exactly, others fuzzily)."""
    purchased_options = {k: normalize_color(v) for k, v in purchased_options.items()}
    goal_options = [normalize_color(o) for o in goal_options]

    num_option_matches = 0
    for p_option_k, p_option_v in purchased_options.items():
        matched = False
        if p_option_k.lower() in EXACT_MATCH_OPTS:
            if p_option_v in goal_options:
                num_option_matches += 1
                matched = True
        else:
            for g_option in goal_options:
                if fuzzy_match(g_option, p_option_v):
                    num_option_matches += 1
                    matched = True
                    break
        if not matched and _in_product_text(p_option_v, purchased_product):
            num_option_matches += 1

    r_option = num_option_matches / len(goal_options) if len(goal_options) > 0 else None
    return r_option, num_option_matches


def get_reward(
    purchased_product: Mapping,
    goal: Mapping,
    price: float,
    options: Mapping[str, str],
    noun_words: frozenset[str],
) -> PurchaseScore:
    """WebShop's ``get_reward``: the score of buying ``purchased_product`` at ``price`` with ``options``."""
    type_reward = get_type_reward(purchased_product, goal, noun_words)
    r_price = (price <= goal["price_upper"]) if goal["price_upper"] > 0 else None
    r_att, num_attr_matches = get_attribute_reward(purchased_product, goal)
    goal_options = goal["goal_options"]
    goal_option_values = (
        list(goal_options.values()) if isinstance(goal_options, Mapping) else list(goal_options)
    )
    r_option, num_option_matches = get_option_reward(purchased_product, goal_option_values, options)

    total_reward = (num_attr_matches + num_option_matches + (r_price or 0)) / (
        len(goal["attributes"]) + len(goal_options) + 1
    )
    total_reward *= type_reward.r_type
    return PurchaseScore(
        total=total_reward,
        r_type=type_reward.r_type,
        r_att=r_att,
        r_option=r_option,
        r_price=r_price,
        num_attr_matches=num_attr_matches,
        num_option_matches=num_option_matches,
        query_match=type_reward.query_match,
        category_match=type_reward.category_match,
        title_score=type_reward.title_score,
    )
