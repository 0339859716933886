"""pytest plugin: transformers' own Qwen2 / Qwen3 model tests under an alignment spec.

`make test-transformers-models TRANSFORMERS_SRC=<checkout>` (tests/upstream/run_models.py) runs
`tests/models/qwen2` and `tests/models/qwen3` of a transformers source checkout once per spec with
this plugin loaded (`-p rla_upstream_plugin`, tests/upstream on PYTHONPATH). The suite's environment
and its installed transformers run the tests; the checkout gives only its `tests` package. This file
is not a test module (no `test_` prefix): the suite's own `pytest` never collects it.

Options: `--rla-spec` (an ablation or regions, as `patches.apply` takes it; default "none", stock),
`--rla-target` (default "vllm") and `--rla-outcomes PATH`, a JSON file {test id: passed | failed |
skipped | differs} written at the end: a test fails if any of its phases or subtests fails (an error in setup
counts as a failure), is skipped if its setup or call is skipped, and passes otherwise (a test whose
subtests all skip passes, as pytest counts it).

Every change this plugin makes to transformers' harness, for every spec (stock included):

1. The spec is applied at session start with the public API: `patches.apply(spec, target=...)`,
   which patches transformers' Qwen2/Qwen3 classes for the whole session (and, while regions are
   applied, checks every model with decoder layers where it is built, as it does everywhere).
2. The model testers' activation: their default `hidden_act="gelu"` becomes "silu", the activation
   Qwen ships and the swiglu region requires. Where the default lives depends on the release:
   `transformers.testing_utils._TEXT_MODEL_TESTER_DEFAULTS["hidden_act"]` (read by
   `CausalLMModelTester.__init__` in recent checkouts), else the `hidden_act` keyword default of
   `CausalLMModelTester.__init__` or of a tester class in the collected Qwen test modules. A tester
   that passes `hidden_act` explicitly keeps it.
3. The checkout's conftest.py files are not loaded (`--noconftest`, given by the runner): the root
   one puts the checkout's `src/` on `sys.path`. What the tests need from it is done here: the
   markers it registers, and `DISABLE_SAFETENSORS_CONVERSION=true`. The checkout's pytest settings
   (pyproject.toml) are not read either (`-c /dev/null`).
4. No network: `HF_HUB_OFFLINE=1`, so a test that downloads from the Hub fails at once.
5. A checkout older than the installed release may import a name the release no longer has
   (`transformers.integrations.tensor_parallel._get_parameter_tp_plan`, gone in 5.19): the plugin
   defines such a name as a stand-in that raises `NotImplementedError` when called, so the module
   imports and only the tests calling it fail, on every spec alike. Nothing is filled in where the
   release has the name. (Processes a test spawns import the checkout's modules without this plugin:
   there the import still fails, as it does for stock.)
6. Outside this file, in the runner: `parameterized`, which transformers' tests import, comes from
   `.cache/transformers-models/deps` on PYTHONPATH (the make target installs it there, not in .venv),
   and pytest runs with one worker (`-p no:xdist`) and without its cache (`-p no:cacheprovider`).

7. Where an aligned region is meant to differ from transformers, the test that checks the difference is
   marked a stated difference (`STATED_DIFFERENCES`: `xfail`, strict) under every spec with that region:
   it counts as `differs`, not as a failure, and a pass fails it (the stated difference is gone).

The session refuses to start (pytest UsageError) if `transformers` would be imported from the
checkout instead of the suite's environment.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("DISABLE_SAFETENSORS_CONVERSION", "true")

# the markers transformers' root conftest.py and pyproject.toml register
MARKERS = ("slow", "is_pipeline_test", "is_staging_test", "accelerate_tests", "not_device_test", "torch_compile_test",
           "torch_export_test", "flash_attn_test", "flash_attn_3_test", "flash_attn_4_test", "all_flash_attn_test",
           "training_ci", "tensor_parallel_ci", "fsdp_ci", "bitsandbytes", "generate", "is_training_test",
           "is_tensor_parallel_test", "is_fsdp_test")

# (module, name) the checkout's tests may import that the installed release may lack
MOVED_NAMES = (("transformers.integrations.tensor_parallel", "_get_parameter_tp_plan"),)

_stand_ins: list[str] = []
_outcomes: dict[str, str] = {}
_testers: list[str] = []


def pytest_addoption(parser):
    group = parser.getgroup("rla", "rounding alignment applied to transformers' own tests")
    group.addoption("--rla-spec", default="none", help="alignment spec for patches.apply (none = stock)")
    group.addoption("--rla-target", default="vllm", help="alignment target for patches.apply")
    group.addoption("--rla-outcomes", default=None, help="write {test id: outcome} as JSON to this file")


def _stand_in(module: str, name: str):
    import transformers

    def missing(*args, **kwargs):
        raise NotImplementedError(f"{module}.{name} is not in the installed transformers {transformers.__version__}; "
                                  "the checkout's tests are of another release")

    missing.__name__ = name
    return missing


def pytest_configure(config):
    for marker in MARKERS:
        config.addinivalue_line("markers", f"{marker}: registered by transformers' conftest.py / pyproject.toml")

    import importlib

    import transformers

    location = Path(transformers.__file__).resolve()
    rootdir = Path(str(config.rootpath)).resolve()
    if rootdir in location.parents:
        raise pytest.UsageError(f"transformers is imported from the checkout ({location}), not from the suite's "
                                f"environment; run the tests with the suite's .venv/bin/python")

    for module_name, name in MOVED_NAMES:
        module = importlib.import_module(module_name)
        if not hasattr(module, name):
            setattr(module, name, _stand_in(module_name, name))
            _stand_ins.append(f"{module_name}.{name}")

    import transformers.testing_utils as testing_utils

    defaults = getattr(testing_utils, "_TEXT_MODEL_TESTER_DEFAULTS", None)
    if isinstance(defaults, dict) and defaults.get("hidden_act") == "gelu":
        defaults["hidden_act"] = "silu"
        _testers.append("transformers.testing_utils._TEXT_MODEL_TESTER_DEFAULTS")

    import patches

    spec = config.getoption("--rla-spec")
    target = config.getoption("--rla-target")
    regions = patches.apply(spec, target=target)
    config._rla = dict(spec=spec, target=target, regions=",".join(sorted(regions)) or "none",
                       transformers=f"{transformers.__version__} at {location.parent}")


def pytest_report_header(config):
    rla = getattr(config, "_rla", None)
    if rla is None:
        return None
    lines = [f"rounding alignment: spec {rla['spec']!r} -> regions {rla['regions']} (target {rla['target']})",
             f"transformers {rla['transformers']}"]
    if _stand_ins:
        lines.append("stand-ins for names the installed release lacks: " + ", ".join(_stand_ins))
    return lines


def _silu_default(cls) -> bool:
    """Set the default of `hidden_act` in cls.__init__ (defined on cls itself) from "gelu" to "silu"."""
    init = cls.__dict__.get("__init__")
    if init is None or not inspect.isfunction(init) or not init.__defaults__:
        return False
    code = init.__code__
    positional = code.co_varnames[:code.co_argcount]
    if "hidden_act" not in positional:
        return False
    index = positional.index("hidden_act") - (len(positional) - len(init.__defaults__))
    if index < 0 or init.__defaults__[index] != "gelu":
        return False
    defaults = list(init.__defaults__)
    defaults[index] = "silu"
    init.__defaults__ = tuple(defaults)
    return True


# (region, test name) -> why the aligned region differs from transformers there (docs/patches.md)
STATED_DIFFERENCES = {
    ("rope", "test_model_rope_scaling_from_config_1_dynamic"):
        "the aligned dynamic NTK RoPE fixes its base once from the config, as vLLM's "
        "DynamicNTKScalingRotaryEmbedding does; transformers grows it with the input's length",
}


def pytest_collection_modifyitems(session, config, items):
    rla = getattr(config, "_rla", None)
    regions = set(rla["regions"].split(",")) if rla else set()
    for item in items:
        for (region, name), why in STATED_DIFFERENCES.items():
            if region in regions and item.name == name:
                item.add_marker(pytest.mark.xfail(strict=True, reason=f"stated difference ({region}): {why}"))
    modules = {item.module for item in items if getattr(item, "module", None) is not None}
    tester = sys.modules.get("tests.causal_lm_tester")
    if tester is not None:
        modules.add(tester)
    for module in sorted(modules, key=lambda m: m.__name__):
        for name, cls in sorted(vars(module).items()):
            if inspect.isclass(cls) and cls.__module__ == module.__name__ and name.endswith("Tester"):
                if _silu_default(cls):
                    _testers.append(f"{module.__name__}.{name}")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    rla = getattr(config, "_rla", None)
    if rla is None:
        return
    terminalreporter.write_line(
        f"rounding alignment: spec {rla['spec']!r} (regions {rla['regions']}, target {rla['target']}); "
        f"hidden_act default gelu -> silu in: {', '.join(_testers) or 'none'}")


def pytest_runtest_logreport(report):
    subtest = hasattr(report, "context")  # a SubtestReport: its failure fails the test, its skip does not
    if report.failed:
        _outcomes[report.nodeid] = "failed"
    elif _outcomes.get(report.nodeid) == "failed" or subtest:
        return
    elif report.skipped and hasattr(report, "wasxfail"):  # a stated difference held
        _outcomes[report.nodeid] = "differs"
    elif report.skipped and report.when in ("setup", "call"):
        _outcomes[report.nodeid] = "skipped"
    elif report.passed and report.when == "call":
        _outcomes[report.nodeid] = "passed"


def pytest_sessionfinish(session, exitstatus):
    path = session.config.getoption("--rla-outcomes")
    if path:
        Path(path).write_text(json.dumps(_outcomes, indent=0, sort_keys=True))
