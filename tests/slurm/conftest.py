"""Tests against a real SLURM cluster (tests/slurm/start_cluster.sh). They need root, apt and a few
minutes, so `make test` skips them; `make test-slurm` starts the cluster and runs them."""

import os
import shutil

import pytest


def pytest_collection_modifyitems(config, items):
    if os.environ.get("RLA_TEST_SLURM") == "1" and shutil.which("sbatch"):
        return
    skip = pytest.mark.skip(reason="needs a SLURM cluster: `make test-slurm` (RLA_TEST_SLURM=1)")
    for item in items:
        if "slurm" in item.keywords:
            item.add_marker(skip)
