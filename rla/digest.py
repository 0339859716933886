"""A short hash of a tensor's bytes: two runs gave bit-equal outputs when their digests agree."""

from __future__ import annotations

import hashlib


def tensor_digest(t) -> str:
    """The first 16 hex digits of the SHA-256 of `t`'s bytes, in any dtype (bf16 too: read as bytes)."""
    import torch  # here: rla imports without torch (the DAG and the reports use it)

    raw = t.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes()
    return hashlib.sha256(raw).hexdigest()[:16]
