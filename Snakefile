# The experiment grid (workflows/rules/grid.smk): data -> (warm start) -> one training job per cell -> tables ->
# figures; and the studies (workflows/rules/studies.smk). How to run it: docs/running.md.
from snakemake.utils import min_version

min_version("9.0")


report: "workflows/report/workflow.rst"


# tiny.yaml is the default only: a --configfile replaces it instead of being merged into it.
if not workflow.config_settings.configfiles:

    configfile: "experiments/tiny.yaml"


include: "workflows/rules/grid.smk"
include: "workflows/rules/studies.smk"


rule all:
    default_target: True
    input:
        all_targets(),
