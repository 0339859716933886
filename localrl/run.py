"""One grid cell: the RL loop (rollout on the engine, update on the trainer), logged as verl logs
(docs/running.md: "The embedded default"; checkpoints, signals and reruns: "One cell, reruns and progress").
"""

from __future__ import annotations

import copy
import logging
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import yaml
from transformers import AutoConfig, AutoTokenizer

from localrl import checkpoint, engines
from localrl.device import device
from localrl.metrics import MetricsLog, data_metrics, mismatch_metrics
from localrl.trainer import Batch, Trainer, compute_dtype, correct_rollout
from rla import cells, files, layout
from rla.cells import Cell
from rla.config import RL, ConfigError, engine_settings, identity_of, model_spec, rl_settings
from rla.metricslog import METRICS, RUNNING
from patches.targets import resolve as resolve_target
from rla.names import ablation
from tinyqwen.data import load_split
from tinyqwen.task import render_prompt, score

log = logging.getLogger("localrl")


def resolve(cell: Cell) -> dict:
    """The resolved config of one cell (its config.yaml), every value checked; `engine` resolved here."""
    spec = model_spec(cell.cfg, cell.model, "local")
    resolved = engines.resolve(engine_settings(cell.cfg), device().type,
                               compilation=ablation(cell.ablation).engine_compilation, ablation=cell.ablation)
    engines.check_shape(resolved, cell.model, spec)
    config = copy.deepcopy(cell.cfg)
    config.update({"model": cell.model, "ablation": cell.ablation, "seed": cell.seed, "steps": cell.steps,
                   "model_spec": spec, "rl": rl_settings(cell.cfg, "local", cell.model), "engine": resolved})
    return config


class PromptSampler:
    """Epoch-wise shuffled prompt order (like verl's RandomSampler), resumable."""

    def __init__(self, n: int, generator: torch.Generator):
        self.n, self.gen = n, generator
        self.perm, self.cursor = torch.randperm(n, generator=generator), 0

    def take(self, k: int) -> list[int]:
        out = []
        while len(out) < k:
            if self.cursor == self.n:
                self.perm, self.cursor = torch.randperm(self.n, generator=self.gen), 0
            take = min(k - len(out), self.n - self.cursor)
            out += self.perm[self.cursor:self.cursor + take].tolist()
            self.cursor += take
        return out

    def state_dict(self) -> dict:
        return {"perm": self.perm, "cursor": self.cursor}

    def load_state_dict(self, state: dict) -> None:
        self.perm, self.cursor = state["perm"], state["cursor"]


@dataclass
class Rig:
    """Everything one cell's RL loop holds. A context manager: leaving it removes the patches."""

    config: dict  # the cell's resolved config (resolve)
    trainer: object
    engine: object
    tokenizer: object
    prompts: list[list[int]]
    truths: list[str]
    val_prompts: list[list[int]]
    val_truths: list[str]
    sampler: PromptSampler
    gens: dict[str, torch.Generator]
    numerics: dict  # how the two sides compute: the engine's build, the trainer's target and GEMM
    owns_engine: bool = True

    def __enter__(self) -> "Rig":
        return self

    def __exit__(self, *exc) -> None:
        self.trainer.close()
        if self.owns_engine and hasattr(self.engine, "close"):
            self.engine.close()

    def state_dict(self) -> dict:
        return {"trainer": self.trainer.state_dict(), "sampler": self.sampler.state_dict(),
                "rng": checkpoint.rng_state(self.gens), "numerics": self.numerics}

    def load_state_dict(self, state: dict) -> None:
        saved = state.get("numerics")
        if saved is not None and saved != self.numerics:
            changed = "; ".join(cells.differences(saved, self.numerics))
            log.warning(f"resuming with other numerics than the checkpoint's: {changed}")
        self.trainer.load_state_dict(state["trainer"])
        self.sampler.load_state_dict(state["sampler"])
        checkpoint.set_rng_state(state["rng"], self.gens)
        self.engine.load_weights(self.trainer.weights_for_engine())


def _check_engine(engine, config: dict, model_dir: Path, dtype: torch.dtype) -> None:
    """A given (shared) engine must be the one the cell would start."""
    name = getattr(engine, "name", "local")
    if name != config["engine"]["name"] or getattr(engine, "dtype", dtype) != dtype or (
            name == "vllm" and (Path(engine.model_dir).resolve() != model_dir.resolve()
                                or engine.compilation_config != config["engine"].get("compilation_config"))):
        raise ValueError(f"the given engine ({name}, {getattr(engine, 'dtype', '?')}, "
                         f"{getattr(engine, 'model_dir', '-')}) is not the cell's ({config['engine']['name']}, "
                         f"{dtype}, {model_dir})")


def build_rig(cell: Cell, model_dir: str | Path, engine=None, config: dict | None = None) -> Rig:
    """Engine, patched trainer, tokenized prompts and seeded generators of a cell; `model_dir`: the
    warm-started model; `engine`: a started engine of the cell's kind to use (and leave running);
    `config`: the cell's resolved config, if resolved already."""
    config = config or resolve(cell)
    seed, rl, model_dir = cell.seed, config["rl"], Path(model_dir)
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    gens = {"data": torch.Generator().manual_seed(seed), "sampling": torch.Generator().manual_seed(seed + 1)}
    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    def encode(frame):
        return ([tokenizer(render_prompt(list(p)))["input_ids"] for p in frame["prompt"]],
                [rm["ground_truth"] for rm in frame["reward_model"]])

    prompts, truths = encode(load_split(cell.data, "train"))
    val_prompts, val_truths = encode(load_split(cell.data, "test").iloc[: rl["test_size"]])
    entry, target = ablation(cell.ablation), resolve_target(config["engine"]["target"])  # looked up once, passed on
    dtype, hf_config, owns = compute_dtype(entry), AutoConfig.from_pretrained(model_dir), engine is None
    log.info(engines.describe(config["engine"]))
    if owns:
        engine = engines.start(config["engine"], model_dir, tokenizer, hf_config, dtype, seed, log=log.info)
    else:
        _check_engine(engine, config, model_dir, dtype)
    try:
        gemm = engines.trainer_gemm(engine, model_dir, hf_config, dtype, device(), log=log.info)
        trainer = Trainer(str(model_dir), rl, entry, target=target, gemm=gemm)
        engine.load_weights(trainer.weights_for_engine())
    except BaseException:
        if owns and hasattr(engine, "close"):
            engine.close()
        raise
    numerics = {**engines.identity(config["engine"]), "trainer_gemm": gemm}
    return Rig(config, trainer, engine, tokenizer, prompts, truths, val_prompts, val_truths,
               PromptSampler(len(prompts), gens["data"]), gens, numerics, owns)


def decode_responses(tokenizer, responses: torch.Tensor, mask: torch.Tensor) -> list[str]:
    return [tokenizer.decode(r[m].tolist(), skip_special_tokens=True) for r, m in zip(responses, mask)]


def validate(rig: Rig) -> float:
    """Greedy score on the test prompts (verl's validation default: do_sample=False)."""
    out = rig.engine.generate(rig.val_prompts, rig.config["rl"]["max_response_length"], greedy=True)
    texts = decode_responses(rig.tokenizer, out.responses, out.response_mask)
    return float(np.mean([score(t, g) for t, g in zip(texts, rig.val_truths)]))


def rl_step(rig: Rig, step: int) -> dict[str, float]:
    """One RL step; returns its metrics under verl's names."""
    from verl.trainer.ppo.core_algos import agg_loss  # verl: heavy and optional, loaded only when a step runs

    rl, trainer = rig.config["rl"], rig.trainer
    t_step, metrics = time.perf_counter(), {}
    every = rl["test_every"]
    if every > 0 and (step == 1 or step % every == 0 or step == rig.config["steps"]):
        metrics["val/score/mean"] = validate(rig)

    n, group = rl["prompts_per_step"], rl["samples_per_prompt"]
    idx = rig.sampler.take(n)
    t0 = time.perf_counter()
    out = rig.engine.generate([rig.prompts[i] for i in idx for _ in range(group)],  # a prompt's samples together
                              rl["max_response_length"], rl["temperature"], rig.gens["sampling"])
    metrics["timing_s/gen"] = time.perf_counter() - t0
    texts = decode_responses(rig.tokenizer, out.responses, out.response_mask)
    scores = torch.tensor([score(t, rig.truths[i]) for t, i in zip(texts, np.repeat(idx, group))])
    batch = Batch(out.prompt_ids, out.prompt_mask, out.responses, out.response_mask, rollout_log_probs=out.logprobs)

    t0 = time.perf_counter()
    batch.old_log_probs, entropy = trainer.compute_log_probs(batch)
    if trainer.ref is not None:
        batch.ref_log_probs, _ = trainer.compute_log_probs(batch, trainer.ref)
    metrics["timing_s/old_log_prob"] = time.perf_counter() - t0
    metrics["actor/entropy"] = agg_loss(entropy, batch.response_mask.float(), rl["loss_agg_mode"]).item()
    if trainer.correction is not None:  # tis, mis: verl's rollout correction, before the advantages (as verl)
        metrics.update(correct_rollout(batch, trainer.correction))
    batch.advantages = trainer.grpo_advantages(scores, batch.kept_mask(), np.repeat(np.arange(n), group))

    t0 = time.perf_counter()
    metrics.update(trainer.update(batch))
    rig.engine.load_weights(trainer.weights_for_engine())
    metrics["timing_s/update"] = time.perf_counter() - t0

    metrics.update(mismatch_metrics(batch.old_log_probs, batch.rollout_log_probs, batch.response_mask,
                                    batch.responses))
    metrics.update(data_metrics(scores, batch.advantages, batch.response_mask, rl["max_response_length"]))
    metrics["timing_s/step"] = time.perf_counter() - t_step
    return metrics


def cell_identity(config: dict, model_dir: Path, data_dir: Path) -> dict:
    """What the cell's results depend on (besides `steps`), from its resolved config: see `rla.cells`."""
    return cells.canonical({
        "backend": "local", "model": config["model"], "model_spec": config["model_spec"],
        "ablation": config["ablation"], "seed": config["seed"], "engine": engines.identity(config["engine"]),
        "rl": identity_of(config["rl"], RL),
        "data": cells.fingerprint(data_dir / "train.parquet", data_dir / "test.parquet"),
        "initial_model": cells.fingerprint(model_dir / "model.safetensors"),
    })


def _previous(out_dir: Path) -> tuple[dict | None, int | None, dict | None, bool]:
    """(identity, steps, last checkpoint, anything there?) of the cell folder."""
    state = checkpoint.load_latest(out_dir / "checkpoints")
    if state is not None:
        return state.get("identity"), state.get("steps"), state, True
    config = out_dir / "config.yaml"
    recorded = (yaml.safe_load(config.read_text()) or {}) if config.exists() else {}
    has_results = config.exists() or (out_dir / "metrics.jsonl").exists()
    return recorded.get("identity"), recorded.get("steps"), None, has_results


def _setup_logging(path: Path) -> list[logging.Handler]:
    handlers: list[logging.Handler] = [logging.FileHandler(path, mode="a"), logging.StreamHandler(sys.stderr)]
    for h in handlers:
        h.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        log.addHandler(h)
    log.setLevel(logging.INFO)
    log.propagate = False
    return handlers


def _wandb_run(config: dict, out_dir: Path):
    """wandb in offline mode (sync later) when `wandb.enabled`; WANDB_MODE in the environment wins."""
    settings = config.get("wandb") or {}
    if not settings.get("enabled"):
        return None
    import wandb  # optional: only a run with wandb.enabled needs it installed

    name = f"{config['model']}/{config['ablation']}/seed{config['seed']}"
    return wandb.init(project=settings.get("project", "rounding-alignment"), name=name, config=config,
                      dir=str(out_dir), mode=os.environ.get("WANDB_MODE", "offline"), resume="allow",
                      id=name.replace("/", "-"))


def _duration(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 100 else f"{seconds:.0f} s"


def train_cell(cell: Cell, model_dir: str | Path | None = None, stop_after: int | None = None,
               engine=None) -> int:
    """Run (or resume) one cell in `cell.out`; returns the last completed step. `model_dir`: default the
    profile's (`rla.layout`); `stop_after`: stop like a preemption after that many steps of this call;
    `engine`: as `build_rig`'s."""
    out_dir = cell.out
    model_dir = Path(model_dir if model_dir is not None else layout.model_dir(cell.cfg, cell.model))
    if not (model_dir / "model.safetensors").exists():
        raise ConfigError(f"warm-started model {model_dir} not found: run `python -m localrl warmstart "
                          f"--model {cell.model} --out {model_dir}` first")
    config = resolve(cell)
    steps, identity = cell.steps, cell_identity(config, model_dir, cell.data)
    old_identity, old_steps, state, has_results = _previous(out_dir)
    plan = cells.plan(old_identity, old_steps, state["step"] if state else 0, has_results, identity, steps)
    if plan.action == "replace" and state and state["step"] == old_steps and not any(
            (out_dir / name).exists() for name in (METRICS, RUNNING)):
        # `snakemake --force` deletes a finished cell's metrics.jsonl before the job runs: the folder kept
        # aside gets it back from its last checkpoint, which holds the lines byte for byte
        files.write_bytes(out_dir / METRICS, b"".join(state["metrics"]))
    moved = cells.move_aside(out_dir) if plan.action == "replace" else None
    out_dir.mkdir(parents=True, exist_ok=True)
    files.write_text(out_dir / "config.yaml", yaml.safe_dump(
        {**config, "model_dir": str(model_dir), "data_dir": str(cell.data), "identity": identity}, sort_keys=False))
    handlers = _setup_logging(out_dir / "train.log")
    try:
        log.info(f"cell {cell.model}/{cell.ablation}/seed{cell.seed}: {plan.message}"
                 + (f"; the previous folder is now {moved}" if moved else ""))
        with build_rig(cell, model_dir, engine, config) as rig:
            return _loop(rig, out_dir, state if plan.restores else None, identity, stop_after)
    finally:
        for h in handlers:
            log.removeHandler(h)
            h.close()


def _loop(rig: Rig, out_dir: Path, state: dict | None, identity: dict, stop_after: int | None) -> int:
    steps, every = rig.config["steps"], rig.config["rl"]["checkpoint_every"]
    start = state["step"] if state else 0
    if state:
        rig.load_state_dict(state)
    metrics_log = MetricsLog(out_dir, state["metrics"] if state else [])
    log.info(f"steps {start + 1}..{steps}, regions {sorted(rig.trainer.regions) or 'none'}; "
             f"progress in {out_dir / 'train.log'}")
    if start < steps and rig.config["engine"]["name"] == "local":
        log.info(f"step {start + 1} first compiles the engine's kernels (Inductor, a one-off 10-60 s on a CPU)")
    run, began, step = _wandb_run(rig.config, out_dir), time.perf_counter(), start

    def save(at: int) -> None:
        checkpoint.save(out_dir / "checkpoints", at, {"identity": identity, "steps": steps,
                                                      "metrics": metrics_log.lines, **rig.state_dict()})

    with checkpoint.StopFlag(lambda: f"finishing step {step}, then saving a checkpoint") as stop:
        for step in range(start + 1, steps + 1):
            metrics = rl_step(rig, step)
            metrics_log.log(metrics, step)
            if run is not None:
                run.log(metrics, step=step)
            elapsed = time.perf_counter() - began
            log.info(f"step {step}/{steps} score {metrics['critic/score/mean']:.3f} "
                     f"k3 {metrics['rollout_corr/k3_kl']:.2e} grad_norm {metrics['actor/grad_norm']:.3f} | "
                     f"{_duration(elapsed)} elapsed, ETA {_duration(elapsed / (step - start) * (steps - step))}")
            preempted = stop_after is not None and step - start >= stop_after
            if step % every == 0 or step == steps or stop.requested or preempted:
                save(step)
            if stop.requested:
                log.warning(f"stopped by signal {stop.signum} after step {step}; checkpoint saved, rerun to resume")
                raise SystemExit(128 + stop.signum)
            if preempted:
                break
    if run is not None:
        run.finish()
    if step == steps:
        log.info(f"done: step {step}/{steps}; wrote {metrics_log.finish()}")
    return step
