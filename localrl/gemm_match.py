"""Which GEMM the training side must run to compute what the engine's GEMMs compute, measured at run time
(it depends on the machine and the engine build; docs/running.md: "The embedded default"): the engine's
own GEMM layers of decoder layer 0 and its LM head on seeded random inputs against each of CANDIDATES on the
same BF16 weights, as the trainer computes them. The first candidate equal on every value wins, else the
closest, and the line says by how much.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch import Tensor

from localrl.kernels import linear as fp32_linear

CANDIDATES = {
    "bf16": "torch's F.linear in the compute dtype",
    "fp32": "an FP32 GEMM of the BF16 values, rounded once (localrl.kernels.linear)",
}
# vLLM's merged layer -> (HF module, HF projections in vLLM's concatenation order)
MERGED = {"qkv_proj": ("self_attn", ("q_proj", "k_proj", "v_proj")), "o_proj": ("self_attn", ("o_proj",)),
          "gate_up_proj": ("mlp", ("gate_proj", "up_proj")), "down_proj": ("mlp", ("down_proj",))}
ROWS = (7, 300)  # a decode-sized and a prefill-sized batch of tokens
SEED = 0


def _tensor_files(model_dir: Path) -> dict[str, Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        return {k: model_dir / v for k, v in json.loads(index.read_text())["weight_map"].items()}
    single = model_dir / "model.safetensors"
    if not single.exists():
        raise FileNotFoundError(f"{model_dir} holds no model.safetensors or model.safetensors.index.json")
    with safe_open(single, "pt") as f:
        return {k: single for k in f.keys()}


def layer0_weights(model_dir: str | Path, tie_word_embeddings: bool, dtype: torch.dtype) -> dict[str, Tensor]:
    """Decoder layer 0's projections (HF names after `model.layers.0.`) and `lm_head`, in `dtype`."""
    model_dir = Path(model_dir)
    files = _tensor_files(model_dir)
    wanted = {f"{module}.{proj}.{kind}": f"model.layers.0.{module}.{proj}.{kind}"
              for module, projs in MERGED.values() for proj in projs for kind in ("weight", "bias")}
    wanted["lm_head"] = "model.embed_tokens.weight" if tie_word_embeddings else "lm_head.weight"
    out = {}
    for short, name in wanted.items():
        if name not in files:
            if name.endswith(".bias"):
                continue
            raise KeyError(f"{model_dir}: tensor {name} not found")
        with safe_open(files[name], "pt") as f:
            out[short] = f.get_tensor(name).to(dtype)
    return out


def gemm_inputs(weights: dict[str, Tensor], rows: int, seed: int = SEED) -> dict[str, Tensor]:
    """Seeded N(0, 1) inputs of each merged layer's width, in the weights' dtype."""
    g = torch.Generator().manual_seed(seed + rows)
    widths = {name: weights[f"{module}.{projs[0]}.weight"].shape[1] for name, (module, projs) in MERGED.items()}
    widths["lm_head"] = weights["lm_head"].shape[1]
    dtype = weights["lm_head"].dtype
    return {name: torch.randn(rows, width, generator=g).to(dtype) for name, width in widths.items()}


def trainer_outputs(weights: dict[str, Tensor], inputs: dict[str, Tensor], candidate: str,
                    device: torch.device | str = "cpu") -> dict[str, Tensor]:
    """Each merged layer's output as the trainer computes it with `candidate` (separate projections,
    concatenated as vLLM merges them)."""
    if candidate not in CANDIDATES:
        raise ValueError(f"unknown GEMM candidate {candidate!r}; allowed: {', '.join(CANDIDATES)}")
    gemm = F.linear if candidate == "bf16" else fp32_linear

    def run(x, name):
        w, b = weights[name + ".weight"], weights.get(name + ".bias")
        return gemm(x.to(device), w.to(device), None if b is None else b.to(device)).cpu()

    out = {}
    with torch.no_grad():
        for layer, (module, projs) in MERGED.items():
            out[layer] = torch.cat([run(inputs[layer], f"{module}.{p}") for p in projs], dim=-1)
        out["lm_head"] = gemm(inputs["lm_head"].to(device), weights["lm_head"].to(device)).cpu()
    return out


@dataclass(frozen=True)
class GemmMatch:
    choice: str                           # a CANDIDATES key
    differing: dict[str, dict[str, int]]  # candidate -> layer -> values that differ from the engine
    n_values: int                         # values compared per candidate

    @property
    def exact(self) -> bool:
        return sum(self.differing[self.choice].values()) == 0

    def describe(self) -> str:
        counts = ", ".join(f"{c} {sum(d.values())}" for c, d in self.differing.items())
        verdict = ("equals the engine's GEMMs bit for bit" if self.exact else
                   "is the closest; no candidate equals the engine's GEMMs bit for bit")
        return (f"trainer GEMM '{self.choice}' ({CANDIDATES[self.choice]}) {verdict} "
                f"(values differing of {self.n_values}: {counts}; decoder layer 0 and the LM head at "
                f"{' and '.join(map(str, ROWS))} tokens)")


def engine_gemms(model, inputs: dict[str, Tensor]) -> dict[str, Tensor]:
    """A loaded vLLM model's own GEMM layers of decoder layer 0 and its LM head on `inputs` (one per name)."""
    device = next(model.parameters()).device
    layer = model.model.layers[0]
    layers = {"qkv_proj": layer.self_attn.qkv_proj, "o_proj": layer.self_attn.o_proj,
              "gate_up_proj": layer.mlp.gate_up_proj, "down_proj": layer.mlp.down_proj}
    out = {}
    with torch.inference_mode():
        for name, module in layers.items():
            y = module(inputs[name].to(device))
            out[name] = (y[0] if isinstance(y, tuple) else y).cpu()
        out["lm_head"] = model.lm_head.quant_method.apply(model.lm_head, inputs["lm_head"].to(device)).cpu()
    return out


def match(engine, model_dir: str | Path, tie_word_embeddings: bool, dtype: torch.dtype,
          device: torch.device | str = "cpu") -> GemmMatch:
    weights = layer0_weights(model_dir, tie_word_embeddings, dtype)
    differing = {c: {} for c in CANDIDATES}
    n_values = 0
    for rows in ROWS:
        inputs = gemm_inputs(weights, rows)
        reference = engine.gemm_outputs(inputs)
        n_values += sum(t.numel() for name, t in reference.items() if name != "lm_head")
        n_values += inputs["lm_head"].shape[0] * weights["lm_head"].shape[0]
        for candidate in CANDIDATES:
            got = trainer_outputs(weights, inputs, candidate, device)
            for layer, ref in reference.items():
                if layer == "lm_head":  # vLLM pads the vocabulary (to a multiple of 64): those columns are its own
                    ref = ref[..., :got[layer].shape[-1]]
                if got[layer].shape != ref.shape:
                    raise RuntimeError(f"GEMM check: {layer} gives {tuple(ref.shape)} in the engine, "
                                       f"{tuple(got[layer].shape)} on the training side")
                differing[candidate][layer] = differing[candidate].get(layer, 0) + int((got[layer] != ref).sum())
    # The first exact candidate, else the closest (min keeps the first of equals: CANDIDATES' order).
    return GemmMatch(min(CANDIDATES, key=lambda c: sum(differing[c].values())), differing, n_values)
