# Local backend: per-region numerics of each (warm-started) model, training side vs engine.


rule probe:
    input:
        model=f"{RESULTS}/models/{{model}}",
    output:
        directory(f"{RESULTS}/probe/{{model}}"),
    params:
        config=CONFIG_FILE,
    log:
        f"{LOGS}/probe/{{model}}.log",
    threads: 1
    conda:
        CPU_ENV
    shell:
        "python -m localrl probe --config {params.config} --model {wildcards.model} --out {output} > {log} 2>&1"
