"""Warm start: a short supervised pass on generated solutions, so RL starts from a policy that solves
some problems (docs/running.md: "The embedded default"). FP32 throughout: this is not the experiment,
only its starting point.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from localrl.device import device
from localrl.engine.engine import left_pad, pad
from rla.config import model_spec, warmstart_settings
from tinyqwen.data import load_split
from tinyqwen.models import build_model, num_parameters
from tinyqwen.task import render_prompt, score
from tinyqwen.tokenizer import build_tokenizer

def encode_examples(frame, tokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded (prompt + solution + eos) ids and a loss mask over the solution tokens."""
    seqs, masks = [], []
    for prompt, extra in zip(frame["prompt"], frame["extra_info"]):
        p = tokenizer(render_prompt(list(prompt)))["input_ids"]
        r = tokenizer(extra["answer"])["input_ids"] + [tokenizer.eos_token_id]
        seqs.append(p + r)
        masks.append([0] * len(p) + [1] * len(r))
    return pad(seqs, tokenizer.pad_token_id, torch.long), pad(masks, False, torch.bool)


@torch.no_grad()
def greedy_solve_rate(model, tokenizer, frame, max_new_tokens: int, batch_size: int = 100) -> float:
    """Fraction of problems whose greedy answer verl's gsm8k scorer accepts."""
    model.eval()
    prompts = [tokenizer(render_prompt(list(p)))["input_ids"] for p in frame["prompt"]]
    truths = [rm["ground_truth"] for rm in frame["reward_model"]]
    eos, total = tokenizer.eos_token_id, 0.0
    for start in range(0, len(prompts), batch_size):
        ids, mask = (t.to(model.device) for t in left_pad(prompts[start:start + batch_size], tokenizer.pad_token_id))
        mask = mask.long()
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=model.config)
        done = torch.zeros(len(ids), dtype=torch.bool, device=model.device)
        out = []
        for _ in range(max_new_tokens):
            logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache,
                           use_cache=True).logits[:, -1]
            nxt = torch.where(done, eos, logits.argmax(-1))
            out.append(nxt)
            done |= nxt == eos
            if done.all():
                break
            ids, pos = nxt[:, None], pos[:, -1:] + 1
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
        for row, truth in zip(torch.stack(out, 1).tolist(), truths[start:start + batch_size]):
            row = row[: row.index(eos)] if eos in row else row
            total += score(tokenizer.decode(row), truth)
    model.train()
    return total / len(prompts)


def warmstart(cfg: dict, model_name: str, data_dir: str | Path, out_dir: str | Path) -> dict:
    spec = model_spec(cfg, model_name, "local")
    ws = warmstart_settings(cfg)
    out_dir = Path(out_dir)
    tokenizer = build_tokenizer()
    train, test = load_split(data_dir, "train"), load_split(data_dir, "test")
    ids, loss_mask = encode_examples(train, tokenizer)
    model = build_model(spec, tokenizer, seed=ws["seed"]).to(device())  # initialised on the CPU: same weights
    print(f"[warmstart] {model_name}: {num_parameters(model) / 1e6:.2f}M parameters, {len(ids)} examples, "
          f"{ws['steps']} steps x {ws['batch_size']}", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=ws["lr"], weight_decay=ws["weight_decay"], betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / ws["warmup"])
                                              * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * s / ws["steps"]))))
    gen = torch.Generator().manual_seed(ws["seed"])
    t0, loss_ema = time.time(), None
    model.train()
    for step in range(ws["steps"]):
        idx = torch.randint(len(ids), (ws["batch_size"],), generator=gen)
        batch, m = ids[idx].to(model.device), loss_mask[idx].to(model.device)
        width = int(m.nonzero()[:, 1].max()) + 1  # drop all-pad columns
        batch, m = batch[:, :width], m[:, :width]
        logits = model(input_ids=batch).logits[:, :-1]
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), batch[:, 1:].reshape(-1),
                               reduction="none")
        loss = (loss * m[:, 1:].reshape(-1)).sum() / m[:, 1:].sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        loss_ema = loss.item() if loss_ema is None else 0.9 * loss_ema + 0.1 * loss.item()
        if (step + 1) % 50 == 0 or step + 1 == ws["steps"]:
            print(f"[warmstart] {model_name} step {step + 1}/{ws['steps']} loss {loss_ema:.3f} "
                  f"({time.time() - t0:.1f}s)", flush=True)

    eval_frame = test.iloc[: ws["eval_size"]]
    solve_rate = greedy_solve_rate(model, tokenizer, eval_frame, ws["max_new_tokens"])
    summary = {"model": model_name, "steps": ws["steps"], "final_loss": loss_ema, "greedy_solve_rate": solve_rate,
               "eval_size": len(eval_frame), "seconds": round(time.time() - t0, 1),
               "parameters": num_parameters(model)}
    print(f"[warmstart] {model_name}: greedy solve rate {solve_rate:.1%} on {len(eval_frame)} test problems",
          flush=True)

    # Save into a temporary sibling, then swap in: an interrupted save never leaves a broken model.
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "warmstart.json").write_text(json.dumps(summary, indent=2) + "\n")
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)
    print(f"[warmstart] saved {out_dir}", flush=True)
    return summary
