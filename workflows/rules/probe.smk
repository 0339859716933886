# Local backend: per-region numerics of each (warm-started) model, training side vs engine.


rule probe_model:
    input:
        model=str(layout.model_dir(config, "{model}")),
        test=f"{DATA}/test.parquet",
    output:
        directory(f"{RESULTS}/probe/{{model}}"),
    log:
        f"{LOGS}/probe/{{model}}.log",
    threads: 1
    conda:
        CPU_ENV
    shell:
        configured(
            "python -m studies run probe --config $RLA_CONFIG --model {wildcards.model} --out {output} > {log} 2>&1"
        )


# The probe's tables across models and its figures (reads the probe CSV files only).
rule probe_figures:
    input:
        lambda wildcards: probe_targets(),
    output:
        report(f"{TABLES}/probe_subsets.csv", caption="../report/probe.rst", category="Probe"),
    params:
        probe=f"{RESULTS}/probe",
        figures=FIGURES,
        tables=lambda wildcards, output: os.path.dirname(output[0]),
    log:
        f"{LOGS}/probe_figures.log",
    conda:
        CPU_ENV
    shell:
        "python -m studies report probe --probe {params.probe} --out {params.figures} --tables {params.tables} > {log} 2>&1"
