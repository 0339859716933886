# What one training cell reads (its staged model, verl backend) and the scheduler resources it gets:
# the model's `resources` in model_specs, else the config's resources.train; one node per cell
# unless the model asks for more (nnodes).
import verlrun.models as staging


def cell_inputs(wildcards):
    """The data, and the cell's model: warm-started (local backend) or staged, downloaded or built here
    (verl backend; none for a local `path`)."""
    inputs = {"train": f"{DATA}/train.parquet", "test": f"{DATA}/test.parquet"}
    if BACKEND == "local":
        inputs["model"] = str(layout.model_dir(config, wildcards.model))
    elif staging.needs_staging(config, wildcards.model):
        inputs["hf_model"] = str(staging.local_path(config, wildcards.model))
    return inputs


def _cell_resource(name):
    def value(wildcards):
        spec = config["model_specs"][wildcards.model].get("resources") or {}
        return spec.get(name, TRAIN_RESOURCES[name])

    return value


cell_runtime = _cell_resource("runtime")
cell_mem_mb = _cell_resource("mem_mb")


def cell_nodes(wildcards):
    if BACKEND != "verl":
        return 1
    return settings.verl_settings(config, wildcards.model)["nnodes"]
