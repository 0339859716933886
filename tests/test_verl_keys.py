"""Every key verlrun's overrides set is one verl 0.9.1 reads. Hydra's composition accepts any key its
config has, including fields no code of the V1 trainer reads (`actor.grad_clip`, `fsdp_config.dtype`
...), so composing is not enough: READERS names, for each key the overrides write, the line of the
installed verl that reads it, and the tests check that every generated key has one, that the line is
there, and that none of the keys the audit found unread comes back."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from rla.config import load as load_config
from tests.test_verlrun import CPU, PAPER
from verlrun.overrides import build_overrides, compose
from rla.cells import Cell

A = "actor_rollout_ref."
F = "workers/engine/fsdp/transformer_impl.py"
W = "workers/engine_workers.py"
T = "trainer/ppo/v1/trainer_base.py"
V = "workers/rollout/vllm_rollout/vllm_async_server.py"
L = "workers/utils/losses.py"
C = "trainer/ppo/rollout_corr_helper.py"
D = "utils/dataset/rl_dataset.py"

# key (or a section passed on whole, ending in ".") -> (file under verl/, the line that reads it)
READERS: dict[str, tuple[str, str]] = {
    "algorithm.adv_estimator": (T, "adv_estimator=self.config.algorithm.adv_estimator"),
    "algorithm.use_kl_in_reward": (T, "if self.config.algorithm.use_kl_in_reward:"),
    "algorithm.rollout_correction.bypass_mode": (T, 'rollout_corr_config.get("bypass_mode", False)'),
    "algorithm.rollout_correction.rollout_is": (C, 'rollout_is = rollout_corr_config.get("rollout_is", None)'),
    "algorithm.rollout_correction.rollout_is_threshold": (C, 'rollout_corr_config.get("rollout_is_threshold", 2.0)'),
    "algorithm.rollout_correction.rollout_is_batch_normalize":
        (C, 'rollout_corr_config.get("rollout_is_batch_normalize", False)'),
    "algorithm.rollout_correction.rollout_rs": (C, 'rollout_rs = rollout_corr_config.get("rollout_rs", None)'),
    "algorithm.rollout_correction.rollout_rs_threshold": (C, 'rollout_corr_config.get("rollout_rs_threshold", None)'),
    "data.train_files": (T, "self.config.data.train_files,"),
    "data.val_files": (T, "self.config.data.val_files,"),
    "data.train_batch_size": (T, "train_batch_size = self.config.data.train_batch_size"),
    "data.max_prompt_length": (D, 'self.max_prompt_length = config.get("max_prompt_length", 1024)'),
    # rollout.response_length is `${oc.select:data.max_response_length,512}` (trainer/config/rollout/rollout.yaml)
    "data.max_response_length": (V, "self.config.response_length"),
    "data.filter_overlong_prompts": (D, 'self.filter_overlong_prompts = config.get("filter_overlong_prompts", True)'),
    "data.seed": (D, 'self.seed = config.get("seed")'),
    "data.dataloader_num_workers": (T, 'num_workers=self.config.data["dataloader_num_workers"]'),
    A + "model.path": ("workers/config/model.py", "self.local_path = copy_to_local(self.path, use_shm=self.use_shm)"),
    A + "model.external_lib": ("workers/config/model.py", "import_external_libs(self.external_lib)"),
    A + "model.use_remove_padding": (W, 'self.engine_config.use_remove_padding = self.model_config.get("use_remove_padding", False)'),
    A + "model.enable_gradient_checkpointing": (F, "if self.model_config.enable_gradient_checkpointing:"),
    A + "model.use_liger": (F, "use_liger = self.model_config.use_liger"),
    A + "model.use_fused_kernels": (W, 'self.engine_config.use_fused_kernels = self.model_config.get("use_fused_kernels", False)'),
    A + "model.override_config.attn_implementation":
        ("workers/config/model.py", 'attn_implementation = self.override_config.get("attn_implementation", "flash_attention_2")'),
    A + "actor.strategy": ("workers/config/actor.py", 'object.__setattr__(self.engine, "strategy", self.strategy)'),
    A + "actor.optim.lr": ("workers/config/optimizer.py", '"lr": config.lr'),
    A + "actor.optim.betas": ("workers/config/optimizer.py", 'optimizer_args["betas"] = config.betas'),
    A + "actor.optim.weight_decay": ("workers/config/optimizer.py", '"weight_decay": config.weight_decay'),
    A + "actor.optim.clip_grad": (F, "self.module.clip_grad_norm_(self.optimizer_config.clip_grad)"),
    A + "actor.ppo_mini_batch_size": (T, "ppo_mini_batch_size = self.config.actor_rollout_ref.actor.ppo_mini_batch_size"),
    A + "actor.use_dynamic_bsz": (W, "actor_training_config.engine_config.use_dynamic_bsz = self.config.actor.use_dynamic_bsz"),
    A + "actor.ppo_max_token_len_per_gpu":
        (W, "actor_training_config.engine_config.max_token_len_per_gpu = self.config.actor.ppo_max_token_len_per_gpu"),
    A + "actor.ppo_micro_batch_size_per_gpu": (W, "self.config.actor.ppo_micro_batch_size_per_gpu"),
    A + "rollout.log_prob_use_dynamic_bsz":
        (W, "assert self.config.actor.use_dynamic_bsz == self.config.rollout.log_prob_use_dynamic_bsz"),
    A + "rollout.log_prob_max_token_len_per_gpu": (W, "self.config.rollout.log_prob_max_token_len_per_gpu"),
    A + "rollout.log_prob_micro_batch_size_per_gpu": (W, "self.config.rollout.log_prob_micro_batch_size_per_gpu"),
    # The reference policy's, read (renamed) where verl builds it: written only when there is one.
    A + "ref.log_prob_use_dynamic_bsz": (W, 'self.config.ref.pop("log_prob_use_dynamic_bsz", False)'),
    A + "ref.log_prob_max_token_len_per_gpu": (W, 'self.config.ref.pop("log_prob_max_token_len_per_gpu", None)'),
    A + "ref.log_prob_micro_batch_size_per_gpu": (W, '"log_prob_micro_batch_size_per_gpu", None'),
    A + "actor.clip_ratio_low": ("trainer/ppo/core_algos.py", "clip_ratio_low = config.clip_ratio_low if config.clip_ratio_low"),
    A + "actor.clip_ratio_high": ("trainer/ppo/core_algos.py", "clip_ratio_high = config.clip_ratio_high if config.clip_ratio_high"),
    A + "actor.clip_ratio_c": ("trainer/ppo/core_algos.py", '"clip_ratio_c", 3.0'),
    A + "actor.use_kl_loss": (L, "if config.use_kl_loss:"),
    A + "actor.kl_loss_coef": (L, "policy_loss += kl_loss * config.kl_loss_coef"),
    A + "actor.kl_loss_type": (L, "kl_penalty=config.kl_loss_type"),
    A + "actor.entropy_coeff": (L, "entropy_coeff = config.entropy_coeff"),
    A + "actor.loss_agg_mode": (T, "loss_agg_mode=actor_config.loss_agg_mode"),
    A + "actor.data_loader_seed": (T, '"seed": self.config.actor_rollout_ref.actor.data_loader_seed'),
    A + "actor.fsdp_config.model_dtype": (F, "torch_dtype = self.engine_config.model_dtype"),
    A + "actor.fsdp_config.mixed_precision": (F, "mixed_precision_config = self.engine_config.mixed_precision"),
    A + "actor.fsdp_config.entropy_from_logits_with_chunking": (F, "if self.engine_config.entropy_from_logits_with_chunking:"),
    A + "actor.fsdp_config.use_torch_compile": (F, "if self.engine_config.use_torch_compile"),
    A + "rollout.name": (W, "get_rollout_class(rollout_config.name, rollout_config.mode)"),
    A + "rollout.dtype": (V, '"dtype": self.config.dtype'),
    A + "rollout.enforce_eager": (V, '"enforce_eager": self.config.enforce_eager'),
    A + "rollout.n": ("trainer/ppo/v1/agent_loop_tq.py", 'config.n if not trajectory["validate"] else config.val_kwargs.n'),
    A + "rollout.temperature": ("trainer/ppo/v1/agent_loop_tq.py", "temperature=config.temperature,"),
    A + "rollout.top_p": ("trainer/ppo/v1/agent_loop_tq.py", "top_p=config.top_p,"),
    A + "rollout.top_k": ("trainer/ppo/v1/agent_loop_tq.py", "top_k=config.top_k,"),
    A + "rollout.calculate_log_probs": ("trainer/ppo/v1/agent_loop_tq.py", "logprobs=config.calculate_log_probs,"),
    A + "rollout.tensor_model_parallel_size": (W, "infer_tp = rollout_config.tensor_model_parallel_size"),
    A + "rollout.gpu_memory_utilization": (V, '"gpu_memory_utilization": self.config.gpu_memory_utilization'),
    A + "rollout.seed": (V, '"seed": self.replica_rank + self.config.seed'),
    A + "rollout.enable_sleep_mode": (V, '"enable_sleep_mode": self.config.enable_sleep_mode'),
    A + "rollout.free_cache_engine": (W, "if self.config.rollout.free_cache_engine:"),
    A + "rollout.val_kwargs.temperature": ("trainer/ppo/v1/agent_loop_tq.py", 'sampling_params["temperature"] = config.val_kwargs.temperature'),
    A + "rollout.val_kwargs.top_p": ("trainer/ppo/v1/agent_loop_tq.py", 'sampling_params["top_p"] = config.val_kwargs.top_p'),
    A + "rollout.val_kwargs.top_k": ("trainer/ppo/v1/agent_loop_tq.py", 'sampling_params["top_k"] = config.val_kwargs.top_k'),
    A + "rollout.val_kwargs.n": (T, "[self.config.actor_rollout_ref.rollout.val_kwargs.n] * batch_size"),
    A + "rollout.agent.num_workers": ("experimental/agent_loop/agent_loop.py", "num_workers = self.rollout_config.agent.num_workers"),
    "reward.num_workers": ("experimental/reward_loop/reward_loop.py", "num_workers = self.config.reward.num_workers"),
    "trainer.project_name": (T, "project_name=self.config.trainer.project_name,"),
    "trainer.experiment_name": (T, "experiment_name=self.config.trainer.experiment_name,"),
    "trainer.logger": (T, "default_backend=self.config.trainer.logger,"),
    "trainer.default_local_dir": (T, "checkpoint_folder = self.config.trainer.default_local_dir"),
    "trainer.resume_mode": (T, 'elif self.config.trainer.resume_mode == "auto":'),
    "trainer.max_actor_ckpt_to_keep": (T, 'self.config.trainer.get("max_actor_ckpt_to_keep", None)'),
    "trainer.total_training_steps": (T, "self.config.trainer.total_training_steps"),
    "trainer.total_epochs": (T, "total_training_steps = self.steps_per_epoch * self.config.trainer.total_epochs"),
    "trainer.save_freq": (T, "if self.config.trainer.save_freq > 0 and ("),
    "trainer.test_freq": (T, "if self.config.trainer.test_freq > 0 and ("),
    "trainer.val_before_train": (T, 'if self.config.trainer.get("val_before_train", True):'),
    "trainer.nnodes": (T, "global_pool_id: [config.trainer.n_gpus_per_node] * config.trainer.nnodes,"),
    "trainer.n_gpus_per_node": (T, "global_pool_id: [config.trainer.n_gpus_per_node] * config.trainer.nnodes,"),
    "trainer.device": (T, 'wg_kwargs["device_name"] = self.config.trainer.device'),
    # Sections verl hands on whole: to ray.init (environment variables of every worker included) and to
    # TransferQueue.
    "ray_kwargs.ray_init.": ("trainer/main_ppo.py", "ray.init(**OmegaConf.to_container(ray_init_kwargs))"),
    "transfer_queue.": ("trainer/main_ppo.py", "tq.init(config.transfer_queue)"),
}

# Found unread by the audit of verl 0.9.1 (V1 trainer): a generated override must not name them.
UNREAD: dict[str, str] = {
    A + "actor.grad_clip": "the engine clips with optim.clip_grad (workers/engine/fsdp/transformer_impl.py:806)",
    A + "actor.fsdp_config.seed": "read only with fsdp_config.full_determinism (transformer_impl.py:157)",
    A + "actor.fsdp_config.dtype": "never read; precision is fsdp_config.mixed_precision (transformer_impl.py:391)",
    A + "rollout.val_kwargs.do_sample": "read by the legacy trainer only (trainer/ppo/ray_trainer.py:631)",
    "trainer.max_critic_ckpt_to_keep": "no critic in GRPO",
    "algorithm.rollout_correction.loss_type": "read only in bypass mode (trainer/ppo/core_algos.py:2484)",
}

VERL = Path(__import__("verl").__file__).parent


def generated_configs():
    """Every kind of cell the profiles make: both profiles, dynamic or fixed micro-batches, with and
    without a KL term (a reference policy), each ablation."""
    for path, dynamic, kl in itertools.product((PAPER, CPU), (True, False), (0.0, 0.001)):
        cfg = load_config(path)
        rl = {**cfg["rl"], "use_dynamic_bsz": dynamic, "kl_coef": kl}
        if dynamic and cfg["verl"].get("platform") == "cpu":
            rl["max_token_len_per_gpu"] = 4096
        cfg = {**cfg, "rl": rl}
        for ablation in ("none", "all", "tis", "mis", "fp16", "compile"):
            yield f"{path.stem}-{'dynamic' if dynamic else 'fixed'}-kl{kl}-{ablation}", cfg, ablation


def reader_of(key: str) -> tuple[str, str] | None:
    if key in READERS:
        return READERS[key]
    return next((READERS[p] for p in READERS if p.endswith(".") and key.startswith(p)), None)


def test_every_generated_key_has_a_reader_and_none_is_one_the_audit_found_unread(tmp_path):
    seen = set()
    for name, cfg, ablation in generated_configs():
        overrides = build_overrides(Cell.of(cfg, cfg["models"][0], ablation, 0, tmp_path / "cell", tmp_path / "data"))
        keys = {o.split("=", 1)[0].lstrip("+") for o in overrides if not o.startswith("hydra.")}
        seen |= keys
        assert not keys & set(UNREAD), (name, {k: UNREAD[k] for k in keys & set(UNREAD)})
        unread = sorted(k for k in keys if reader_of(k) is None)
        assert not unread, f"{name}: no verl line reads {unread}; find the one that does (READERS) or stop writing it"
    # The table holds no key that nothing generates any more.
    stale = [k for k in READERS if not k.endswith(".") and k not in seen]
    assert not stale, stale


@pytest.mark.parametrize("key", sorted(READERS))
def test_the_reading_line_is_in_the_installed_verl(key):
    file, line = READERS[key]
    assert line in (VERL / file).read_text(), f"{key}: verl/{file} no longer holds {line!r}"


def test_the_unread_keys_compose_silently(tmp_path):
    """Why composing is not enough: Hydra takes each of them without a word."""
    paper = load_config(PAPER)
    base = build_overrides(Cell.of(paper, paper["models"][0], "none", 0, tmp_path, tmp_path))
    for key in UNREAD:
        value = {"trainer.max_critic_ckpt_to_keep": "2", "algorithm.rollout_correction.loss_type": "ppo_clip",
                 A + "rollout.val_kwargs.do_sample": "True", A + "actor.fsdp_config.dtype": "bfloat16"}.get(key, "1")
        compose(base + [f"{key}={value}"])
