"""The names the probe family's tables use (torch-free: reports read them)."""

import itertools

from rla.names import REGIONS

MAIN_REFERENCE = "engine_forward"  # the engine's full forward of prompt + response
SAMPLING_REFERENCE = "engine_sampling"  # the logprobs the engine returned while sampling
ENGINE_ORDER = "all+engine_order"  # all three regions + the compiled engine's summation order
# every subset of the regions, by size, each in REGIONS order
SUBSETS = tuple(c for k in range(len(REGIONS) + 1) for c in itertools.combinations(REGIONS, k))
