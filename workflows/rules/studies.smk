# The studies (studies/): each one a target named after it that measures it, reports it and publishes
# what the docs quote into studies/<name>/published/ with a provenance.json (studies/provenance.py).
#   snakemake --cores N scaling          one study, end to end (`python -m studies list` names them all)
#   snakemake --cores N studies          all of them (make studies)
# Never part of the default target (`make run`): publishing writes tracked files, a run must not.
# Working files go to results/studies/<name>/ (each job's log, benchmark and the measuring machine, and
# publication.json: the target's own output, a copy of the provenance record it published).


localrules:
    studies,


rule studies:
    input:
        [published(name) for name in STUDIES],


# --- the embedded default grid's headline and its probe (the grid of `make run`, then published)


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


rule tiny_report:
    input:
        f"{TABLES}/metrics.parquet",
    output:
        f"{STUDY_OUT}/tiny/report/headline.csv",
    log:
        study_log("tiny", "report"),
    conda:
        CPU_ENV
    shell:
        "python -m studies report tiny --tables $(dirname {input}) --out $(dirname {output}) > {log} 2>&1"


rule tiny:
    input:
        tables=[f"{TABLES}/summary.csv", f"{TABLES}/stability.csv", f"{TABLES}/metrics.parquet"],
        headline=rules.tiny_report.output[0],
        machine=f"{RESULTS}/machine.json",
        benchmarks=train_benchmarks(),
    output:
        report(published("tiny"), caption="../report/published.rst", category="Published"),
    log:
        study_log("tiny", "publish"),
    conda:
        CPU_ENV
    shell:
        publish_shell("tiny", [TABLES, FIGURES, f"{STUDY_OUT}/tiny/report"],
                      ["summary.csv", "summary.md", "stability.csv", "metrics.parquet", "headline.*"]
                      + [f"{name}.png" for name in FIGURE_NAMES])


rule probe:
    input:
        tables=probe_figure_targets(),
        machine=f"{RESULTS}/machine.json",
        benchmarks=[],  # the probe's jobs keep no benchmark file
    output:
        report(published("probe"), caption="../report/published.rst", category="Published"),
    log:
        study_log("probe", "publish"),
    conda:
        CPU_ENV
    shell:
        publish_shell("probe", [f"{RESULTS}/probe", TABLES, FIGURES],
                      ["*/*.csv", "*/probe.json", "probe*.csv", "probe*.md", "probe_*.png"])


# --- studies that are grids of their own


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
    shell:
        "python -m studies machine > {output.machine}; "
        "snakemake --nolock --cores {threads} --configfile {input} > {log} 2>&1"


rule stress:
    input:
        tables=f"{grid_tables('stress')}/summary.csv",
        machine=f"{GRID_RESULTS['stress']}/machine.json",
        benchmarks=[f"{GRID_RESULTS['stress']}/logs/study_grid.tsv"],
    output:
        report(published("stress"), caption="../report/published.rst", category="Published"),
    log:
        study_log("stress", "publish"),
    conda:
        CPU_ENV
    shell:
        publish_shell("stress", [grid_tables("stress"), GRID_FIGURES["stress"]],
                      ["summary.*", "stability.csv", "probe_*", "*.png"])


# The embedded default grid with another attention on the training side (rl.trainer_attention), one study
# each: its grid, the tiny grid's headline of it, published. A shell command is formatted when its job
# runs, after the loop: what it needs of the loop's variable comes through params.
for attention_grid in ("tiny_sdpa", "tiny_amx"):

    rule:
        name:
            f"{attention_grid}_report"
        input:
            f"{grid_tables(attention_grid)}/summary.csv",
        output:
            f"{STUDY_OUT}/{attention_grid}/report/headline.csv",
        log:
            study_log(attention_grid, "report"),
        benchmark:
            study_benchmark(attention_grid, "report")
        conda:
            CPU_ENV
        params:
            name=attention_grid,
        shell:
            "python -m studies report {params.name} --tables $(dirname {input}) --out $(dirname {output}) > {log} 2>&1"

    rule:
        name:
            attention_grid
        input:
            tables=f"{grid_tables(attention_grid)}/summary.csv",
            headline=f"{STUDY_OUT}/{attention_grid}/report/headline.csv",
            machine=f"{GRID_RESULTS[attention_grid]}/machine.json",
            benchmarks=[f"{GRID_RESULTS[attention_grid]}/logs/study_grid.tsv", study_benchmark(attention_grid, "report")],
        output:
            report(published(attention_grid), caption="../report/published.rst", category="Published"),
        log:
            study_log(attention_grid, "publish"),
        conda:
            CPU_ENV
        params:
            name=attention_grid,
            sources=" ".join([grid_tables(attention_grid), GRID_FIGURES[attention_grid],
                              f"{STUDY_OUT}/{attention_grid}/report"]),
        shell:
            publish_shell("{params.name}", ["{params.sources}"],
                          ["summary.*", "stability.csv", "metrics.parquet", "headline.*", "*.png"])


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


rule geo_rs:
    input:
        checks=rules.geo_rs_report.output.checks,
        machine=f"{GRID_RESULTS['geo_rs']}/machine.json",
        benchmarks=[f"{GRID_RESULTS['geo_rs']}/logs/study_grid.tsv"]
        + [study_benchmark("geo_rs", s) for s in ("report",)],
    output:
        report(published("geo_rs"), caption="../report/published.rst", category="Published"),
    log:
        study_log("geo_rs", "publish"),
    conda:
        CPU_ENV
    shell:
        publish_shell("geo_rs", [grid_tables("geo_rs"), GRID_FIGURES["geo_rs"], f"{STUDY_OUT}/geo_rs/report"],
                      ["summary.*", "stability.csv", "stall_*.csv", "*.png"])


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


rule calibration:
    input:
        text=rules.calibration_report.output.text,
        tables=rules.calibration_report.output.tables,
        machine=f"{GRID_RESULTS['calibration']}/machine.json",
        benchmarks=[f"{GRID_RESULTS['calibration']}/logs/study_grid.tsv"]
        + [study_benchmark("calibration", s) for s in ("report",)],
    output:
        report(published("calibration"), caption="../report/published.rst", category="Published"),
    log:
        study_log("calibration", "publish"),
    conda:
        CPU_ENV
    shell:
        publish_shell("calibration", [grid_tables("calibration"), GRID_FIGURES["calibration"],
                                      f"{STUDY_OUT}/calibration/report"],
                      ["summary.*", "stability.csv", "calibration.txt", "calibration.csv", "alternatives.csv",
                       "*.png"])


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


rule treatments:
    input:
        table=rules.treatments_report.output[0],
        stability=f"{grid_tables('treatments')}/stability.csv",  # per run: what the collapse rule saw
        machine=f"{GRID_RESULTS['treatments']}/machine.json",
        benchmarks=[f"{GRID_RESULTS['treatments']}/logs/study_grid.tsv"]
        + [study_benchmark("treatments", s) for s in ("cost", "report")],
    output:
        report(published("treatments"), caption="../report/published.rst", category="Published"),
    log:
        study_log("treatments", "publish"),
    conda:
        CPU_ENV
    shell:
        publish_shell("treatments", [f"{STUDY_OUT}/treatments/report", f"{STUDY_OUT}/treatments/cost.json",
                                     "{input.stability}"])


# --- studies with a measurement of their own


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


rule scaling_report:
    input:
        rules.scaling_measure.output.measured,
    output:
        directory(f"{STUDY_OUT}/scaling/report"),
    log:
        study_log("scaling", "report"),
    benchmark:
        study_benchmark("scaling", "report")
    conda:
        CPU_ENV
    shell:
        "python -m studies report scaling --tables {input} --out {output} > {log} 2>&1"


rule scaling:
    input:
        measured=rules.scaling_measure.output.measured,
        reported=rules.scaling_report.output[0],
        machine=rules.scaling_measure.output.machine,
        benchmarks=[study_benchmark("scaling", s) for s in ("measure", "report")],
    output:
        report(published("scaling"), caption="../report/published.rst", category="Published"),
    log:
        study_log("scaling", "publish"),
    conda:
        CPU_ENV
    shell:
        publish_shell("scaling", ["{input.measured}", "{input.reported}"], ["*.csv", "*.md", "*.png"])


# The plan's points are measured one after the other and a measured point is kept: an interrupted run
# resumes where it stopped (studies/gradprobe/plan.py), so the step's output is a flag, not the folder.
rule gradprobe_measure:
    input:
        STUDY_SETTINGS["gradprobe"],
    output:
        done=touch(f"{STUDY_OUT}/gradprobe/points/plan.done"),
        machine=study_machine("gradprobe"),
    log:
        study_log("gradprobe", "measure"),
    benchmark:
        study_benchmark("gradprobe", "measure")
    threads: 1
    conda:
        CPU_ENV
    shell:
        "python -m studies run gradprobe --machine {output.machine} --plan {input} --out $(dirname {output.done}) > {log} 2>&1"


rule gradprobe_report:
    input:
        plan=STUDY_SETTINGS["gradprobe"],
        done=rules.gradprobe_measure.output.done,
    output:
        table=f"{STUDY_OUT}/gradprobe/points/hypotheses.csv",
        report=f"{STUDY_OUT}/gradprobe/points/report.md",
    log:
        study_log("gradprobe", "report"),
    benchmark:
        study_benchmark("gradprobe", "report")
    conda:
        CPU_ENV
    shell:
        "python -m studies report gradprobe --plan {input.plan} --out $(dirname {output.table})"
        " > {output.report} 2> {log}"


rule gradprobe:
    input:
        table=rules.gradprobe_report.output.table,
        machine=study_machine("gradprobe"),
        benchmarks=[study_benchmark("gradprobe", s) for s in ("measure", "report")],
    output:
        report(published("gradprobe"), caption="../report/published.rst", category="Published"),
    log:
        study_log("gradprobe", "publish"),
    conda:
        CPU_ENV
    shell:
        publish_shell("gradprobe", [f"{STUDY_OUT}/gradprobe/points"],
                      ["*.csv", "*.json", "*.md", "*/no_signal.txt"])


# --- the gradient probe's HA4 again (studies/rope_lead): its plan through the gradient probe's steps


use rule gradprobe_measure as rope_lead_measure with:
    input:
        STUDY_SETTINGS["rope_lead"],
    output:
        done=touch(f"{STUDY_OUT}/rope_lead/points/plan.done"),
        machine=study_machine("rope_lead"),
    log:
        study_log("rope_lead", "measure"),
    benchmark:
        study_benchmark("rope_lead", "measure")


use rule gradprobe_report as rope_lead_report with:
    input:
        plan=STUDY_SETTINGS["rope_lead"],
        done=rules.rope_lead_measure.output.done,
    output:
        table=f"{STUDY_OUT}/rope_lead/points/hypotheses.csv",
        report=f"{STUDY_OUT}/rope_lead/points/report.md",
    log:
        study_log("rope_lead", "report"),
    benchmark:
        study_benchmark("rope_lead", "report")


rule rope_lead:
    input:
        table=rules.rope_lead_report.output.table,
        machine=study_machine("rope_lead"),
        benchmarks=[study_benchmark("rope_lead", s) for s in ("measure", "report")],
    output:
        report(published("rope_lead"), caption="../report/published.rst", category="Published"),
    log:
        study_log("rope_lead", "publish"),
    conda:
        CPU_ENV
    shell:
        publish_shell("rope_lead", [f"{STUDY_OUT}/rope_lead/points"], ["*.csv", "*.json", "*.md", "*/no_signal.txt"])


rule vllm_alignment_measure:
    output:
        result=f"{STUDY_OUT}/vllm_alignment/vllm_alignment.json",
        machine=study_machine("vllm_alignment"),
    log:
        study_log("vllm_alignment", "measure"),
    benchmark:
        study_benchmark("vllm_alignment", "measure")
    params:
        options=shlex.join(STUDY_SETTINGS["vllm_alignment"]),
    threads: min(2, EXCLUSIVE_THREADS)
    conda:
        CPU_ENV
    shell:
        "python -m studies run vllm_alignment --machine {output.machine} {params.options} --out {output.result} > {log} 2>&1"


rule vllm_alignment:
    input:
        result=rules.vllm_alignment_measure.output.result,
        machine=study_machine("vllm_alignment"),
        benchmarks=[study_benchmark("vllm_alignment", "measure")],
    output:
        report(published("vllm_alignment"), caption="../report/published.rst", category="Published"),
    log:
        study_log("vllm_alignment", "publish"),
    conda:
        CPU_ENV
    shell:
        publish_shell("vllm_alignment", ["{input.result}"])


# Each engine's graphs for each architecture at one of localrl.models.REAL_SHAPES (default `tiny`: 4 layers). Exit status 1
# is the map's verdict "differs from the target" - recorded in the JSON, not a failed job.
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


rule roundmap:
    input:
        maps=[f"{STUDY_OUT}/roundmap/maps/{cell}.json" for cell in ROUNDMAP_CELLS],
        machine=study_machine("roundmap"),
        benchmarks=[study_benchmark("roundmap", cell) for cell in ROUNDMAP_CELLS],
    output:
        report(published("roundmap"), caption="../report/published.rst", category="Published"),
    log:
        study_log("roundmap", "publish"),
    conda:
        CPU_ENV
    shell:
        publish_shell("roundmap", [f"{STUDY_OUT}/roundmap/maps"])


# --- the GPU check: measured on a GPU machine by benchmarks/gpu_check.sh (no Snakemake there), its runs
# committed in studies/gpu_check/runs/; the DAG turns them into tables and publishes them


GPU_CHECK_RUNS = Path(sys.modules["studies"].__file__).parent / "gpu_check" / "runs"  # beside the code that reads them


rule gpu_check_report:
    input:
        sorted(GPU_CHECK_RUNS.glob("*/summary.json")),
    output:
        tables=[f"{STUDY_OUT}/gpu_check/report/{t}.csv" for t in ("runs", "fused", "model", "checks", "regions",
                                                                   "repeats")],
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


rule gpu_check:
    input:
        tables=rules.gpu_check_report.output.tables,
        machine=rules.gpu_check_report.output.machine,
        benchmarks=[study_benchmark("gpu_check", "report")],
    output:
        report(published("gpu_check"), caption="../report/published.rst", category="Published"),
    log:
        study_log("gpu_check", "publish"),
    conda:
        CPU_ENV
    shell:
        publish_shell("gpu_check", [f"{STUDY_OUT}/gpu_check/report"])


# --- the aligned regions' cost (benchmarks/bench_regions.py): a timing, so run it on an otherwise idle machine


rule kernels_measure:
    output:
        record=f"{STUDY_OUT}/kernels/measure/regions.json",
        machine=study_machine("kernels"),
    log:
        study_log("kernels", "measure"),
    benchmark:
        study_benchmark("kernels", "measure")
    params:
        options=shlex.join(STUDY_SETTINGS["kernels"]),
    threads: EXCLUSIVE_THREADS  # the timings want the machine to themselves
    conda:
        CPU_ENV
    shell:
        "python -m studies run kernels --machine {output.machine} {params.options} --out {output.record} > {log} 2>&1"


rule kernels:
    input:
        record=rules.kernels_measure.output.record,
        machine=rules.kernels_measure.output.machine,
        benchmarks=[study_benchmark("kernels", "measure")],
    output:
        report(published("kernels"), caption="../report/published.rst", category="Published"),
    log:
        study_log("kernels", "publish"),
    conda:
        CPU_ENV
    shell:
        publish_shell("kernels", ["{input.record}"])


# --- the patches against vLLM-CPU along a depth ladder and at the paper models' widths (studies/depth)


rule depth_measure:
    output:
        result=f"{STUDY_OUT}/depth/depth.json",
        machine=study_machine("depth"),
    log:
        study_log("depth", "measure"),
    benchmark:
        study_benchmark("depth", "measure")
    params:
        options=shlex.join(STUDY_SETTINGS["depth"]),
    threads: EXCLUSIVE_THREADS  # the engine and the scoring share the machine with nothing else
    conda:
        CPU_ENV
    shell:
        "python -m studies run depth --machine {output.machine} {params.options} --out {output.result} > {log} 2>&1"


rule depth_report:
    input:
        rules.depth_measure.output.result,
    output:
        directory(f"{STUDY_OUT}/depth/report"),
    log:
        study_log("depth", "report"),
    benchmark:
        study_benchmark("depth", "report")
    conda:
        CPU_ENV
    shell:
        "python -m studies report depth --result {input} --out {output} > {log} 2>&1"


rule depth:
    input:
        result=rules.depth_measure.output.result,
        reported=rules.depth_report.output[0],
        machine=rules.depth_measure.output.machine,
        benchmarks=[study_benchmark("depth", s) for s in ("measure", "report")],
    output:
        report(published("depth"), caption="../report/published.rst", category="Published"),
    log:
        study_log("depth", "publish"),
    conda:
        CPU_ENV
    shell:
        publish_shell("depth", ["{input.result}", "{input.reported}"], ["*.csv", "*.png"])


# --- what `all` leaves at the goal depth, by component (studies/leftover): the depth measurement with
# vLLM-CPU's own kernels swapped into the training side one at a time


use rule depth_measure as leftover_measure with:
    output:
        result=f"{STUDY_OUT}/leftover/depth.json",
        machine=study_machine("leftover"),
    log:
        study_log("leftover", "measure"),
    benchmark:
        study_benchmark("leftover", "measure")
    params:
        options=shlex.join(STUDY_SETTINGS["leftover"]),


rule leftover_report:
    input:
        rules.leftover_measure.output.result,
    output:
        directory(f"{STUDY_OUT}/leftover/report"),
    log:
        study_log("leftover", "report"),
    benchmark:
        study_benchmark("leftover", "report")
    conda:
        CPU_ENV
    shell:
        "python -m studies report leftover --result {input} --out {output} > {log} 2>&1"


rule leftover:
    input:
        result=rules.leftover_measure.output.result,
        reported=rules.leftover_report.output[0],
        machine=rules.leftover_measure.output.machine,
        benchmarks=[study_benchmark("leftover", s) for s in ("measure", "report")],
    output:
        report(published("leftover"), caption="../report/published.rst", category="Published"),
    log:
        study_log("leftover", "publish"),
    conda:
        CPU_ENV
    shell:
        publish_shell("leftover", ["{input.result}", "{input.reported}"], ["*.csv", "*.png"])


# --- layer by layer against vLLM-CPU: where the two sides first differ (studies/trace)


rule trace_measure:
    output:
        result=f"{STUDY_OUT}/trace/trace.json",
        machine=study_machine("trace"),
    log:
        study_log("trace", "measure"),
    benchmark:
        study_benchmark("trace", "measure")
    params:
        options=shlex.join(STUDY_SETTINGS["trace"]),
    threads: EXCLUSIVE_THREADS  # the engine and the scoring share the machine with nothing else
    conda:
        CPU_ENV
    shell:
        "python -m studies run trace --machine {output.machine} {params.options} --out {output.result} > {log} 2>&1"


rule trace_report:
    input:
        rules.trace_measure.output.result,
    output:
        directory(f"{STUDY_OUT}/trace/report"),
    log:
        study_log("trace", "report"),
    benchmark:
        study_benchmark("trace", "report")
    conda:
        CPU_ENV
    shell:
        "python -m studies report trace --result {input} --out {output} > {log} 2>&1"


rule trace:
    input:
        result=rules.trace_measure.output.result,
        reported=rules.trace_report.output[0],
        machine=rules.trace_measure.output.machine,
        benchmarks=[study_benchmark("trace", s) for s in ("measure", "report")],
    output:
        report(published("trace"), caption="../report/published.rst", category="Published"),
    log:
        study_log("trace", "publish"),
    conda:
        CPU_ENV
    shell:
        publish_shell("trace", ["{input.result}", "{input.reported}"], ["*.csv", "*.png"])


# --- target auto against the engine it reads, per vLLM-CPU configuration (patches/engine_table.py)


rule engine_tables_measure:
    output:
        measured=directory(f"{STUDY_OUT}/engine_tables/measure"),
        machine=study_machine("engine_tables"),
    log:
        study_log("engine_tables", "measure"),
    benchmark:
        study_benchmark("engine_tables", "measure")
    params:
        options=shlex.join(STUDY_SETTINGS["engine_tables"]),
    threads: EXCLUSIVE_THREADS  # the engine's throughput wants the machine to itself
    conda:
        CPU_ENV
    shell:
        "python -m studies run engine_tables --machine {output.machine} {params.options} --out {output.measured} > {log} 2>&1"


rule engine_tables:
    input:
        measured=rules.engine_tables_measure.output.measured,
        machine=rules.engine_tables_measure.output.machine,
        benchmarks=[study_benchmark("engine_tables", "measure")],
    output:
        report(published("engine_tables"), caption="../report/published.rst", category="Published"),
    log:
        study_log("engine_tables", "publish"),
    conda:
        CPU_ENV
    shell:
        publish_shell("engine_tables", ["{input.measured}"], ["*.csv"])
