import os

import pytest
import torch

os.environ.setdefault("WANDB_MODE", "disabled")
# The cores shared among pytest-xdist's workers (`make test` runs one per core): a second thread waiting on a
# core another worker keeps busy makes small ops many times slower.
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, min(2, (os.cpu_count() or 1) // WORKERS)))
# Another vector ISA on this machine (`make test-isa`): ATEN_CPU_CAPABILITY=avx2 picks ATen's kernels,
# RLA_INDUCTOR_SIMDLEN=256 Inductor's generated code (applied by `import localrl`).
import localrl  # noqa: E402,F401
from localrl.inductor_isa_check import remember_isa_checks  # noqa: E402

remember_isa_checks()  # Inductor's ISA checks loaded once per machine, not in every worker
# Past its recompile limit a compiled function silently runs eagerly, and a fused-vs-eager comparison
# would compare eager with itself: make that an error.
torch._dynamo.config.fail_on_recompile_limit_hit = True
# Each width is its own kernel (static widths), and the tests use many widths per region function.
torch._dynamo.config.recompile_limit = 64


@pytest.hookimpl(trylast=True)  # after -m has deselected: only the tests that will run count
def pytest_collection_modifyitems(config, items):
    """Files holding a `slow` test first: pytest-xdist hands out work in this order (whole files with
    `--dist loadfile`; the first two to each worker, then one at a time, with `loadgroup`), so the
    longest start early and a run does not end on one busy worker."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)


@pytest.fixture(autouse=True)
def _stock_transformers():
    """Every test starts and ends with stock transformers."""
    import patches

    patches.remove()
    yield
    patches.remove()


CONDA_STAND_IN = """#!/bin/sh
# Answers the questions Snakemake asks conda while planning (a dry run creates no environment).
case "$*" in
  --version) echo "conda 24.11.0";;
  "info --json") echo '{"conda_version": "24.11.0", "platform": "linux-64", "conda_prefix": "/opt/conda", "root_prefix": "/opt/conda", "envs_dirs": [], "pkgs_dirs": []}';;
  "config --get channel_priority --json") echo '{"get": {"channel_priority": "strict"}}';;
  *) echo "conda stand-in cannot: $*" >&2; exit 1;;
esac
"""


@pytest.fixture
def conda_on_path(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "conda").write_text(CONDA_STAND_IN)
    (bin_dir / "conda").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


@pytest.fixture(scope="session")
def warm_model(tmp_path_factory, worker_id):
    """One warm-started tiny model and its data for every test that needs one (tests/vllm_setup.py), built
    once per run: among pytest-xdist's workers the first to ask builds it, the others wait and read it."""
    from filelock import FileLock

    from tests.vllm_setup import build

    if worker_id == "master":
        return build(tmp_path_factory.mktemp("warm_model"))
    root = tmp_path_factory.getbasetemp().parent / "warm_model"
    with FileLock(f"{root}.lock"):
        return build(root)


@pytest.fixture(scope="session")
def vllm_model(warm_model):
    """The warm-started model, for the tests that run vLLM."""
    from tests.vllm_setup import REASON

    if REASON is not None:
        pytest.skip(f"vLLM cannot run here: {REASON}")
    return warm_model
