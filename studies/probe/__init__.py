"""The mismatch probe: how much of the training-inference mismatch each alignment region removes
(measure.py against the local engine, vllm.py against vLLM, cli.py the command, report.py its tables and
figures); the names its tables use: studies._shared.names."""
