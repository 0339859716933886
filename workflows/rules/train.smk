# One grid cell per job; the only place that chooses a backend (localrl or verlrun).


include: "models.smk"


rule train:
    input:
        unpack(cell_inputs),
    output:
        f"{RUNS}/{{model}}/{{ablation}}/seed{{seed}}/metrics.jsonl",
    params:
        module=BACKEND_MODULE,
        steps=config["steps"],
        settings=lambda wildcards: cell_settings(wildcards.model),
        out=lambda wildcards, output: os.path.dirname(output[0]),
        data=lambda wildcards, input: f"--data {os.path.dirname(input.train)}" if BACKEND == "verl" else "",
    log:
        f"{LOGS}/train/{{model}}/{{ablation}}/seed{{seed}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/train/{{model}}/{{ablation}}/seed{{seed}}.tsv"
    threads: TRAIN_RESOURCES["threads"]
    resources:
        gpu=train_gpus,
        nodes=cell_nodes,
        runtime=cell_runtime,
        mem_mb=cell_mem_mb,
    conda:
        TRAIN_ENV
    # exec: the trainer is the job's process, so a SIGTERM to the job (Snakemake stopped, a scheduler's
    # preemption) reaches it with no shell left to die first, and Snakemake waits for its checkpoint.
    shell:
        configured(
            "exec python -m {params.module} train --config $RLA_CONFIG --model {wildcards.model}"
            " --ablation {wildcards.ablation} --seed {wildcards.seed} --out {params.out}"
            " --steps {params.steps} {params.data} > {log} 2>&1"
        )
