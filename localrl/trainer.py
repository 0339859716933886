"""The training side: HF transformers with the alignment patches, under FSDP-style mixed precision, and
verl's objective (docs/running.md: "The embedded default"). An ablation's treatments (`rla.names.TREATMENTS`)
change only what they name; `fp16` adds dynamic loss scaling as verl's FSDP engine does."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor
from transformers import AutoModelForCausalLM

import patches
from localrl.amx_attention import use_amx_rounding_attention
from localrl.device import device
from localrl.gemm_match import CANDIDATES
from localrl.kernels import use_local_kernels
from localrl.models import compute_copy
from patches.compile import compile_layers
from patches.targets import Target
from rla import names


@dataclass
class Batch:
    """One RL batch, response-aligned tensors (B, R)."""

    prompt_ids: Tensor
    prompt_mask: Tensor
    responses: Tensor
    response_mask: Tensor
    rollout_log_probs: Tensor | None = None
    old_log_probs: Tensor | None = None
    ref_log_probs: Tensor | None = None
    advantages: Tensor | None = None
    loss_mask: Tensor | None = None  # response_mask less rollout correction's rejections (None: none)
    rollout_is_weights: Tensor | None = None  # rollout correction's importance weights (None: none)

    def rows(self, index: Tensor) -> "Batch":
        return Batch(**{k: (None if v is None else v[index]) for k, v in vars(self).items()})

    def to(self, device: torch.device) -> "Batch":
        return Batch(**{k: (None if v is None else v.to(device)) for k, v in vars(self).items()})

    def kept_mask(self) -> Tensor:  # the tokens the loss and the advantages count
        return self.response_mask if self.loss_mask is None else self.loss_mask


def sequence_inputs(batch: Batch) -> tuple[Tensor, Tensor, Tensor]:
    """Prompt + response ids, attention mask and positions (0 at each prompt's first real token)."""
    ids = torch.cat([batch.prompt_ids, batch.responses], 1)
    mask = torch.cat([batch.prompt_mask, batch.response_mask], 1).long()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, positions


def compute_dtype(ablation: names.Ablation) -> torch.dtype:
    return torch.float16 if ablation.precision == "fp16" else torch.bfloat16


def rollout_correction_config(preset: str | None):
    """verl's RolloutCorrectionConfig of a preset (an ablation's `rollout_correction`; None: none)."""
    if preset is None:
        return None
    from verl.trainer.config.algorithm import RolloutCorrectionConfig  # verl: the GPU image has none

    return getattr(RolloutCorrectionConfig, preset)()


def correct_rollout(batch: Batch, config) -> dict[str, float]:
    """verl's rollout correction in decoupled mode, once the old log-probs are known: weights and rejections
    into `batch.rollout_is_weights` and `batch.loss_mask`; returns verl's `rollout_corr/*` metrics."""
    from verl import DataProto  # verl: the GPU image has none (this module must import without it)
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch

    data = DataProto.from_dict(tensors={"old_log_probs": batch.old_log_probs,
                                        "rollout_log_probs": batch.rollout_log_probs,
                                        "response_mask": batch.response_mask.float()})
    data, metrics = compute_rollout_correction_and_add_to_batch(data, config)
    batch.loss_mask = data.batch["response_mask"]
    batch.rollout_is_weights = data.batch["rollout_is_weights"] if "rollout_is_weights" in data.batch else None
    return metrics


def policy_loss_config(rl: dict):
    """The smallest config verl's policy loss accepts (it reads clip ratios and global batch info)."""
    from omegaconf import OmegaConf  # verl's config library: the GPU image has neither

    return OmegaConf.create({"clip_ratio": rl["clip_ratio_low"], "clip_ratio_low": rl["clip_ratio_low"],
                             "clip_ratio_high": rl["clip_ratio_high"], "clip_ratio_c": rl["clip_ratio_c"],
                             "global_batch_info": {}})


def policy_loss(batch: Batch, log_prob: Tensor, rl: dict) -> tuple[Tensor, dict]:
    """verl's vanilla PPO loss over the kept tokens, with the rollout correction's weights if any."""
    from verl.trainer.ppo.core_algos import get_policy_loss_fn  # verl: the GPU image has none

    return get_policy_loss_fn("vanilla")(batch.old_log_probs, log_prob, batch.advantages, batch.kept_mask().float(),
                                         rl["loss_agg_mode"], policy_loss_config(rl),
                                         rollout_is_weights=batch.rollout_is_weights)


class Trainer:
    """The policy under training. Patching is process-wide: `close()` (or leaving a `with Trainer(...)`
    block) gives the process back stock transformers."""

    def __init__(self, model_dir: str, rl: dict, ablation: names.Ablation | str, target: Target | str = "vllm",
                 gemm: str = "fp32"):
        """`ablation`: its entry or name; `target`: what the aligned regions round like (patches.apply);
        `gemm`: the one equal to the engine's (localrl.gemm_match.CANDIDATES)."""
        if gemm not in CANDIDATES:
            raise ValueError(f"unknown trainer GEMM {gemm!r}; allowed: {', '.join(CANDIDATES)}")
        self.rl, self.target, self.gemm, self.device = rl, target, gemm, device()
        entry = ablation if isinstance(ablation, names.Ablation) else names.ablation(ablation)
        # Patches replace transformers' classes process-wide: apply before the model is built.
        # `engine_order` (all+engine_order): the norm's variance summed in the compiled engine's order
        self.regions = patches.apply(entry.regions, target=self.target, reduction=entry.reduction)
        self.dtype, self.compiled = compute_dtype(entry), entry.compiled
        self.correction = rollout_correction_config(entry.rollout_correction)
        self.master = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(self.device)
        self.model = self._numerics(compute_copy(self.master, self.dtype))
        self.ref = None
        if rl["kl_coef"] > 0:  # the reference policy: the initial weights, same numerics
            self.ref = self._numerics(compute_copy(self.master, self.dtype)).requires_grad_(False)
        self.optimizer = torch.optim.AdamW(self.master.parameters(), lr=rl["lr"], betas=tuple(rl["betas"]),
                                           weight_decay=rl["weight_decay"])
        # FP16 gradients underflow without loss scaling; verl's FSDP engine: ShardedGradScaler(growth_interval=400).
        self.scaler = torch.amp.GradScaler(self.device.type, growth_interval=400) if entry.precision == "fp16" else None

    def close(self) -> None:
        patches.remove()

    def __enter__(self) -> "Trainer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _numerics(self, model):
        """The shared GEMM/attention kernels, and the decoder layers compiled under `compile`."""
        use_local_kernels(model, linear=self.gemm == "fp32", attention=self.rl["trainer_attention"] == "rounded_once")
        if self.rl["trainer_attention"] == "amx_rounding":
            use_amx_rounding_attention(model)
        if self.compiled:
            compile_layers(model)
        return model

    @torch.no_grad()
    def sync_compute_weights(self) -> None:
        for p, m in zip(self.model.parameters(), self.master.parameters()):
            p.copy_(m)  # fp32 -> bf16, round to nearest

    def weights_for_engine(self) -> dict[str, Tensor]:  # the bf16 (fp16) compute weights
        return {k: v.detach() for k, v in self.model.state_dict().items() if v.dtype == self.dtype}

    def logits(self, model, batch: Batch, fp32_temperature: bool = False) -> Tensor:
        """bf16 logits predicting each response token, divided by the temperature in bf16 (as verl), or
        (`fp32_temperature`) cast to fp32 first, as the engine divides."""
        ids, mask, positions = (t.to(self.device) for t in sequence_inputs(batch))
        R = batch.responses.shape[1]
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=R + 1).logits
        if fp32_temperature:
            return logits[:, :-1].float() / self.rl["temperature"]
        return logits[:, :-1].div(self.rl["temperature"])

    @staticmethod
    def token_log_probs(logits: Tensor, labels: Tensor) -> Tensor:
        # fp32 log-softmax of the bf16 logits: what verl's flash-attn cross-entropy computes on GPU.
        return torch.log_softmax(logits.float(), -1).gather(-1, labels[..., None]).squeeze(-1)

    @torch.no_grad()
    def compute_log_probs(self, batch: Batch, model=None) -> tuple[Tensor, Tensor]:
        """(log-probs, entropy) of the sampled responses under `model` (default: the policy)."""
        from verl.utils.torch_functional import entropy_from_logits  # verl: the GPU image has none

        logits = self.logits(model or self.model, batch)
        labels = batch.responses.to(self.device)
        return self.token_log_probs(logits, labels).cpu(), entropy_from_logits(logits.float()).cpu()

    @staticmethod
    def grpo_advantages(scores: Tensor, response_mask: Tensor, group_ids: np.ndarray) -> Tensor:
        from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage  # verl: the GPU image has none

        # Outcome reward on the last response token, as verl's reward manager places it.
        rewards = torch.zeros(response_mask.shape, dtype=torch.float32)
        last = response_mask.long().sum(1) - 1
        rewards[torch.arange(len(scores)), last.clamp(min=0)] = scores
        adv, _ = compute_grpo_outcome_advantage(rewards, response_mask.float(), group_ids)
        return adv

    def update(self, batch: Batch) -> dict[str, float]:
        """One PPO epoch over the batch, one optimizer step per `ppo_mini_batch_size` prompts (with their
        samples, as verl splits); returns verl-named metrics."""
        from verl.trainer.ppo.core_algos import agg_loss, kl_penalty  # verl: the GPU image has none
        from verl.utils.torch_functional import entropy_from_logits

        rl = self.rl
        batch = batch.to(self.device)
        n = batch.responses.shape[0]
        per_mb = rl["ppo_mini_batch_size"] * rl["samples_per_prompt"]
        sums: dict[str, list[float]] = {}
        for start in range(0, n, per_mb):
            mb = batch.rows(torch.arange(start, start + per_mb, device=self.device))
            mask = mb.kept_mask().float()
            logits = self.logits(self.model, mb)
            log_prob = self.token_log_probs(logits, mb.responses)
            pg_loss, pg_metrics = policy_loss(mb, log_prob, rl)
            loss = pg_loss
            metrics = {"actor/pg_loss": pg_loss.item(), **pg_metrics}
            if rl["entropy_coeff"]:
                ent = agg_loss(entropy_from_logits(logits.float()), mask, rl["loss_agg_mode"])
                loss = loss - rl["entropy_coeff"] * ent
            if self.ref is not None:
                kld = kl_penalty(log_prob, mb.ref_log_probs, rl["kl_loss_type"])
                kl_loss = agg_loss(kld, mask, rl["loss_agg_mode"])
                loss = loss + rl["kl_coef"] * kl_loss
                metrics["actor/kl_loss"] = kl_loss.item()
            self.model.zero_grad(set_to_none=True)
            (loss if self.scaler is None else self.scaler.scale(loss)).backward()
            # bf16 gradients -> fp32 master gradients (FSDP reduces in fp32).
            for p, m in zip(self.model.parameters(), self.master.parameters()):
                m.grad = None if p.grad is None else p.grad.float()
            if self.scaler is not None:
                self.scaler.unscale_(self.optimizer)  # clip the true gradient, as verl's engine
            grad_norm = torch.nn.utils.clip_grad_norm_(self.master.parameters(), rl["grad_clip"])
            metrics["actor/grad_norm"] = grad_norm.item()
            if self.scaler is not None:
                self.scaler.step(self.optimizer)  # skipped on inf/nan gradients (an overflow of the scaled loss)
                self.scaler.update()
                metrics["actor/loss_scale"] = self.scaler.get_scale()
            elif torch.isfinite(grad_norm):
                self.optimizer.step()  # verl skips the step on a non-finite grad norm
            self.optimizer.zero_grad(set_to_none=True)
            self.sync_compute_weights()
            for k, v in metrics.items():
                sums.setdefault(k, []).append(v)
        out = {k: float(np.mean(v)) for k, v in sums.items()}
        out["actor/lr"] = self.optimizer.param_groups[0]["lr"]
        return out

    def state_dict(self) -> dict:
        state = {"master": self.master.state_dict(), "optimizer": self.optimizer.state_dict()}
        if self.scaler is not None:
            state["scaler"] = self.scaler.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.master.load_state_dict(state["master"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scaler is not None:
            self.scaler.load_state_dict(state["scaler"])
        self.sync_compute_weights()
