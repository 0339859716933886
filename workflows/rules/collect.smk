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
    conda:
        CPU_ENV
    shell:
        configured(
            "python -m analysis stability --runs {params.runs} --config $RLA_CONFIG --out {output} > {log} 2>&1"
        )
