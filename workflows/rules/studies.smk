# The studies (studies/; docs/running.md, "The studies"): each one a target named after it that measures,
# reports and publishes what the docs quote into its published/ folder with a provenance.json; `studies`
# runs them all. Never part of the default target (`make run`): publishing writes tracked files, a run must not.
# Every rule here is made from the studies' declarations (studies/NAME/study.yaml; declarations.smk): a rule
# per step, NAME_STEP, and a publishing rule, NAME.
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


rule studies:
    input:
        [published(name) for name in STUDIES],
    localrule: True


# each study's steps (its measurement and its report: `python -m studies run/report NAME ...`), then its
# publishing step: what it waits for, where its measuring machine and benchmarks are, and what it copies into
# its tracked folder (globs of the sources' files; a file source is copied as it is)
for name, study in STUDIES.items():
    values = placeholders(name)
    cells = {wildcard: STUDY_SETTINGS[name][key] for wildcard, key in study.workflow.get("cells", {}).items()}
    steps = study.workflow.get("steps", {})
    for step, how in steps.items():
        step_rule(name, step, how, values, cells)
    publish_rule(name, steps, values, cells)
