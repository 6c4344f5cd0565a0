"""The ALFWorld TextWorld engine (``textworld.envs.pddl.PddlEnv`` + ``AlfredDemangler``) and its speed-ups.

The engine spends almost all of its time outside the game logic: it re-parses the same grammar strings with
tatsu on every step (once per admissible command), deep-copies the whole derivation context for every symbol,
re-parses the grammar document on every load and re-translates the PDDL problem to SAS twice per reset.
``install_engine_speedups`` memoises those pure
functions once per process and reuses each text derivation (every admissible command's text, at every step) while
the facts it read are unchanged; the game text, admissible commands and rewards stay byte-identical (checked by
``tests/envs/test_alfworld_env.py::test_speedups_keep_transcripts_identical``). Set
``PROGPO_ALFWORLD_SPEEDUPS=0`` to run the unmodified engine.

``pddl2sas`` also overwrites ``sys.argv`` (a hack inside fast-downward's translator); the wrapper restores it,
so a Hydra or pytest process that plays games in-process keeps its command line.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import pickle
import sys
from collections import OrderedDict
from typing import Any

logger = logging.getLogger(__name__)

_INSTALLED = False
_SAS_CACHE_SIZE = 256  # translated problems kept per process (one entry is a few hundred KB at most)
_GAME_CACHE_SIZE = 256  # parsed game files kept per process
_DERIVED_LIMIT = 1024  # derived-text tables kept per process at most (each is dropped when its engine loads or closes)


class _LRU:
    """A tiny bounded mapping (``functools.lru_cache`` cannot key on a digest we compute ourselves)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._data: OrderedDict[Any, Any] = OrderedDict()

    def get(self, key: Any) -> Any:
        value = self._data.get(key)
        if value is not None:
            self._data.move_to_end(key)
        return value

    def put(self, key: Any, value: Any) -> None:
        self._data[key] = value
        self._data.move_to_end(key)
        while len(self._data) > self.size:
            self._data.popitem(last=False)


_SAS = _LRU(_SAS_CACHE_SIZE)
_GAMES = _LRU(_GAME_CACHE_SIZE)
_LOGIC = _LRU(_GAME_CACHE_SIZE)
_DERIVED: dict[int, tuple[Any, Any, dict, dict]] = {}  # id(infos) -> (infos, grammar, texts, fact sets read)


def speedups_enabled() -> bool:
    return os.environ.get("PROGPO_ALFWORLD_SPEEDUPS", "1") not in ("0", "false", "False")


def install_engine_speedups() -> None:
    """Memoise the engine's pure helpers in this process (idempotent; no-op when disabled by env var)."""
    global _INSTALLED
    if _INSTALLED or not speedups_enabled():
        return
    import fast_downward
    import textworld.envs.pddl.logic as pddl_logic
    import textworld.envs.pddl.textgen as textgen
    import textworld.logic as tw_logic

    # 1. Grammar strings -> symbol lists: parsed once, copied on use (derivation mutates the symbols). The
    #    copy is a pickle round trip, several times faster than ``copy.deepcopy`` on these small trees.
    parse = textgen._parse_and_convert

    @functools.lru_cache(maxsize=4096)
    def _parsed(text: str, rule_name: str) -> bytes:
        return pickle.dumps(parse(text, rule_name=rule_name), protocol=pickle.HIGHEST_PROTOCOL)

    def cached_parse(*args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and isinstance(args[0], str) and set(kwargs) <= {"rule_name", "trace"}:
            if "rule_name" in kwargs and not kwargs.get("trace"):
                return pickle.loads(_parsed(args[0], kwargs["rule_name"]))
        return parse(*args, **kwargs)

    textgen._parse_and_convert = cached_parse

    # 2. Derivation contexts: the engine deep-copies variables (EntityInfo) and mappings for every symbol but
    #    only ever adds keys to the copies, so copying the two dicts is enough.
    def copy_context(context: dict) -> dict:
        return {
            "state": context["state"],
            "facts": context["facts"],
            "variables": dict(context["variables"]),
            "mapping": dict(context["mapping"]),
            "entity_infos": context["entity_infos"],
        }

    textgen.copy_context = copy_context

    # 3. Grammar conditions (``openable(r:receptacle) & ...``) parsed once; Rule objects are only read.
    parse_query = tw_logic.Rule.parse_conjunctive_query.__func__
    cached_query = functools.lru_cache(maxsize=4096)(parse_query)
    tw_logic.Rule.parse_conjunctive_query = classmethod(lambda cls, expr: cached_query(cls, expr))

    # 4. PDDL -> SAS translation, keyed by a digest of (domain, problem, optimize); the translated task is only
    #    read by the engine, so a reset of a game seen before skips the translator entirely.
    pddl2sas = fast_downward.pddl2sas

    def cached_pddl2sas(domain: str, problem: str, verbose: bool = False, optimize: bool = False) -> Any:
        key = hashlib.blake2b(f"{optimize}\0{domain}\0{problem}".encode(), digest_size=16).digest()
        hit = _SAS.get(key)
        if hit is None:
            argv = list(sys.argv)
            try:
                hit = pddl2sas(domain, problem, verbose=verbose, optimize=optimize)
            finally:
                sys.argv[:] = argv
            _SAS.put(key, hit)
        return hit

    fast_downward.pddl2sas = cached_pddl2sas

    # 5. Game logic (the grammar document parsed by tatsu), keyed by (domain, grammar): the envs of a worker
    #    that play the same game share it. The engine only reads it (its type registry ignores duplicates).
    game_logic = pddl_logic.GameLogic

    def cached_game_logic(domain: str, grammar: str) -> Any:
        key = hashlib.blake2b(f"{domain}\0{grammar}".encode(), digest_size=16).digest()
        hit = _LOGIC.get(key)
        if hit is None:
            hit = game_logic(domain=domain, grammar=grammar)
            _LOGIC.put(key, hit)
        return hit

    pddl_logic.GameLogic = cached_game_logic

    # 6. Text derivations reused while the facts they read are unchanged (``_memoise_derivations``).
    _memoise_derivations(textgen, tw_logic)
    _INSTALLED = True
    logger.debug("ALFWorld engine speed-ups installed in pid %d", os.getpid())


def _memoise_derivations(textgen: Any, tw_logic: Any) -> None:
    """Reuse a derivation of the game's grammar (an admissible command's text, a feedback) for the same start symbol,
    action mapping and variables while the facts it read are unchanged.

    Every step derives the text of every admissible command (most of an engine step's time), and most commands
    (``go to`` each receptacle) are the same from one step to the next. A derivation reads the state only through
    ``State.facts_with_signature`` (its queries' matches, which it sorts) and ``State.variables_of_type`` (free
    placeholders): it is recorded with the fact sets it read and reused while ``facts_with_signature`` returns equal
    sets, so the text is the one the grammar would derive. A derivation that read variables (whose set order is not
    fixed by their content) is not kept. Each loaded game has its table (keyed by its entity infos), dropped when its
    engine loads another game or closes.
    """
    derive = textgen.ContextSensitiveGrammar.derive
    facts_of = tw_logic.State.facts_with_signature
    variables_of = tw_logic.State.variables_of_type

    @functools.wraps(derive)
    def memoised_derive(self: Any, start: str, context: dict = {}) -> str:  # noqa: B006 - the engine's signature
        infos, state, mapping = context.get("entity_infos"), context.get("state"), context.get("mapping")
        if infos is None or state is None or mapping is None or "facts_with_signature" in vars(state):
            return derive(self, start, context)
        texts, fact_sets = _derived_texts(infos, self)
        key = (start, tuple(mapping.items()), tuple((k, id(v)) for k, v in context.get("variables", {}).items()))
        hit = texts.get(key)
        if hit is not None and all(facts_of(state, signature) == facts for signature, facts in hit[1]):
            return hit[0]
        read: dict[Any, frozenset] = {}
        free: list[str] = []

        def recorded_facts(signature: Any) -> Any:
            found = facts_of(state, signature)
            if signature not in read:
                facts = frozenset(found)
                read[signature] = fact_sets.setdefault(facts, facts)  # one copy of each set per game
            return found

        def recorded_variables(type_name: str) -> Any:
            free.append(type_name)
            return variables_of(state, type_name)

        state.facts_with_signature, state.variables_of_type = recorded_facts, recorded_variables
        try:
            text = derive(self, start, context)
        finally:
            del state.facts_with_signature, state.variables_of_type
        if not free:
            texts[key] = (text, tuple(read.items()))
        return text

    textgen.ContextSensitiveGrammar.derive = memoised_derive


def _derived_texts(infos: dict, grammar: Any) -> tuple[dict, dict]:
    """The derived texts and the fact sets they read of the game whose entity infos are ``infos``."""
    entry = _DERIVED.get(id(infos))
    if entry is None or entry[0] is not infos or entry[1] is not grammar:
        entry = _DERIVED[id(infos)] = (infos, grammar, {}, {})
        while len(_DERIVED) > _DERIVED_LIMIT:  # engines dropped without close
            del _DERIVED[next(iter(_DERIVED))]
    return entry[2], entry[3]


def _forget_derived(engine: Any) -> None:
    """Drop the derived texts of the game ``engine`` has loaded (it loads another or closes)."""
    infos = getattr(engine.unwrapped, "_entity_infos", None)
    if infos is not None:
        _DERIVED.pop(id(infos), None)  # the table holds its infos alive: the id is theirs


def read_game(path: str) -> dict:
    """Parsed ``game.tw-pddl`` (cached per process: a pool worker resets the same games many times)."""
    data = _GAMES.get(path)
    if data is None:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        for key in ("pddl_domain", "grammar", "pddl_problem"):
            if key not in data:
                raise ValueError(f"{path}: not an ALFWorld game file, missing key {key!r}")
        _GAMES.put(path, data)
    return data


# fast-downward library copies of closed engines. They stay loaded until the process ends: unloading one
# (dlclose) makes the interpreter crash at exit (SIGSEGV in the library's static destructors), and handing a
# cleaned-up copy to a new engine crashed too. Each env loads one copy (~33 MB of file-backed mappings).
_RETIRED_LIBS: list[Any] = []


def make_engine() -> Any:
    """A fresh ALFWorld engine: TextWorld's PDDL env behind ALFWorld's name demangler (``apple 1``).

    Each engine loads its own copy of fast-downward's library (the library keeps one game state globally).
    """
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler
    from textworld.envs.pddl import PddlEnv

    install_engine_speedups()
    infos = textworld.EnvInfos(won=True, admissible_commands=True)
    return AlfredDemangler(PddlEnv(infos), shuffle=False)


def close_engine(engine: Any) -> None:
    """End the game; the engine's private copy of fast-downward stays loaded (see ``_RETIRED_LIBS``)."""
    try:
        _forget_derived(engine)
        engine.close()
        lib = getattr(engine.unwrapped, "downward_lib", None)
        if lib is not None:
            engine.unwrapped.downward_lib = None
            _RETIRED_LIBS.append(lib)
    except Exception:  # noqa: BLE001 - closing must not mask the error that brought us here
        logger.debug("ALFWorld engine close failed", exc_info=True)


def load_game(engine: Any, path: str) -> None:
    """Load a game into ``engine`` from the (cached) parsed file."""
    _forget_derived(engine)
    argv = list(sys.argv)
    try:
        engine.load(read_game(path))
    finally:
        sys.argv[:] = argv
    engine.unwrapped._game_file = path


def expert_plan(engine: Any) -> list[str]:
    """ALFWorld's planner expert (``AlfredExpertType.PLANNER``): fast-downward replans from the current state.

    Returns the remaining commands, or ``[]`` when the goal cannot be reached (or is reached already).
    """
    pddl_env = engine.unwrapped
    return list(pddl_env._pddl_state.replan(pddl_env._entity_infos))
