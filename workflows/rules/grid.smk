# The experiment grid on one config: data -> (warm start) -> one training job per cell -> tables -> figures,
# the per-model studies, the machine it ran on (all_targets()). The Snakefile runs it on its config; each grid study runs it
# as a module on the study's config files (workflows/rules/studies.smk).


include: "common.smk"
include: "data.smk"
include: "warmstart.smk"
include: "train.smk"
include: "collect.smk"
include: "plots.smk"
include: "per_model.smk"


rule grid_machine:
    input:
        grid_metrics(),
    output:
        f"{RESULTS}/machine.json",
    log:
        f"{LOGS}/machine.log",
    conda:
        CPU_ENV
    shell:
        "python -m studies machine > {output} 2> {log}"
