# The studies' declarations (studies/NAME/study.yaml) as workflows/rules/studies.smk reads them: each study's
# settings, the placeholders of its paths and commands, and the functions that make its rules from them.
import glob
import json
import itertools

STUDY_OUT = "results/studies"
# the config's `studies:` section (experiments/micro-studies.yaml): whether the studies run their `micro:`
# settings, whether a publish step renders the docs' pages after it and whether the timing and engine studies'
# measuring jobs take every core, so that nothing runs beside them (off where the numbers mean nothing)
STUDY_RUN = {"micro": False, "pages": True, "exclusive": True, **config.get("studies", {})}
EXCLUSIVE_THREADS = workflow.cores if STUDY_RUN["exclusive"] else 1
# `studies: {options: {NAME: [...]}}` replaces a study's declared `{options}`; its provenance command says so
OPTIONS = {name: [str(o) for o in given] for name, given in STUDY_RUN.get("options", {}).items()}
if stray := sorted(set(OPTIONS) - set(STUDIES)):
    raise WorkflowError(f"config studies.options: {', '.join(stray)} is not a study; allowed: {', '.join(STUDIES)}")
STUDY_SETTINGS = {name: {**s.settings(STUDY_RUN["micro"]), **({"options": OPTIONS[name]} if name in OPTIONS else {})}
                  for name, s in STUDIES.items()}
GRID_CONFIGS = {name: s["grid"] for name, s in STUDY_SETTINGS.items() if "grid" in s}  # a grid study's config files
# Snakemake's own placeholders in a declared command, left for it to fill when the job runs
SNAKEMAKE_NAMES = {"input", "output", "log", "threads", "params", "wildcards", "resources"}
PLACEHOLDER = re.compile(r"\{(\w+)\}")


def published(name):
    """The publish step's output: a copy of its provenance record. Not the tracked provenance.json, which a
    fresh clone already has: Snakemake would take the study for done."""
    return f"{STUDY_OUT}/{name}/publication.json"


def placeholders(name):
    """What a study's declared paths and commands may name: its results folder (`out`), its code's folder, the
    embedded grid's folders, its own grid's and its settings (a list of options shell-quoted)."""
    values = {"name": name, "out": f"{STUDY_OUT}/{name}", "folder": str(STUDY_ROOT / STUDIES[name].folder),
              "results": RESULTS, "tables": TABLES, "figures": FIGURES, "per_model_tables": per_model_tables(),
              "train_benchmarks": train_benchmarks()}
    if name in GRIDS:
        grid = GRIDS[name]
        values.update(grid=grid.RESULTS, grid_figures=grid.FIGURES, grid_configs=GRID_CONFIGS[name],
                      grid_targets=grid.all_targets(), grid_train_benchmarks=grid.train_benchmarks())
    clash = sorted(set(STUDY_SETTINGS[name]) & (set(values) | SNAKEMAKE_NAMES) - {"grid"})
    if clash:
        raise WorkflowError(f"{STUDIES[name].folder}/study.yaml: settings {clash} take names the workflow fills; "
                            f"taken: {', '.join(sorted(set(values) | SNAKEMAKE_NAMES))}")
    return {**{k: v for k, v in STUDY_SETTINGS[name].items() if k != "grid"}, **values}


def filled(text, values, where, wildcards=()):
    """`text` with the declaration's placeholders filled (a list joined as shell words); Snakemake's own and the
    study's cell wildcards left as they are."""

    def one(match):
        key = match.group(1)
        if key in values:
            value = values[key]
            return value if isinstance(value, str) else shlex.join(value)
        if key in SNAKEMAKE_NAMES or key in wildcards:
            return match.group(0)
        raise WorkflowError(f"{where}: unknown placeholder {match.group(0)} in {text!r}; known: "
                            f"{', '.join(sorted([*values, *wildcards]))} and Snakemake's {', '.join(sorted(SNAKEMAKE_NAMES))}")

    return PLACEHOLDER.sub(one, text)


def paths(entries, values, where, wildcards=()):
    """Declared paths as a list: a placeholder naming a list is that list, a `*` a glob of committed files."""
    found = []
    for entry in [entries] if isinstance(entries, str) else entries:
        whole = PLACEHOLDER.fullmatch(entry)
        if whole and isinstance(values.get(whole.group(1)), list):
            found += values[whole.group(1)]
            continue
        path = filled(entry, values, where, wildcards)
        found += sorted(glob.glob(path)) if "*" in path else [path]
    return found


def every_cell(path_list, cells):
    """Each path once per combination of the study's cells (an engine x architecture map's, say)."""
    combinations = [dict(zip(cells, values)) for values in itertools.product(*cells.values())]
    return list(dict.fromkeys(PLACEHOLDER.sub(lambda m: combination.get(m[1], m[0]), path)
                              for combination in combinations for path in path_list))


def step_output(key, path, how):
    """A declared output: a folder where its path ends in a separator, the step's flag, or a file."""
    if path.endswith(os.sep):
        return directory(path.rstrip(os.sep))
    return touch(path) if key == how.get("flag") else path


def step_rule(name, step, how, values, cells):
    """One declared step's rule, NAME_STEP. A function: its command is read again when its job runs, and a
    loop's variable would hold the last step's by then."""
    at = f"{STUDIES[name].folder}/study.yaml: steps.{step}"
    log_as = how.get("log_as", step)
    if runs := how.get("runs"):  # a step of several runs gets them one after the other as {runs}
        values = {**values, "runs": " && ".join(
            filled(runs["then"] if i else runs["first"], {**values, "run": options}, at, cells)
            for i, options in enumerate(values[runs["setting"]]))}
    command = filled(how["shell"], values, at, cells)
    # threads `all`: every core where the studies run exclusive, else one; a number: that many, capped the same way
    threads = how.get("threads", 1)

    rule:
        name:
            f"{name}_{step}"
        input:
            **{key: paths(path, values, at, cells) for key, path in how.get("input", {}).items()},
        output:
            **{key: step_output(key, filled(path, values, at, cells), how) for key, path in how["output"].items()},
        log:
            f"{STUDY_OUT}/{name}/logs/{log_as}.log",
        benchmark:
            f"{STUDY_OUT}/{name}/benchmarks/{log_as}.tsv"
        wildcard_constraints:
            **{wildcard: "|".join(re.escape(v) for v in allowed) for wildcard, allowed in cells.items()},
        threads: EXCLUSIVE_THREADS if threads == "all" else min(threads, EXCLUSIVE_THREADS)
        params:
            # the filled command as a param: other settings (studies.options) rerun the step, not only its publication
            command=lambda wildcards, text=command: text,
        conda:
            CPU_ENV
        shell:
            command


def publish_rule(name, steps, values, cells):
    """The study's publishing rule, NAME: what it waits for, its machine, its jobs' benchmarks."""
    how = STUDIES[name].workflow["publish"]
    at = f"{STUDIES[name].folder}/study.yaml: publish"
    # unless declared: its grid's training cells' (where it has one) and each step's
    logs = [h.get("log_as", step) for step, h in steps.items()]
    grid = ["{grid_train_benchmarks}"] if name in GRIDS else []
    benchmarks = [path for entry in how.get("benchmarks", grid + logs)
                  for path in (every_cell([f"{STUDY_OUT}/{name}/benchmarks/{entry}.tsv"], cells) if entry in logs
                               else paths(entry, values, at))]

    rule:
        name:
            name
        input:
            # a grid study waits for its whole grid, as the grid's default target makes it
            data=every_cell(paths(how.get("inputs", how["sources"]), values, at, cells), cells)
            + values.get("grid_targets", []),
            machine=filled(how.get("machine", "{grid}/machine.json" if grid else "{out}/machine.json"), values, at),
            benchmarks=benchmarks,
        output:
            report(published(name), caption="../report/published.rst", category="Published"),
        log:
            f"{STUDY_OUT}/{name}/logs/publish.log",
        params:
            name=name,
            sources=paths(how["sources"], values, at),
            globs=shlex.join(["--include", *how["include"]]) if how.get("include") else "",
            command=shlex.quote(f"snakemake --cores N {name}" + (f" --config 'studies={{options: {{{name}: "
                                 f"{json.dumps(OPTIONS[name])}}}}}'" if name in OPTIONS else "")),
        conda:
            CPU_ENV
        shell:
            PUBLISH_SHELL


PUBLISH_SHELL = ("python -m studies publish {params.name} --source {params.sources} {params.globs}"
                 " --command {params.command} --machine {input.machine} --benchmark {input.benchmarks}"
                 " --record {output} > {log} 2>&1"
                 + (" && python -m studies pages >> {log} 2>&1" if STUDY_RUN["pages"] else ""))
