"""The studies: one folder each, with its measurement, its report and its judge, declared in its `study.yaml`
(the schema: studies/study.schema.yaml); a variant (another config of the same measurement) is declared in its
parent's study.yaml and keeps its page and published files in a subfolder. How to run and publish them:
docs/running.md, "The studies" (`python -m studies --help`). Report and judge modules import no torch: they
run on tables copied from another machine. Nothing outside this folder imports a study.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml
from jsonschema import Draft202012Validator

HERE = Path(__file__).resolve().parent
SCHEMA = HERE / "study.schema.yaml"
DECLARATION = "study.yaml"

# What the rig runs unless a study says otherwise (localrl/engines.py, localrl/kernels.py).
AUTO_ENGINE = "the config's `engine: auto`: vLLM's CPU build where it is installed (make install), else the local engine"
RIG_ENGINE = "the local engine (localrl/engine: vLLM's GPU graph as compiled pieces, on this CPU)"
RIG_ATTENTION = "the rig's shared attention kernel, used by both sides (FP32 inside, rounded to BF16 once)"
BOTH_ATTENTIONS = "both, as separate rows: transformers' SDPA (`hf`) and FP32 attention rounded once (`attention`)"
# the words a study.yaml may use for the texts above
ENGINES = {"auto": AUTO_ENGINE, "rig": RIG_ENGINE}
ATTENTIONS = {"rig": RIG_ATTENTION, "both": BOTH_ATTENTIONS}
# what a variant does not take from its parent
OWN_KEYS = ("folder", "variants")


@dataclass(frozen=True)
class Study:
    """One study: what `python -m studies run/report NAME` call, and where its target publishes."""

    name: str
    summary: str
    folder: str  # from the repository's root: studies/NAME, or studies/PARENT/SUB for a variant
    measure: str | None  # module with main(argv); None where the measurement is the grid's own DAG
    report: str | None  # module with main(argv) reading the measurement's files (no torch)
    config: str | None = None  # the experiment config holding its settings and pre-registration
    engine: str = RIG_ENGINE  # the inference side its numbers are measured against
    attention: str = RIG_ATTENTION  # the training side's attention (a condition of every mismatch number)
    per_machine: bool = False  # its numbers depend on the machine's kind: published per kind, side by side
    measured_by: str | None = None  # where `measure` is None and no grid measures it: what does
    code: tuple[str, ...] = ()  # modules that measure it besides `measure` (a grid's backend): studies/stale.py
    parent: str | None = None  # the study this one is a variant of
    # its target's jobs (workflows/rules/studies.smk): settings, micro, grid, cells, steps, publish; per_model:
    # what the grid runs on each of its models (workflows/rules/per_model.smk)
    workflow: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    @property
    def published(self) -> str:
        return f"{self.folder}/published"

    def settings(self, micro: bool = False) -> dict:
        """Its target's settings (its options, plan, grid configs...), laid over by its `micro:` ones when
        the micro profile runs it (experiments/micro-studies.yaml)."""
        return {**self.workflow.get("settings", {}), **(self.workflow.get("micro", {}) if micro else {})}


def _problems(data, where: Path) -> list[str]:
    """The schema's verdict in a line per fault: the file, the key, the value and what is allowed."""
    with open(SCHEMA) as f:
        schema = yaml.safe_load(f)
    found = []
    for error in sorted(Draft202012Validator(schema).iter_errors(data), key=lambda e: list(e.path)):
        key = ".".join(str(p) for p in error.path) or "(top)"
        if error.validator == "additionalProperties":
            allowed = sorted(error.schema.get("properties", {}))
            unknown = sorted(set(error.instance) - set(allowed))
            found.append(f"{where}: unknown key(s) {unknown} in {key}; allowed: {', '.join(allowed)}")
        else:
            found.append(f"{where}: {key} = {error.instance!r}: {error.message}")
    return found


def _study(name: str, data: dict, folder: str, parent: str | None, where: Path) -> Study:
    if "micro" in data and (unknown := sorted(set(data["micro"]) - set(data.get("settings", {})))):
        raise ValueError(f"{where}: micro key(s) {unknown} of {name!r} are no settings of it; its settings: "
                         f"{', '.join(data.get('settings', {})) or 'none'}")
    return Study(name, data["summary"], folder, data.get("measure"), data.get("report"),
                 data.get("config"), ENGINES.get(data.get("engine", "rig"), data.get("engine")),
                 ATTENTIONS.get(data.get("attention", "rig"), data.get("attention")), data.get("per_machine", False),
                 data.get("measured_by"), tuple(data.get("code", ())), parent,
                 {k: data[k] for k in ("settings", "micro", "cells", "steps", "publish", "per_model") if k in data})


def declared(root: Path = HERE) -> dict[str, Study]:
    """Every study declared under `root` (each folder's study.yaml, then its variants), in folder order."""
    found = {}
    for path in sorted(root.glob(f"*/{DECLARATION}")):
        try:
            data = yaml.safe_load(path.read_text())
        except yaml.YAMLError as err:
            raise ValueError(f"{path}: not YAML: {err}") from None
        if problems := _problems(data, path):
            raise ValueError("invalid study declaration:\n  " + "\n  ".join(problems))
        name = path.parent.name
        if name in found:
            raise ValueError(f"{path}: study {name!r} is also declared as a variant of {found[name].parent!r}")
        folder = str(path.parent.relative_to(root.parent))  # from the repository's root: studies/NAME
        found[name] = _study(name, data, folder, None, path)
        inherited = {k: v for k, v in data.items() if k not in OWN_KEYS}
        for variant, own in data.get("variants", {}).items():
            if variant in found:
                raise ValueError(f"{path}: variant {variant!r} is declared twice")
            found[variant] = _study(variant, {**inherited, **own}, f"{folder}/{own['folder']}", name, path)
    return found


STUDIES = declared()


def study(name: str) -> Study:
    """The registered study `name`, or a KeyError naming the known ones."""
    if name not in STUDIES:
        raise KeyError(f"unknown study {name!r}; known: {', '.join(STUDIES)}")
    return STUDIES[name]
