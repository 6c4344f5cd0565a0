"""Rollout engines behind one protocol: ``HFEngine`` (a transformers model decoded with its own KV-cache loop;
shares the actor) and ``VLLMEngine`` (colocated vLLM, weights pushed after each update). vLLM is imported only
when used."""

from progpo.rollout.engines.base import Engine, Generation

__all__ = ["Engine", "Generation"]
