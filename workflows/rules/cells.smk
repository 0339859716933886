# Scheduler resources of one training cell: the model's `resources` in model_specs, else the
# config's resources.train. One node per cell unless the model asks for more (nnodes).


def _cell_resource(name):
    def value(wildcards):
        spec = config["model_specs"][wildcards.model].get("resources") or {}
        return spec.get(name, train_resources()[name])

    return value


cell_runtime = _cell_resource("runtime")
cell_mem_mb = _cell_resource("mem_mb")


def cell_nodes(wildcards):
    if BACKEND != "verl":
        return 1
    spec = config["model_specs"][wildcards.model]
    return int(spec.get("nnodes", (config.get("verl") or {}).get("nnodes", 1)))
