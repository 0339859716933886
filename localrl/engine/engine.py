"""The rollout side: batched sampling with a KV cache on the engine's own model runner, as verl asks of
vLLM (docs/running.md: "The embedded default"): prompts left-padded, positions 0 at each prompt's first
real token, the processed logprobs `log_softmax(logits.float() / T)`. The engine is never patched.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence

from localrl.device import device as default_device
from localrl.engine.model import EngineModel, KVCache
from localrl.kernels import causal_mask


@dataclass
class Rollout:
    prompt_ids: Tensor  # (B, P) left-padded
    prompt_mask: Tensor  # (B, P) bool, True = real token
    responses: Tensor  # (B, R) sampled tokens, pad after eos
    response_mask: Tensor  # (B, R) bool, True up to and including eos
    logprobs: Tensor  # (B, R) fp32 processed logprobs of the sampled tokens, 0 where masked


def pad(rows: list[list], fill, dtype: torch.dtype, side: str = "right") -> Tensor:
    """Rows of different lengths as one (rows, longest) tensor, filled with `fill` on `side`."""
    return pad_sequence([torch.tensor(row, dtype=dtype) for row in rows], batch_first=True, padding_value=fill,
                        padding_side=side)


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    return (pad(prompts, pad_id, torch.long, "left"),
            pad([[True] * len(p) for p in prompts], False, torch.bool, "left"))


def prefill_mask(prompt_mask: Tensor) -> Tensor:
    """(B, 1, P, P): causal, real keys only; a pad query sees itself (no empty softmax rows)."""
    P = prompt_mask.shape[1]
    eye = torch.eye(P, dtype=torch.bool, device=prompt_mask.device)
    return (causal_mask(P, P, prompt_mask.device) & (prompt_mask[:, None, :] | eye))[:, None]


class Engine:
    def __init__(self, model_config, eos_id: int, pad_id: int, max_positions: int | None = None,
                 device: torch.device | str | None = None, dtype: torch.dtype = torch.bfloat16):
        self.max_positions = max_positions or model_config.max_position_embeddings
        self.device = torch.device(device) if device is not None else default_device()
        self.model = EngineModel(model_config, self.max_positions, dtype, device=self.device)
        self.eos_id, self.pad_id = eos_id, pad_id

    def load_weights(self, state_dict: dict[str, Tensor]) -> None:
        self.model.load_hf_weights(state_dict)  # HF names, any dtype -> the engine's (bf16 or fp16)

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], max_new_tokens: int, temperature: float = 1.0,
                 generator: torch.Generator | None = None, greedy: bool = False,
                 forced: Tensor | None = None) -> Rollout:
        """Sample `max_new_tokens` per prompt; with `forced` (B, max_new_tokens), feed those tokens instead of
        drawing them: their logprobs as the sampling loop computes them (the decode path of given responses)."""
        ids, prompt_mask = (t.to(self.device) for t in left_pad(prompts, self.pad_id))
        B, P = ids.shape
        if P + max_new_tokens > self.max_positions:
            raise ValueError(f"prompt width {P} + max_new_tokens {max_new_tokens} exceeds the engine's "
                             f"{self.max_positions} positions")
        cache = KVCache.allocate(self.model, B, P + max_new_tokens)
        positions = (prompt_mask.long().cumsum(-1) - 1).clamp(min=0)
        logits = self.model(ids, positions, prefill_mask(prompt_mask), kv_cache=cache, cache_len=0)[:, -1]
        next_pos = positions[:, -1] + 1
        key_mask = torch.cat([prompt_mask, torch.ones(B, max_new_tokens, dtype=torch.bool, device=self.device)], 1)

        done = torch.zeros(B, dtype=torch.bool, device=self.device)
        tokens, logps, masks = [], [], []
        for t in range(max_new_tokens):
            logp = torch.log_softmax(logits.float() / temperature, dim=-1)
            if forced is not None:
                tok = forced[:, t].to(self.device)
            elif greedy:
                tok = logp.argmax(-1)
            else:  # drawn on the CPU (a CPU generator on every device): the same seed, the same stream
                tok = torch.multinomial(logp.exp().cpu(), 1, generator=generator).squeeze(-1).to(self.device)
            alive = ~done
            tokens.append(torch.where(alive, tok, self.pad_id))
            logps.append(torch.where(alive, logp.gather(-1, tok[:, None]).squeeze(-1), 0.0))
            masks.append(alive)
            done = done | (tok == self.eos_id)
            if done.all() or t + 1 == max_new_tokens:
                break
            mask = key_mask[:, None, None, : P + t + 1]
            logits = self.model(tok[:, None], next_pos[:, None], mask, kv_cache=cache, cache_len=P + t)[:, -1]
            next_pos = next_pos + 1
        return Rollout(*(t.cpu() for t in (ids, prompt_mask, torch.stack(tokens, 1), torch.stack(masks, 1),
                                            torch.stack(logps, 1))))
