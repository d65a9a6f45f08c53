"""TL704 checkpoint-needs-pickle."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from trainlint.analysis.checkpoints import Item, Save, pickled_loads
from trainlint.analysis.loaded_objects import loads_of_branch_objects
from trainlint.analysis.model import FileModel
from trainlint.config import OLDEST_TORCH, TARGET_TORCH, torch_version
from trainlint.findings import Fix
from trainlint.rules.base import Invalid, Report, Rule, Valid

#: The first torch whose `torch.load` accepts `weights_only` at all.
HAS_WEIGHTS_ONLY = (1, 13)

_SAVE_ARGS = (
    "import argparse\nimport os\nimport torch\n\n"
    "parser = argparse.ArgumentParser()\nparser.add_argument('--lr', type=float)\n"
    "args = parser.parse_args()\n\n"
    "def save(model, out):\n"
    "    torch.save({'model': model.state_dict(), 'args': args}, os.path.join(out, 'last.pt'))\n\n"
    "def resume(model, run):\n"
    "    ckpt = torch.load(os.path.join(run, 'last.pt'))\n"
    "    model.load_state_dict(ckpt['model'])\n"
)
_NUMPY = (
    "import numpy as np\nimport torch\n\ndef save(model, out, epoch, scores):\n"
    "    state = {}\n    state['model'] = model.state_dict()\n"
    "    state['best'] = np.max(scores)\n"
    "    torch.save(state, f'{out}/ckpt_{epoch}.pt')\n\n"
    "def load(run, epoch):\n    return torch.load(f'{run}/ckpt_{epoch}.pt')\n"
)
_OPTIMIZER = (
    "import torch\n\ndef train(model, args):\n"
    "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "    torch.save({'model': model.state_dict(), 'optimizer': opt, 'epoch': 3}, args.out)\n\n"
    "def resume(model, args):\n    ckpt = torch.load(args.resume)\n"
    "    model.load_state_dict(ckpt['model'])\n    return ckpt['epoch']\n"
)
_LOAD = "torch.load(os.path.join(run, 'last.pt'))"
_LOAD_FALSE = "torch.load(os.path.join(run, 'last.pt'), weights_only=False)"


_ORDER = ((0, "argparse"), (1, "Namespace"), (2, "dataclass"), (3, "Config"), (4, "Module"))


def _advice(item: Item) -> str:
    """The change to the save that makes the checkpoint plain data, for this object."""
    if "argparse" in item.kind or "Namespace" in item.kind:
        return f"save `vars({item.text})`"
    if "module" in item.kind.lower() or "optimizer" in item.kind or "scheduler" in item.kind:
        return f"save `{item.text}.state_dict()`"
    return "register its class with `torch.serialization.add_safe_globals([...])`"


class CheckpointNeedsPickle(Rule):
    """## What it does
    Flags a `torch.load(path)` without `weights_only` that reads a checkpoint this project
    saves with objects other than tensors and plain containers: an `argparse.Namespace`,
    a config or dataclass object, a whole `nn.Module`, an optimizer or scheduler object,
    NumPy arrays or scalars. Each `torch.save` is paired with the loads of the same
    checkpoint anywhere in the project: the same file name or name pattern
    (`f"{out}/best.pt"`, `os.path.join(d, "best.pt")`), the same config key or attribute
    (`cfg.ckpt_path`), the same path helper (`ckpt_path(run, "best")`), or a load that
    reads only keys the saved dict has (`ckpt["model"]`, `ckpt["epoch"]`). Saves through a
    helper that hands its arguments to `torch.save` (`save_on_master(state, path)`) count.
    A load is also reported when the code right after it shows the checkpoint holds such
    an object, whoever saved it: a module method called on the loaded value or one of its
    entries (`ckpt["model"].float().state_dict()`, `torch.load(p).eval()`), or an
    attribute read from its command-line entry (`ckpt["args"].arch`), or another branch
    of the same `if`/`else` assigning the name an object of a class of the file
    (`agent = torch.load(cfg.resume)` / `else: agent = Agent(cfg)`). The message names
    the object, what it is and where it is saved (or used).

    ## Why is this bad?
    Since torch 2.6, `torch.load` defaults to `weights_only=True`, which refuses to
    unpickle anything but tensors, numbers, strings and containers of them. The load
    raises `UnpicklingError` ("Weights only load failed... Unsupported global") on
    exactly the checkpoints the program wrote itself: resume, evaluation and export break
    the day the environment upgrades torch, with nothing in the training code changed.
    It is reported whatever torch the project pins: a project on torch 2.1 still breaks
    when it upgrades, and `weights_only=False` behaves the same on every torch since
    1.13, so the fix costs nothing now. Loads of files another program wrote (a URL,
    `hf_hub_download`, `torch.hub`) are not this rule's business (see TL702), and when
    what the checkpoint holds is unknown, nothing is reported. Neither is the
    `except TypeError:` fallback of a load that passes `weights_only` (it runs only on a
    torch without the argument), nor a use under `isinstance`/`hasattr`, which is code
    reading several checkpoint formats.

    ## Example
    ```python
    torch.save({"model": model.state_dict(), "args": args}, f"{out}/last.pt")  # train.py
    ckpt = torch.load(f"{run}/last.pt")  # eval.py: UnpicklingError on torch >= 2.6
    ```

    ## Use instead
    ```python
    ckpt = torch.load(f"{run}/last.pt", weights_only=False)  # our own, trusted file
    ```
    or save plain data, which any torch loads with `weights_only=True`:
    ```python
    torch.save({"model": model.state_dict(), "args": vars(args)}, f"{out}/last.pt")
    ```
    or allow the class: `torch.serialization.add_safe_globals([argparse.Namespace])`.
    Never `weights_only=True` alone here: that is the failing load.

    ## Fix safety
    The fix adds `weights_only=False` to the load. It keeps today's behaviour on every
    torch, but it is unsafe: it unpickles whatever the file holds, which is right only for
    checkpoints the project wrote itself. No fix is offered when the target torch is
    older than 1.13, which lacks the argument.

    ## Options
    - `target-torch` (default: the `target-torch` setting, else the project's torch pin,
      else `"2.1"`): decides only whether the fix is offered.

    ## References
    - [torch.load and weights_only](https://pytorch.org/docs/stable/notes/serialization.html#weights-only)
    - Confirmed at runtime by `tests/runtime/test_runtime_checkpoint.py`: a real
      checkpoint holding an `argparse.Namespace` fails a bare `torch.load` on torch 2.6+
      and loads with `weights_only=False`.
    """

    code = "TL704"
    name = "checkpoint-needs-pickle"
    message = (
        "this checkpoint holds objects `weights_only` refuses: since torch 2.6 the bare "
        "`torch.load` raises `UnpicklingError`; pass `weights_only=False` for the "
        "project's own checkpoints"
    )
    triggers = ("load",)
    fix_safety = "unsafe"
    test_files = False  # a test's save and load break loudly, in the test run itself
    options = {TARGET_TORCH: None}
    valid = [
        # only state dicts and numbers: `weights_only=True` loads them
        "import torch\n\ndef save(model, opt, epoch):\n"
        "    torch.save({'model': model.state_dict(), 'opt': opt.state_dict(), 'epoch': epoch},"
        " 'last.pt')\n\ndef resume(model):\n    ckpt = torch.load('last.pt')\n",
        # the load already says what it wants
        _SAVE_ARGS.replace(_LOAD, _LOAD_FALSE),
        _SAVE_ARGS.replace("'args': args", "'args': vars(args)"),
        # a file another program wrote
        "import argparse\nimport torch\nargs = argparse.ArgumentParser().parse_args()\n"
        "torch.save({'args': args}, 'run/last.pt')\n"
        "sd = torch.load(hf_hub_download('org/model', 'last.pt'))\n",
        # what the saved dict holds is unknown here
        "import torch\n\ndef save(state):\n    torch.save(state, 'last.pt')\n\n"
        "def resume():\n    return torch.load('last.pt')\n",
        # the same file object name for two different files
        "import torch\n\ndef run(model, args):\n"
        "    with open(args.export, 'wb') as f:\n        torch.save(model, f)\n"
        "    with open(args.init, 'rb') as f:\n        init = torch.load(f)\n",
        # entries used as plain data: a tensor's attributes, a dict's methods
        "import torch\nckpt = torch.load(p)\nw = ckpt['weight'].float().shape\n"
        "lr = ckpt['args'].get('lr')\n",
        # the name holds another object by the time a module method is called on it
        "import torch\nsd = torch.load(p)\nsd = Net()\nsd.eval()\n",
        # a different file name
        "import argparse\nimport torch\nargs = argparse.ArgumentParser().parse_args()\n"
        "torch.save({'args': args}, 'run/args.pt')\nsd = torch.load('run/weights.pt')\n",
        # shadowed: a local `torch` object that is not the library
        "def roundtrip(torch, args, path):\n    torch.save({'args': args}, path)\n"
        "    return torch.load(path)\n",
        # no torch at all
        "import pickle\n\ndef load(path):\n    with open(path, 'rb') as f:\n"
        "        return pickle.load(f)\n",
        Valid(_SAVE_ARGS, path="tests/test_resume.py"),
    ]
    invalid = [
        Invalid(
            _SAVE_ARGS,
            line=13,
            column=12,
            fixed=_SAVE_ARGS.replace(_LOAD, _LOAD_FALSE),
        ),
        # an aliased import, a whole model saved to a literal path
        Invalid(
            "import torch as T\nfrom torchvision.models import resnet18\n\n"
            "model = resnet18()\nT.save(model, 'weights/full.pth')\n"
            "net = T.load('weights/full.pth', map_location='cpu')\n",
            line=6,
            fixed="import torch as T\nfrom torchvision.models import resnet18\n\n"
            "model = resnet18()\nT.save(model, 'weights/full.pth')\n"
            "net = T.load('weights/full.pth', map_location='cpu', weights_only=False)\n",
        ),
        # a dict built up key by key, and a NumPy value; the pattern of an f-string
        Invalid(
            _NUMPY,
            line=11,
            fixed=_NUMPY.replace(
                "ckpt_{epoch}.pt')\n", "ckpt_{epoch}.pt', weights_only=False)\n"
            ).replace("{out}/ckpt_{epoch}.pt', weights_only=False)", "{out}/ckpt_{epoch}.pt')"),
        ),
        # the optimizer object, not its state dict; a resume through `args.resume` that
        # reads the keys this file saves
        Invalid(
            _OPTIMIZER,
            line=8,
            fixed=_OPTIMIZER.replace("(args.resume)", "(args.resume, weights_only=False)"),
        ),
        # what the code does with the loaded entries shows what the checkpoint holds
        Invalid(
            "import torch\n\ndef restore(weights):\n"
            "    ckpt = torch.load(weights, map_location='cpu')\n"
            "    return ckpt['model'].float().state_dict(), ckpt['args'].arch\n",
            line=4,
            fixed="import torch\n\ndef restore(weights):\n"
            "    ckpt = torch.load(weights, map_location='cpu', weights_only=False)\n"
            "    return ckpt['model'].float().state_dict(), ckpt['args'].arch\n",
        ),
        # a file object stands for the path it opened
        Invalid(
            "import torch\nfrom torch import nn\n\nmodel = nn.LSTM(8, 8)\n"
            "with open(args.save, 'wb') as f:\n    torch.save(model, f)\n"
            "with open(args.save, 'rb') as f:\n    model = torch.load(f)\n",
            line=8,
            fixed="import torch\nfrom torch import nn\n\nmodel = nn.LSTM(8, 8)\n"
            "with open(args.save, 'wb') as f:\n    torch.save(model, f)\n"
            "with open(args.save, 'rb') as f:\n    model = torch.load(f, weights_only=False)\n",
        ),
        # a list of NumPy scalars, appended epoch after epoch from a helper's return
        Invalid(
            "import numpy as np\nimport torch\n\nclass Trainer:\n"
            "    def _epoch(self):\n        if not self.loader:\n            return None\n"
            "        return np.mean(self.batch_losses)\n\n"
            "    def fit(self, n):\n        for _ in range(n):\n"
            "            self.losses.append(self._epoch())\n\n"
            "    def save(self, path):\n"
            "        torch.save({'model': self.model.state_dict(), 'losses': self.losses}, path)\n\n"
            "    def load(self, path):\n        ckpt = torch.load(path)\n"
            "        self.model.load_state_dict(ckpt['model'])\n        self.losses = ckpt['losses']\n",
            line=18,
            fixed="import numpy as np\nimport torch\n\nclass Trainer:\n"
            "    def _epoch(self):\n        if not self.loader:\n            return None\n"
            "        return np.mean(self.batch_losses)\n\n"
            "    def fit(self, n):\n        for _ in range(n):\n"
            "            self.losses.append(self._epoch())\n\n"
            "    def save(self, path):\n"
            "        torch.save({'model': self.model.state_dict(), 'losses': self.losses}, path)\n\n"
            "    def load(self, path):\n        ckpt = torch.load(path, weights_only=False)\n"
            "        self.model.load_state_dict(ckpt['model'])\n        self.losses = ckpt['losses']\n",
        ),
        # torch 1.12 has no `weights_only`: reported, no fix
        Invalid(_SAVE_ARGS, line=13, options={TARGET_TORCH: "1.12"}),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        found = pickled_loads(model)
        for call, save in found.items():
            yield self.report(call, self._message(save), fix=self._fix(model, call))
        for call, save in loads_of_branch_objects(model).items():
            if call not in found:
                yield self.report(call, self._message(save), fix=self._fix(model, call))

    def _message(self, save: Save) -> str:
        # the object a reader recognises first (the command line, the model) leads
        item = min(save.items, key=lambda i: next((n for n, w in _ORDER if w in i.kind), 9))
        more = len(save.items) - 1
        named = item.key is None or item.key == item.text
        what = f"`{item.text}`" if named else f"`{item.key}`: `{item.text}`"
        if save.read:
            return (
                f"the loaded checkpoint holds `{item.text}`, {item.kind}; since torch 2.6 "
                f"this bare `torch.load` raises `UnpicklingError`: pass `weights_only=False` "
                f"for the project's own checkpoint, or {_advice(item)}"
            )
        where = f"line {save.line}" if not save.where else f"`{save.where}` line {save.line}"
        return (
            f"checkpoint saved at {where} holds {what} ({item.kind})"
            f"{f' and {more} more such object' + ('s' if more > 1 else '') if more else ''}"
            f": since torch 2.6 this "
            f"bare `torch.load` raises `UnpicklingError`; pass `weights_only=False` for the "
            f"project's own checkpoint, or {_advice(item)}"
        )

    def _fix(self, model: FileModel, load: ast.Call) -> Fix | None:
        explicit = self.opts.get(TARGET_TORCH)
        if explicit:
            target = torch_version(explicit)
        else:
            target = model.torch_pin or torch_version(OLDEST_TORCH)
        if target < HAS_WEIGHTS_ONLY:
            return None
        from trainlint.edits import add_keyword

        edit = add_keyword(model, load, "weights_only=False")
        if edit is None:
            return None
        return Fix("unsafe", (edit,), "add `weights_only=False`")
