# The experiment grid: data -> (warm start) -> one training job per cell -> tables -> figures.
#   snakemake --cores N                                   the embedded default (experiments/tiny.yaml)
#   snakemake --configfile experiments/paper.yaml --workflow-profile profiles/slurm
#   snakemake --cores 1 figures_only                      figures from existing logs; never trains
#   snakemake --report results/<profile>/report.html      a browsable report of figures and tables
from snakemake.utils import min_version

min_version("9.0")


report: "workflows/report/workflow.rst"


# tiny.yaml is the default only: a --configfile replaces it instead of being merged into it.
if not workflow.config_settings.configfiles:

    configfile: "experiments/tiny.yaml"


include: "workflows/rules/common.smk"
include: "workflows/rules/data.smk"
include: "workflows/rules/warmstart.smk"
include: "workflows/rules/train.smk"
include: "workflows/rules/collect.smk"
include: "workflows/rules/plots.smk"
include: "workflows/rules/probe.smk"
include: "workflows/rules/studies.smk"
include: "workflows/rules/pages.smk"


rule all:
    default_target: True
    input:
        all_targets(),
