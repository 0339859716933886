"""Per-step metrics under verl's names, from verl's own helpers, and the metrics file in verl's
file-logger format (docs/running.md: "The embedded default"). verl's FileLogger opens its file with "wb"
(a resumed run would truncate it), so the lines are written here in its format, but appended, and
rewritten from the checkpoint on resume (`rla.metricslog`).
"""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import torch

from rla import files
from rla.metricslog import METRICS, RUNNING

def mismatch_metrics(old_log_probs, rollout_log_probs, response_mask, responses) -> dict[str, float]:
    from verl import DataProto  # verl: optional, its helpers loaded where the metrics are computed
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_corr_metrics_from_logprobs
    from verl.utils.debug.metrics import calculate_debug_metrics

    mask = response_mask.float()
    out = compute_rollout_corr_metrics_from_logprobs(old_log_probs, rollout_log_probs, mask)
    data = DataProto.from_dict(tensors={"old_log_probs": old_log_probs, "rollout_log_probs": rollout_log_probs,
                                        "response_mask": mask, "responses": responses})
    out.update(calculate_debug_metrics(data))
    return out


def data_metrics(scores: torch.Tensor, advantages: torch.Tensor, response_mask: torch.Tensor,
                 max_response_length: int) -> dict[str, float]:
    """verl's compute_data_metrics names for the parts this backend has (no critic)."""
    lengths = response_mask.float().sum(1)
    out = {}
    for name, t in (("critic/score", scores), ("critic/advantages", advantages[response_mask.bool()]),
                    ("response_length", lengths)):
        out.update({f"{name}/{stat}": getattr(t, stat)().item() for stat in ("mean", "max", "min")})
    out["response_length/clip_ratio"] = (lengths >= max_response_length).float().mean().item()
    return out


class MetricsLog:
    """A cell's metric lines: appended to `metrics.running.jsonl` as the steps go, kept in memory too (every
    checkpoint holds them: a resumed cell rewrites exactly its checkpoint's lines), and written as
    `metrics.jsonl` when the cell has finished its steps."""

    def __init__(self, cell_dir: str | Path, lines: list[bytes] = ()):
        self.cell_dir, self.lines = Path(cell_dir), list(lines)
        (self.cell_dir / METRICS).unlink(missing_ok=True)  # only a finished cell has one
        files.write_bytes(self.running, b"".join(self.lines))

    @property
    def running(self) -> Path:
        return self.cell_dir / RUNNING

    def log(self, data: dict, step: int) -> None:
        line = orjson.dumps({"step": step, "data": data}, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n"
        with open(self.running, "ab") as fp:
            fp.write(line)
            fp.flush()
            os.fsync(fp.fileno())
        self.lines.append(line)

    def finish(self) -> Path:
        target = files.write_bytes(self.cell_dir / METRICS, b"".join(self.lines))
        self.running.unlink()
        return target
