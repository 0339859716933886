"""docs/reference/config.md, generated from the settings tables of `rla.config`:

    python -m rla.reference > docs/reference/config.md

tests/test_config.py fails when the page in the repository is not what this prints.
"""

from __future__ import annotations

from rla import config
from rla.config import A, Key

SECTIONS = (  # (section, its table, what it is)
    ("rl", config.RL, "The RL recipe; every key means the same in both backends. A model's own `rl:` in its "
     "`model_specs` entry overrides the section for that model."),
    ("engine", config.ENGINE, "The local backend's rollout engine (`engine: vllm` is short for "
     "`engine: {name: vllm}`)."),
    ("warmstart", config.WARMSTART, "The local backend's supervised warm start of the tiny models."),
    ("task", config.TASK, "The local backend's generated arithmetic problems (verl's `data.generate` takes the "
     "same keys)."),
    ("data", config.DATA, "The verl backend's problems: `train` and `test` sources, or `generate`."),
    ("collapse", config.COLLAPSE, "The collapse rule's thresholds "
     "([collapse definition](../reference.md#collapse-definition)); they judge the logs and retrain nothing."),
    ("verl", config.VERL, "A verl cell's cluster shape and platform; a `model_specs` entry may set "
     f"{', '.join(f'`{k}`' for k in config.PER_MODEL_VERL)} for its model."),
)


def markdown_table(keys: dict[str, Key]) -> str:
    """One section's keys: default, meaning, backends, identity, the verl keys each sets."""
    rows = ["| key | default | meaning | backends | identity | verl keys it sets |",
            "| --- | --- | --- | --- | --- | --- |"]
    for name, key in keys.items():
        default = "derived" if key.default is None else f"`{key.default}`"
        if key.choices:
            default += f" ({', '.join(key.choices)})"
        verl = ", ".join(f"`{v.removeprefix(A)}`" for v in key.verl) if "verl" in key.backends and key.verl else "-"
        rows.append(f"| `{name}` | {default} | {key.help} | {', '.join(key.backends)} | "
                    f"{'yes' if key.identity else '-'} | {verl} |")
    return "\n".join(rows) + "\n"


def page() -> str:
    parts = [
        "# Settings reference\n",
        "Generated from the tables of `rla/config.py` by `python -m rla.reference > docs/reference/config.md`; "
        "a test fails when this page is stale. How the settings are checked, and the top-level keys: "
        "[reference](../reference.md#settings-experimentsyaml).\n",
        "*identity*: the value is part of a cell's identity (`rla.cells`): a cell folder written with "
        "another value is moved aside, not resumed. `-`: the key changes how a cell runs, not what it "
        "computes. *verl keys*: under `actor_rollout_ref.` unless they start with `data.`, `trainer.` or "
        "`algorithm.`; `verlrun.overrides` writes a one-key setting from the table as it is, and derives "
        "the settings of several keys.\n",
    ]
    for section, keys, what in SECTIONS:
        parts += [f"## `{section}`\n", what + "\n", markdown_table(keys)]
    parts += [
        "## `model_specs`\n",
        f"A local model is built from its spec: {', '.join(f'`{k}`' for k in config.LOCAL_SPEC_KEYS)}. A verl "
        "model has either `path` (a Hugging Face name at a pinned `revision`, or a local directory) or "
        f"`build` (a tiny model built here: {', '.join(f'`{k}`' for k in config.BUILD_KEYS)}), and may set "
        "its own `rl:`, cluster shape and Hydra `overrides`.\n",
    ]
    return "\n".join(parts)


if __name__ == "__main__":
    print(page(), end="")
