"""The mismatch of one side's logprobs against the other's: verl's metrics, the per-token frame and its bins
(by the engine's probability and position: the diagnosis's, diagnose/metrics.py)."""

from __future__ import annotations

import pandas as pd
import torch
from torch import Tensor

from diagnose import metrics
from localrl import mismatch_metrics
from studies._shared.scored import Layout

VERL_METRICS = {"k3_kl": "rollout_corr/k3_kl", "kl": "rollout_corr/kl",
                "log_ppl_abs_diff": "rollout_corr/log_ppl_abs_diff",
                "probs_diff_mean": "training/rollout_probs_diff_mean",
                "probs_diff_max": "training/rollout_probs_diff_max",
                "probs_pearson": "training/rollout_actor_probs_pearson_corr"}


def mismatch_summary(train_lp: Tensor, ref_lp: Tensor, layout: Layout) -> dict[str, float]:
    """verl's mismatch metrics over the response tokens, plus |d logprob| and the bit-identical fraction."""
    sel, cols = layout.response, layout.response_cols
    # verl's masked means multiply by the mask: masked entries must be finite, so zero them; verl
    # holds response-aligned (B, R) tensors.
    # float64 copies (exact): in fp32, exp(d) - 1 - d cancels to 0 for |d| below ~1e-4.
    train_r, ref_r = (torch.where(sel, lp, 0.0)[:, cols].double() for lp in (train_lp, ref_lp))
    verl = mismatch_metrics(train_r, ref_r, sel[:, cols], layout.responses)
    d = (train_lp - ref_lp)[sel].double()
    return {"n_tokens": int(sel.sum()), "mean_abs_dlogprob": d.abs().mean().item(),
            "max_abs_dlogprob": d.abs().max().item(), **{name: verl[key] for name, key in VERL_METRICS.items()},
            "frac_identical": (d == 0).double().mean().item()}


def binned(frame: pd.DataFrame, key: str) -> pd.DataFrame:
    g = frame.groupby(key, observed=True, sort=True)
    out = g.agg(n_tokens=("abs_d", "size"), mean_abs_dlogprob=("abs_d", "mean"),
                mean_dlogprob=("d", "mean"),  # signed: a biased error does not average out
                max_abs_dlogprob=("abs_d", "max"), mean_abs_dprob=("abs_dp", "mean"),
                frac_identical=("identical", "mean"), sum_abs=("abs_d", "sum"))
    total = out["sum_abs"].sum()
    out["share_of_abs_dlogprob"] = out["sum_abs"] / total if total > 0 else 0.0
    return out.drop(columns="sum_abs").reset_index()


def response_tokens(name: str, train_lp: Tensor, ref_lp: Tensor, layout: Layout) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The response tokens' frame and its bins by the engine's probability, once the training side is finite."""
    if not torch.isfinite(train_lp[layout.sequence]).all():
        raise FloatingPointError(f"non-finite training-side logprobs under setting {name!r}")
    tokens = token_frame(train_lp, ref_lp, layout, "response")
    return tokens, metrics.by_probability(tokens, binned).assign(setting=name)


def token_frame(train_lp: Tensor, ref_lp: Tensor, layout: Layout, scope: str) -> pd.DataFrame:
    sel = {"response": layout.response, "sequence": layout.sequence}[scope]
    d = (train_lp - ref_lp)[sel].double()
    p_ref = ref_lp[sel].double().exp()
    return pd.DataFrame({"d": d.numpy(), "abs_d": d.abs().numpy(),
                         "abs_dp": (train_lp[sel].double().exp() - p_ref).abs().numpy(),
                         "identical": (d == 0).numpy(), "p_ref": p_ref.numpy(),
                         "position": layout.scored_positions[sel].numpy()})
