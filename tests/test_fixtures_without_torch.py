"""A runtime fixture in an environment without torch says what to install (issue 36,
item 28), instead of a raw ModuleNotFoundError from deep inside a check."""

from __future__ import annotations


def test_fixture_without_torch_names_what_to_install(pytester):
    # torch made unimportable for the run's own process
    pytester.makeconftest("import sys\nsys.modules['torch'] = None\n")
    pytester.makepyfile(
        "def test_step(assert_grads_nonzero):\n    assert_grads_nonzero(None, lambda: None)\n"
    )
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)  # at the fixture's setup
    text = result.stdout.str()
    assert "needs torch" in text and "trainlint[runtime]" in text
    assert "During handling" not in text and "ModuleNotFoundError:" not in text
