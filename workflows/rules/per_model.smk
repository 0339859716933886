# Local backend: the studies the grid runs on each of its (warm-started) models, where its config turns them
# on (`NAME: true`), each declared by its study.yaml's `per_model:`; then their tables across models.


def per_model_rules(name, how):
    """The study's NAME_model and NAME_figures rules. A function: a rule's command is read again when its
    job runs, and a loop's variable would hold the last study's (or a grid module's) by then."""
    measure = configured(per_model_command(how["measure"], name) + " > {log} 2>&1")
    tables = per_model_command(how["report"], name) + " > {log} 2>&1"

    rule:
        name:
            f"{name}_model"
        input:
            model=str(layout.model_dir(config, "{model}")),
            test=f"{DATA}/test.parquet",
        output:
            directory(f"{RESULTS}/{name}/{{model}}"),
        log:
            f"{LOGS}/{name}/{{model}}.log",
        conda:
            CPU_ENV
        shell:
            measure

    rule:
        name:
            f"{name}_figures"
        input:
            lambda wildcards: per_model_targets(name),
        output:
            report(f"{TABLES}/{how['table']}", caption=str(STUDY_ROOT / STUDIES[name].folder / how["caption"]),
                   category=name.title()),
        log:
            f"{LOGS}/{name}_figures.log",
        localrule: True  # light: where Snakemake runs, as the other figures rules (grid.smk)
        conda:
            CPU_ENV
        shell:
            tables


for _study, _declared in PER_MODEL.items():
    per_model_rules(_study, _declared)
