"""The gradient probe: how far the mismatch moves the policy gradient, against the batch's own noise.

Per setting, the policy gradient the RL trainer would take from engine-sampled batches (verl's PPO loss,
GRPO advantages, the setting's rollout correction), against a reference whose forward equals the local
engine's: all+engine_order with the logits divided by the temperature in FP32, as the engine does (the
trainer divides in BF16, as verl's actor). Per setting s and batch b, with ḡ the reference's batch mean:
`e` = sqrt(mean_b |g_s,b - g_ref,b|^2) / |ḡ|, `noise` = one batch's sampling noise on that scale, `mnr`
= e / noise; `is_size`: verl's sequence-level IS (`decoupled_seq_is`) against the uncorrected gradient,
to compare with sqrt(2 k3 L) (`sqrt_2k3L`). The rest: `summarize`, `token_stats`; the points:
studies/gradprobe/plan.py; what it found: studies/gradprobe/page.md.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from localrl import Batch, Rollout, Trainer, correct_rollout, mismatch_metrics, policy_loss, rollout_correction_config
from rla import layout
from rla.config import ConfigError, load, model_spec, rl_settings
from rla.files import write_csv, write_text
from rla.names import ABLATIONS, REGIONS
from studies._shared.batches import Sample, sample_batches
from studies._shared.scored import Layout
from studies._shared.settings import Setting, run_settings
from studies._shared.sides import Sides, engine_forward

EXACT = "exact"  # the reference: all+engine_order with the engine's FP32 temperature division
REFERENCE_ABLATION = "all+engine_order"
# The settings a user can pick (rla.names ablations on the BF16 engine): regions, then treatments.
SETTINGS = tuple(name for name, entry in ABLATIONS.items() if entry.precision == "bf16")
IS_PRESET = "decoupled_seq_is"  # verl's sequence-level IS: the off-policy correction's size
DEFAULT_BATCHES = 12


class NoSignal(ConfigError):
    """Every batch's groups scored alike: GRPO's advantages, and every gradient, are zero."""


def _flat(grads) -> Tensor:
    return torch.cat([g.float().flatten() for g in grads]).cpu()


@dataclass
class BatchGradient:
    grad: Tensor                 # the policy gradient (fp32 copy of the BF16 gradients), flattened
    grad_is: Tensor | None       # the same with verl's sequence-level IS weights
    log_prob: Tensor             # (B, R) the setting's log-probs of the responses
    correction: dict = field(default_factory=dict)  # verl's rollout_corr/* metrics of the setting's correction


def batch_gradient(trainer: Trainer, model, sample: Sample, setting: Setting, with_is: bool) -> BatchGradient:
    """The RL trainer's policy gradient of one batch under `setting` (its numerics: the caller's, run_settings);
    the old log-probs equal the new ones, as verl recomputes them with the same model."""
    params = [p for p in model.parameters() if p.requires_grad]
    batch = sample.batch.to(trainer.device)
    log_prob = trainer.token_log_probs(trainer.logits(model, batch, fp32_temperature=setting.name == EXACT),
                                       batch.responses)
    batch = replace(batch, old_log_probs=log_prob.detach())

    def loss_of(correction: str | None) -> tuple[Tensor, dict]:
        b = replace(batch)
        metrics = correct_rollout(b, rollout_correction_config(correction)) if correction else {}
        b.advantages = Trainer.grpo_advantages(sample.scores, b.kept_mask().cpu(), sample.groups).to(trainer.device)
        return policy_loss(b, log_prob, trainer.rl)[0], metrics

    loss, metrics = loss_of(setting.correction)
    grad = _flat(torch.autograd.grad(loss, params, retain_graph=with_is, allow_unused=False))
    grad_is = _flat(torch.autograd.grad(loss_of(IS_PRESET)[0], params)) if with_is else None
    return BatchGradient(grad, grad_is, log_prob.detach().cpu(), {k: float(v) for k, v in metrics.items()})


def _sq(t: Tensor) -> float:
    return float(t.double().pow(2).sum())


def token_stats(log_prob: Tensor, ref: Tensor, batch: Batch) -> dict:
    """Per-token mismatch of a setting's log-probs: to the reference, and to the engine's sampling
    log-probs under verl's names (localrl.mismatch_metrics), the largest |log-ratio| and the sequence log-ratio."""
    mask = batch.response_mask.bool()
    d_ref = (log_prob - ref)[mask].double()
    d_roll = torch.where(mask, log_prob.double() - batch.rollout_log_probs.double(), 0.0)
    verl = mismatch_metrics(torch.where(mask, log_prob, 0.0).double(), batch.rollout_log_probs.double(), mask,
                            batch.responses)
    seq = d_roll.sum(1)
    return {"mean_abs_d_ref": d_ref.abs().mean().item(), "max_abs_d_ref": d_ref.abs().max().item(),
            "frac_identical_ref": (d_ref == 0).double().mean().item(),
            "k3": verl["rollout_corr/k3_kl"], "chi2_seq": verl["rollout_corr/chi2_seq"],
            "probs_diff_mean": verl["training/rollout_probs_diff_mean"],
            "mean_abs_d_rollout": d_roll[mask].abs().mean().item(),
            "max_abs_log_ratio": d_roll[mask].abs().max().item(),
            "seq_logratio_var": seq.var().item(), "response_len": mask.sum(1).double().mean().item(),
            "n_tokens": int(mask.sum())}


def summarize(name: str, grads: list[BatchGradient], ref: list[BatchGradient], tokens: list[dict]) -> dict:
    """One row of the table for one setting (e, noise, mnr, is_size: the module docstring)."""
    B = len(ref)
    ref_mean = torch.stack([r.grad for r in ref]).double().mean(0)
    mean_norm = float(ref_mean.norm())
    if mean_norm == 0:  # every group scored alike in every batch: GRPO's advantages, and the gradient, are 0
        raise NoSignal(f"the reference gradient is 0 in all {B} batches (no group with differing scores): "
                       "this model and task give no learning signal to compare")
    noise_abs = math.sqrt(sum(_sq(r.grad.double() - ref_mean) for r in ref) / max(B - 1, 1))
    diffs = [g.grad.double() - r.grad.double() for g, r in zip(grads, ref)]
    err_abs = math.sqrt(sum(_sq(d) for d in diffs) / B)
    rms_ref = math.sqrt(sum(_sq(r.grad) for r in ref) / B)
    mean_diff = torch.stack(diffs).mean(0)
    cos = [float(d @ ref_mean / (d.norm() * mean_norm)) if d.norm() > 0 and mean_norm > 0 else 0.0 for d in diffs]
    row = {"setting": name, "batches": B, "mean_grad_norm": mean_norm, "noise_abs": noise_abs,
           "mean_resolved": mean_norm ** 2 / (noise_abs ** 2 / B) if noise_abs > 0 else float("inf"),
           "e": err_abs / mean_norm, "noise": noise_abs / mean_norm, "mnr": err_abs / noise_abs if noise_abs else 0.0,
           "e_rms": err_abs / rms_ref, "e_systematic": float(mean_diff.norm()) / mean_norm,
           "e_systematic_floor": err_abs / math.sqrt(B) / mean_norm, "cos_error_mean_grad": float(np.mean(cos))}
    if all(g.grad_is is not None for g in grads):
        is_diffs = [g.grad_is.double() - g.grad.double() for g in grads]
        rms_g = math.sqrt(sum(_sq(g.grad) for g in grads) / B)
        row["is_size"] = math.sqrt(sum(_sq(d) for d in is_diffs) / B) / rms_g
        row["is_bias"] = float(torch.stack(is_diffs).mean(0).norm()) / mean_norm
    frame = pd.DataFrame(tokens)
    row.update(frame.mean(numeric_only=True).to_dict())
    row["max_abs_log_ratio"] = float(frame["max_abs_log_ratio"].max())
    row["n_tokens"] = int(frame["n_tokens"].sum())
    row["sqrt_2k3L"] = math.sqrt(2 * row["k3"] * row["response_len"]) if row["k3"] > 0 else 0.0
    corrections = pd.DataFrame([g.correction for g in grads])
    for key, column in (("rollout_corr/rollout_rs_seq_masked_fraction", "rejected_seq_frac"),
                        ("rollout_corr/rollout_is_mean", "is_weight_mean")):
        if key in corrections:
            row[column] = float(corrections[key].mean())
    return row


@dataclass
class PointResult:
    rows: pd.DataFrame      # one row per setting
    batches: pd.DataFrame   # one row per setting and batch: norms, error, rejection
    meta: dict


def measure(trainer: Trainer, engine, samples: list[Sample], settings: list[str], log=print) -> PointResult:
    """The reference's gradients first, then every setting's against them (run_settings)."""
    sides = Sides(trainer.model, engine)
    ref_setting = replace(Setting.of_ablation(REFERENCE_ABLATION), name=EXACT)
    with_is = {"none", *REGIONS, "all", REFERENCE_ABLATION, EXACT}
    chosen = [ref_setting] + [Setting.of_ablation(s) for s in settings]
    engine_check, results = {}, {}

    def step(setting: Setting, model, engine_model) -> None:
        grads = results[setting.name] = [batch_gradient(trainer, model, s, setting, setting.name in with_is)
                                         for s in samples]
        if setting.name == EXACT:  # how exact the reference is: the engine's full forward and its sampling
            engine_check.update(_reference_check(engine_model, samples, grads, trainer.rl["temperature"]))

    run_settings(chosen, sides, step, log)
    ref = results[EXACT]
    refs = [g.log_prob for g in ref]
    rows, batch_rows = [], []
    for setting in chosen:
        grads = results[setting.name]
        tokens = [token_stats(g.log_prob, r, s.batch) for g, r, s in zip(grads, refs, samples)]
        rows.append({**summarize(setting.name, grads, ref, tokens), "regions": ",".join(setting.regions) or "none",
                     "reduction": setting.reduction, "correction": setting.correction or "",
                     "compiled": setting.compiled})
        for b, (g, r) in enumerate(zip(grads, ref)):
            batch_rows.append({"setting": setting.name, "batch": b, "grad_norm": float(g.grad.norm()),
                               "error_norm": float((g.grad.double() - r.grad.double()).norm()),
                               "score_mean": float(samples[b].scores.mean()), **tokens[b], **g.correction})
    return PointResult(pd.DataFrame(rows), pd.DataFrame(batch_rows), {"reference": engine_check})


@torch.no_grad()
def _reference_check(engine_model, samples: list[Sample], ref: list[BatchGradient], temperature: float) -> dict:
    """Fractions of response tokens whose reference log-prob equals the engine's full forward and its
    sampling log-probs (both at the temperature, FP32 log-softmax of the engine's BF16 logits)."""
    equal_forward = equal_sampling = total = 0
    for sample, grad in zip(samples, ref):
        batch = sample.batch
        scored = Layout.from_rollout(Rollout(batch.prompt_ids, batch.prompt_mask, batch.responses,
                                                   batch.response_mask, batch.rollout_log_probs))
        logits = engine_forward(engine_model, scored.ids, scored.mask, scored.positions).logits
        lp = torch.log_softmax(logits.float() / temperature, -1)[:, :-1]
        lp = lp.gather(-1, scored.ids[:, 1:, None].to(lp.device)).squeeze(-1).cpu()[:, scored.response_cols]
        mask = batch.response_mask.bool()
        equal_forward += int((lp == grad.log_prob)[mask].sum())
        equal_sampling += int((batch.rollout_log_probs == grad.log_prob)[mask].sum())
        total += int(mask.sum())
    return {"frac_equal_engine_forward": equal_forward / total, "frac_equal_engine_sampling": equal_sampling / total,
            "response_tokens": total}


def run_point(point: dict, checkpoint: str | None = None, log=print) -> PointResult:
    """One point of a plan (plan.py: its keys, every one given) on its config's model or an RL checkpoint of it."""
    config, model, settings = point["config"], point["model"], list(point["settings"])
    temperature, batches, seed = float(point["temperature"]), int(point["batches"]), int(point["seed"])
    cfg = load(config)
    model_spec(cfg, model, "local")
    rl = {**rl_settings(cfg, "local", model), "temperature": temperature}
    data_dir, model_dir = layout.data_dir(cfg), layout.model_dir(cfg, model)
    if not (model_dir / "model.safetensors").exists():
        raise ConfigError(f"model {model_dir} not found: run `python -m localrl warmstart --config {config} "
                          f"--model {model} --out {model_dir}` first")
    max_new = point.get("max_new_tokens") or rl["max_response_length"]
    started = time.perf_counter()
    with Trainer(str(model_dir), rl, REFERENCE_ABLATION, target="vllm", gemm="fp32") as trainer:
        step = 0
        if checkpoint:
            state = torch.load(checkpoint, weights_only=False)
            trainer.master.load_state_dict(state["trainer"]["master"])
            trainer.sync_compute_weights()
            step = int(state["step"])
        log(f"gradprobe {model} (step {step}, T {temperature}): sampling {batches} batches of "
            f"{rl['prompts_per_step']} x {rl['samples_per_prompt']} (the engine compiles on first use)")
        engine, samples = sample_batches(trainer, model_dir, data_dir, batches, rl, temperature, max_new, seed)
        result = measure(trainer, engine, samples, settings, log)
    lengths = torch.cat([s.batch.response_mask.sum(1) for s in samples]).double()
    result.meta.update({"config": config, "model": model, "checkpoint": checkpoint, "rl_step": step,
                        "temperature": temperature, "batches": batches, "max_new_tokens": max_new,
                        "seed": seed, "prompts_per_batch": rl["prompts_per_step"],
                        "samples_per_prompt": rl["samples_per_prompt"],
                        "hidden": trainer.master.config.hidden_size, "layers": trainer.master.config.num_hidden_layers,
                        "arch": trainer.master.config.model_type,
                        "parameters": sum(p.numel() for p in trainer.master.parameters()),
                        "response_len_mean": lengths.mean().item(), "response_len_max": int(lengths.max()),
                        "score_mean": float(torch.cat([s.scores for s in samples]).mean()),
                        "seconds": round(time.perf_counter() - started, 1)})
    for key in ("rl_step", "temperature", "hidden", "arch", "response_len_mean"):
        result.rows[key] = result.meta[key]
    return result


def write(result: PointResult, out: str | Path) -> list[Path]:
    paths = [Path(out) / name for name in ("gradprobe.csv", "batches.csv", "gradprobe.json")]
    write_csv(result.rows, paths[0])
    write_csv(result.batches, paths[1])
    write_text(paths[2], json.dumps(result.meta, indent=1, default=str) + "\n")
    return paths
