"""Which transformers attributes each region replaces, per model family (one entry per family).

Patches are class- and module-level, so models built before and after `apply` both use them -
verl builds its models inside Ray workers, after `external_lib` has been imported.

The replacements copy transformers' own forwards (Qwen3Attention, the decoder layers) with the
regions swapped in. They were checked against the transformers releases in TRANSFORMERS: the
upstream forwards they replace are the same source, byte for byte, from 5.5.3 to 5.17.0
(tests/test_patches_api.py fingerprints them). Another release is refused, unless
RLA_TRANSFORMERS_UNCHECKED=1 says you checked it yourself.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass

from patches import rmsnorm, rope, swiglu


@dataclass(frozen=True)
class Family:
    name: str
    module: str   # transformers modeling module
    prefix: str   # class-name prefix in that module
    qk_norm: bool  # Qwen3: per-head q/k RMSNorm on the RoPE path

    def modeling(self):
        return importlib.import_module(self.module)

    def cls(self, suffix: str):
        return getattr(self.modeling(), self.prefix + suffix)

    def replacements(self, regions) -> list[tuple[object, str, object]]:
        """(owner, attribute, new value) for the given regions."""
        m, cls = self.modeling(), self.cls
        out = []
        if "rope" in regions:
            rotary = cls("RotaryEmbedding")
            out += [(m, "apply_rotary_pos_emb", rope.apply_rotary_pos_emb),
                    (rotary, "_rla_stock_forward", rotary.__dict__["forward"]),
                    (rotary, "forward", rope.rotary_embedding_forward)]
            if self.qk_norm:
                out += [(cls("Attention"), "_rla_modeling", m),
                        (cls("Attention"), "forward", rope.qwen3_attention_forward)]
        if "swiglu" in regions:
            out.append((cls("MLP"), "forward", swiglu.mlp_forward))
        if "rmsnorm" in regions:
            norm = cls("RMSNorm")
            out += [(cls("DecoderLayer"), "forward", rmsnorm.decoder_layer_forward),
                    (norm, "_rla_stock_forward", norm.__dict__["forward"]),
                    (norm, "forward", rmsnorm.norm_forward)]
        return out


TRANSFORMERS = ((5, 5, 3), (5, 18))  # checked releases: >= first, < second
UNCHECKED_ENV = "RLA_TRANSFORMERS_UNCHECKED"


def check_transformers(version: str | None = None) -> str:
    """The installed transformers version, or a RuntimeError saying what is supported and how to override."""
    import transformers

    version = version or transformers.__version__
    numbers = tuple(int(part) for part in version.split("+")[0].split(".")[:3] if part.isdigit())
    low, high = TRANSFORMERS
    if low <= numbers < high or os.environ.get(UNCHECKED_ENV) == "1":
        return version
    raise RuntimeError(
        f"transformers {version} is not a release the alignment patches were checked against "
        f"(>= {'.'.join(map(str, low))}, < {'.'.join(map(str, high))}): they replace copies of its Qwen2/Qwen3 "
        f"forwards. Install a checked release, or set {UNCHECKED_ENV}=1 after comparing "
        "tests/test_patches_api.py's fingerprints with your version's forwards."
    )


FAMILIES: dict[str, Family] = {
    "qwen2": Family("qwen2", "transformers.models.qwen2.modeling_qwen2", "Qwen2", qk_norm=False),  # Qwen2, Qwen2.5, R1-Distill-Qwen
    "qwen3": Family("qwen3", "transformers.models.qwen3.modeling_qwen3", "Qwen3", qk_norm=True),
}
