"""The pytest plugin: fixtures, train_device, failure output, and life without torch."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
import torch._dynamo  # noqa: F401 - see below

import trainlint.testing

# pytester's in-process runs drop the modules a run imported when it ends. torch imports
# torch._dynamo lazily (torch.manual_seed does) and cannot import it a second time, so it
# is imported here, before any inner run, and survives them all.

CHECKS = [
    "assert_grads_nonzero",
    "assert_finite_grads",
    "assert_weights_updated",
    "assert_memory_stable",
    "assert_step_time_stable",
    "assert_lr_schedule",
    "assert_loss_decreases",
    "assert_thread_safe",
]

MODEL = """
import torch
from torch import nn

def make(seed=0, device="cpu"):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)).to(device)
    x = torch.randn(16, 4, device=device)
    y = torch.randn(16, 1, device=device)
    return model, x, y
"""


def test_every_check_is_a_fixture_returning_the_function(pytester):
    pytester.makeconftest("")
    body = "\n".join(
        f"def test_{name}({name}):\n    assert {name} is trainlint.testing.{name}\n"
        for name in CHECKS
    )
    pytester.makepyfile(f"import trainlint.testing\n\n{body}")
    result = pytester.runpytest("-q")
    result.assert_outcomes(passed=len(CHECKS))


def test_fixture_docstrings_point_at_the_functions(pytester):
    pytester.makepyfile("def test_nothing(): pass")
    result = pytester.runpytest("--fixtures")
    out = result.stdout.str()
    # Each fixture on its own: pytest does not promise the order --fixtures lists them in.
    for name in [*CHECKS, "train_device"]:
        result.stdout.fnmatch_lines([f"{name}*"])
    for name in CHECKS:
        assert f"trainlint.testing.{name}" in out


def test_train_device_runs_cpu_and_skips_cuda_cleanly(pytester):
    pytester.makepyfile(model=MODEL)
    pytester.makepyfile(
        test_device="""
        from model import make

        def test_weights_move(train_device, assert_weights_updated):
            model, x, y = make(device=train_device)
            opt = __import__("torch").optim.SGD(model.parameters(), lr=0.1)

            def step():
                opt.zero_grad()
                ((model(x) - y) ** 2).mean().backward()
                opt.step()

            assert_weights_updated(model, step, optimizer=opt)
            assert next(model.parameters()).device.type == train_device
        """
    )
    result = pytester.runpytest("-v", "-rs", "--strict-markers")
    if torch.cuda.is_available():
        result.assert_outcomes(passed=2)
    else:
        result.assert_outcomes(passed=1, skipped=1)
        result.stdout.fnmatch_lines(
            ["*test_weights_move?cpu? PASSED*", "*SKIPPED*CUDA is not available*"]
        )


def test_train_device_cuda_case_is_marked(pytester):
    pytester.makepyfile("def test_device(train_device): pass")
    result = pytester.runpytest("-m", "not cuda", "-v", "--strict-markers")
    result.assert_outcomes(passed=1, deselected=1)


def test_a_failing_check_reads_well_in_pytest_output(pytester):
    pytester.makepyfile(model=MODEL)
    pytester.makepyfile(
        test_bug="""
        import copy
        import torch
        from model import make

        def test_training_moves_the_model(assert_weights_updated):
            model, x, y = make()
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            model = copy.deepcopy(model)  # optimizer now holds orphaned tensors

            def step():
                opt.zero_grad()
                ((model(x) - y) ** 2).mean().backward()
                opt.step()

            assert_weights_updated(model, step, optimizer=opt)
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "CheckFailed: assert_weights_updated: 4 of 4 parameters misbehaved" in out
    assert "0.weight   (8, 4)  did not change  yes             no" in out
    assert "TL107 optimizer-on-stale-params" in out
    # the check's own frames are hidden; the test's line is shown
    assert "assert_weights_updated(model, step, optimizer=opt)" in out
    assert "opt.step()\n" not in out.split("def step")[0]
    assert "_runtime" not in out


def test_checks_work_without_the_plugin(pytester):
    pytester.makepyfile(model=MODEL)
    pytester.makepyfile(
        test_plain="""
        import torch
        from model import make
        from trainlint.testing import assert_grads_nonzero

        def test_plain():
            model, x, y = make()
            assert_grads_nonzero(model, lambda: ((model(x) - y) ** 2).mean().backward())
        """
    )
    result = pytester.runpytest("-p", "no:trainlint")
    result.assert_outcomes(passed=1)


def test_importing_the_plugin_and_testing_does_not_import_torch():
    code = textwrap.dedent(
        """
        import sys
        import trainlint.pytest_plugin, trainlint.testing
        assert "torch" not in sys.modules, "torch was imported"
        print("ok")
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


BLOCK_TORCH = """
import sys

class BlockTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is not installed in this environment")
        return None

sys.meta_path.insert(0, BlockTorch())
"""


def test_pytest_runs_in_an_environment_without_torch(pytester):
    # `-p` plugins load before entry points: the blocker is in place before trainlint.
    pytester.makepyfile(blocktorch=BLOCK_TORCH)
    pytester.makepyfile(
        test_no_torch="""
        import sys

        def test_plugin_loaded_without_torch(pytestconfig):
            assert pytestconfig.pluginmanager.has_plugin("trainlint")
            assert "torch" not in sys.modules

        def test_device(train_device):
            assert train_device == "cpu"

        def test_fixture(assert_lr_schedule):
            assert callable(assert_lr_schedule)
        """
    )
    result = pytester.runpytest_subprocess("-p", "blocktorch", "-rs", "-p", "no:cacheprovider")
    # a check's fixture cannot run without torch: it errors with what to install (a skip
    # would let a regression test pass unseen); the CUDA device case skips
    result.assert_outcomes(passed=2, skipped=1, errors=1)
    result.stdout.fnmatch_lines(["*SKIPPED*torch is not installed*"])
    result.stdout.fnmatch_lines(["*needs torch*pip install*trainlint*runtime*"])


def test_a_checks_fixture_does_not_import_torch_before_the_check_runs(pytester):
    pytester.makepyfile(
        test_lazy="""
        import sys

        def test_fixture(assert_lr_schedule):
            assert callable(assert_lr_schedule)
            assert "torch" not in sys.modules
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_checks_are_listed_in_the_public_api():
    for name in CHECKS:
        assert name in trainlint.testing.__all__
        assert getattr(trainlint.testing, name).__doc__


@pytest.mark.parametrize("name", CHECKS)
def test_fixture_returns_the_check(request, name):
    assert request.getfixturevalue(name) is getattr(trainlint.testing, name)
