"""RL batches as the loop draws them, sampled from the engine: the gradient probe's and treatments' batches."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from localrl import Batch, PromptSampler, decode_responses
from tinyqwen.data import load_split
from tinyqwen.task import render_prompt, score


@dataclass
class Sample:

    batch: Batch
    scores: Tensor
    groups: np.ndarray


def train_prompts(tokenizer, data_dir: Path) -> tuple[list[list[int]], list[str]]:
    """The train split's prompts as token ids, and their ground truths."""
    frame = load_split(data_dir, "train")
    return ([tokenizer(render_prompt(list(p)))["input_ids"] for p in frame["prompt"]],
            [rm["ground_truth"] for rm in frame["reward_model"]])


def sample_batches(engine, tokenizer, prompts: list[list[int]], truths: list[str], n_batches: int, rl: dict,
                   temperature: float, max_new_tokens: int, seed: int) -> list[Sample]:
    """`n_batches` RL batches: prompts in the seeded epoch order, `samples_per_prompt` responses each, verl's
    gsm8k scores."""
    sampler = PromptSampler(len(prompts), torch.Generator().manual_seed(seed))
    gen = torch.Generator().manual_seed(seed + 1)
    n, group = rl["prompts_per_step"], rl["samples_per_prompt"]
    out = []
    for _ in range(n_batches):
        idx = sampler.take(n)
        rollout = engine.generate([prompts[i] for i in idx for _ in range(group)], max_new_tokens, temperature, gen)
        texts = decode_responses(tokenizer, rollout.responses, rollout.response_mask)
        scores = torch.tensor([score(t, truths[i]) for t, i in zip(texts, np.repeat(idx, group))])
        batch = Batch(rollout.prompt_ids, rollout.prompt_mask, rollout.responses, rollout.response_mask,
                      rollout_log_probs=rollout.logprobs)
        out.append(Sample(batch, scores, np.repeat(np.arange(n), group)))
    return out
