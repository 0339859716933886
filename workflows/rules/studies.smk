# The studies (studies/; docs/running.md, "The studies"): each one a target named after it that measures,
# reports and publishes what the docs quote into its published/ folder with a provenance.json; `studies`
# runs them all. Never part of the default target (`make run`): publishing writes tracked files, a run must not.
# Every rule here is made from the studies' declarations (studies/NAME/study.yaml): a rule per step, NAME_STEP,
# and a publish rule, NAME.
include: "declarations.smk"


# A grid study (settings.grid) is the grid (workflows/rules/grid.smk) on its config files, later ones laid over
# earlier ones: a module of this workflow with its own config and $RLA_CONFIG, its rules named after its
# results_dir (rule train of results/NAME: NAME_grid_train). Studies whose configs name the same
# results_dir share one module, on the config files of the first study that names it.
GRIDS = {}  # per grid study, its module's names (RESULTS, FIGURES, all_targets(), ...)
_by_results = {}
for _name, _files in GRID_CONFIGS.items():
    _config = settings.load_all(_files)
    _results = str(layout.results_dir(_config))
    if _results not in _by_results:
        _module = re.sub(r"\W", "_", Path(_results).name) + "_grid"
        workflow.module(_module, snakefile=os.path.join(workflow.basedir, "workflows/rules/grid.smk"), config=_config)
        workflow.userule(rules=["*"], from_module=_module, name_modifier=f"{_module}_*")(None)
        _by_results[_results] = globals()[_module]
    GRIDS[_name] = _by_results[_results]


localrules:
    studies,


rule studies:
    input:
        [published(name) for name in STUDIES],


# --- each study's steps (its measurement and its report: `python -m studies run/report NAME ...`), then its
# publish step: what it waits for, where its measuring machine and benchmarks are, and what it copies into its
# tracked folder (globs of the sources' files; a file source is copied as it is)


def step_rule(name, step, how, values, cells):
    """One declared step's rule, NAME_STEP. A function: its command is read again when its job runs, and a
    loop's variable would hold the last step's by then."""
    at = f"{STUDIES[name].folder}/study.yaml: steps.{step}"
    log_as = how.get("log_as", step)
    command = step_command(how, values, at, cells)

    rule:
        name:
            f"{name}_{step}"
        input:
            **{key: paths(path, values, at, cells) for key, path in how.get("input", {}).items()},
        output:
            **{key: step_output(key, filled(path, values, at, cells), how) for key, path in how["output"].items()},
        log:
            study_log(name, log_as),
        benchmark:
            study_benchmark(name, log_as)
        wildcard_constraints:
            **{wildcard: "|".join(re.escape(v) for v in allowed) for wildcard, allowed in cells.items()},
        threads: step_threads(how.get("threads", 1))
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
                  for path in (every_cell([study_benchmark(name, entry)], cells) if entry in logs
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
            study_log(name, "publish"),
        params:
            name=name,
            sources=paths(how["sources"], values, at),
            globs=shlex.join(["--include", *how["include"]]) if how.get("include") else "",
            command=shlex.quote(f"snakemake --cores N {name}"),
        conda:
            CPU_ENV
        shell:
            PUBLISH_SHELL


for name, study in STUDIES.items():
    values = placeholders(name)
    cells = {wildcard: STUDY_SETTINGS[name][key] for wildcard, key in study.workflow.get("cells", {}).items()}
    steps = study.workflow.get("steps", {})
    for step, how in steps.items():
        step_rule(name, step, how, values, cells)
    publish_rule(name, steps, values, cells)
