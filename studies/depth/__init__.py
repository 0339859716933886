"""The patches against vLLM-CPU at the paper models' depth: random Qwen2 / Qwen3 models of 28 layers at
hidden 256, measured as the vLLM alignment benchmark measures its shallow shapes
(studies/vllm_alignment/measure.py, `--shapes qwen2-256x28 qwen3-256x28 --no-local`), so the two
studies' tables read side by side: the same regions at 4 layers and at 28."""
