import os

import pytest
import torch

os.environ.setdefault("WANDB_MODE", "disabled")
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
# Past its recompile limit a compiled function silently runs eagerly, and a fused-vs-eager comparison
# would compare eager with itself: make that an error.
torch._dynamo.config.fail_on_recompile_limit_hit = True


@pytest.fixture(autouse=True)
def _stock_transformers():
    """Every test starts and ends with stock transformers."""
    import patches

    patches.remove()
    yield
    patches.remove()
