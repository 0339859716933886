"""The memory and disk tables of docs/running.md, from the functions that make the decisions."""

from __future__ import annotations

from verlrun import disk, memory
from rla.config import model_spec
from verlrun.overrides import cell_settings, memory_setup, token_budget


def memory_table(cfg: dict) -> str:
    rows = ["| model | params | token budget per GPU | update | old-log-prob | rollout | usable | micro-batch mode (sequences x longest): update |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for model in cfg["models"]:
        spec = model_spec(cfg, model, "verl")
        rl, _ = cell_settings(cfg, model)
        setup = memory_setup(cfg, model)
        shape = memory.shape_of(spec)
        longest = int(rl["max_prompt_length"]) + int(rl["max_response_length"])
        budget = token_budget(cfg, model)
        peaks = memory.peak_bytes(shape, budget, setup)
        micro = int(rl["micro_batch_size_per_gpu"])
        before = memory.peak_bytes(shape, micro * longest, setup)["update"]
        rows.append(
            f"| {model} | {shape.params() / 1e9:.2f} B | {budget:,} | {peaks['update'] / memory.GIB:.1f} GiB | "
            f"{peaks['old_log_prob'] / memory.GIB:.1f} GiB | {peaks['rollout'] / memory.GIB:.1f} GiB | "
            f"{setup.usable_bytes() / memory.GIB:.1f} GiB | {micro} x {longest:,} tokens: {before / memory.GIB:.1f} GiB |"
        )
    return "\n".join(rows)


def disk_table(cfg: dict) -> str:
    gb = 1e9
    rows = ["| model | checkpoint | checkpoints per cell at peak | per cell | cells | staged model | model total |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in disk.grid_rows(cfg):
        rows.append(f"| {r['model']} | {r['checkpoint'] / gb:.0f} GB | {r['checkpoints_per_cell']} | {r['cell'] / gb:.0f} GB | "
                    f"{r['cells']} | {r['staged_model'] / gb:.1f} GB | {r['total'] / gb:,.0f} GB |")
    rows.append(f"| **grid** | | | | {sum(r['cells'] for r in disk.grid_rows(cfg))} | | **{disk.grid_bytes(cfg) / 1e12:.2f} TB** |")
    return "\n".join(rows)


def tables(cfg: dict) -> str:
    return f"Memory per GPU\n\n{memory_table(cfg)}\n\nDisk\n\n{disk_table(cfg)}"
