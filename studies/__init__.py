"""The studies: one folder each, with its measurement, its report and its judge; one registry. How to run
and publish them: docs/running.md, "The studies" (`python -m studies --help`). Report and judge modules
import no torch: they run on tables copied from another machine. Nothing outside this folder imports a
study.
"""

from __future__ import annotations

from dataclasses import dataclass


# What the rig runs unless a study says otherwise (localrl/engines.py, localrl/kernels.py).
AUTO_ENGINE = "the config's `engine: auto`: vLLM's CPU build where it is installed (make install), else the local engine"
RIG_ENGINE = "the local engine (localrl/engine: vLLM's GPU graph as compiled pieces, on this CPU)"
RIG_ATTENTION = "the rig's shared attention kernel, used by both sides (FP32 inside, rounded to BF16 once)"
GRID = ("localrl.__main__",)  # what a grid cell runs (workflows/rules/train.smk)
BOTH_ATTENTIONS = "both, as separate rows: transformers' SDPA (`hf`) and FP32 attention rounded once (`attention`)"


@dataclass(frozen=True)
class Study:
    """One study: what `python -m studies run/report NAME` call, and where its target publishes."""

    name: str
    summary: str
    measure: str | None  # module with main(argv); None where the measurement is the grid's own DAG
    report: str | None  # module with main(argv) reading the measurement's files (no torch)
    config: str | None = None  # the experiment config holding its settings and pre-registration
    engine: str = RIG_ENGINE  # the inference side its numbers are measured against
    attention: str = RIG_ATTENTION  # the training side's attention (a condition of every mismatch number)
    per_machine: bool = False  # its numbers depend on the machine's kind: published per kind, side by side
    measured_by: str | None = None  # where `measure` is None and no grid measures it: what does
    code: tuple[str, ...] = ()  # modules that measure it besides `measure` (a grid's backend): studies/stale.py

    @property
    def published(self) -> str:
        return f"studies/{self.name}/published"


STUDIES = {s.name: s for s in (
    Study("tiny", "the embedded default grid (experiments/tiny.yaml): stability and score of 4 tiny Qwen models "
                  "x ablations x seeds", None, "studies.tiny.report", "experiments/tiny.yaml", AUTO_ENGINE,
          per_machine=True, code=GRID),
    Study("probe", "per-region training-inference mismatch of the tiny grid's models against its engine",
          "studies.probe.cli", "studies.probe.report", "experiments/tiny.yaml", AUTO_ENGINE,
          "FP32 inside, rounded to BF16 once: the rig's shared kernel (against vLLM, on the training side only)",
          per_machine=True),
    Study("scaling", "the mismatch against depth, width, vocabulary, head size and response length "
                     "(random-weight models, the local engine)", "studies.scaling.measure", "studies.scaling.report"),
    Study("gradprobe", "the policy-gradient error of each setting against one batch's noise: pre-registered "
                       "ladders", "studies.gradprobe.plan", "studies.gradprobe.judge", "experiments/gradprobe.yaml"),
    Study("rope_lead", "the gradient probe's HA4 again: RoPE alone at the Qwen3 points where it failed and their "
                       "Qwen2 counterparts, 3 seeds x 24 batches: pre-registered", "studies.gradprobe.plan",
          "studies.gradprobe.judge", "experiments/gradprobe-rope.yaml"),
    Study("geo_rs", "does verl's geometric rejection stall stock numerics: pre-registered", None,
          "studies.geo_rs.judge", "experiments/geo_rs.yaml", code=GRID),
    Study("calibration", "the collapse rule's false positives on runs with no mismatch", None,
          "studies.calibration.judge", "experiments/calibration.yaml", code=GRID),
    Study("tiny_sdpa", "the embedded default grid's none / rope / all with transformers' SDPA as the training "
                       "side's attention: the mismatch its RL loop logs", None, "studies.tiny.report",
          "experiments/tiny-sdpa.yaml",
          AUTO_ENGINE, "transformers' SDPA (rl.trainer_attention: sdpa)", per_machine=True, code=GRID),
    Study("tiny_amx", "the embedded default grid's none / rope / all with an attention rounding as vLLM-CPU's AMX "
                      "kernel does on the training side: the mismatch its RL loop logs", None, "studies.tiny.report",
          "experiments/tiny-amx.yaml", AUTO_ENGINE,
          "the probabilities rounded to BF16 before they multiply V (rl.trainer_attention: amx_rounding)",
          per_machine=True, code=GRID),
    Study("verl_cpu", "verl's own trainer on this CPU (experiments/verl-cpu.yaml): the mismatch verl logs for one "
                      "tiny random Qwen2 x none / all / tis / fp16 / compile", None, "studies.tiny.report",
          "experiments/verl-cpu.yaml", "verl 0.9.1's vLLM server: vLLM's CPU build 0.32 (its default compiled graph)",
          "transformers' SDPA (verl's workers on a CPU: attn_implementation=sdpa)", per_machine=True,
          code=("verlrun.__main__",)),
    Study("stress", "the grid at stressed shapes and longer responses, with the probe", None, None,
          "experiments/stress.yaml", code=GRID),
    Study("treatments", "the fixes side by side: alignment, compile, FP16, TIS/MIS: mismatch, cost, stability",
          "studies.treatments.cost", "studies.treatments.report", "experiments/treatments.yaml", AUTO_ENGINE,
          per_machine=True, code=GRID),
    Study("vllm_alignment", "the patches against vLLM-CPU's own samples, with SDPA or a rounded-once attention "
                            "on the training side", "studies.vllm_alignment.measure", None, None,
          "vLLM's CPU build 0.32 (its default compiled graph), and the local engine for contrast",
          BOTH_ATTENTIONS,
          per_machine=True),
    Study("depth", "the patches against vLLM-CPU's own samples along a depth ladder (2-28 layers, hidden 256, "
                   "3 seeds; the paper models' widths at 28 layers as an option), with SDPA or a rounded-once attention on "
                   "the training side: per token and per sequence", "studies.depth.measure", "studies.depth.report",
          "experiments/depth.yaml",
          "vLLM's CPU build 0.32 (its default compiled graph)", BOTH_ATTENTIONS,
          per_machine=True),
    Study("leftover", "what `all` leaves at 28 layers against vLLM-CPU, by component: vLLM-CPU's own attention "
                      "kernel and GEMMs swapped into the training side's forward one at a time, in both summation "
                      "orders", "studies.depth.measure", "studies.leftover.report", "experiments/depth.yaml",
          "vLLM's CPU build 0.32 (its default compiled graph)",
          "each row's own: transformers' SDPA (`hf`), FP32 attention rounded once (`attention`), vLLM-CPU's "
          "attention kernel (`engine_attention`, `engine`); GEMMs torch's or vLLM-CPU's (`engine_gemm`, `engine`)",
          per_machine=True),
    Study("trace", "layer by layer against vLLM-CPU at 28 layers: where the training side and the engine's decode "
                   "first differ at each layer's attention op (q, k, v, output), and how the difference grows; with "
                   "the engine's own prefill of its samples", "studies.trace.measure", "studies.trace.report", None,
          "vLLM's CPU build 0.32 (its default compiled graph), its attention op's inputs and output read by a tap",
          "each setting's own: transformers' SDPA (`stock`), FP32 attention rounded once (`all`), an attention "
          "in torch ops rounding where vLLM-CPU's AMX kernel does (`all_amx_rounding`; with vLLM-CPU's GEMMs: "
          "`all_amx_rounding_engine_gemm`), vLLM-CPU's attention kernel and GEMMs (`all_engine_kernels`)",
          per_machine=True),
    Study("kernels", "forward + backward time and bytes saved for backward of the aligned regions, eager and "
                     "fused, against stock transformers", "benchmarks.bench_regions", None, None,
          "none: no engine (the training side's region kernels against stock transformers' formulas)",
          "none: the regions alone; a decoder layer runs the rig's FP32-compute GEMM and attention kernels",
          per_machine=True),
    Study("engine_tables", "target auto against the engine it reads: per vLLM-CPU configuration (default, "
                           "emulate_precision_casts), the table read off its graph and the patched training side "
                           "against its samples beside every named table, with its rollout throughput",
          "studies.engine_tables.measure", None, None,
          "vLLM's CPU build 0.32 under each configuration (its compiled graph; the table read off it)",
          BOTH_ATTENTIONS, per_machine=True),
    Study("gpu_check", "the regions, the `vllm` target and the suite's CUDA paths on a GPU: what "
                       "benchmarks/gpu_check.sh measured on an H200 (its runs: studies/gpu_check/runs/)", None,
          "studies.gpu_check.report", None,
          "the local engine compiled by Inductor to Triton on the GPU (vLLM's GPU graph as read from vLLM's source; "
          "vLLM itself did not run there); measured on the GPU machine, each run's machine and versions in runs.csv",
          "one pinned attention kernel for both sides (torch's efficient SDPA kernel)",
          measured_by="benchmarks/gpu_check.sh, on a GPU machine (its runs: studies/gpu_check/runs/)",
          code=("benchmarks.gpu_check",)),
    Study("roundmap", "which values each engine's compiled graph stores as BF16, against the alignment targets",
          "studies.roundmap.measure", None, None, "the local engine's and vLLM's compiled graphs, read, not run",
          "none: no training side (the graphs' stored values against patches/targets.py)"),
)}


def study(name: str) -> Study:
    """The registered study `name`, or a KeyError naming the known ones."""
    if name not in STUDIES:
        raise KeyError(f"unknown study {name!r}; known: {', '.join(STUDIES)}")
    return STUDIES[name]
