"""Which tokens are scored (`Layout`, in (B, T-1) coordinates) and the measures over them needing torch only:
the GPU check's image has no verl or orjson (studies._shared.mismatch holds verl's metrics)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from localrl import Batch, Rollout, left_pad, pad, sequence_inputs

# log-spaced position bins (responses reach thousands of tokens)
LOG_POSITION_EDGES = (0, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


@dataclass
class Layout:
    ids: Tensor          # (B, T) prompt + response, prompts left-padded
    mask: Tensor         # (B, T) long, 1 = real token
    positions: Tensor    # (B, T) RoPE positions, 0 at each prompt's first real token
    response: Tensor     # (B, T-1) bool: the scored token is a response token
    sequence: Tensor     # (B, T-1) bool: input and scored token are both real (prompt or response)
    sampling: Tensor     # (B, T-1) fp32: the engine's sampling logprobs at response tokens, 0 elsewhere
    responses: Tensor    # (B, R), for verl's debug metrics
    response_cols: slice  # the response tokens' columns in (B, T-1): all prompts are padded to one width

    @classmethod
    def from_rollout(cls, rollout: Rollout) -> "Layout":
        ids, mask, positions = sequence_inputs(Batch(rollout.prompt_ids, rollout.prompt_mask, rollout.responses,
                                                     rollout.response_mask))
        P, R = rollout.prompt_ids.shape[1], rollout.responses.shape[1]
        response = torch.zeros(ids.shape[0], ids.shape[1] - 1, dtype=torch.bool)
        response[:, P - 1:P - 1 + R] = rollout.response_mask
        sampling = torch.zeros(response.shape)
        sampling[:, P - 1:P - 1 + R] = torch.where(rollout.response_mask, rollout.logprobs, 0.0)
        sequence = mask[:, :-1].bool() & mask[:, 1:].bool()
        return cls(ids, mask, positions, response, sequence, sampling, rollout.responses, slice(P - 1, P - 1 + R))

    @classmethod
    def from_samples(cls, samples, pad_id: int) -> "Layout":
        """The layout of `diagnose.engine.Sample`s, laid out as an engine's Rollout."""
        tokens = [s.tokens for s in samples]
        return cls.from_rollout(Rollout(*left_pad([s.prompt for s in samples], pad_id), pad(tokens, pad_id, torch.long),
                                        pad([[True] * len(t) for t in tokens], False, torch.bool),
                                        pad([s.logprobs for s in samples], 0.0, torch.float32)))

    @property
    def scored_positions(self) -> Tensor:
        return self.positions[:, 1:]


def token_mismatch(train_lp: Tensor, ref_lp: Tensor, selected: Tensor) -> dict:
    """Over the selected tokens, d = train - ref: verl's k3 (tests/test_gpu_check.py), mean |d|, the share with
    d == 0. float64: in fp32, exp(d) - 1 - d cancels to 0 for |d| below ~1e-4."""
    d = (train_lp.double() - ref_lp.double())[selected.to(train_lp.device)]
    return {"n_tokens": int(d.numel()), "k3": (torch.expm1(d) - d).mean().item(),
            "mean_abs_dlogprob": d.abs().mean().item(), "bit_equal": (d == 0).double().mean().item()}


def entropy_per_token(logits: Tensor, sel: Tensor) -> Tensor:
    """Entropy (nats) of the fp32 softmax of logits (B, T, V) at the positions `sel`, row by row (memory)."""
    sel = sel.to(logits.device)
    out = []
    for row in range(logits.shape[0]):
        lp = torch.log_softmax(logits[row, :-1][sel[row]].float(), -1)
        out.append(-(lp.exp() * lp).sum(-1))
    return torch.cat(out).cpu()
