"""The layers of ``analysis/``: which module sits where. Each imports only its own layer
and the layers below it (``tests/test_analysis_layers.py`` checks it; docs/architecture.md
explains it).

* **facts**: one parse, one indexing walk per file: the :class:`FileModel` and its
  tables (calls, assignments, scopes, imports, loops), the tree walks, what torch's API
  does, module names. Nothing here knows what training is.
* **values**: where a value comes from and goes to: the values a name is assigned,
  constants, which object a name, attribute, parameter or return holds (``roles``: the
  model, optimizer, scheduler... a binding resolves to), what carries autograd history
  (``flow``), which output layer a value comes from.
* **meaning**: what the code does to training: step events, step loops and their paths,
  accumulation, modes, schedules, checkpoints, what escapes to threads and processes.
* **project**: the index joining per-file summaries, and the answers it gives a file
  about other files (views, step effects of calls across files).

A question a lower layer must ask of a higher one goes through :mod:`hooks`.
"""

from __future__ import annotations

#: Layer name -> its modules, bottom layer first.
LAYERS: dict[str, tuple[str, ...]] = {
    "facts": (
        "imports",
        "walk",
        "hooks",
        "torch_table",
        "model",
        "project_modules",
        "context",
        "dominance",
        "reordering",
        "layers",
    ),
    "values": (
        "assignments",
        "arguments",
        "call_keywords",
        "constants",
        "settings",
        "devices",
        "roles",
        "flow",
        "invariants",
        "submodules",
        "activations",
        "softmax",
        "loss_terms",
    ),
    "meaning": (
        "step_events",
        "step_paths",
        "steps",
        "step_branches",
        "paths",
        "ordering",
        "grad_mode",
        "grad_clearing",
        "grad_accumulation",
        "accumulation",
        "amp",
        "syncs",
        "modes",
        "schedules",
        "schedule_units",
        "seeding",
        "dataset_rng",
        "checkpoint_contents",
        "checkpoints",
        "loaded_objects",
        "escape_sites",
        "escape_dispatches",
        "escape_training",
        "escapes",
        "escape_targets",
        "escape_callers",
        "objects",
        "loaders",
        "data_parallel",
        "lr_assignments",
        "lr_objects",
        "lr_units",
    ),
    "project": (
        "project_summary",
        "project_views",
        "effects",
        "project",
        "debug",
    ),
}

#: Modules that may import inside a function: only optional dependencies, which a
#: plain install lacks (module -> the top-level packages it imports lazily). None today.
OPTIONAL_IMPORTS: dict[str, frozenset[str]] = {}

#: Downward imports kept inside a function for start-up time alone. None today: every
#: analysis module imports what it needs at its top (a one-file check still starts within
#: SPEC section 12's 0.05 s). Module -> the analysis modules it imports on first use.
LAZY_IMPORTS: dict[str, frozenset[str]] = {}


def layer_of(module: str) -> int | None:
    """The index of ``module``'s layer (0: facts), None for a module in no layer."""
    for i, modules in enumerate(LAYERS.values()):
        if module in modules:
            return i
    return None
