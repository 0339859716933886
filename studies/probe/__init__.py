"""The mismatch probe: how much of the training-inference mismatch each alignment region removes
(measure.py against the local engine, vllm.py against vLLM, cli.py the command, report.py its tables and
figures). The names its tables use, shared by all of them (torch-free)."""

import itertools

from rla.names import REGIONS

MAIN_REFERENCE = "engine_forward"  # the engine's full forward of prompt + response
SAMPLING_REFERENCE = "engine_sampling"  # the logprobs the engine returned while sampling
ENGINE_ORDER = "all+engine_order"  # all three regions + the compiled engine's summation order
# every subset of the regions, by size, each in REGIONS order
SUBSETS = tuple(c for k in range(len(REGIONS) + 1) for c in itertools.combinations(REGIONS, k))
