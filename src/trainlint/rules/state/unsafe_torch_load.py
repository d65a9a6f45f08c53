"""TL702 unsafe-torch-load."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from trainlint.analysis.model import FileModel, has_star_kwargs, is_false, keyword
from trainlint.rules.base import Invalid, Report, Rule, Valid

TORCH_LOAD = "torch.load"
TORCH_SAVE = "torch.save"


def _literal_path(node: ast.AST | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


class UnsafeTorchLoad(Rule):
    """## What it does
    Flags `torch.load(..., weights_only=False)` on a path that is not a literal this
    file itself saved with `torch.save`, and (as a warning) `torch.load` without an
    explicit `weights_only`.

    ## Why is this bad?
    This is a security rule. `torch.load` unpickles: with `weights_only=False` a
    checkpoint can run arbitrary code when it is loaded, so a downloaded or shared
    checkpoint is a remote-code-execution vector. Without the argument the behaviour
    depends on the torch version: before 2.6 the default was `False` (unsafe), since
    2.6 it is `True`, so the same line is unsafe on one machine and fails to load a
    whole pickled model on another.

    ## Example
    ```python
    state = torch.load(args.checkpoint, weights_only=False)
    model.load_state_dict(torch.load(path))
    ```

    ## Use instead
    ```python
    state = torch.load(args.checkpoint, weights_only=True)
    model.load_state_dict(torch.load(path, weights_only=True))
    ```
    Save state dicts (`model.state_dict()`), not whole modules, so `weights_only=True`
    can load them.

    ## Fix safety
    Adding `weights_only=True` where the argument is missing is safe: it is the
    default since torch 2.6, and on older versions it refuses to unpickle code instead
    of running it. An explicit `weights_only=False` is never changed automatically.

    ## Options
    - `require-explicit` (default `true`): also warn when `weights_only` is missing.
      Projects that require torch >= 2.6, where the default is already `True`, can
      set it to `false` to report only an explicit `weights_only=False`.

    ## References
    - [torch.load](https://pytorch.org/docs/stable/generated/torch.load.html)
    - [Python pickle security warning](https://docs.python.org/3/library/pickle.html)
    """

    code = "TL702"
    name = "unsafe-torch-load"
    message = "`torch.load(weights_only=False)` unpickles arbitrary code from this file"
    triggers = ("load",)
    fix_safety = "safe"
    options = {"require-explicit": True}
    valid = [
        "import torch\nstate = torch.load(path, weights_only=True)\n",
        "import torch\nstate = torch.load(path, map_location='cpu', **load_kwargs)\n",
        "import torch\nstate = torch.load(path, weights_only=args.trust)\n",
        # the project wrote this literal path itself, in this file
        "import torch\ntorch.save(model, 'ckpt/full.pt')\n"
        "model = torch.load('ckpt/full.pt', weights_only=False)\n",
        # shadowed: a local `torch` object
        "def restore(torch, path):\n    return torch.load(path)\n",
        # no torch at all: json.load, pickle-free config loading
        "import json\nwith open('cfg.json') as f:\n    cfg = json.load(f)\n",
        "import numpy as np\nw = np.load('w.npy')\n",
        Valid("import torch\nsd = torch.load(path)\n", options={"require-explicit": False}),
    ]
    invalid = [
        Invalid("import torch\nsd = torch.load(args.ckpt, weights_only=False)\n", line=2, column=6),
        Invalid(
            "from torch import load as tload\n\nsd = tload(path)\n",
            line=3,
            fixed="from torch import load as tload\n\nsd = tload(path, weights_only=True)\n",
        ),
        Invalid(
            "import torch\nmodel.load_state_dict(\n    torch.load(\n        ckpt,\n"
            "        map_location='cpu',\n    )\n)\n",
            line=3,
            fixed="import torch\nmodel.load_state_dict(\n    torch.load(\n        ckpt,\n"
            "        map_location='cpu', weights_only=True,\n    )\n)\n",
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        loads = model.calls_to(TORCH_LOAD)
        if not loads:
            return
        saved = {
            _literal_path(c.args[1] if len(c.args) > 1 else keyword(c, "f"))
            for c in model.calls_to(TORCH_SAVE)
        }
        saved.discard(None)
        for call in loads:
            weights_only = keyword(call, "weights_only")
            if weights_only is None:
                if not self.opts["require-explicit"] or has_star_kwargs(call):
                    continue  # may carry weights_only; cannot tell
                from trainlint.fix import add_keyword

                edit = add_keyword(model, call, "weights_only=True")
                yield self.report(
                    call,
                    "`torch.load` without `weights_only`: unpickles arbitrary code on "
                    "torch < 2.6; pass `weights_only=True`",
                    severity="warning",
                    fix=self.fix(edit, message="add `weights_only=True`") if edit else None,
                )
            elif is_false(weights_only):
                path = call.args[0] if call.args else keyword(call, "f")
                if _literal_path(path) in saved:
                    continue
                yield self.report(call)
