"""vLLM as the rig's rollout engine with `Engine`'s interface, asking of vLLM what verl's vLLM rollout asks
(docs/running.md, "The rollout engine: vLLM, or the local model of it"). Its engine core runs in this
process, so weights pass without copies and `gemm_outputs` can call the engine's own GEMM layers."""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import threading
import time
from pathlib import Path

import torch
from torch import Tensor

from diagnose.engine import sequence_logprobs
from localrl.engine.engine import Rollout, left_pad, pad
from localrl.gemm_match import engine_gemms
from localrl.vllm_compile_cache import reuse_compiles

LOGPROBS_MODE = "processed_logprobs"  # verl's rollout setting; vLLM's default is raw_logprobs
TOP_K_OFF = 0                         # vLLM 0.32: 0 disables top-k (-1 is still accepted)
HEARTBEAT_S = 15.0
SEED_RANGE = 2**31 - 1
# Set before vLLM is imported: offline (models are local directories) and quiet (its INFO lines would
# bury the cell's progress; VLLM_LOGGING_LEVEL=INFO brings them back).
ENV_DEFAULTS = {"HF_HUB_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
IN_PROCESS = ("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def _known_benign(record: logging.LogRecord) -> bool:
    """vLLM's in-place reload warns "RotaryEmbedding: Failed to load weights" at every weight update: the
    cos/sin table is no checkpoint weight and vLLM puts its own back (a reloaded engine equals a fresh one
    bit for bit: tests/test_vllm_engine.py)."""
    return not record.getMessage().startswith("RotaryEmbedding: Failed to load weights")


def _quiet_known_benign() -> None:
    logger = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
    if _known_benign not in logger.filters:
        logger.addFilter(_known_benign)


def environment_defaults() -> None:
    for key, value in ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)


def prepare_environment(kv_cache_gib: int, log=print) -> None:
    """vLLM's environment, before an engine starts; another multiprocessing setting is replaced, saying so."""
    environment_defaults()
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(kv_cache_gib)
    key, value = IN_PROCESS
    if os.environ.get(key, value) != value:
        log(f"{key}={os.environ[key]!r} replaced by {value!r}: the rig runs vLLM's engine core in this process")
    os.environ[key] = value


@contextlib.contextmanager
def heartbeat(log, what: str, every: float = HEARTBEAT_S):
    """A line every `every` seconds while the block runs (a long start-up is visibly alive)."""
    start, done = time.perf_counter(), threading.Event()

    def beat():
        while not done.wait(every):
            log(f"{what}: still running ({time.perf_counter() - start:.0f} s)")

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def request_seeds(n: int, generator: torch.Generator | None) -> list[int]:
    return torch.randint(0, SEED_RANGE, (n,), generator=generator).tolist()


def _layer0_gemms(worker, inputs: dict[str, Tensor]) -> dict[str, Tensor]:
    """Runs inside vLLM's worker: its model's GEMM layers on `inputs` (gemm_match.engine_gemms)."""
    return engine_gemms(worker.model_runner.get_model(), inputs)


class VllmEngine:
    name = "vllm"

    def __init__(self, model_dir: str | Path, eos_id: int, pad_id: int, dtype: torch.dtype = torch.bfloat16,
                 seed: int = 0, kv_cache_gib: int = 1, compilation_config: dict | None = None, log=print):
        prepare_environment(kv_cache_gib, log)
        self.model_dir, self.dtype, self.eos_id, self.pad_id = Path(model_dir), dtype, eos_id, pad_id
        threads, set_threads = torch.get_num_threads(), torch.set_num_threads
        start = time.perf_counter()
        with heartbeat(log, "vLLM start-up"):
            import vllm  # vLLM: optional, and it reads the environment prepared above when it loads
            from vllm import LLM
            from vllm.compilation.counter import compilation_counter
            from vllm.platforms import current_platform
            from vllm.utils.gc_utils import freeze_gc_heap

            reuse_compiles()
            loaded_before = compilation_counter.num_aot_artifacts_loaded
            self.version, self.platform = vllm.__version__, current_platform.device_type
            _quiet_known_benign()
            log(f"vLLM {self.version} ({self.platform}): starting an in-process engine for {self.model_dir} "
                f"({str(dtype).removeprefix('torch.')}); it compiles the model with Inductor (15-60 s on a CPU, "
                f"less when Inductor's cache is warm), or loads the compile it saved for this configuration")
            kwargs = {"compilation_config": compilation_config} if compilation_config else {}
            if self.platform == "cpu":
                # vLLM 0.32's CPU path fails on seeded requests whose prefill is split into chunks ("CPU
                # Generator does not use offset"): every prompt is prefilled in one piece.
                kwargs["enable_chunked_prefill"] = False
            # What this process holds out of the way of vLLM's start-up collections (about 1 s of a start);
            # collectable again once the engine is up, so that an engine closed later is freed.
            freeze_gc_heap()
            try:
                self.llm = LLM(model=str(self.model_dir), dtype=str(dtype).removeprefix("torch."), seed=seed,
                               max_num_seqs=256, enforce_eager=False, logprobs_mode=LOGPROBS_MODE,
                               enable_prefix_caching=True, **kwargs)
            finally:
                gc.unfreeze()
                # vLLM's CPU worker replaces torch.set_num_threads with a no-op (guarding its own thread
                # binding); the trainer in this process keeps its threads.
                torch.set_num_threads = set_threads
                torch.set_num_threads(threads)
        self.startup_s = time.perf_counter() - start
        self.loaded_compile = compilation_counter.num_aot_artifacts_loaded > loaded_before
        config = self.llm.llm_engine.vllm_config
        self.max_model_len = config.model_config.max_model_len
        self.compilation = f"compilation mode {config.compilation_config.mode.name}" + (
            f", {compilation_config}" if compilation_config else "")
        self.compilation_config = compilation_config
        log(f"vLLM ready in {self.startup_s:.1f} s ({self.compilation}"
            f"{', its saved compile loaded' if self.loaded_compile else ''}, logprobs_mode {LOGPROBS_MODE}, "
            f"max_model_len {self.max_model_len})")

    def load_weights(self, state_dict: dict[str, Tensor]) -> None:
        """Receive the trainer's weights (HF names; cast to the engine's dtype, round to nearest)."""
        weights = [(name, tensor.detach().to(self.dtype)) for name, tensor in state_dict.items()]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM did not reset its prefix cache after a weight update: KV blocks of the "
                               "previous weights could be reused")

    def _params(self, n: int, max_new_tokens: int, temperature: float, generator, greedy: bool, **extra):
        from vllm import SamplingParams  # vLLM: optional, loaded where the engine starts

        common = dict(max_tokens=max_new_tokens, logprobs=0, stop_token_ids=[self.eos_id], detokenize=False, **extra)
        if greedy:
            return [SamplingParams(temperature=0.0, **common)] * n
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0 for sampling (greedy=True for greedy), got {temperature!r}")
        seeds = request_seeds(n, generator)
        return [SamplingParams(temperature=temperature, top_p=1.0, top_k=TOP_K_OFF, seed=s, **common) for s in seeds]

    def _check_length(self, prompts: list[list[int]], max_new_tokens: int) -> None:
        longest = max(map(len, prompts))
        if longest + max_new_tokens > self.max_model_len:
            raise ValueError(f"prompts of up to {longest} tokens + max_new_tokens {max_new_tokens} exceed vLLM's "
                             f"max_model_len {self.max_model_len}")

    def generate(self, prompts: list[list[int]], max_new_tokens: int, temperature: float = 1.0,
                 generator: torch.Generator | None = None, greedy: bool = False) -> Rollout:
        """Sample one response per prompt; the same layout as `Engine.generate` (left-padded prompts,
        responses padded after their eos, fp32 processed logprobs, 0 where masked)."""
        from vllm.inputs import TokensPrompt  # vLLM: optional, loaded where the engine starts

        self._check_length(prompts, max_new_tokens)
        params = self._params(len(prompts), max_new_tokens, temperature, generator, greedy)
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False)
        tokens, logprobs = [], []
        for prompt, output in zip(prompts, outputs):
            completion = output.outputs[0]
            ids = list(completion.token_ids)
            if not ids or completion.logprobs is None or len(completion.logprobs) != len(ids):
                raise RuntimeError(f"vLLM returned {len(ids)} tokens and "
                                   f"{None if completion.logprobs is None else len(completion.logprobs)} logprobs "
                                   f"for a prompt of {len(prompt)} tokens")
            tokens.append(ids)
            logprobs.append([step[token].logprob for token, step in zip(ids, completion.logprobs)])
        mask = pad([[True] * len(ids) for ids in tokens], False, torch.bool)
        return Rollout(*left_pad(prompts, self.pad_id), pad(tokens, self.pad_id, torch.long), mask,
                       pad(logprobs, 0.0, torch.float32))

    def prompt_logprobs(self, sequences: list[list[int]]) -> list[Tensor]:
        """vLLM's full forward (prefill) of each sequence: fp32 logprob of token j given tokens < j, for
        j = 1 .. len - 1 (prompt logprobs skip the sampling processors: raw, temperature 1)."""
        self._check_length(sequences, 1)
        return [torch.tensor(lp, dtype=torch.float32) for lp in sequence_logprobs(self, sequences)]

    def gemm_outputs(self, inputs: dict[str, Tensor]) -> dict[str, Tensor]:
        """The engine's own GEMM layers (decoder layer 0: qkv_proj, o_proj, gate_up_proj, down_proj; the LM
        head) applied to `inputs` (one tensor per layer name): what `localrl.gemm_match` compares with."""
        return self.llm.collective_rpc(_layer0_gemms, args=(inputs,))[0]

    def close(self) -> None:
        llm = self.__dict__.pop("llm", None)
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
            del llm
