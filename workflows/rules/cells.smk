# What one training cell reads (its staged model, verl backend) and the scheduler resources it gets:
# the model's `resources` in model_specs, else the config's resources.train; one node per cell
# unless the model asks for more (nnodes).
import verlrun.models as staging


def staged_model_input(wildcards):
    """The staged model a verl cell reads: downloaded or built here ({} for the local backend or a
    local `path`)."""
    if BACKEND != "verl" or not staging.needs_staging(config, wildcards.model):
        return {}
    return {"hf_model": str(staging.local_path(config, wildcards.model))}


def cell_inputs(wildcards):
    return {**train_inputs(wildcards), **staged_model_input(wildcards)}


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
    return settings.verl_settings(config, wildcards.model)["nnodes"]
