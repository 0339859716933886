"""The treatments beside the regions (rla.names.TREATMENTS): each changes what it claims and leaves
the rest as it was - compile (Inductor code for every decoder layer), fp16 (both sides FP16, FP32
masters, dynamic loss scaling), tis / mis (verl's rollout correction, exactly as verl's functions) -
and the verl overrides of every ablation, read as verl reads them."""

from __future__ import annotations

import json
import re

import pytest
import torch
from omegaconf import OmegaConf
from torch.profiler import profile

import patches
from patches import compile as compiled_layers
from rla import names
from rla.config import load as load_config
from rla.config import rl_settings
from tests.model_factory import tiny_model, to_bf16_fsdp_style
from tests.test_patches_api import _hf_model_config, tiny_model_dir  # noqa: F401 (a fixture)
from rla.cells import Cell

INDUCTOR_CALL = "## Call CompiledFxGraph"  # the profiler's event around each run of Inductor-generated code


def inductor_calls(run) -> int:
    """How many times `run()` executes Inductor-generated code."""
    with profile() as prof, torch.no_grad():
        run()
    return sum(event.name.startswith(INDUCTOR_CALL) for event in prof.events())


def test_every_ablation_is_regions_plus_known_treatments():
    for name, ablation in names.ABLATIONS.items():
        assert set(ablation.regions) <= set(names.REGIONS) and set(ablation.treatments) <= set(names.TREATMENTS), name
    assert (names.ABLATIONS["all+tis"].regions, names.ABLATIONS["all+tis"].treatments) == (names.REGIONS, ("tis",)) and names.regions_of("fp16") == ()
    assert names.ablation("rope+tis").rollout_correction == "decoupled_token_is" and names.ablation("fp16").rollout_correction is None
    assert names.ablation("all+geo_rs").rollout_correction == "decoupled_geo_rs" and names.regions_of("geo_rs") == ()
    assert names.ablation("all+engine_order").reduction == "inductor_cpu" and names.ablation("all").reduction == "eager"
    assert "engine_order" not in names.ABLATIONS  # a modifier of `all`, never an ablation by itself
    # the engine-side fix: the engine compiled with Inductor's kept casts, the training side stock
    casts = names.ablation("engine_casts")
    assert casts.regions == () and casts.engine_compilation == {"inductor_compile_config": {"emulate_precision_casts": True}}
    assert all(a.engine_compilation is None for n, a in names.ABLATIONS.items() if n != "engine_casts")
    with pytest.raises(ValueError, match=r"treatments \('engine_casts',\) change the engine's compilation: they align no region"):
        names.compose_ablation(("rope",), ("engine_casts",), "#000000")
    with pytest.raises(ValueError, match=r"unknown ablation 'tiss'; allowed: none, rope, .*, tis, mis, geo_rs, engine_casts, rope\+tis"):
        names.treatments_of("tiss")
    for treatment in names.TREATMENTS:  # the patches know regions only
        with pytest.raises(ValueError, match=f"unknown alignment spec '{treatment}'"):
            patches.apply(treatment)
    # the treatments that change the training forward (the probe's rows), read off what each does
    assert names.FORWARD_TREATMENTS == ("compile", "fp16")
    assert all(names.forward_treatment(names.ablation(t).compiled, names.ablation(t).precision == "fp16") == t
               for t in names.FORWARD_TREATMENTS)


# ---------------------------------------------------------------------------------------------
# compile


def _bf16_model():
    from localrl.kernels import use_local_kernels

    return use_local_kernels(to_bf16_fsdp_style(tiny_model(
        "qwen3", hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32)))


def test_compile_runs_inductor_code_for_every_decoder_layer_and_remove_gives_eager_back():
    model, ids = _bf16_model(), torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(0))
    forward = lambda: model(input_ids=ids).logits  # noqa: E731
    with torch.no_grad():
        eager = forward()
    assert inductor_calls(forward) == 0
    assert compiled_layers.compile_layers(model) == 2 and patches.active() == frozenset()
    with torch.no_grad():
        compiled = forward()
    assert inductor_calls(forward) == 2  # one compiled graph per decoder layer, every forward
    # Inductor fuses HF's elementwise chains (fewer roundings): other bits, same function
    assert not torch.equal(compiled, eager)
    # holds on every ISA: the two differ by where bf16 rounds (2^-9 relative per rounding), a few ulps of the
    # largest logit at most; another function (a wrong graph) would be off by its own size
    assert (compiled.float() - eager.float()).abs().max() < 0.05 * eager.float().abs().max()
    patches.remove()
    assert inductor_calls(forward) == 0
    with torch.no_grad():
        assert torch.equal(forward(), eager)


def test_verl_plugin_compiles_each_decoder_layer_as_it_is_built(tiny_model_dir, monkeypatch):  # noqa: F811
    from transformers import AutoModelForCausalLM
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer

    stock_init = Qwen2DecoderLayer.__init__
    monkeypatch.delenv(names.REGIONS_ENV, raising=False)
    monkeypatch.setenv(names.TREATMENTS_ENV, "compile")
    _hf_model_config(tiny_model_dir)  # verl imports the plugin, then builds the model
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    layers = compiled_layers.decoder_layers(model)
    assert all(compiled_layers.is_compiled(layer) for layer in layers) and patches.active() == frozenset()
    ids = torch.tensor([[2, 3, 4, 5, 6, 1]])
    assert inductor_calls(lambda: model(input_ids=ids)) == len(layers)
    patches.remove()
    assert Qwen2DecoderLayer.__init__ is stock_init
    assert not any(compiled_layers.is_compiled(layer) for layer in layers)
    assert inductor_calls(lambda: AutoModelForCausalLM.from_pretrained(tiny_model_dir)(input_ids=ids)) == 0


def test_verl_plugin_refuses_treatments_that_are_verl_settings(tiny_model_dir, monkeypatch):  # noqa: F811
    monkeypatch.setenv(names.TREATMENTS_ENV, "compile,fp16")
    with pytest.raises(ValueError, match=r"RLA_TREATMENTS='compile,fp16': unknown worker treatment\(s\) \['fp16'\]; "
                                         r"allowed: compile"):
        _hf_model_config(tiny_model_dir)


# ---------------------------------------------------------------------------------------------
# fp16


@pytest.fixture
def model_dir(tmp_path):
    tiny_model("qwen2", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
               num_key_value_heads=1, head_dim=32).save_pretrained(tmp_path)
    return tmp_path


def _batch(n: int = 8, prompt: int = 6, response: int = 5):
    from localrl.trainer import Batch

    gen = torch.Generator().manual_seed(1)
    mask = torch.ones(n, response, dtype=torch.bool)
    mask[::3, 3:] = False
    batch = Batch(torch.randint(2, 256, (n, prompt), generator=gen), torch.ones(n, prompt, dtype=torch.bool),
                  torch.randint(2, 256, (n, response), generator=gen), mask)
    batch.advantages = torch.randn(n, 1, generator=gen).expand(n, response) * mask
    return batch


def test_fp16_runs_both_sides_in_fp16_with_fp32_masters_and_loss_scaling(model_dir):
    from localrl.engine.engine import Engine
    from localrl.trainer import Trainer

    rl = {**rl_settings({}, "local"), "samples_per_prompt": 2, "ppo_mini_batch_size": 2}
    with Trainer(str(model_dir), rl, "none") as stock:
        assert stock.dtype == torch.bfloat16 and stock.scaler is None and stock.correction is None
    with Trainer(str(model_dir), rl, "fp16") as trainer:
        assert trainer.dtype == torch.float16 and trainer.regions == frozenset()
        assert {p.dtype for p in trainer.model.parameters()} == {torch.float16}
        assert {p.dtype for p in trainer.master.parameters()} == {torch.float32}
        assert {b.dtype for b in trainer.model.buffers()} == {torch.float32}  # RoPE's inv_freq, as FSDP keeps it
        assert {v.dtype for v in trainer.weights_for_engine().values()} == {torch.float16}
        outputs = []
        hooks = [layer.register_forward_hook(lambda m, a, out: outputs.append(out[0] if isinstance(out, tuple) else out))
                 for layer in compiled_layers.decoder_layers(trainer.model)]
        batch = _batch()
        batch.old_log_probs, _ = trainer.compute_log_probs(batch)
        for h in hooks:
            h.remove()
        assert outputs and {o.dtype for o in outputs} == {torch.float16}  # activations
        engine = Engine(trainer.master.config, eos_id=1, pad_id=0, dtype=trainer.dtype)
        engine.load_weights(trainer.weights_for_engine())
        assert {w.dtype for w in engine.model.weights.values() if w is not None} == {torch.float16}
        logits = engine.model(batch.prompt_ids, torch.arange(6).expand(8, 6))
        assert logits.dtype == torch.float16

        # dynamic loss scaling, as verl's FSDP engine for an FP16 param_dtype (ShardedGradScaler, growth 400)
        assert isinstance(trainer.scaler, torch.amp.GradScaler) and trainer.scaler.get_scale() == 2.0 ** 16
        before = [p.detach().clone() for p in trainer.master.parameters()]
        metrics = trainer.update(batch)
        assert metrics["actor/loss_scale"] == 2.0 ** 16 and torch.isfinite(torch.tensor(metrics["actor/grad_norm"]))
        assert all(not torch.equal(a, p) for a, p in zip(before, trainer.master.parameters()))
        # a scale that overflows the FP16 gradients: the step is skipped and the scale backs off
        trainer.scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 120, growth_interval=400)
        before = [p.detach().clone() for p in trainer.master.parameters()]
        trainer.update(batch)  # two mini-batches: two overflows, two halvings
        assert trainer.scaler.get_scale() == 2.0 ** 118
        assert all(torch.equal(a, p) for a, p in zip(before, trainer.master.parameters()))


# ---------------------------------------------------------------------------------------------
# tis, mis: verl's rollout correction


def _corrected_batch():
    """Rollout and old log-probs built so that the presets' thresholds bite: a token ratio of 3 (TIS
    truncates it to 2), sequences whose ratio product is above 2 (that one's, and row 1's) or below 0.5
    (row 2's): MIS rejects those three, keeps the rest."""
    batch = _batch(6, 4, 5)
    gen = torch.Generator().manual_seed(2)
    batch.rollout_log_probs = -3 * torch.rand(6, 5, generator=gen)
    delta = 0.02 * torch.randn(6, 5, generator=gen)
    delta[0, 0] = 1.1   # ratio 3.0: truncated to 2
    delta[1] = 0.3      # sequence ratio exp(1.5)
    delta[2] = -0.2     # sequence ratio exp(-1.0)
    batch.old_log_probs = (batch.rollout_log_probs + delta) * batch.response_mask
    batch.rollout_log_probs = batch.rollout_log_probs * batch.response_mask
    return batch


@pytest.mark.parametrize("ablation", ["tis", "mis", "rope+tis"])
def test_rollout_correction_changes_the_loss_exactly_as_verls_functions(ablation):
    from verl.trainer.config.algorithm import RolloutCorrectionConfig
    from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask

    from localrl.trainer import correct_rollout, policy_loss, policy_loss_config, rollout_correction_config

    rl = rl_settings({}, "local")
    config = rollout_correction_config(names.ablation(ablation).rollout_correction)
    assert config == getattr(RolloutCorrectionConfig, names.ablation(ablation).rollout_correction)()
    assert all(rollout_correction_config(names.ablation(a).rollout_correction) is None for a in ("none", "fp16"))
    batch = _corrected_batch()
    log_prob = batch.old_log_probs + 0.01 * torch.randn(batch.old_log_probs.shape, generator=torch.Generator().manual_seed(3))
    uncorrected, _ = policy_loss(batch, log_prob, rl)
    metrics = correct_rollout(batch, config)
    corrected, _ = policy_loss(batch, log_prob, rl)

    mask = batch.response_mask.float()
    weights, kept, _ = compute_rollout_correction_and_rejection_mask(
        batch.old_log_probs, batch.rollout_log_probs, mask, rollout_is=config.rollout_is,
        rollout_is_threshold=config.rollout_is_threshold, rollout_is_batch_normalize=config.rollout_is_batch_normalize,
        rollout_rs=config.rollout_rs, rollout_rs_threshold=config.rollout_rs_threshold)
    weights = weights.batch["rollout_is_weights"]
    expected, _ = compute_policy_loss_vanilla(batch.old_log_probs, log_prob, batch.advantages, kept, rl["loss_agg_mode"],
                                              policy_loss_config(rl), rollout_is_weights=weights)
    assert torch.equal(corrected, expected) and not torch.equal(corrected, uncorrected)
    assert torch.equal(batch.rollout_is_weights, weights) and torch.equal(batch.loss_mask, kept)
    assert "rollout_corr/rollout_is_mean" in metrics

    # what the presets mean, independently of verl's code (threshold 2; MIS keeps sequence ratios in [0.5, 2])
    ratio = torch.exp(batch.old_log_probs - batch.rollout_log_probs)
    if names.ablation(ablation).rollout_correction == "decoupled_token_is":
        assert torch.allclose(weights, ratio.clamp(max=2) * mask, rtol=1e-6) and weights[0, 0] == 2
        assert torch.equal(kept, mask)
    else:
        sequence = torch.exp(((batch.old_log_probs - batch.rollout_log_probs) * mask).sum(-1))
        rejected = (sequence < 0.5) | (sequence > 2)
        assert rejected.tolist() == [True, True, True, False, False, False]
        assert torch.equal(kept, mask * ~rejected[:, None])
        assert torch.allclose(weights, sequence.clamp(max=2)[:, None] * mask, rtol=1e-6)


@pytest.mark.parametrize("ablation", ["geo_rs", "rope+geo_rs", "all+geo_rs"])
def test_geo_rs_rejects_sequences_by_their_geometric_mean_ratio_as_verl_does(ablation):
    """verl's Geo-RS at its documented thresholds: a sequence is dropped from the loss when its mean
    token log-ratio leaves [log 0.999, log 1.001]; no importance weights. A sequence whose tokens are
    far off but average out stays in (a geometric mean); the loss is verl's over the kept ones."""
    from verl.trainer.config.algorithm import RolloutCorrectionConfig
    from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla

    from localrl.trainer import correct_rollout, policy_loss, policy_loss_config, rollout_correction_config

    rl = rl_settings({}, "local")
    config = rollout_correction_config(names.ablation(ablation).rollout_correction)
    assert config == RolloutCorrectionConfig.decoupled_geo_rs() and config.rollout_rs_threshold == "0.999_1.001"
    batch = _batch(6, 4, 4)
    batch.response_mask[:] = True
    batch.rollout_log_probs = -3 * torch.rand(6, 4, generator=torch.Generator().manual_seed(4))
    delta = torch.zeros(6, 4)
    delta[1] = 0.002                                  # geometric mean ratio e^0.002 > 1.001: dropped
    delta[2] = -0.0015                                # below 0.999: dropped
    delta[3] = torch.tensor([0.5, -0.5, 0.3, -0.3])   # far off token by token, mean 0: kept
    delta[4] = 0.0009                                 # inside: kept
    batch.old_log_probs = batch.rollout_log_probs + delta
    log_prob = batch.old_log_probs + 0.01 * torch.randn(batch.old_log_probs.shape, generator=torch.Generator().manual_seed(5))
    metrics = correct_rollout(batch, config)
    kept_rows = batch.loss_mask.bool().all(1).tolist()
    assert kept_rows == [True, False, False, True, True, True] and batch.rollout_is_weights is None
    assert metrics["rollout_corr/rollout_rs_seq_masked_fraction"] == pytest.approx(2 / 6)
    expected, _ = compute_policy_loss_vanilla(batch.old_log_probs, log_prob, batch.advantages, batch.loss_mask,
                                              rl["loss_agg_mode"], policy_loss_config(rl))
    assert torch.equal(policy_loss(batch, log_prob, rl)[0], expected)


# ---------------------------------------------------------------------------------------------
# verl overrides of every ablation, read as verl reads them


@pytest.mark.parametrize("ablation", list(names.ABLATIONS))
def test_verl_overrides_carry_each_treatment(ablation, tmp_path):
    from verl.utils.config import omega_conf_to_dataclass

    from tests.test_cluster_config import engine_precision
    from tests.test_verlrun import PAPER
    from verlrun.overrides import build_overrides, compose

    paper = load_config(PAPER)
    assert paper["rl"]["dtype"] == "bfloat16"
    if names.local_only(ablation):  # the CPU-compiled engine's summation order has no verl counterpart
        from rla.config import ConfigError

        with pytest.raises(ConfigError, match=f"ablation '{re.escape(ablation)}' runs on the local backend only"):
            build_overrides(Cell.of(paper, paper["models"][0], ablation, 0, tmp_path / "cell", tmp_path / "data"))
        return
    cfg = compose(build_overrides(Cell.of(paper, paper["models"][0], ablation, 0, tmp_path / "cell", tmp_path / "data")))
    treatments = names.treatments_of(ablation)
    env = cfg.ray_kwargs.ray_init.runtime_env.env_vars
    assert env[names.REGIONS_ENV] == ",".join(names.regions_of(ablation))
    assert env[names.TREATMENTS_ENV] == ("compile" if "compile" in treatments else "")
    precision = engine_precision(cfg)
    fp16 = "fp16" in treatments
    assert precision.param == (torch.float16 if fp16 else torch.bfloat16) and precision.scaler == fp16
    assert precision.master == precision.reduce == torch.float32
    assert cfg.actor_rollout_ref.rollout.dtype == ("float16" if fp16 else "bfloat16")
    correction = omega_conf_to_dataclass(cfg.algorithm).rollout_correction  # verl's trainer reads it with .get
    preset = names.ablation(ablation).rollout_correction
    if preset is None:
        assert correction.get("rollout_is") is None and correction.get("rollout_rs") is None
    else:
        from verl.trainer.config.algorithm import RolloutCorrectionConfig

        assert RolloutCorrectionConfig(**correction) == getattr(RolloutCorrectionConfig, preset)()
        assert correction["bypass_mode"] is False  # decoupled: old log-probs recomputed, as the local rig
    # what reaches vLLM (verl's vllm_async_server passes compilation_config on) and what target auto reads
    given = cfg.actor_rollout_ref.rollout.engine_kwargs.vllm.get("compilation_config")
    compilation = names.ablation(ablation).engine_compilation
    assert (OmegaConf.to_container(given) if given else {}) == (compilation or {})
    assert json.loads(env[names.ENGINE_CONFIG_ENV])["compilation_config"] == (compilation or {})
