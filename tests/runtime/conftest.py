"""Shared setup for the runtime-check tests: pytester, and CPU thread count kept small.

The checks run real training steps; a tiny MLP is faster on one intra-op thread than on
many, and the suite must stay fast on a two-core CI machine.
"""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    # `pytest_plugins = ["pytester"]` is an error outside the rootdir's conftest, and a
    # `pytest` run from the repository root loads this conftest only during collection.
    # Registering the plugin here works either way (pytest_configure and pytest_addoption
    # are historic hooks, so a late plugin still gets its options with their defaults).
    if not config.pluginmanager.has_plugin("pytester"):
        config.pluginmanager.import_plugin("pytester")


@pytest.fixture(autouse=True)
def _one_intraop_thread():
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
