"""The mismatch probe's shared harness - `probe_settings`, `Layout` (which tokens are scored),
`run_settings` (the loop over settings, shared with the scaling study and the gradient probe) and
`SettingRows` (each setting against the engine's full forward, `engine_forward`, and its sampling
logprobs, `engine_sampling`) - and the probe against the local engine (`probe_local`); vllm.py runs the
same harness against vLLM. What it measures and found: studies/probe/page.md.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import Tensor

import patches
from patches import compile as compiled_layers
from rla.config import ConfigError
from rla.names import FORWARD_TREATMENTS, REGIONS, forward_treatment, subset_name
from studies.probe import ENGINE_ORDER, MAIN_REFERENCE, SAMPLING_REFERENCE, SUBSETS
from localrl.engine.engine import Engine, Rollout, prefill_mask
from localrl.models import compute_copy
from localrl.trainer import Batch, Trainer, sequence_inputs

# Bins of the engine's probability of the scored token (prior work: low-probability tokens carry the
# largest errors); the last bin closes at 1.
PROBABILITY_EDGES = (0.0, 1e-3, 1e-2, 0.1, 0.5, 0.9, 0.99, 1.0)
DEFAULT_POSITION_BIN = 16


@dataclass(frozen=True)
class Setting:
    """One configuration of both sides: the aligned regions, the RMSNorm summation order, decoder
    layers compiled or not, the dtype both sides compute in, the engine build the regions round like
    (`target`), and verl's rollout-correction preset of the loss (`correction`: read by the gradient
    probe; a forward does not see it)."""

    name: str
    regions: tuple[str, ...]
    reduction: str = "eager"
    compiled: bool = False
    dtype: torch.dtype = torch.bfloat16
    target: str = patches.DEFAULT_TARGET
    correction: str | None = None

    @property
    def treatment(self) -> str:
        return forward_treatment(self.compiled, self.dtype == torch.float16)

    @classmethod
    def of_ablation(cls, name: str) -> "Setting":
        """An ablation of the grid (rla.names.ABLATIONS) as the RL trainer runs it."""
        from rla import names

        entry = names.ablation(name)
        return cls(name, entry.regions, entry.reduction, compiled=entry.compiled,
                   dtype=torch.float16 if entry.precision == "fp16" else torch.bfloat16,
                   correction=entry.rollout_correction)


def probe_settings(target: str = patches.DEFAULT_TARGET, other: str | None = None,
                   engine_order: bool = True) -> list[Setting]:
    """Every subset of the regions rounding like `target`, all + engine order, then (with `other`, the
    other target) every subset with rmsnorm rounding like it - the targets differ only in where the
    residual stream is stored - and the treatments."""
    settings = [Setting(subset_name(c), c, target=target) for c in SUBSETS]
    if engine_order:
        settings.append(Setting(ENGINE_ORDER, REGIONS, "inductor_cpu", target=target))
    if other is not None:
        settings += [Setting(f"{subset_name(c)}@{other}", c, target=other) for c in SUBSETS if "rmsnorm" in c]
        if engine_order:
            settings.append(Setting(f"{ENGINE_ORDER}@{other}", REGIONS, "inductor_cpu", target=other))
    return settings + [replace(Setting.of_ablation(t), target=target) for t in FORWARD_TREATMENTS]


# ---------------------------------------------------------------------------------------------
# One forward per side


@dataclass
class Forward:
    logprobs: Tensor         # (B, T-1) fp32: logprob of token t+1 given tokens <= t
    residuals: list[Tensor]  # bf16 residual stream (B, T, hidden): embedding output, then each layer's
    logits: Tensor           # (B, T, vocab) bf16


def next_token_logprobs(logits: Tensor, ids: Tensor) -> Tensor:
    """Raw logprobs (temperature 1) as both sides compute them: fp32 log-softmax of bf16 logits."""
    ids = ids.to(logits.device)
    return torch.log_softmax(logits.float(), -1)[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)


def engine_forward(engine_model, ids: Tensor, mask: Tensor, positions: Tensor) -> Forward:
    """The engine's full forward (prefill layout) of prompt + response."""
    engine_model.layer_outputs = []
    try:
        logits = engine_model(ids, positions, prefill_mask(mask.bool()))
        layers = engine_model.layer_outputs
    finally:
        engine_model.layer_outputs = None
    embed = engine_model.weights["embed"][ids.to(engine_model.device)]
    # The engine records each layer's fp32 sum; its residual stream stores that sum in bf16.
    return Forward(next_token_logprobs(logits, ids), [embed] + [h.to(embed.dtype) for h in layers], logits)


@contextlib.contextmanager
def numerics(model, setting: Setting):
    """The training side under `setting` inside the block: its regions rounding like its target, the
    norm's summation order, its decoder layers compiled (`compile`); the previous state after it."""
    with patches.aligned(setting.regions, target=setting.target, reduction=setting.reduction):
        if setting.compiled:  # the forward each layer has under these regions
            compiled_layers.compile_layers(model)
        try:
            yield model
        finally:
            if setting.compiled:
                compiled_layers.uncompile_layers(model)


def run_settings(settings: list[Setting], sides: "Sides | dict", step: Callable, log=print,
                 describe: Callable = lambda result: "") -> dict[str, float]:
    """The settings loop of the probe (both engines), the scaling study and the gradient probe: for each
    setting its sides in its dtype (`sides.get(dtype)`: a Sides, or a dict {dtype: (training model,
    engine side)}), `step(setting, train_model, engine_side)` called under the setting's numerics, and
    one progress line (`describe(step's result)`). Returns each setting's seconds."""
    seconds = {}
    for i, setting in enumerate(settings, 1):
        start = time.perf_counter()
        model, engine_side = sides.get(setting.dtype)
        with numerics(model, setting):
            result = step(setting, model, engine_side)
        seconds[setting.name] = round(time.perf_counter() - start, 2)
        log(f"[{i}/{len(settings)}] {setting.name:26s} {describe(result)} ({seconds[setting.name]:.1f} s)")
    return seconds


@torch.no_grad()
def train_forward(model, ids: Tensor, mask: Tensor, positions: Tensor, setting: Setting | None = None) -> Forward:
    """The training side's forward under `setting` (None: as the model is, e.g. inside `run_settings`).
    Layer outputs come from hooks, not from HF's `hidden_states` (whose last entry is the final norm's
    output, not the last layer's)."""
    if setting is not None:
        with numerics(model, setting):
            return train_forward(model, ids, mask, positions)
    from patches.stream import hidden_state

    hidden, dtype = model.config.hidden_size, model.get_input_embeddings().weight.dtype
    recorded: list[Tensor] = []

    def record(module, args, output):
        out = output[0] if isinstance(output, tuple) else output
        # With the rmsnorm region a layer returns its fp32 stream, bit-cast: recorded rounded to the
        # activation dtype, as the engine's pieces store the residual.
        recorded.append(hidden_state(out, hidden).to(dtype))

    layers = compiled_layers.decoder_layers(model)
    handles = [layer.register_forward_hook(record) for layer in layers]  # outside a compiled layer
    handles.append(model.get_input_embeddings().register_forward_hook(record))
    try:
        device = next(model.parameters()).device
        logits = model(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=positions.to(device),
                       use_cache=False).logits
    finally:
        for h in handles:
            h.remove()
    # hooks fire in execution order: the embedding first, then each decoder layer
    if len(recorded) != len(handles):
        raise RuntimeError(f"recorded {len(recorded)} residual-stream values, expected {len(handles)}")
    return Forward(next_token_logprobs(logits, ids), recorded, logits)


# ---------------------------------------------------------------------------------------------
# Which tokens are scored, in the (B, T-1) coordinates of `next_token_logprobs`


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

    @property
    def scored_positions(self) -> Tensor:
        """RoPE position of each scored token."""
        return self.positions[:, 1:]


# ---------------------------------------------------------------------------------------------
# Metrics


def mismatch_summary(train_lp: Tensor, ref_lp: Tensor, layout: Layout) -> dict[str, float]:
    """verl's mismatch metrics over the response tokens (d = logp_train - logp_rollout; k3 = mean(exp(d)
    - 1 - d), an estimate of KL(rollout || train)), plus |d logprob| and the bit-identical fraction."""
    from localrl.metrics import mismatch_metrics

    sel, cols = layout.response, layout.response_cols
    # verl's masked means multiply by the mask: masked entries must be finite, so zero them; verl
    # holds response-aligned (B, R) tensors.
    # float64 copies (exact): in fp32, exp(d) - 1 - d cancels to 0 for |d| below ~1e-4.
    train_r, ref_r = (torch.where(sel, lp, 0.0)[:, cols].double() for lp in (train_lp, ref_lp))
    verl = mismatch_metrics(train_r, ref_r, sel[:, cols], layout.responses)
    d = (train_lp - ref_lp)[sel].double()
    return {
        "n_tokens": int(sel.sum()),
        "mean_abs_dlogprob": d.abs().mean().item(),
        "max_abs_dlogprob": d.abs().max().item(),
        "k3_kl": verl["rollout_corr/k3_kl"],
        "kl": verl["rollout_corr/kl"],
        "log_ppl_abs_diff": verl["rollout_corr/log_ppl_abs_diff"],
        "probs_diff_mean": verl["training/rollout_probs_diff_mean"],
        "probs_diff_max": verl["training/rollout_probs_diff_max"],
        "probs_pearson": verl["training/rollout_actor_probs_pearson_corr"],
        "frac_identical": (d == 0).double().mean().item(),
    }


def layer_rows(train: Forward, ref: Forward, mask: Tensor) -> list[dict]:
    """Divergence of the bf16 residual stream at the embedding and every layer output, and of the
    logits, over real tokens. Row `layer` 0 = embedding output (= first layer's input)."""
    real = mask.bool()
    stages = [("embedding", 0)] + [("layer", i + 1) for i in range(len(ref.residuals) - 1)]
    pairs = list(zip(train.residuals, ref.residuals)) + [(train.logits, ref.logits)]
    stages.append(("logits", len(ref.residuals)))
    rows = []
    for (stage, index), (a, b) in zip(stages, pairs):
        a, b = a[real].double(), b[real].double()
        rows.append({"layer": index, "stage": stage,
                     "rel_l2": ((a - b).norm() / b.norm()).item(),
                     "max_abs": (a - b).abs().max().item(),
                     "frac_identical": (a == b).double().mean().item(),
                     "n_values": a.numel()})
    return rows


def binned(frame: pd.DataFrame, key: str) -> pd.DataFrame:
    g = frame.groupby(key, observed=True, sort=True)
    out = g.agg(n_tokens=("abs_d", "size"), mean_abs_dlogprob=("abs_d", "mean"),
                mean_dlogprob=("d", "mean"),  # signed: a biased error does not average out
                max_abs_dlogprob=("abs_d", "max"), mean_abs_dprob=("abs_dp", "mean"),
                frac_identical=("identical", "mean"), sum_abs=("abs_d", "sum"))
    total = out["sum_abs"].sum()
    out["share_of_abs_dlogprob"] = out["sum_abs"] / total if total > 0 else 0.0
    return out.drop(columns="sum_abs").reset_index()


def token_frame(train_lp: Tensor, ref_lp: Tensor, layout: Layout, scope: str) -> pd.DataFrame:
    sel = {"response": layout.response, "sequence": layout.sequence}[scope]
    d = (train_lp - ref_lp)[sel].double()
    p_ref = ref_lp[sel].double().exp()
    return pd.DataFrame({"d": d.numpy(), "abs_d": d.abs().numpy(),
                         "abs_dp": (train_lp[sel].double().exp() - p_ref).abs().numpy(),
                         "identical": (d == 0).numpy(), "p_ref": p_ref.numpy(),
                         "position": layout.scored_positions[sel].numpy()})


def by_probability(tokens: pd.DataFrame) -> pd.DataFrame:
    edges = np.asarray(PROBABILITY_EDGES)
    index = np.clip(np.searchsorted(edges, tokens["p_ref"].to_numpy(), side="right") - 1, 0, len(edges) - 2)
    out = binned(tokens.assign(bin=index), "bin")
    out.insert(1, "p_low", edges[out["bin"]])
    out.insert(2, "p_high", edges[out["bin"] + 1])
    return out.drop(columns="bin")


def by_position(tokens: pd.DataFrame, width: int) -> pd.DataFrame:
    out = binned(tokens.assign(bin=tokens["position"] // width), "bin")
    out.insert(1, "position_low", out["bin"] * width)
    out.insert(2, "position_high", out["bin"] * width + width - 1)
    return out.drop(columns="bin")


# ---------------------------------------------------------------------------------------------
# The probe


@dataclass
class ProbeResult:
    subsets: pd.DataFrame
    layers: pd.DataFrame
    by_probability: pd.DataFrame
    by_position: pd.DataFrame

    def write(self, out_dir: str | Path, meta: dict | None = None, log=print) -> None:
        """The tables as CSV files in `out_dir`, and `meta` (the vLLM probe's run record) as probe.json."""
        from rla import files

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


def sample_rollout(engine, prompts: list[list[int]], max_new_tokens: int, seed: int) -> Rollout:
    """The fixed responses: sampled once from the engine (local or vLLM) at temperature 1 (raw logprobs)."""
    return engine.generate(prompts, max_new_tokens, temperature=1.0, generator=torch.Generator().manual_seed(seed))


class Sides:
    """Both sides' models per compute dtype: the given BF16 pair, and FP16 ones built on first use from
    the master weights (FP16 training copy with the shared kernels; an FP16 engine loaded with the
    master weights, as the `fp16` rig's engine gets the trainer's FP16 copy of them)."""

    def __init__(self, train_model, engine: Engine, master=None):
        self.train = {torch.bfloat16: train_model}
        self.engine = {torch.bfloat16: engine.model}
        self.master, self.max_positions = master, engine.max_positions

    def get(self, dtype: torch.dtype):
        if dtype not in self.train:
            from localrl.engine.model import EngineModel
            from localrl.kernels import use_local_kernels

            if self.master is None:
                raise ValueError(f"a {dtype} setting needs the fp32 master weights (run_probe(..., master=...))")
            self.train[dtype] = use_local_kernels(compute_copy(self.master, dtype))
            self.engine[dtype] = EngineModel(self.master.config, self.max_positions, dtype, device=self.master.device)
            self.engine[dtype].load_hf_weights(self.master.state_dict())
        return self.train[dtype], self.engine[dtype]


def run_probe(train_model, engine: Engine, rollout: Rollout, position_bin: int = DEFAULT_POSITION_BIN,
              log=print, master=None) -> ProbeResult:
    """Score `rollout` on the training model under every setting and compare with the engine. `master`
    (the fp32 weights the BF16 model was cast from) is needed for FP16 settings."""
    layout = Layout.from_rollout(rollout)
    refs = {torch.bfloat16: engine_forward(engine.model, layout.ids, layout.mask, layout.positions)}
    rows = SettingRows(refs[torch.bfloat16].logprobs, layout, position_bin)
    layers = []

    def step(setting: Setting, model, engine_model) -> dict:
        if setting.dtype not in refs:
            refs[setting.dtype] = engine_forward(engine_model, layout.ids, layout.mask, layout.positions)
        ref = refs[setting.dtype]
        train = train_forward(model, layout.ids, layout.mask, layout.positions)
        layers.extend({"setting": setting.name, **row} for row in layer_rows(train, ref, layout.mask))
        return rows.compare(setting, describe(setting), train.logprobs, ref.logprobs)

    run_settings(probe_settings(), Sides(train_model, engine, master), step, log, describe_main)
    return rows.result(pd.DataFrame(layers))


def describe_main(main: dict) -> str:
    """One setting's progress line: its mismatch against the main reference."""
    return (f"mean |d logprob| {main['mean_abs_dlogprob']:.3e}  k3 {main['k3_kl']:.2e}  "
            f"bit-identical {main['frac_identical']:.1%} ")


class SettingRows:
    """The probe's rows of one layout as the settings are scored (compare), then its tables (result).
    The first row compares the engine's BF16 forward (`engine_lp`) with its own sampling logprobs: the
    engine's prefill-vs-decode part, which no training-side alignment can remove; `columns` are the
    engine's columns of the table beyond `describe`'s."""

    def __init__(self, engine_lp: Tensor, layout: Layout, position_bin: int, **columns):
        self.layout, self.position_bin = layout, position_bin
        self.subsets = [{"setting": MAIN_REFERENCE, "regions": "", "n_regions": np.nan, "reduction": "",
                         "treatment": "", "dtype": "bfloat16", **columns, **{region: np.nan for region in REGIONS},
                         "reference": SAMPLING_REFERENCE, **mismatch_summary(engine_lp, layout.sampling, layout)}]
        self.by_probability, self.by_position = [], []

    def compare(self, setting: Setting, described: dict, train_lp: Tensor, ref_lp: Tensor) -> dict:
        """One setting's training-side logprobs against the engine's forward (and, for BF16, its sampling
        logprobs: the responses were sampled by the BF16 engine); returns the main row."""
        layout = self.layout
        if not torch.isfinite(train_lp[layout.sequence]).all():
            raise FloatingPointError(f"non-finite training-side logprobs under setting {setting.name!r}")
        references = [(MAIN_REFERENCE, ref_lp)]
        if setting.dtype == torch.bfloat16:
            references.append((SAMPLING_REFERENCE, layout.sampling))
        for reference, lp in references:
            self.subsets.append({**described, "reference": reference, **mismatch_summary(train_lp, lp, layout)})
        response_tokens = token_frame(train_lp, ref_lp, layout, "response")
        self.by_probability.append(by_probability(response_tokens).assign(setting=setting.name))
        for scope in ("response", "sequence"):
            tokens = response_tokens if scope == "response" else token_frame(train_lp, ref_lp, layout, scope)
            self.by_position.append(by_position(tokens, self.position_bin).assign(setting=setting.name, scope=scope))
        return self.subsets[-len(references)]

    def result(self, layers: pd.DataFrame) -> ProbeResult:
        def front(frame: pd.DataFrame, first: list[str]) -> pd.DataFrame:
            return frame[first + [c for c in frame.columns if c not in first]]

        return ProbeResult(subsets=pd.DataFrame(self.subsets), layers=layers,
                           by_probability=front(pd.concat(self.by_probability, ignore_index=True), ["setting"]),
                           by_position=front(pd.concat(self.by_position, ignore_index=True), ["setting", "scope"]))


# ---------------------------------------------------------------------------------------------
# The probe of one model of an experiment config against the local engine (studies/probe/cli.py: the command)


def probe_local(args, cfg: dict) -> int:
    """The probe against the local engine (localrl/engine) of one model of an experiment config."""
    from studies.probe.inputs import log, probe_inputs

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
