"""TL702 unsafe-torch-load."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from trainlint.analysis import checkpoints
from trainlint.analysis.checkpoints import Save
from trainlint.analysis.model import (
    FileModel,
    call_name,
    has_star_kwargs,
    is_false,
    keyword,
    walk_local,
)
from trainlint.config import OLDEST_TORCH, TARGET_TORCH, torch_version
from trainlint.findings import Applicability, Fix
from trainlint.rules.base import Invalid, Report, Rule, Valid

TORCH_LOAD = "torch.load"
TORCH_SAVE = "torch.save"
#: The first torch whose `torch.load` defaults to `weights_only=True`.
SAFE_DEFAULT = (2, 6)
#: The first torch whose `torch.load` accepts `weights_only` at all.
HAS_WEIGHTS_ONLY = (1, 13)


def _path_arg(call: ast.Call) -> ast.expr | None:
    return call.args[0] if call.args else keyword(call, "f")


def _save_target(call: ast.Call) -> ast.expr | None:
    return call.args[1] if len(call.args) > 1 else keyword(call, "f")


def _has_literal(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Constant) and isinstance(n.value, str) for n in ast.walk(node))


def _written_here(model: FileModel, load: ast.Call, saves: list[ast.Call]) -> bool:
    """The file loads what it saved itself: the same path expression is a `torch.save`
    target, either built from a literal file name (anywhere in the file), or earlier in
    the same function (a round trip through a temporary file or an in-memory buffer)."""
    path = _path_arg(load)
    if path is None:
        return False
    shape = ast.dump(path)
    fn = model.function_of(load)
    for save in saves:
        target = _save_target(save)
        if target is None or ast.dump(target) != shape:
            continue
        if _has_literal(path):
            return True
        if fn is not None and model.function_of(save) is fn and save.lineno < load.lineno:
            return True
    return False


def _state_dict_argument(model: FileModel, node: ast.AST) -> bool:
    """``node`` is the state dict passed to some ``.load_state_dict(...)``."""
    parent = model.parent_of(node)
    if not isinstance(parent, ast.Call) or call_name(parent) != "load_state_dict":
        return False
    return (bool(parent.args) and parent.args[0] is node) or keyword(parent, "state_dict") is node


def _goes_to_load_state_dict(model: FileModel, load: ast.Call) -> bool:
    """Provably, the loaded value is only ever a state dict given to `load_state_dict`:
    passed directly, or bound once to a local name whose every use is such an argument."""
    if _state_dict_argument(model, load):
        return True
    stmt = model.parent_of(load)
    if not (
        isinstance(stmt, ast.Assign)
        and len(stmt.targets) == 1
        and isinstance(stmt.targets[0], ast.Name)
    ):
        return False
    name = stmt.targets[0].id
    scope = model.scope_of(load)
    uses: list[ast.Name] = []
    stores = 0
    for node in walk_local(scope):
        if isinstance(node, ast.Name) and node.id == name:
            if isinstance(node.ctx, ast.Load):
                uses.append(node)
            else:
                stores += 1
        elif isinstance(node, (ast.Global, ast.Nonlocal)) and name in node.names:
            return False
    return stores == 1 and bool(uses) and all(_state_dict_argument(model, u) for u in uses)


def _objects_message(why: str, save: Save) -> str:
    item = save.items[0]
    where = f"line {save.line}" if not save.where else f"`{save.where}` line {save.line}"
    held = f"holds `{item.text}`, {item.kind}" if save.read else f"saved at {where} holds"
    if not save.read:
        held += f" `{item.text}` ({item.kind})"
    return (
        f"`torch.load` without `weights_only` unpickles arbitrary code before torch 2.6 "
        f"({why}); the checkpoint {held}, so "
        f"`weights_only=True` cannot load it: store plain data (state dicts, `vars(args)`) "
        f"before restricting the load"
    )


class UnsafeTorchLoad(Rule):
    """## What it does
    Flags `torch.load(..., weights_only=False)` on a path this file did not itself save
    with `torch.save`, and `torch.load` without `weights_only` when the project supports
    a torch older than 2.6 (see `target-torch` below). Test files are not checked: they
    load what they just saved.

    Off by default: this is security hygiene, not a training bug (select it with
    `--select TL702` or `extend-select`). A bare load of a checkpoint that pickles objects
    breaks on torch 2.6 and later; that training bug is TL704, on by default.

    ## Why is this bad?
    This is a security rule. `torch.load` unpickles: with `weights_only=False` a
    checkpoint can run arbitrary code when it is loaded, so a downloaded or shared
    checkpoint is a remote-code-execution vector. Without the argument the behaviour
    depends on the torch version: before 2.6 the default was `False` (unsafe), since
    2.6 it is `True`, so the same line is unsafe on one machine and fails to load a
    whole pickled model on another.

    Which torch counts is the project's *target torch*: `target-torch = "2.6"` in
    `[tool.trainlint]`, else the lower bound of the project's torch requirement
    (`torch>=2.6` is 2.6), read from `pyproject.toml` (`[project]` dependencies and
    optional groups, poetry), `setup.py`/`setup.cfg` `install_requires`,
    `requirements*.txt` (with `-r` includes) or `environment.yml`, else 2.1, the oldest
    torch trainlint considers. The message says which pin it used. From 2.6 on, a missing `weights_only` is the safe
    default and is not reported. An explicit `weights_only=False` is a deliberate choice
    in most real code (a checkpoint format that pickles objects): it is reported by
    default only where the loaded value provably is a state dict handed to
    `load_state_dict`, which loads fine with `weights_only=True`; the option
    `report-explicit-false` reports every one. Not reported either: a load whose path this file saves to itself (a literal
    file name, or earlier in the same function: a round trip through a temporary file
    or an in-memory buffer), and the `except TypeError:` fallback of a `try` that passes
    `weights_only`, which runs only on a torch too old to accept it. Where the project
    saves the loaded checkpoint with objects (an `argparse.Namespace`, a whole model: see
    TL704), the message says that `weights_only=True` cannot load it, and offers no fix.

    ## Example
    ```python
    state = torch.load(args.checkpoint, weights_only=False)
    model.load_state_dict(torch.load(path))  # project requires torch>=2.1
    ```

    ## Use instead
    ```python
    state = torch.load(args.checkpoint, weights_only=True)
    model.load_state_dict(torch.load(path, weights_only=True))
    ```
    Save state dicts (`model.state_dict()`), not whole modules, so `weights_only=True`
    can load them.

    ## Fix safety
    Where `weights_only` is missing, the fix adds `weights_only=True`. It is safe when
    the loaded value provably goes to `load_state_dict` (passed directly, or bound to a
    name used only that way): a state dict loads under `weights_only`. Otherwise it is
    unsafe: a checkpoint holding pickled objects other than tensors (a whole module, an
    `argparse.Namespace`, a config class) no longer loads. No fix is offered when the
    target torch is older than 1.13, which lacks the argument, and an explicit
    `weights_only=False` is never changed automatically.

    ## Options
    - `require-explicit` (default `true`): report a missing `weights_only` when the
      target torch is older than 2.6; `false` reports only an explicit
      `weights_only=False`.
    - `report-explicit-false` (default `false`): also report an explicit
      `weights_only=False` whose value is not provably a state dict (security audits).
    - `target-torch` (default: the `target-torch` setting of `[tool.trainlint]`, else the
      project's torch pin, else `"2.1"`): the oldest torch the project supports.

    ## References
    - [torch.load](https://pytorch.org/docs/stable/generated/torch.load.html)
    - [Python pickle security warning](https://docs.python.org/3/library/pickle.html)
    """

    code = "TL702"
    name = "unsafe-torch-load"
    default_enabled = False  # security hygiene, not a training bug: opt in with --select
    message = "`torch.load(weights_only=False)` unpickles arbitrary code from this file"
    triggers = ("load",)
    fix_safety = "unsafe"
    test_files = False  # tests load what they just saved
    options = {"require-explicit": True, "report-explicit-false": False, TARGET_TORCH: None}
    valid = [
        "import torch\nstate = torch.load(path, weights_only=True)\n",
        # a deliberate False for a checkpoint that pickles more than tensors (the default
        # reports it only with `report-explicit-false`)
        "import torch\nckpt = torch.load(args.resume, weights_only=False)\n"
        "model.load_state_dict(ckpt['model'])\nstart_epoch = ckpt['args'].epochs\n",
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
        # torch >= 2.6 (the project's pin or `target-torch`): the default is already safe
        Valid("import torch\nsd = torch.load(path)\n", options={TARGET_TORCH: "2.6"}),
        Valid(
            "import torch\nsd = torch.load(path, map_location='cpu')\n",
            options={TARGET_TORCH: "2.7.1"},
        ),
        # a round trip through an in-memory buffer, as in broadcasting a pickled object
        "import io\nimport torch\n\ndef share(obj, is_src, data):\n"
        "    if is_src:\n        buffer = io.BytesIO()\n        torch.save(obj, buffer)\n"
        "        return buffer.getvalue()\n"
        "    buffer = io.BytesIO(data)\n    return torch.load(buffer)\n",
        # a file name the same file writes elsewhere (save/load methods of one class)
        "import os\nimport torch\n\nclass Centroids:\n"
        "    def save(self, d):\n        torch.save(self.c, os.path.join(d, 'centroids.pth'))\n"
        "    def load(self, d):\n        self.c = torch.load(os.path.join(d, 'centroids.pth'))\n",
        # the fallback for a torch without the argument
        "import torch\ntry:\n    sd = torch.load(path, weights_only=True)\n"
        "except TypeError:\n    sd = torch.load(path)\n",
        "import torch\n\ndef load(path, **kw):\n    try:\n        return torch.load(path, **kw)\n"
        "    except (TypeError, ValueError):\n        return torch.load(path, map_location='cpu')\n",
        # a test loads what it just saved
        Valid(
            "import torch\n\ndef test_roundtrip(tmp_path, model):\n"
            "    torch.save(model.state_dict(), tmp_path / 'm.pt')\n"
            "    sd = torch.load(tmp_path / 'm.pt', weights_only=False)\n",
            path="tests/test_checkpoint.py",
        ),
    ]
    invalid = [
        # explicit False where the value is only ever a state dict: `True` would load it
        Invalid(
            "import torch\nmodel.load_state_dict(torch.load(args.ckpt, weights_only=False))\n",
            line=2,
            column=23,
        ),
        Invalid(
            "import torch\nsd = torch.load(args.ckpt, weights_only=False)\n",
            line=2,
            column=6,
            options={"report-explicit-false": True},
        ),
        # explicit False stays unsafe on every torch
        Invalid(
            "import torch\nsd = torch.load(args.ckpt, weights_only=False)\n",
            line=2,
            options={TARGET_TORCH: "2.6", "report-explicit-false": True},
        ),
        # the loaded value is not provably a state dict: unsafe fix
        Invalid(
            "from torch import load as tload\n\nsd = tload(path)\n",
            line=3,
            fixed="from torch import load as tload\n\nsd = tload(path, weights_only=True)\n",
        ),
        # `ckpt['args'].epoch`: the checkpoint holds an object, so no `weights_only=True` fix
        Invalid(
            "import torch\nckpt = torch.load(args.resume, map_location='cpu')\n"
            "model.load_state_dict(ckpt['model'])\nstart = ckpt['args'].epoch\n",
            line=2,
            options={TARGET_TORCH: "2.5"},
        ),
        # straight into load_state_dict: safe fix
        Invalid(
            "import torch\nmodel.load_state_dict(\n    torch.load(\n        ckpt,\n"
            "        map_location='cpu',\n    )\n)\n",
            line=3,
            fixed="import torch\nmodel.load_state_dict(\n    torch.load(\n        ckpt,\n"
            "        map_location='cpu', weights_only=True,\n    )\n)\n",
        ),
        Invalid(
            "import torch\n\ndef restore(model, path):\n    sd = torch.load(path)\n"
            "    model.load_state_dict(sd, strict=False)\n",
            line=4,
            fixed="import torch\n\ndef restore(model, path):\n"
            "    sd = torch.load(path, weights_only=True)\n"
            "    model.load_state_dict(sd, strict=False)\n",
        ),
        # the project saves objects into this checkpoint: no `weights_only=True` advice
        Invalid(
            "import argparse\nimport torch\nargs = argparse.ArgumentParser().parse_args()\n"
            "torch.save({'args': args, 'epoch': 1}, args.out)\n"
            "ckpt = torch.load(args.resume)\nstart = ckpt['epoch'] + ckpt['args'].warmup\n",
            line=5,
        ),
        # torch 1.12 has no `weights_only`: reported, but no fix
        Invalid("import torch\nsd = torch.load(path)\n", line=2, options={TARGET_TORCH: "1.12"}),
        # an `except TypeError:` around something else is no old-torch fallback
        Invalid(
            "import torch\ntry:\n    cfg = parse(text)\nexcept TypeError:\n"
            "    cfg = torch.load(path)\n",
            line=5,
            fixed="import torch\ntry:\n    cfg = parse(text)\nexcept TypeError:\n"
            "    cfg = torch.load(path, weights_only=True)\n",
        ),
        # a round trip elsewhere does not cover a load before the save
        Invalid(
            "import torch\n\ndef resume_then_save(path, state):\n"
            "    state.update(torch.load(path, weights_only=False))\n"
            "    torch.save(state, path)\n",
            line=4,
            options={"report-explicit-false": True},
        ),
    ]

    def _target(self, model: FileModel) -> tuple[tuple[int, int], str]:
        """The target torch and where it came from (for the message)."""
        explicit = self.opts.get(TARGET_TORCH)
        if explicit:
            return torch_version(explicit), f"`{TARGET_TORCH}` {explicit}"
        pin = model.torch_pin
        if pin is not None:
            major, minor = pin
            source = getattr(pin, "source", "the project")
            return pin, f"{source} requires torch>={major}.{minor}"
        return torch_version(OLDEST_TORCH), f"no torch pin found, assuming {OLDEST_TORCH}"

    def check(self, model: FileModel) -> Iterator[Report]:
        loads = model.calls_to(TORCH_LOAD)  # (every load: explicit `False` included)
        if not loads:
            return
        target, why = self._target(model)
        report_missing = self.opts["require-explicit"] and target < SAFE_DEFAULT
        saves = model.calls_to(TORCH_SAVE)
        pickled = checkpoints.pickled_loads(model)
        for call in loads:
            weights_only = keyword(call, "weights_only")
            if weights_only is None:
                if not report_missing or has_star_kwargs(call):
                    continue  # safe by default, or **kwargs may carry weights_only
                if _written_here(model, call, saves) or checkpoints.old_torch_fallback(model, call):
                    continue
                held = pickled.get(call)
                if held is not None:
                    # `weights_only=True` is no advice for a checkpoint of objects (TL704)
                    yield self.report(call, _objects_message(why, held))
                    continue
                yield self.report(
                    call,
                    f"`torch.load` without `weights_only` unpickles arbitrary code before "
                    f"torch 2.6 ({why}); pass `weights_only=True`",
                    fix=self._fix(model, call, target),
                )
            elif is_false(weights_only):
                if _written_here(model, call, saves):
                    continue
                if self.opts["report-explicit-false"]:
                    yield self.report(call)
                elif _goes_to_load_state_dict(model, call):
                    yield self.report(
                        call,
                        "`weights_only=False` on a load that only feeds `load_state_dict`: "
                        "it unpickles arbitrary code for nothing; pass `weights_only=True`",
                    )

    def _fix(self, model: FileModel, call: ast.Call, target: tuple[int, int]) -> Fix | None:
        if target < HAS_WEIGHTS_ONLY:
            return None
        from trainlint.edits import add_keyword

        edit = add_keyword(model, call, "weights_only=True")
        if edit is None:
            return None
        safety: Applicability = "safe" if _goes_to_load_state_dict(model, call) else "unsafe"
        return Fix(safety, (edit,), "add `weights_only=True`")
