import os

import pytest
import torch

os.environ.setdefault("WANDB_MODE", "disabled")
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
# Another vector ISA on this machine (`make test-isa`): ATEN_CPU_CAPABILITY=avx2 picks ATen's kernels,
# RLA_INDUCTOR_SIMDLEN=256 Inductor's generated code (applied by `import localrl`).
import localrl  # noqa: E402,F401
# Past its recompile limit a compiled function silently runs eagerly, and a fused-vs-eager comparison
# would compare eager with itself: make that an error.
torch._dynamo.config.fail_on_recompile_limit_hit = True
# Each width is its own kernel (static widths), and the tests use many widths per region function.
torch._dynamo.config.recompile_limit = 64


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
def vllm_model(tmp_path_factory):
    """A warm-started tiny model and its data for the tests that run vLLM (tests/vllm_setup.py)."""
    from tests.vllm_setup import REASON, build

    if REASON is not None:
        pytest.skip(f"vLLM cannot run here: {REASON}")
    return build(tmp_path_factory.mktemp("vllm_model"))
