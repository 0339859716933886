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
    conda:
        TRAIN_ENV
    shell:
        configured(
            "python -m {params.module} prepare-data --config $RLA_CONFIG --out {params.out} > {log} 2>&1"
        )
