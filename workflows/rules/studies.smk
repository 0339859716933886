# The studies (studies/; docs/running.md, "The studies"): each one a target named after it that measures,
# reports and publishes what the docs quote into studies/<name>/published/ with a provenance.json; `studies`
# runs them all. Never part of the default target (`make run`): publishing writes tracked files, a run must not.


localrules:
    studies,


rule studies:
    input:
        [published(name) for name in STUDIES],


# --- the measurements: the embedded default grid's, the studies that are grids of their own, and the
# studies with a measurement of their own


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


rule study_grid:
    input:
        lambda wildcards: GRID_FILES_BY_RESULTS[wildcards.results],
    output:
        summary="{results}/tables/summary.csv",
        stability="{results}/tables/stability.csv",
        machine="{results}/machine.json",
    log:
        "{results}/logs/study_grid.log",
    benchmark:
        "{results}/logs/study_grid.tsv"
    wildcard_constraints:
        results="|".join(re.escape(r) for r in GRID_FILES_BY_RESULTS),
    threads: workflow.cores
    conda:
        CPU_ENV
    # --nolock: this run holds the lock on the study's files; the inner one writes nothing else
    shell:
        "python -m studies machine > {output.machine}; "
        "snakemake --nolock --cores {threads} --configfile {input} > {log} 2>&1"


# the studies with a measurement of their own: MEASURED (common.smk)
for name, (study, result, cores) in MEASURED.items():

    rule:
        name:
            f"{name}_measure"
        output:
            result=measured(name) if Path(result).suffix else directory(measured(name)),
            machine=study_machine(name),
        log:
            study_log(name, "measure"),
        benchmark:
            study_benchmark(name, "measure")
        params:
            study=study,
            options=shlex.join(STUDY_SETTINGS[name]),
        threads: cores
        conda:
            CPU_ENV
        shell:
            "python -m studies run {params.study} --machine {output.machine} {params.options} --out {output.result}"
            " > {log} 2>&1"


rule scaling_measure:
    output:
        measured=directory(f"{STUDY_OUT}/scaling/measure"),
        machine=study_machine("scaling"),
    log:
        study_log("scaling", "measure"),
    benchmark:
        study_benchmark("scaling", "measure")
    params:
        # one run per entry of the settings, each adding its points to the tables of the ones before
        runs=lambda wildcards, output: " && ".join(
            f"python -m studies run scaling {shlex.join(options)} --out {output.measured}"
            + (" --append" if i else f" --machine {output.machine}")
            for i, options in enumerate(STUDY_SETTINGS["scaling"])),
    threads: 1
    conda:
        CPU_ENV
    shell:
        "({params.runs}) > {log} 2>&1"


rule treatments_cost:
    input:
        grid=f"{grid_tables('treatments')}/summary.csv",
        configs=GRID_CONFIGS["treatments"],
    output:
        f"{STUDY_OUT}/treatments/cost.json",
    log:
        study_log("treatments", "cost"),
    benchmark:
        study_benchmark("treatments", "cost")
    params:
        results=lambda wildcards, input: os.path.dirname(os.path.dirname(input.grid)),
        options=shlex.join(STUDY_SETTINGS["treatments_cost"]),
    threads: 1
    conda:
        CPU_ENV
    shell:
        "python -m studies run treatments --results {params.results} --config {input.configs} {params.options}"
        " --out {output} > {log} 2>&1"


# The plan's points are measured one after the other and a measured point is kept: an interrupted run
# resumes where it stopped (studies/gradprobe/plan.py), so the step's output is a flag, not the folder.
# rope_lead is the gradient probe's HA4 again: its plan through the same steps.
for name in ("gradprobe", "rope_lead"):

    rule:
        name:
            f"{name}_measure"
        input:
            STUDY_SETTINGS[name],
        output:
            done=touch(f"{STUDY_OUT}/{name}/points/plan.done"),
            machine=study_machine(name),
        log:
            study_log(name, "measure"),
        benchmark:
            study_benchmark(name, "measure")
        threads: 1
        conda:
            CPU_ENV
        shell:
            "python -m studies run gradprobe --machine {output.machine} --plan {input} --out $(dirname {output.done})"
            " > {log} 2>&1"

    rule:
        name:
            f"{name}_report"
        input:
            plan=STUDY_SETTINGS[name],
            done=f"{STUDY_OUT}/{name}/points/plan.done",
        output:
            table=f"{STUDY_OUT}/{name}/points/hypotheses.csv",
            report=f"{STUDY_OUT}/{name}/points/report.md",
        log:
            study_log(name, "report"),
        benchmark:
            study_benchmark(name, "report")
        conda:
            CPU_ENV
        shell:
            "python -m studies report gradprobe --plan {input.plan} --out $(dirname {output.table})"
            " > {output.report} 2> {log}"


# Each engine's graphs for each architecture at one of tinyqwen.models.REAL_SHAPES (default `tiny`: 4 layers).
# Exit status 1 is the map's verdict "differs from the target" - recorded in the JSON, not a failed job.
ROUNDMAP = STUDY_SETTINGS["roundmap"]
ROUNDMAP_CELLS = [f"{engine}-{arch}" for engine in ROUNDMAP["engines"] for arch in ROUNDMAP["archs"]]


rule roundmap_measure:
    output:
        f"{STUDY_OUT}/roundmap/maps/{{engine}}-{{arch}}.json",
    log:
        study_log("roundmap", "{engine}-{arch}"),
    benchmark:
        study_benchmark("roundmap", "{engine}-{arch}")
    params:
        shape=ROUNDMAP["shape"],
        layers=f"--layers {ROUNDMAP['layers']}" if ROUNDMAP.get("layers") else "",
    wildcard_constraints:
        engine="local|vllm|vllm-gpu-split",
        arch="qwen2|qwen3",
    threads: 1
    conda:
        CPU_ENV
    shell:
        "python -m studies run roundmap --engine {wildcards.engine} --arch {wildcards.arch} --shape {params.shape} {params.layers}"
        " --json {output} > {log} 2>&1 || [ $? -eq 1 ]"


rule roundmap_machine:
    output:
        study_machine("roundmap"),
    log:
        study_log("roundmap", "machine"),
    conda:
        CPU_ENV
    shell:
        "python -m studies machine > {output} 2> {log}"


# --- the reports: `python -m studies report NAME` on what was measured (no torch: tables and figures)


# the grid's headline, of the embedded default grid, of it with another attention on the training side
# (rl.trainer_attention) and of verl's own trainer on this CPU, from the table each waits for: the embedded
# grid's metrics, the others' summary
HEADLINE_INPUTS = {"tiny": f"{TABLES}/metrics.parquet", "tiny_sdpa": f"{grid_tables('tiny_sdpa')}/summary.csv",
                   "tiny_amx": f"{grid_tables('tiny_amx')}/summary.csv",
                   "verl_cpu": f"{grid_tables('verl_cpu')}/summary.csv"}
for name, table in HEADLINE_INPUTS.items():

    rule:
        name:
            f"{name}_report"
        input:
            table,
        output:
            f"{STUDY_OUT}/{name}/report/headline.csv",
        log:
            study_log(name, "report"),
        benchmark:
            study_benchmark(name, "report")
        params:
            name=name,
        conda:
            CPU_ENV
        shell:
            "python -m studies report {params.name} --tables $(dirname {input}) --out $(dirname {output}) > {log} 2>&1"


# studies that read a result file (--result) or a folder of tables (--tables) into a folder of their own
READ_REPORTS = {name: ("--result", measured(name)) for name in ("depth", "leftover", "trace")}
READ_REPORTS["scaling"] = ("--tables", f"{STUDY_OUT}/scaling/measure")
for name, (source, read) in READ_REPORTS.items():

    rule:
        name:
            f"{name}_report"
        input:
            read,
        output:
            directory(f"{STUDY_OUT}/{name}/report"),
        log:
            study_log(name, "report"),
        benchmark:
            study_benchmark(name, "report")
        params:
            name=name,
            source=source,
        conda:
            CPU_ENV
        shell:
            "python -m studies report {params.name} {params.source} {input} --out {output} > {log} 2>&1"


rule geo_rs_report:
    input:
        grid=f"{grid_tables('geo_rs')}/stability.csv",
        configs=GRID_CONFIGS["geo_rs"],
    output:
        checks=f"{STUDY_OUT}/geo_rs/report/stall_checks.csv",
        runs=f"{STUDY_OUT}/geo_rs/report/stall_runs.csv",
    params:
        runs=f"{GRID_RESULTS['geo_rs']}/runs",
    log:
        study_log("geo_rs", "report"),
    benchmark:
        study_benchmark("geo_rs", "report")
    conda:
        CPU_ENV
    shell:
        "python -m studies report geo_rs --config {input.configs} --runs {params.runs}"
        " --out $(dirname {output.checks}) > {log} 2>&1"


rule calibration_report:
    input:
        stability=f"{grid_tables('calibration')}/stability.csv",
        configs=GRID_CONFIGS["calibration"],
    output:
        text=f"{STUDY_OUT}/calibration/report/calibration.txt",
        tables=[f"{STUDY_OUT}/calibration/report/{name}.csv" for name in ("calibration", "alternatives")],
    params:
        runs=f"{GRID_RESULTS['calibration']}/runs",
    log:
        study_log("calibration", "report"),
    benchmark:
        study_benchmark("calibration", "report")
    conda:
        CPU_ENV
    shell:
        "python -m studies report calibration --stability {input.stability} --config {input.configs}"
        " --runs {params.runs} --out $(dirname {output.text}) > {output.text} 2> {log}"


rule treatments_report:
    input:
        grid=f"{grid_tables('treatments')}/summary.csv",
        cost=rules.treatments_cost.output[0],
    output:
        f"{STUDY_OUT}/treatments/report/treatments.csv",
    params:
        tables=lambda wildcards, input: os.path.dirname(input.grid),
    log:
        study_log("treatments", "report"),
    benchmark:
        study_benchmark("treatments", "report")
    conda:
        CPU_ENV
    shell:
        "python -m studies report treatments --tables {params.tables} --bench {input.cost}"
        " --out $(dirname {output}) > {log} 2>&1"


# The GPU check: measured on a GPU machine by benchmarks/gpu_check.sh (no Snakemake there), its runs
# committed in studies/gpu_check/runs/; the DAG turns them into tables.
GPU_CHECK_RUNS = Path(sys.modules["studies"].__file__).parent / "gpu_check" / "runs"  # beside the code that reads them
GPU_CHECK_TABLES = [f"{STUDY_OUT}/gpu_check/report/{t}.csv" for t in ("runs", "fused", "model", "checks", "regions")]


rule gpu_check_report:
    input:
        sorted(GPU_CHECK_RUNS.glob("*/summary.json")),
    output:
        tables=GPU_CHECK_TABLES,
        machine=study_machine("gpu_check"),
    log:
        study_log("gpu_check", "report"),
    benchmark:
        study_benchmark("gpu_check", "report")
    params:
        runs=GPU_CHECK_RUNS,
    conda:
        CPU_ENV
    shell:
        "python -m studies report gpu_check --machine {output.machine} --runs {params.runs} --out $(dirname {output.tables[0]}) > {log} 2>&1"


# --- publishing: per study, what it waits for, where its measuring machine and benchmarks are, and what
# it copies into its tracked folder (globs of the sources' files; a file source is copied as it is)


GRID_TABLES = ["summary.*", "stability.csv"]
PUBLISHING = {
    "tiny": dict(inputs=[f"{TABLES}/summary.csv", f"{TABLES}/stability.csv", f"{STUDY_OUT}/tiny/report/headline.csv"],
                 machine=f"{RESULTS}/machine.json", benchmarks=train_benchmarks(),
                 sources=[TABLES, FIGURES, f"{STUDY_OUT}/tiny/report"],
                 globs=["summary.csv", "summary.md", "stability.csv", "metrics.parquet", "headline.*"]
                 + [f"{figure}.png" for figure in FIGURE_NAMES]),
    "probe": dict(inputs=probe_figure_targets(), machine=f"{RESULTS}/machine.json", benchmarks=[],  # no benchmark
                  sources=[f"{RESULTS}/probe", TABLES, FIGURES],
                  globs=["*/*.csv", "*/probe.json", "probe*.csv", "probe*.md", "probe_*.png"]),
    "stress": of_grid("stress", [], [], GRID_TABLES + ["probe_*", "*.png"]),
    **{name: of_grid(name, ["report"], [f"{STUDY_OUT}/{name}/report"],
                     GRID_TABLES + ["metrics.parquet", "headline.*", "*.png"],
                     inputs=[f"{STUDY_OUT}/{name}/report/headline.csv"]) for name in ("tiny_sdpa", "tiny_amx", "verl_cpu")},
    "geo_rs": of_grid("geo_rs", ["report"], [f"{STUDY_OUT}/geo_rs/report"], GRID_TABLES + ["stall_*.csv", "*.png"],
                      inputs=rules.geo_rs_report.output),
    "calibration": of_grid("calibration", ["report"], [f"{STUDY_OUT}/calibration/report"],
                           GRID_TABLES + ["calibration.txt", "calibration.csv", "alternatives.csv", "*.png"],
                           inputs=rules.calibration_report.output),
    "treatments": dict(of_grid("treatments", ["cost", "report"], [], []),
                       inputs=[*rules.treatments_report.output, f"{grid_tables('treatments')}/stability.csv"],
                       # the report's table, the cost and per run what the collapse rule saw
                       sources=[f"{STUDY_OUT}/treatments/report", *rules.treatments_cost.output,
                                f"{grid_tables('treatments')}/stability.csv"]),
    "scaling": own("scaling", ["measure", "report"], [f"{STUDY_OUT}/scaling/measure", f"{STUDY_OUT}/scaling/report"],
                   ["*.csv", "*.md", "*.png"]),
    **{name: own(name, ["measure", "report"], [f"{STUDY_OUT}/{name}/points"],
                 ["*.csv", "*.json", "*.md", "*/no_signal.txt"], inputs=[f"{STUDY_OUT}/{name}/points/hypotheses.csv"])
       for name in ("gradprobe", "rope_lead")},
    "vllm_alignment": own("vllm_alignment", ["measure"], [measured("vllm_alignment")]),
    "kernels": own("kernels", ["measure"], [measured("kernels")]),
    "engine_tables": own("engine_tables", ["measure"], [measured("engine_tables")], ["*.csv"]),
    **{name: own(name, ["measure", "report"], [measured(name), f"{STUDY_OUT}/{name}/report"], ["*.csv", "*.png"])
       for name in ("depth", "leftover", "trace")},
    "roundmap": dict(own("roundmap", ROUNDMAP_CELLS, [f"{STUDY_OUT}/roundmap/maps"]),
                     inputs=[f"{STUDY_OUT}/roundmap/maps/{cell}.json" for cell in ROUNDMAP_CELLS]),
    "gpu_check": dict(own("gpu_check", ["report"], [f"{STUDY_OUT}/gpu_check/report"]), inputs=GPU_CHECK_TABLES),
}


for name, how in PUBLISHING.items():

    rule:
        name:
            name
        input:
            data=how["inputs"],
            machine=how["machine"],
            benchmarks=how["benchmarks"],
        output:
            report(published(name), caption="../report/published.rst", category="Published"),
        log:
            study_log(name, "publish"),
        params:
            **publish_params(name, how["sources"], how["globs"]),
        conda:
            CPU_ENV
        shell:
            PUBLISH_SHELL
