"""One grid cell: the RL loop (rollout on the engine, update on the trainer), logged as verl logs.

Per step: sample prompts -> engine generates `samples_per_prompt` responses each (with processed
logprobs) -> verl's gsm8k scorer -> trainer recomputes old log-probs -> GRPO advantages -> one PPO
epoch -> bf16 weights to the engine -> one metrics line. Checkpoints every `checkpoint_every`
steps and on SIGTERM/SIGINT; a restarted cell resumes from its last checkpoint.
"""

from __future__ import annotations

import logging
import os
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch
import yaml

from localrl import checkpoint
from localrl.config import ConfigError
from localrl.metrics import MetricsFile, data_metrics, mismatch_metrics
from localrl.task import render_prompt, score

log = logging.getLogger("localrl")


def default_paths(cfg: dict, model: str) -> tuple[Path, Path]:
    """(data dir, warm-started model dir) as the workflow lays them out under results_dir."""
    root = Path(cfg.get("results_dir", "results"))
    return root / "data" / cfg.get("profile", "tiny"), root / "models" / model


def _setup_logging(path: Path, echo: bool) -> list[logging.Handler]:
    """train.log in the cell (appended across resumes); echoed to stderr when there is no bar."""
    handlers: list[logging.Handler] = [logging.FileHandler(path, mode="a")]
    if echo:
        handlers.append(logging.StreamHandler(sys.stderr))
    for h in handlers:
        h.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        log.addHandler(h)
    log.setLevel(logging.INFO)
    log.propagate = False
    return handlers


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


def _wandb_run(cell: dict, out_dir: Path):
    """wandb in offline mode (sync later) when `wandb.enabled`; WANDB_MODE in the environment wins."""
    settings = cell.get("wandb") or {}
    if not settings.get("enabled"):
        return None
    import wandb

    name = f"{cell['model']}/{cell['ablation']}/seed{cell['seed']}"
    return wandb.init(project=settings.get("project", "rounding-alignment"), name=name, config=cell,
                      dir=str(out_dir), mode=os.environ.get("WANDB_MODE", "offline"), resume="allow",
                      id=name.replace("/", "-"))


def _decode(tokenizer, responses: torch.Tensor, mask: torch.Tensor) -> list[str]:
    return [tokenizer.decode(r[m].tolist(), skip_special_tokens=True) for r, m in zip(responses, mask)]


def validate(engine, tokenizer, prompts: list[list[int]], truths: list[str], max_new_tokens: int) -> float:
    """Greedy score on the test prompts (verl's validation default: do_sample=False)."""
    out = engine.generate(prompts, max_new_tokens, greedy=True)
    texts = _decode(tokenizer, out.responses, out.response_mask)
    return float(np.mean([score(t, g) for t, g in zip(texts, truths)]))


def train_cell(cell: dict, out_dir: str | Path, model_dir: str | Path, data_dir: str | Path,
               stop_after: int | None = None, progress: bool = True) -> int:
    """Run (or resume) one cell; returns the last completed step. `stop_after` stops like a
    preemption after that many steps of this call (checkpoint, return)."""
    from transformers import AutoTokenizer

    from localrl.data import load_split
    from localrl.engine.engine import Engine
    from localrl.trainer import Batch, Trainer

    out_dir, model_dir = Path(out_dir), Path(model_dir)
    if not (model_dir / "config.json").exists():
        raise ConfigError(f"warm-started model {model_dir} not found: run `python -m localrl warmstart "
                          f"--model {cell['model']} --out {model_dir}` first")
    train, test = load_split(data_dir, "train"), load_split(data_dir, "test")

    rl, seed, steps = cell["rl"], cell["seed"], cell["steps"]
    out_dir.mkdir(parents=True, exist_ok=True)
    resolved = {**cell, "model_dir": str(model_dir), "data_dir": str(data_dir)}
    tmp = out_dir / "config.yaml.tmp"
    tmp.write_text(yaml.safe_dump(resolved, sort_keys=False))
    os.replace(tmp, out_dir / "config.yaml")
    handlers = _setup_logging(out_dir / "train.log", echo=not progress)
    try:
        return _loop(cell, rl, seed, steps, out_dir, model_dir, train, test, stop_after, progress,
                     AutoTokenizer, Engine, Trainer, Batch)
    finally:
        for h in handlers:
            log.removeHandler(h)
            h.close()


def _loop(cell, rl, seed, steps, out_dir, model_dir, train, test, stop_after, progress,
          AutoTokenizer, Engine, Trainer, Batch) -> int:
    from tqdm import tqdm
    from verl.trainer.ppo.core_algos import agg_loss

    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    gens = {"data": torch.Generator().manual_seed(seed), "sampling": torch.Generator().manual_seed(seed + 1)}

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = [tokenizer(render_prompt(list(p)))["input_ids"] for p in train["prompt"]]
    truths = [rm["ground_truth"] for rm in train["reward_model"]]
    val_frame = test.iloc[: rl["val_size"]]
    val_prompts = [tokenizer(render_prompt(list(p)))["input_ids"] for p in val_frame["prompt"]]
    val_truths = [rm["ground_truth"] for rm in val_frame["reward_model"]]

    trainer = Trainer(str(model_dir), rl, cell["ablation"])
    engine = Engine(trainer.master.config, tokenizer.eos_token_id, tokenizer.pad_token_id)
    sampler = PromptSampler(len(prompts), gens["data"])
    metrics_file = MetricsFile(out_dir / "metrics.jsonl")
    # A run stopped by a signal parks its metrics (below) so that a scheduler never takes the cell
    # for finished; the resumed run continues them.
    aside = out_dir / "metrics.interrupted.jsonl"
    if aside.exists() and not metrics_file.path.exists():
        os.replace(aside, metrics_file.path)
    ckpt_dir = out_dir / "checkpoints"

    state = checkpoint.load_latest(ckpt_dir)
    start = 0
    if state is not None:
        start = state["step"]
        trainer.load_state_dict(state["trainer"])
        sampler.load_state_dict(state["sampler"])
        checkpoint.set_rng_state(state["rng"], gens)
        kept = metrics_file.truncate_to(start)
        log.info(f"resumed from checkpoint step {start} ({kept} metric lines kept)")
    elif metrics_file.path.exists():
        metrics_file.truncate_to(0)  # a run that died before its first checkpoint starts over
    log.info(f"cell {cell['model']}/{cell['ablation']}/seed{seed}: steps {start + 1}..{steps}, "
             f"regions {sorted(trainer.regions) or 'none'}")
    engine.load_weights(trainer.weights_for_engine())

    def save(step):
        checkpoint.save(ckpt_dir, step, {"trainer": trainer.state_dict(), "sampler": sampler.state_dict(),
                                         "rng": checkpoint.rng_state(gens)})

    run = _wandb_run(cell, out_dir)
    n, G = rl["prompts_per_step"], rl["samples_per_prompt"]
    bar = tqdm(total=steps, initial=start, desc=f"{cell['model']}/{cell['ablation']}", disable=not progress,
               file=sys.stderr, dynamic_ncols=True)
    step = start
    with checkpoint.StopFlag() as stop:
        for step in range(start + 1, steps + 1):
            t_step = time.perf_counter()
            metrics = {}
            val_every = rl["val_every"]
            if val_every and (step == 1 or step % val_every == 0 or step == steps):
                metrics["val/score/mean"] = validate(engine, tokenizer, val_prompts, val_truths,
                                                     rl["max_new_tokens"])

            idx = sampler.take(n)
            batch_prompts = [prompts[i] for i in idx for _ in range(G)]  # each prompt's samples together
            group_ids = np.repeat(np.arange(n), G)
            t0 = time.perf_counter()
            out = engine.generate(batch_prompts, rl["max_new_tokens"], rl["temperature"], gens["sampling"])
            metrics["timing_s/gen"] = time.perf_counter() - t0

            texts = _decode(tokenizer, out.responses, out.response_mask)
            scores = torch.tensor([score(t, truths[i]) for t, i in zip(texts, np.repeat(idx, G))])
            batch = Batch(out.prompt_ids, out.prompt_mask, out.responses, out.response_mask,
                          rollout_log_probs=out.logprobs)

            t0 = time.perf_counter()
            batch.old_log_probs, entropy = trainer.compute_log_probs(batch)
            if trainer.ref is not None:
                batch.ref_log_probs, _ = trainer.compute_log_probs(batch, trainer.ref)
            metrics["timing_s/old_log_prob"] = time.perf_counter() - t0
            mask = batch.response_mask.float()
            metrics["actor/entropy"] = agg_loss(entropy, mask, rl["loss_agg_mode"]).item()
            batch.advantages = trainer.grpo_advantages(scores, batch.response_mask, group_ids)

            t0 = time.perf_counter()
            metrics.update(trainer.update(batch))
            engine.load_weights(trainer.weights_for_engine())
            metrics["timing_s/update"] = time.perf_counter() - t0

            metrics.update(mismatch_metrics(batch.old_log_probs, batch.rollout_log_probs,
                                            batch.response_mask, batch.responses))
            metrics.update(data_metrics(scores, batch.advantages, batch.response_mask, rl["max_new_tokens"]))
            metrics["timing_s/step"] = time.perf_counter() - t_step
            metrics_file.log(metrics, step)
            if run is not None:
                run.log(metrics, step=step)

            bar.update(1)
            bar.set_postfix(score=f"{metrics['critic/score/mean']:.2f}",
                            k3=f"{metrics['rollout_corr/k3_kl']:.1e}")
            log.info(f"step {step}: score {metrics['critic/score/mean']:.3f} "
                     f"k3_kl {metrics['rollout_corr/k3_kl']:.3e} grad_norm {metrics['actor/grad_norm']:.3f} "
                     f"({metrics['timing_s/step']:.2f}s)")

            preempted = stop_after is not None and step - start >= stop_after
            if step % rl["checkpoint_every"] == 0 or step == steps or stop.requested or preempted:
                save(step)
            if stop.requested:
                bar.close()
                msg = f"stopped by signal {stop.signum} after step {step}; checkpoint saved, rerun to resume"
                log.warning(msg)
                print(msg, file=sys.stderr)
                os.replace(metrics_file.path, aside)
                raise SystemExit(128 + stop.signum)
            if preempted:
                break
    bar.close()
    if run is not None:
        run.finish()
    log.info(f"done: step {step}/{steps}")
    return step
