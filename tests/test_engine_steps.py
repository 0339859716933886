"""How vLLM-CPU's steps fed the sampled sequences' rows to its GEMMs (studies._shared.vllm_cpu
.engine_steps), checked against the engine's own steps: the rows each of its forward steps computed, read
at its attention op by the diagnosis's tap (diagnose/tap.py), which the trace study uses."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from localrl import unavailable_reason
from studies._shared import vllm_cpu as measure

# The studies' sampler under the tap, in a child process (the engine runs in the tapping process): the
# row count of each step at the first layer's attention op.
SAMPLE_TAPPED = """
import json, sys
from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackendImpl
from diagnose.tap import backend_tap
from studies._shared import vllm_cpu as measure
with backend_tap(CPUAttentionBackendImpl) as calls:
    measure.sample_with_vllm(sys.argv[1], sys.argv[2], n_prompts=int(sys.argv[3]))
print(json.dumps([call.starts[-1] for call in calls if call.layer == 0]))
"""


@pytest.mark.long
@pytest.mark.skipif(unavailable_reason() is not None, reason=f"vLLM-CPU: {unavailable_reason()}")
def test_the_engine_prefills_every_prompt_in_one_step_then_decodes_them_together(tmp_path):
    model, out = tmp_path / "model", tmp_path / "samples.json"
    measure.make_checkpoint(measure.SHAPES["qwen2-s"], str(model))
    run = subprocess.run([sys.executable, "-c", SAMPLE_TAPPED, str(model), str(out), "6"], capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    rows_per_step = json.loads(run.stdout.strip().splitlines()[-1])
    samples = json.loads(out.read_text())
    steps = measure.engine_steps(samples)
    assert {s.prefill_rows for s in steps} == {sum(map(len, samples["prompts"]))} and [s.prompt for s in steps] == list(
        map(len, samples["prompts"]))
    assert rows_per_step == [steps[0].prefill_rows] + [steps[0].decode_rows] * (measure.NEW_TOKENS - 1)
    assert steps[0].decode_rows == 6 != steps[0].prefill_rows


def test_samples_that_would_not_fit_one_step_are_refused():
    too_many = {"prompts": [[5] * 8] * (measure.STEP_REQUESTS + 1)}
    with pytest.raises(ValueError, match=f"{measure.STEP_REQUESTS + 1} prompts of .* do not fit one engine step"):
        measure.engine_steps(too_many)
    too_long = {"prompts": [[5] * (measure.STEP_TOKENS // 2 + 1)] * 2}
    with pytest.raises(ValueError, match=f"2 prompts of {measure.STEP_TOKENS + 2} tokens"):
        measure.engine_steps(too_long)
