"""The mismatch probe against the local engine (`probe_local`); `SettingRows` also serves vllm.py. What it
measures and found: studies/probe/page.md."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from diagnose import metrics
from localrl import Engine, Rollout, Trainer
from rla import files
from rla.config import ConfigError
from rla.names import REGIONS
from studies._shared.mismatch import binned, mismatch_summary, response_tokens, token_frame
from studies._shared.names import MAIN_REFERENCE, SAMPLING_REFERENCE
from studies._shared.scored import Layout
from studies._shared.settings import Setting, log, probe_settings, run_settings
from studies._shared.sides import Forward, Sides, engine_forward, sample_rollout, setting_forwards
from studies.probe.inputs import probe_inputs

DEFAULT_POSITION_BIN = 16


def layer_rows(train: Forward, ref: Forward, mask: Tensor) -> list[dict]:
    """Divergence of the bf16 residual stream at the embedding and every layer output, and of the
    logits, over real tokens. Row `layer` 0 = embedding output (= first layer's input)."""
    real = mask.bool()
    n = len(ref.residuals)
    stages = [("embedding", 0)] + [("layer", i) for i in range(1, n)] + [("logits", n)]
    pairs = list(zip(train.residuals, ref.residuals)) + [(train.logits, ref.logits)]
    rows = []
    for (stage, index), (a, b) in zip(stages, pairs):
        a, b = a[real].double(), b[real].double()
        rows.append({"layer": index, "stage": stage, "rel_l2": ((a - b).norm() / b.norm()).item(),
                     "max_abs": (a - b).abs().max().item(), "frac_identical": (a == b).double().mean().item(),
                     "n_values": a.numel()})
    return rows


@dataclass
class ProbeResult:
    subsets: pd.DataFrame
    layers: pd.DataFrame
    by_probability: pd.DataFrame
    by_position: pd.DataFrame

    def write(self, out_dir: str | Path, meta: dict | None = None, log=print) -> None:
        """The tables as CSV files in `out_dir`, and `meta` (the vLLM probe's run record) as probe.json."""
        out_dir = Path(out_dir)
        for name in ("subsets", "layers", "by_probability", "by_position"):
            files.write_csv(getattr(self, name), out_dir / f"{name}.csv")
            log(f"wrote {out_dir / name}.csv")
        if meta is not None:
            files.write_text(out_dir / "probe.json", json.dumps(meta, indent=1) + "\n")
            log(f"wrote {out_dir / 'probe.json'}")
        log(f"figures and tables: python -m studies report probe --probe {out_dir} --out FIGURES_DIR")


def describe(setting: Setting) -> dict:
    """A setting as the columns of the probe's tables."""
    return {"setting": setting.name, "regions": ",".join(setting.regions) or "none",
            "n_regions": len(setting.regions), "reduction": setting.reduction, "treatment": setting.treatment,
            "dtype": str(setting.dtype).removeprefix("torch."),
            **{region: region in setting.regions for region in REGIONS}}


def run_probe(train_model, engine: Engine, rollout: Rollout, position_bin: int = DEFAULT_POSITION_BIN,
              log=print, master=None) -> ProbeResult:
    """Every setting's training side against the engine on `rollout`; FP16 settings need the fp32 `master`."""
    layout = Layout.from_rollout(rollout)
    refs = {torch.bfloat16: engine_forward(engine.model, layout.ids, layout.mask, layout.positions)}
    rows = SettingRows(refs[torch.bfloat16].logprobs, layout, position_bin)
    layers = []

    def step(setting: Setting, model, engine_model) -> dict:
        train, ref = setting_forwards(setting.dtype, model, engine_model, layout, refs)
        layers.extend({"setting": setting.name, **row} for row in layer_rows(train, ref, layout.mask))
        return rows.compare(setting, describe(setting), train.logprobs, ref.logprobs)

    run_settings(probe_settings(), Sides(train_model, engine, master), step, log, describe_main)
    return rows.result(pd.DataFrame(layers))


def describe_main(main: dict) -> str:
    """One setting's progress line: its mismatch against the main reference."""
    return (f"mean |d logprob| {main['mean_abs_dlogprob']:.3e}  k3 {main['k3_kl']:.2e}  "
            f"bit-identical {main['frac_identical']:.1%} ")


class SettingRows:
    """The probe's rows of one layout as the settings are scored (compare), then its tables (result). The
    first row: the engine's BF16 forward against its own sampling logprobs (prefill vs decode, which no
    training-side alignment can remove); `columns`: the engine's columns beyond `describe`'s."""

    def __init__(self, engine_lp: Tensor, layout: Layout, position_bin: int = DEFAULT_POSITION_BIN, **columns):
        self.layout, self.position_bin = layout, position_bin
        self.subsets = [{"setting": MAIN_REFERENCE, "regions": "", "n_regions": np.nan, "reduction": "",
                         "treatment": "", "dtype": "bfloat16", **columns, **{region: np.nan for region in REGIONS},
                         "reference": SAMPLING_REFERENCE, **mismatch_summary(engine_lp, layout.sampling, layout)}]
        self.by_probability, self.by_position = [], []

    def compare(self, setting: Setting, described: dict, train_lp: Tensor, ref_lp: Tensor) -> dict:
        """Against the engine's forward (and for BF16, which sampled the responses, its sampling); the main row."""
        layout = self.layout
        tokens, by_probability = response_tokens(setting.name, train_lp, ref_lp, layout)
        references = [(MAIN_REFERENCE, ref_lp)]
        if setting.dtype == torch.bfloat16:
            references.append((SAMPLING_REFERENCE, layout.sampling))
        for reference, lp in references:
            self.subsets.append({**described, "reference": reference, **mismatch_summary(train_lp, lp, layout)})
        self.by_probability.append(by_probability)
        for scope, frame in (("response", tokens), ("sequence", token_frame(train_lp, ref_lp, layout, "sequence"))):
            by_position = metrics.by_position(frame, self.position_bin, binned)
            self.by_position.append(by_position.assign(setting=setting.name, scope=scope))
        return self.subsets[-len(references)]

    def result(self, layers: pd.DataFrame) -> ProbeResult:
        def front(frame: pd.DataFrame, first: list[str]) -> pd.DataFrame:
            return frame[first + [c for c in frame.columns if c not in first]]

        return ProbeResult(subsets=pd.DataFrame(self.subsets), layers=layers,
                           by_probability=front(pd.concat(self.by_probability, ignore_index=True), ["setting"]),
                           by_position=front(pd.concat(self.by_position, ignore_index=True), ["setting", "scope"]))


def probe_local(args, cfg: dict) -> int:
    """The probe against the local engine (localrl/engine) of one model of an experiment config."""
    inputs = probe_inputs(args, cfg)
    prompts, max_new_tokens, tokenizer = inputs.prompts, inputs.max_new_tokens, inputs.tokenizer
    # The training model exactly as the RL loop builds it (bf16 compute copy, fp32 buffers, shared
    # kernels); "all" makes the trainer check that the patches cover every layer of this model.
    with Trainer(str(inputs.model_dir), {**inputs.rl, "temperature": 1.0}, "all") as trainer:
        engine = Engine(trainer.master.config, tokenizer.eos_token_id, tokenizer.pad_token_id)
        longest = max(map(len, prompts)) + max_new_tokens
        if longest > engine.max_positions:
            raise ConfigError(f"prompts of up to {max(map(len, prompts))} tokens + --max-new-tokens {max_new_tokens} "
                              f"exceed the model's {engine.max_positions} positions")
        engine.load_weights(trainer.weights_for_engine())
        log(f"probe {args.model}: {len(prompts)} prompts, responses of up to {max_new_tokens} tokens "
            f"(sampling compiles the engine on first use)")
        start = time.perf_counter()
        rollout = sample_rollout(engine, prompts, max_new_tokens, args.seed)
        log(f"sampled {int(rollout.response_mask.sum())} response tokens ({time.perf_counter() - start:.1f} s)")
        result = run_probe(trainer.model, engine, rollout, log=log, master=trainer.master)
    result.write(args.out, log=log)
    return 0
