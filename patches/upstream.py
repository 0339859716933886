"""The transformers source the patches were checked against, as fingerprints, and the check of it
(docs/patches.md: "transformers releases"). Each set below was compared by hand with the patches and
tested; `python -m patches.upstream` prints the fingerprints of the release it runs under.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib
import inspect
import json
import os
import sys

UNCHECKED_ENV = "RLA_TRANSFORMERS_UNCHECKED"

# The functions of each family's modeling file the patches depend on (replace, copy, wrap or call).
FUNCTIONS = ("apply_rotary_pos_emb", "{P}RotaryEmbedding.forward", "{P}RotaryEmbedding.compute_default_rope_parameters",
             "{P}MLP.forward", "{P}RMSNorm.forward", "{P}Attention.forward", "{P}DecoderLayer.forward",
             "{P}Model.forward")
PREFIXES = {"qwen2": "Qwen2", "qwen3": "Qwen3"}


def _fingerprints(prefix: str, hashes: str) -> dict[str, str]:
    """One family's function -> fingerprint, from the fingerprints in FUNCTIONS' order."""
    return dict(zip((f.format(P=prefix) for f in FUNCTIONS), hashes.split(), strict=True))


# releases -> family -> function -> sha256[:16] of its source. Fingerprints in FUNCTIONS' order:
#   apply_rotary_pos_emb, RotaryEmbedding.forward, .compute_default_rope_parameters, MLP.forward,
#   RMSNorm.forward, Attention.forward, DecoderLayer.forward, Model.forward
CHECKED: dict[str, dict[str, dict[str, str]]] = {
    "5.5.3, 5.9.0, 5.10.4, 5.11.0, 5.12.1, 5.13.1, 5.14.1": {
        "qwen2": _fingerprints("Qwen2", "dcce26b5d7674297 c718955d8b60e9df f746f13e40451da9 3997a4458faa14a5 "
                                        "0d702ef8d7d8a129 c5e7f9c63c52302c 2054f855effdaa18 eed5a7789297b488"),
        "qwen3": _fingerprints("Qwen3", "dcce26b5d7674297 c718955d8b60e9df eb2039ded764b5e8 3997a4458faa14a5 "
                                        "0d702ef8d7d8a129 46cd4f9c14cd0e72 2054f855effdaa18 eed5a7789297b488"),
    },
    "5.15.1, 5.16.1, 5.17.0": {
        "qwen2": _fingerprints("Qwen2", "dcce26b5d7674297 c718955d8b60e9df cabdcf57f32910c8 3997a4458faa14a5 "
                                        "0d702ef8d7d8a129 c5e7f9c63c52302c 2054f855effdaa18 eed5a7789297b488"),
        "qwen3": _fingerprints("Qwen3", "dcce26b5d7674297 c718955d8b60e9df bf41ffc8b0fc6d18 3997a4458faa14a5 "
                                        "0d702ef8d7d8a129 46cd4f9c14cd0e72 2054f855effdaa18 eed5a7789297b488"),
    },
    "5.18.0": {
        "qwen2": _fingerprints("Qwen2", "dcce26b5d7674297 d8eb9919d7ae4572 cabdcf57f32910c8 3997a4458faa14a5 "
                                        "0d702ef8d7d8a129 c5e7f9c63c52302c 2054f855effdaa18 eed5a7789297b488"),
        "qwen3": _fingerprints("Qwen3", "dcce26b5d7674297 d8eb9919d7ae4572 bf41ffc8b0fc6d18 3997a4458faa14a5 "
                                        "0d702ef8d7d8a129 46cd4f9c14cd0e72 2054f855effdaa18 eed5a7789297b488"),
    },
    "5.19.0, 5.20.0, 5.20.1, 5.20.2, 5.21.0, 5.21.1, 5.22.0, 5.22.1, 5.22.2": {
        "qwen2": _fingerprints("Qwen2", "dcce26b5d7674297 ec4e845686d12335 e9de12c49703d725 3997a4458faa14a5 "
                                        "0d702ef8d7d8a129 c5e7f9c63c52302c 2054f855effdaa18 eed5a7789297b488"),
        "qwen3": _fingerprints("Qwen3", "dcce26b5d7674297 ec4e845686d12335 0cdc01245e403858 3997a4458faa14a5 "
                                        "0d702ef8d7d8a129 46cd4f9c14cd0e72 2054f855effdaa18 eed5a7789297b488"),
    },
    "5.23.0": {  # Model.forward: one annotation; layer forwards wrapped per class (registry.layer_forwards)
        "qwen2": _fingerprints("Qwen2", "dcce26b5d7674297 ec4e845686d12335 e9de12c49703d725 3997a4458faa14a5 "
                                        "0d702ef8d7d8a129 c5e7f9c63c52302c 2054f855effdaa18 cd24015f61894b0f"),
        "qwen3": _fingerprints("Qwen3", "dcce26b5d7674297 ec4e845686d12335 0cdc01245e403858 3997a4458faa14a5 "
                                        "0d702ef8d7d8a129 46cd4f9c14cd0e72 2054f855effdaa18 cd24015f61894b0f"),
    },
    "5.24.0, 5.25.0": {  # the KV cache argument renamed `cache` (the copies pass it on by the release's name)
        "qwen2": _fingerprints("Qwen2", "dcce26b5d7674297 ec4e845686d12335 e9de12c49703d725 3997a4458faa14a5 "
                                        "0d702ef8d7d8a129 23677090c8a910b2 d2972e5ff28f9093 3b78ea658a7b5629"),
        "qwen3": _fingerprints("Qwen3", "dcce26b5d7674297 ec4e845686d12335 0cdc01245e403858 3997a4458faa14a5 "
                                        "0d702ef8d7d8a129 25c2dd9ecb38f5b8 d2972e5ff28f9093 3b78ea658a7b5629"),
    },
}


def fingerprints_of_source(text: str, prefix: str) -> dict[str, str]:
    """sha256 (16 hex digits) of each function in FUNCTIONS, from a modeling file's source text."""
    found = {}
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef):
            found[node.name] = node
        elif isinstance(node, ast.ClassDef):
            found.update({f"{node.name}.{item.name}": item for item in node.body if isinstance(item, ast.FunctionDef)})
    names = [f.format(P=prefix) for f in FUNCTIONS]
    return {name: hashlib.sha256(ast.get_source_segment(text, found[name]).encode()).hexdigest()[:16]
            if name in found else "missing" for name in names}


@functools.lru_cache(maxsize=None)
def installed_fingerprints() -> dict[str, dict[str, str]]:
    """The fingerprints of the installed transformers, per family."""
    out = {}
    for family, prefix in PREFIXES.items():
        module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
        out[family] = fingerprints_of_source(inspect.getsource(module), prefix)
    return out


def checked_release(fingerprints: dict[str, dict[str, str]]) -> str | None:
    """The checked releases whose source these fingerprints are, or None."""
    return next((releases for releases, expected in CHECKED.items() if expected == fingerprints), None)


def check_transformers() -> str:
    """The checked releases the installed transformers' source matches; else a RuntimeError that names
    the installed version, the functions that differ from the nearest checked set, and the override."""
    import transformers  # here: `import patches` loads no transformers until a model is patched

    found = installed_fingerprints()
    releases = checked_release(found)
    if releases is not None or os.environ.get(UNCHECKED_ENV) == "1":
        return releases or f"{transformers.__version__} (unchecked, {UNCHECKED_ENV}=1)"
    nearest = min(CHECKED.values(), key=lambda exp: _differences(exp, found))
    changed = sorted(f"{fam}:{name}" for fam in found for name in found[fam] if found[fam][name] != nearest[fam].get(name))
    raise RuntimeError(
        f"transformers {transformers.__version__} is not a release the alignment patches were checked against "
        f"(checked: {', '.join(CHECKED)}); its source differs in {', '.join(changed)}. The patches copy these "
        f"forwards: install a checked release, or set {UNCHECKED_ENV}=1 after comparing them yourself.")


def _differences(expected, found) -> int:
    return sum(expected[f].get(n) != found[f][n] for f in found for n in found[f])


def main() -> int:
    """Print the installed release's fingerprints and which checked set they match (another release: lay
    its wheel over the environment first, as `make test-transformers V=...` does, and run this under it)."""
    import transformers  # here: `import patches` loads no transformers until a model is patched

    found = installed_fingerprints()
    print(f"{transformers.__version__}: matches {checked_release(found) or 'no checked set'}")
    print(json.dumps(found, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
