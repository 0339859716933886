# Local backend: the studies the grid runs on each of its (warm-started) models, where its config turns them
# on (`NAME: true`), each declared by its study.yaml's `per_model:`; then their tables across models.


for _name, _how in PER_MODEL.items():

    rule:
        name:
            f"{_name}_model"
        input:
            model=str(layout.model_dir(config, "{model}")),
            test=f"{DATA}/test.parquet",
        output:
            directory(f"{RESULTS}/{_name}/{{model}}"),
        log:
            f"{LOGS}/{_name}/{{model}}.log",
        threads: 1
        conda:
            CPU_ENV
        shell:
            configured(per_model_command(_how["measure"], _name) + " > {log} 2>&1")

    rule:
        name:
            f"{_name}_figures"
        input:
            lambda wildcards, name=_name: per_model_targets(name),
        output:
            report(f"{TABLES}/{_how['table']}", caption=str(STUDY_ROOT / STUDIES[_name].folder / _how["caption"]),
                   category=_name.title()),
        log:
            f"{LOGS}/{_name}_figures.log",
        localrule: True  # light: where Snakemake runs, as the other figures rules (plots.smk)
        conda:
            CPU_ENV
        shell:
            per_model_command(_how["report"], _name) + " > {log} 2>&1"
