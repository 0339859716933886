"""Step 4: where the two sides part, layer by layer, at the values both can read (the attention op's q,
k, v and output; diagnose/tap.py), and how the difference grows with depth.

vLLM keeps a layer's MLP output and its residual as two streams and adds them inside the next layer's
fused add-norm, where its compiled graph does not expose them. So a difference first seen at layer L's
q/k/v is attributed to the segment it arose in, not to the layer where it became visible: v (which skips
RoPE) agreeing while q or k differ points at layer L's RoPE or q/k norm; v differing points at the stream
entering layer L (layer L-1's output projection, MLP, the two residual sums, layer L's input norm and
q/k/v projection) - never at layer L-1's MLP alone, which made only one term of that sum.
"""

from __future__ import annotations

import pandas as pd
import torch

from diagnose.tap import VALUES


def segment(layer: int, differing: list[str]) -> str:
    """Where a first difference at `layer`, in the values `differing`, arose."""
    if "v" not in differing and {"q", "k"} & set(differing):
        return f"layer {layer}'s RoPE, q/k norm or q/k projection columns (v, from the same normed input, agrees)"
    if differing == ["out"]:
        return f"layer {layer}'s attention kernel (its q, k and v agree)"
    if layer == 0:
        return "the embedding, layer 0's input norm or its q/k/v projection"
    return (f"the stream entering layer {layer}: layer {layer - 1}'s output projection, MLP or residual sums, or "
            f"layer {layer}'s input norm or q/k/v projection")


def compare(engine_values: list[dict[str, torch.Tensor]], training_values: list[dict[str, torch.Tensor]],
            spec: str) -> tuple[list[dict], list[dict]]:
    """(per layer and value: bit-equal share, relative L2, max |diff|, share of positions differing;
    per sequence: the first layer and values where the sides differ). Positions are the engine's (the
    last sampled token is never fed back)."""
    layers = engine_values[0]["q"].shape[0]
    sums = {(i, n): [0.0, 0, 0.0, 0.0, 0.0, 0, 0] for i in range(layers) for n in VALUES}
    firsts = []
    for s, (ref, got) in enumerate(zip(engine_values, training_values)):
        rows = ref["q"].shape[1]
        first = None
        for i in range(layers):
            differs = torch.zeros(rows, dtype=torch.bool)  # positions where any value differs at this layer
            for n in VALUES:
                a, b = got[n][i, :rows].double(), ref[n][i].double()
                ne = a != b
                acc = sums[(i, n)]
                acc[0] += float((~ne).sum())
                acc[1] += ne.numel()
                acc[2] += float((a - b).pow(2).sum())
                acc[3] += float(b.pow(2).sum())
                acc[4] = max(acc[4], float((a - b).abs().max()))
                acc[5] += int(ne.flatten(1).any(1).sum())
                acc[6] += rows
                differs |= ne.flatten(1).any(1)
            if first is None and differs.any():
                # the first differing position of the first differing layer, and which values differ there
                position = int(differs.nonzero()[0, 0])
                differing = [n for n in VALUES if not torch.equal(got[n][i, position], ref[n][i, position])]
                first = {"spec": spec, "sequence": s, "first_layer": i, "first_values": ",".join(differing),
                         "first_position": position, "arose_in": segment(i, differing)}
        firsts.append(first or {"spec": spec, "sequence": s, "first_layer": None, "first_values": "",
                                "first_position": None, "arose_in": "no difference at any layer"})
    table = [{"spec": spec, "layer": i, "value": n, "bit_equal": acc[0] / acc[1],
              "rel_l2": (acc[2] / acc[3]) ** 0.5 if acc[3] > 0 else 0.0, "max_abs": acc[4],
              "positions_differing": acc[5] / acc[6]} for (i, n), acc in sums.items()]
    return table, firsts


def first_summary(firsts: pd.DataFrame) -> pd.DataFrame:
    """Per spec: how many traced sequences differ, the earliest first layer and the most common segment."""
    rows = []
    for spec, group in firsts.groupby("spec", sort=False):
        hit = group.dropna(subset=["first_layer"])
        rows.append({"spec": spec, "sequences": len(group), "sequences_differing": len(hit),
                     "earliest_layer": int(hit["first_layer"].min()) if len(hit) else None,
                     "arose_in": hit["arose_in"].mode().iloc[0] if len(hit) else "no difference at any layer"})
    return pd.DataFrame(rows)
