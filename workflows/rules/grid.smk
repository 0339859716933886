# The experiment grid on one config: data -> (warm start) -> one training job per cell -> tables -> figures,
# the per-model studies, the machine it ran on (all_targets()). The Snakefile runs it on its config; each grid study runs it
# as a module on the study's config files (workflows/rules/studies.smk).


include: "common.smk"


# Problems in verl's parquet schema: generated (local backend) or converted (verl backend).
rule prepare_data:
    output:
        train=f"{DATA}/train.parquet",
        test=f"{DATA}/test.parquet",
    params:
        module=BACKEND_MODULE,
        settings=config.get("data") if BACKEND == "verl" else config.get("task"),  # what the data depends on
        out=lambda wildcards, output: os.path.dirname(output.train),
    log:
        f"{LOGS}/prepare_data/{PROFILE}.log",
    localrule: True  # light jobs run where Snakemake runs (on a cluster: the login node, which can also download data)
    conda:
        TRAIN_ENV
    shell:
        configured("python -m {params.module} prepare-data --config $RLA_CONFIG --out {params.out} > {log} 2>&1")


# Local backend only: a short supervised warm start gives each tiny model a non-trivial policy.
rule warmstart:
    input:
        train=f"{DATA}/train.parquet",
        test=f"{DATA}/test.parquet",
    output:
        directory(str(layout.model_dir(config, "{model}"))),
    params:
        spec=lambda wildcards: config["model_specs"][wildcards.model],
        settings=config.get("warmstart"),
        data=lambda wildcards, input: os.path.dirname(input.train),
    log:
        f"{LOGS}/warmstart/{{model}}.log",
    conda:
        CPU_ENV
    shell:
        configured(
            "python -m localrl warmstart --config $RLA_CONFIG --model {wildcards.model}"
            " --data {params.data} --out {output} > {log} 2>&1"
        )


# Verl backend: each Hub model downloaded once, at its pinned revision, into verl.models_dir (or, for
# a model with `build:`, built there); the cells read that copy with the Hub offline. Runs where
# Snakemake runs (a login node with internet).
rule stage_model:
    output:
        directory(f"{staging.models_dir(config)}/{{model}}"),
    params:
        source=lambda wildcards: staging.hub_source(config, wildcards.model) or staging.build_spec(config, wildcards.model),
    log:
        f"{LOGS}/stage_model/{{model}}.log",
    localrule: True
    conda:
        TRAIN_ENV
    shell:
        configured("python -m verlrun stage-model --config $RLA_CONFIG --model {wildcards.model} > {log} 2>&1")


# One grid cell per job; the only place that chooses a backend (localrl or verlrun).
rule train:
    input:
        unpack(cell_inputs),
    output:
        f"{RUNS}/{{model}}/{{ablation}}/seed{{seed}}/metrics.jsonl",
    params:
        module=BACKEND_MODULE,
        steps=config["steps"],
        settings=lambda wildcards: cell_settings(wildcards.model),
        out=lambda wildcards, output: os.path.dirname(output[0]),
        data=lambda wildcards, input: f"--data {os.path.dirname(input.train)}" if BACKEND == "verl" else "",
    log:
        f"{LOGS}/train/{{model}}/{{ablation}}/seed{{seed}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/train/{{model}}/{{ablation}}/seed{{seed}}.tsv"
    threads: TRAIN_RESOURCES["threads"]
    resources:
        gpu=train_gpus,
        nodes=cell_nodes,
        runtime=cell_resource("runtime"),
        mem_mb=cell_resource("mem_mb"),
    conda:
        TRAIN_ENV
    # exec: the trainer is the job's process, so a SIGTERM to the job (Snakemake stopped, a scheduler's
    # preemption) reaches it with no shell left to die first, and Snakemake waits for its checkpoint.
    shell:
        configured(
            "exec python -m {params.module} train --config $RLA_CONFIG --model {wildcards.model}"
            " --ablation {wildcards.ablation} --seed {wildcards.seed} --out {params.out}"
            " --steps {params.steps} {params.data} > {log} 2>&1"
        )


# Tables over all cells of the grid (analysis reads logs only, never a backend).
rule collect:
    input:
        grid_metrics(),
    output:
        f"{TABLES}/metrics.parquet",
    params:
        runs=lambda wildcards, input: runs_root(input[0]),
    log:
        f"{LOGS}/collect.log",
    localrule: True
    conda:
        CPU_ENV
    shell:
        "python -m analysis collect --runs {params.runs} --out {output} > {log} 2>&1"


rule stability:
    input:
        grid_metrics(),
    output:
        report(f"{TABLES}/stability.csv", caption="../report/stability.rst", category="Tables"),
    params:
        runs=lambda wildcards, input: runs_root(input[0]),
        collapse=config.get("collapse"),
    log:
        f"{LOGS}/stability.log",
    localrule: True
    conda:
        CPU_ENV
    shell:
        configured("python -m analysis stability --runs {params.runs} --config $RLA_CONFIG --out {output} > {log} 2>&1")


# Figures (PNG + PDF in figures/<profile>/) and the model x ablation summary table; all of them go
# into `snakemake --cores 1 --report results/<profile>/report.html` with their captions (workflows/report/).
FIGURE_NAMES = ["score", "mismatch", "dynamics", "collapse_heatmap"]


rule plots:
    input:
        grid_metrics(),
    output:
        summary=report(f"{TABLES}/summary.csv", caption="../report/summary.rst", category="Tables"),
        summary_md=f"{TABLES}/summary.md",
        figures=[report(f"{FIGURES}/{name}.png", caption=f"../report/{name}.rst", category="Figures")
                 for name in FIGURE_NAMES],
        pdfs=[f"{FIGURES}/{name}.pdf" for name in FIGURE_NAMES],
    params:
        runs=lambda wildcards, input: runs_root(input[0]),
        figures=lambda wildcards, output: os.path.dirname(output.figures[0]),
        tables=lambda wildcards, output: os.path.dirname(output.summary),
        collapse=config.get("collapse"),
    log:
        f"{LOGS}/plots.log",
    localrule: True
    conda:
        CPU_ENV
    shell:
        configured(
            "python -m analysis plots --runs {params.runs} --config $RLA_CONFIG"
            " --out {params.figures} --tables {params.tables} > {log} 2>&1"
        )


# Figures from whatever cells (and per-model studies) exist, e.g. logs copied from a cluster. No inputs, so
# no edit of code or config can make it schedule training: `snakemake --cores 1 figures_only`.
rule figures_only:
    params:
        runs=RUNS,
        figures=FIGURES,
        tables=TABLES,
    log:
        f"{LOGS}/figures_only.log",
    localrule: True
    conda:
        CPU_ENV
    shell:
        configured(
            "(python -m analysis all --runs {params.runs} --config $RLA_CONFIG"
            " --tables {params.tables} --figures {params.figures}"
            + "".join(f" && if [ -d {RESULTS}/{name} ]; then {per_model_command(how['report'], name)}; fi"
                      for name, how in PER_MODEL.items())
            + ") 2>&1 | tee {log}"
        )


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
