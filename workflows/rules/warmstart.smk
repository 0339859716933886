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
    threads: 1
    conda:
        CPU_ENV
    shell:
        configured(
            "python -m localrl warmstart --config $RLA_CONFIG --model {wildcards.model}"
            " --data {params.data} --out {output} > {log} 2>&1"
        )
