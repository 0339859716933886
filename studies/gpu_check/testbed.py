"""The model pair the second GPU check's model steps (long, kernels, determinism) score on: a random
model at a paper shape on the training side (transformers, the shared kernels), the local engine
compiled as vLLM compiles on a GPU, responses sampled from the engine, and each side's logprobs of them.
Built on the shared random models and layout (studies._shared), as studies/scaling/check_model.py is.
"""

from __future__ import annotations

import numpy as np
import torch

import patches
from localrl import Engine, compute_copy, use_local_kernels
from studies._shared.random_models import Point, sample
from studies._shared.scored import LOG_POSITION_EDGES, Layout, entropy_per_token, token_mismatch
from studies._shared.settings import GPU_TARGET
from studies._shared.sides import engine_forward, train_forward


def pair_of(master, point: Point, device: torch.device, dtype: torch.dtype = torch.bfloat16) -> tuple:
    """(training copy in `dtype` with the shared kernels, engine loaded with the same weights in `dtype`)."""
    train = use_local_kernels(compute_copy(master, dtype))
    engine = Engine(master.config, eos_id=-1, pad_id=0, max_positions=point.prompt_len + point.response_len,
                    device=device, dtype=dtype)
    engine.load_weights({k: v for k, v in master.state_dict().items() if v.is_floating_point()})
    return train, engine


def sampled(engine: Engine, point: Point) -> Layout:
    return Layout.from_rollout(sample(engine, point))


def replayed_sampling(engine: Engine, layout: Layout) -> torch.Tensor:
    """The engine's decode-path logprobs of the layout's responses (teacher-forced through its sampling
    loop), in the layout's (B, T-1) coordinates: the sampling reference of an engine that did not sample them."""
    cols = layout.response_cols
    width = cols.start + 1  # the prompts' columns
    prompts = [row[m.bool()].tolist() for row, m in zip(layout.ids[:, :width], layout.mask[:, :width])]
    responses = layout.ids[:, width:]
    rollout = engine.generate(prompts, responses.shape[1], forced=responses)
    out = torch.zeros(layout.response.shape)
    out[:, cols] = torch.where(rollout.response_mask, rollout.logprobs, 0.0)
    return out


def references(engine: Engine, layout: Layout, replay: bool = False) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The engine's prefill logprobs (B, T-1) and its decode-path ones (its own sampling logprobs, or with
    `replay` its decode of the layout's tokens), and its entropy (nats) at each scored response token, in
    the order of `layout.response`'s true entries."""
    forward = engine_forward(engine.model, layout.ids, layout.mask, layout.positions)
    entropy = entropy_per_token(forward.logits, layout.response)
    sampling = replayed_sampling(engine, layout) if replay else layout.sampling
    return {"engine_forward": forward.logprobs.cpu(), "engine_sampling": sampling}, entropy


def aligned_logprobs(model, layout: Layout, regions: str, impl: str) -> torch.Tensor:
    """The training side's logprobs under one setting: `regions` "none" is stock, `impl` "-" eager."""
    with patches.aligned(None if regions == "none" else regions, target=GPU_TARGET,
                         impl="eager" if impl == "-" else impl):
        return train_forward(model, layout.ids, layout.mask, layout.positions).logprobs.cpu()


def against_both(train_lp: torch.Tensor, refs: dict[str, torch.Tensor], layout: Layout) -> dict:
    """k3, mean |d logprob| and bit-equal share against each reference, prefixed by its name."""
    out = {}
    for reference, ref_lp in refs.items():
        out.update({f"{reference}/{k}": v for k, v in token_mismatch(train_lp, ref_lp, layout.response).items()})
    return out


def by_position(train_lp: torch.Tensor, refs: dict[str, torch.Tensor], layout: Layout,
                entropy: torch.Tensor) -> list[dict]:
    """k3 and mean |d| against each reference, and the engine's mean entropy, per log-spaced position bin
    (LOG_POSITION_EDGES) of the scored token."""
    positions = layout.scored_positions[layout.response].numpy()
    edges = np.asarray(LOG_POSITION_EDGES)
    bins = np.clip(np.searchsorted(edges, positions, side="right") - 1, 0, len(edges) - 2)
    d = {r: (train_lp - lp)[layout.response].double().numpy() for r, lp in refs.items()}
    rows = []
    for b in np.unique(bins):
        at = bins == b
        row = {"position_low": int(edges[b]), "position_high": int(edges[b + 1] - 1), "n_tokens": int(at.sum()),
               "entropy_engine": float(entropy.numpy()[at].mean())}
        for reference, diff in d.items():
            row[f"{reference}/k3"] = float(np.mean(np.expm1(diff[at]) - diff[at]))
            row[f"{reference}/mean_abs_dlogprob"] = float(np.abs(diff[at]).mean())
        rows.append(row)
    return rows

