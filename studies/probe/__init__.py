"""The mismatch probe: how much of the training-inference mismatch each alignment region removes
(measure.py against the local engine, vllm.py against vLLM, cli.py the command, report.py its tables and
figures). The names its tables use, shared by all of them (torch-free)."""

MAIN_REFERENCE = "engine_forward"  # the engine's full forward of prompt + response
SAMPLING_REFERENCE = "engine_sampling"  # the logprobs the engine returned while sampling
ENGINE_ORDER = "all+engine_order"  # all three regions + the compiled engine's summation order
