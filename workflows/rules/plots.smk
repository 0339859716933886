# Figures (PNG + PDF in figures/<profile>/) and the model x ablation summary table; all of them go
# into `snakemake --cores 1 --report results/<profile>/report.html` with their captions (workflows/report/).

FIGURE_NAMES = ["score", "mismatch", "dynamics", "collapse_heatmap"]


# Light jobs run where Snakemake runs (on a cluster: the login node, which can also download data).
localrules:
    prepare_data,
    collect,
    stability,
    plots,
    figures_only,


rule plots:
    input:
        grid_metrics(),
    output:
        summary=report(f"{TABLES}/summary.csv", caption="../report/summary.rst", category="Tables"),
        summary_md=f"{TABLES}/summary.md",
        figures=[
            report(f"{FIGURES}/{name}.png", caption=f"../report/{name}.rst", category="Figures")
            for name in FIGURE_NAMES
        ],
        pdfs=[f"{FIGURES}/{name}.pdf" for name in FIGURE_NAMES],
    params:
        runs=lambda wildcards, input: runs_root(input[0]),
        figures=lambda wildcards, output: os.path.dirname(output.figures[0]),
        tables=lambda wildcards, output: os.path.dirname(output.summary),
        collapse=config.get("collapse"),
    log:
        f"{LOGS}/plots.log",
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
