"""pytest plugin for mutation runs (`make mutate`, docs/mutation.md); mutmut loads it
(pyproject.toml, [tool.mutmut] pytest_add_cli_args), nothing else does.

mutmut 3 replaces every mutated function by a trampoline that picks the original or the active
mutant at each call. The region functions (patches/fused.py, `impl="fused"`) and the engine's
formulations (localrl/engine/ops.py, the tests' reference) run compiled, so Dynamo traces the
trampoline too. Choosing the mutant traces fine: it reads `os.environ["MUTANT_UNDER_TEST"]`, which
Dynamo guards on, so a graph compiled for one mutant is never reused for another (and each mutant
runs in a fresh forked process anyway). Recording which tests reach which function (mutmut's "stats"
run) does not: it goes through a ContextVar that Dynamo cannot trace. So here:

- the call stack mutmut keeps for its dependency tracking is a constant (tracking is off:
  track_dependencies = false), and
- a hit inside compiled code is recorded while Dynamo traces it (comptime), and Dynamo's caches
  are reset before each test (`pytest_runtest_setup` says why).
"""

import pytest
import torch
from mutmut import stats
from mutmut.mutation import trampoline
from torch._dynamo.comptime import comptime


class _NoCallStack:
    get = staticmethod(lambda: (None, 0))
    set = staticmethod(lambda value: None)
    reset = staticmethod(lambda token: None)


def _record_hit(name, caller=None):
    if torch.compiler.is_compiling():
        comptime(lambda ctx: stats.record_trampoline_hit(ctx.get_local("name").as_python_constant()))
    else:
        stats.record_trampoline_hit(name)


trampoline.MutmutCallStack = _NoCallStack
trampoline.record_trampoline_hit = _record_hit


def pytest_sessionstart(session):
    """The code under test must be mutmut's copy (mutants/), or every mutant would survive.

    Every mutated function goes through the one `_trampoline_wrapper` code object, so the suite's
    recompile limit per code object (64, tests/conftest.py; a hit is an error there) is reached after
    a few dozen tests in one process, on unmutated code: raised here, after conftest set it."""
    torch._dynamo.config.recompile_limit = 4096
    torch._dynamo.config.accumulated_recompile_limit = 65536
    import localrl.engine.ops
    import patches

    for module in (patches, localrl.engine.ops):
        assert "/mutants/" in module.__file__, f"{module.__name__} imported from {module.__file__}, not mutants/"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Dynamo's caches and automatic-dynamic state are reset before each test. Every mutated function
    is traced through the one trampoline code object, so without it a test inherits the shapes that
    earlier tests compiled for other functions (a dimension already seen to vary is compiled dynamic
    from the start), and a test of which dimensions recompile passes on a mutant it fails on alone.
    In the stats run it also makes every test that reaches compiled code trace it, and be recorded."""
    torch._dynamo.reset()
