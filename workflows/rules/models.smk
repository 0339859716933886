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
        configured(
            "python -m verlrun stage-model --config $RLA_CONFIG --model {wildcards.model} > {log} 2>&1"
        )
