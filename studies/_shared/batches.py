"""RL batches as the loop draws them, sampled from the engine: the gradient probe's and treatments' batches."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from transformers import AutoTokenizer

from localrl import Batch, Engine, PromptSampler, decode_responses
from tinyqwen.data import load_split
from tinyqwen.task import render_prompt, score


@dataclass
class Sample:
    batch: Batch
    scores: Tensor
    groups: np.ndarray


def sample_batches(trainer, model_dir: Path, data_dir: Path, n_batches: int, rl: dict, temperature: float,
                   max_new_tokens: int, seed: int) -> tuple[Engine, list[Sample]]:
    """A local engine with `trainer`'s weights, and `n_batches` RL batches sampled from it: the train split's
    prompts in the seeded epoch order, `samples_per_prompt` responses each, verl's gsm8k scores."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    frame = load_split(data_dir, "train")
    prompts = [tokenizer(render_prompt(list(p)))["input_ids"] for p in frame["prompt"]]
    truths = [rm["ground_truth"] for rm in frame["reward_model"]]
    config = trainer.master.config
    positions = max(config.max_position_embeddings, max(map(len, prompts)) + max_new_tokens)
    engine = Engine(config, tokenizer.eos_token_id, tokenizer.pad_token_id, max_positions=positions)
    engine.load_weights(trainer.weights_for_engine())
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
    return engine, out
