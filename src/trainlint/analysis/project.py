"""The project index: what each module of the linted tree does, summarised, across files.

A run lints each file once and, on the way, takes a small *summary* of it (plain
data: JSON- and pickle-ready, cached by the file's bytes): its module name, its
module-level imports (relative ones made absolute), star imports, and per function
and class only what other files can use:

* what a function returns, when that is a scheduler, optimizer or model built inside
  it (with the scheduler's class and the unit its length counts in);
* which of its parameters a function or constructor takes (to map call sites);
* whether a class is a ``threading.Thread`` and whether its ``forward`` returns a
  softmax;
* the calls it makes to functions and classes of the project, with the roles of the
  arguments it passes (``Trainer(model, opt, StepLR(opt, 30))``).

:class:`ProjectIndex` merges the summaries and gives every file its *view*: the facts
about the names it imports and about the parameters of its own functions (from the
call sites anywhere in the project). The view is all a file's lint may read from the
index, so a file's cached findings are keyed on its bytes and on its view's digest:
editing one module re-lints it and the files whose view it changes, nothing else.
No tree and no per-file model outlives its file.

The summary is written by :mod:`project_summary`, module names and import lines are
read by :mod:`project_modules`, and a file's analysis reads its view through
:mod:`project_views`; this module holds the index itself.
"""

from __future__ import annotations

import ast
import hashlib
import json
from pathlib import Path as FsPath
from typing import Any

from trainlint.analysis import checkpoints
from trainlint.analysis.effects import MAX_EFFECT_PATHS
from trainlint.analysis.model import FileModel
from trainlint.analysis.project_modules import (  # (re-exported: the importers of project use them)
    absolute,  # noqa: F401
    import_graph,  # noqa: F401
    import_order,  # noqa: F401
    imported_names,  # noqa: F401
    module_of,  # noqa: F401
)
from trainlint.analysis.project_summary import (  # (re-exported: the importers of project use them)
    EFFECT_WORDS,  # noqa: F401
    SUMMARY_WORDS,  # noqa: F401
    Fact,
    bare_summary,  # noqa: F401
    summarize,  # noqa: F401
)
from trainlint.analysis.project_views import (  # (re-exported: the importers of project use them)
    apply_view,  # noqa: F401
    foreign_binding,  # noqa: F401
    view_words,  # noqa: F401
)
from trainlint.analysis.roles import Role
from trainlint.analysis.settings import ProjectSettings
from trainlint.source import Source, decode, parse

#: Resolution hops through re-exports and star imports.
MAX_HOPS = 6
#: Calls across files followed from one function (a -> b -> c -> d).
MAX_EFFECT_DEPTH = 4


# -- the index --------------------------------------------------------------------------------


class ProjectIndex:
    """All summaries of a run, merged; gives each file its view."""

    def __init__(self, summaries: list[dict], growing: bool = False) -> None:
        self.modules: dict[tuple[str, str], dict] = {}
        for s in summaries:
            self.modules.setdefault((s["root"], s["module"]), s)
        # (root, module, function) -> param -> facts from every call site
        self._params: dict[tuple[str, str, str], dict[str, list[Fact]]] = {}
        # (root, module, function) -> param -> the project classes whose instances the
        # call sites pass there (canonical ``module.Class``), when they say nothing else
        self._instances: dict[tuple[str, str, str], dict[str, list[str]]] = {}
        # (root, module) -> its functions called with facts (the keys of _params there): a
        # view reads its own module's, without going through every module's
        self._called: dict[tuple[str, str], set[str]] = {}
        # (root, module) -> function -> the slots (parameters, ``self.attr``) whose object
        # some caller in another file reads after the call returns (analysis.escape_callers)
        self._after: dict[tuple[str, str], dict[str, set[str]]] = {}
        self._effect_memo: dict[str, tuple[list[list[Any]], bool]] = {}
        # project directory -> the summaries there that save checkpoints or define savers,
        # and the saves of objects they make (analysis.checkpoints), joined on first ask
        self._ckpt_summaries: dict[str, list[dict]] = {}
        # project directory -> the facts about its data split some file has (data_parallel)
        self._data_facts: dict[str, set[str]] = {}
        self._saves: dict[str, list[list[Any]]] = {}
        #: the summaries with lean entries (see ``summarize``) whose left-out facts were
        #: asked for: the views given are not the whole project's until those files are
        #: summarised in full (``runner.run`` lints them again)
        self.lean_read: set[tuple[str, str]] = set()
        # growing (see add): (root, module) -> the calls that module may resolve, not
        # resolved yet: [summary, callee, args, done]
        self._pending: dict[tuple[str, str], list[list[Any]]] | None = {} if growing else None
        # root -> the project's config settings, joined as summaries come
        self._settings: dict[str, ProjectSettings] = {}
        for s in self.modules.values():
            for callee, args in s["calls"]:
                self._call_or_wait(s, callee, args)
            self._note_checkpoints(s)
            self._note_settings(s)
        for s in self.modules.values():
            self._note_after(s)

    def add(self, summary: dict) -> None:
        """Take one more file's summary, after those it imports: its calls are resolved
        against the summaries there so far, so the views this index gives are the whole
        project's only once every file is in (a run speculates with them, see
        ``runner.run``). A module already here keeps its first summary."""
        key = (summary["root"], summary["module"])
        if key in self.modules:
            return
        self.modules[key] = summary
        for callee, args in summary["calls"]:
            self._call_or_wait(summary, callee, args)
        # calls made earlier into this module (a caller whose summary the cache had)
        for entry in (self._pending or {}).pop(key, ()):
            if not entry[3]:
                entry[3] = self._add_call(*entry[:3])
        self._effect_memo.clear()
        self._note_checkpoints(summary)
        self._note_settings(summary)
        self._note_after(summary)

    def _note_settings(self, s: dict) -> None:
        if s.get("settings"):
            self._settings.setdefault(s["root"], ProjectSettings()).add(s["settings"])

    def _note_checkpoints(self, s: dict) -> None:
        if s.get("data"):
            project = checkpoints.project_dir(s["root"])
            self._data_facts.setdefault(project, set()).update(s["data"])
        # only the files that save (or define a saver) take part in the join: it stays
        # linear in the project's size, and a file without saves changes no join
        ck = s.get("ckpt")
        if ck and ("saves" in ck or "calls" in ck or "savers" in ck):
            project = checkpoints.project_dir(s["root"])
            self._ckpt_summaries.setdefault(project, []).append(s)
            self._saves.pop(project, None)

    def _note_after(self, s: dict) -> None:
        """The caller-side reads of ``s`` (its ``after``), by the callee's parameter names;
        a callee not summarised yet is left out (the use is then not seen: silence)."""
        for callee, slots in s.get("after", ()):
            found = self.resolve(s["root"], callee)
            if found is None:
                continue
            mod, local = found
            fn = mod["functions"].get(local)
            if fn is None:
                continue
            params = fn["params"][1:] if "." in local else fn["params"]
            names = self._after.setdefault((mod["root"], mod["module"]), {})
            read = names.setdefault(local, set())
            for slot in slots:
                if not isinstance(slot, int):
                    read.add(slot)
                elif slot < len(params):
                    read.add(params[slot])

    def _call_or_wait(self, s: dict, callee: str, args: list[list[Any]]) -> None:
        if self._add_call(s, callee, args) or self._pending is None:
            return
        entry = [s, callee, args, False]
        parts = callee.split(".")
        for i in range(1, len(parts)):  # the modules whose arrival may resolve it
            self._pending.setdefault((s["root"], ".".join(parts[:i])), []).append(entry)

    def speculate(self, summary: dict) -> dict | None:
        """``add`` the summary of the file about to be linted, and give its view so far."""
        self.add(summary)
        return self.view(summary["root"], summary["module"])

    def _filled_of(self, root: str, module: str) -> list[str]:
        """The module's functions that call sites pass facts to, in name order."""
        return sorted(self._called.get((root, module), ()))

    # -- resolution -------------------------------------------------------------------
    def resolve(self, root: str, qual: str, hops: int = 0) -> tuple[dict, str] | None:
        """The summary and local name (``f``, ``C``, ``C.m``) ``qual`` names, following
        re-exports (an import in an ``__init__``) and star imports."""
        if hops > MAX_HOPS:
            return None
        parts = qual.split(".")
        for i in range(len(parts) - 1, 0, -1):
            mod = self.modules.get((root, ".".join(parts[:i])))
            if mod is not None:
                break
        else:
            return None
        rest = parts[i:]
        head = rest[0]
        if head in mod["classes"] or head in mod["functions"]:
            return mod, ".".join(rest)
        if head in mod["imports"]:
            target = mod["imports"][head][1]
            if target != qual:
                return self.resolve(root, ".".join([target, *rest[1:]]), hops + 1)
        for star in mod["stars"]:
            found = self.resolve(root, ".".join([star, *rest]), hops + 1)
            if found is not None:
                return found
        return None

    def _add_call(self, s: dict, callee: str, args: list[list[Any]]) -> bool:
        """Note the facts a call passes to a project function or class; False when
        ``callee`` names nothing the index has (yet)."""
        found = self.resolve(s["root"], callee)
        if found is None:
            return False
        mod, local = found
        if local in mod["classes"]:
            fn_name, skip = f"{local}.__init__", 1
        elif local in mod["functions"]:
            fn_name, skip = local, 0
        else:
            return True
        fn = mod["functions"].get(fn_name)
        if fn is None:
            return True
        params = fn["params"][skip:]
        names = set(params) | set(fn.get("kwonly", ()))
        thread = skip == 1 and self.is_thread_class(mod["root"], mod, local)
        slot = self._params.setdefault((mod["root"], mod["module"], fn_name), {})
        self._called.setdefault((mod["root"], mod["module"]), set()).add(fn_name)
        kwarg = fn.get("kwarg")
        for where, fact, *cls in args:
            if cls:
                fact = self._softmax_model(s["root"], fact, cls[0])
            name = params[where] if isinstance(where, int) and where < len(params) else where
            if isinstance(name, str) and name not in names and kwarg and name in kwarg[1]:
                name = f'{kwarg[0]}["{name}"]'  # `Trainer(scheduler=...)` into `**kwargs`
            elif not isinstance(name, str) or name not in names:
                continue
            settled = self._settle(s["root"], fact if thread else fact[:4])
            if settled is not None:
                slot.setdefault(name, []).append(settled)
            elif fact[0] == "instance":
                cls = self._class_qual(s["root"], fact[1])
                if cls is not None:
                    self._instances.setdefault(
                        (mod["root"], mod["module"], fn_name), {}
                    ).setdefault(name, []).append(cls)
        return True

    def _function_facts(self, mod: dict, name: str) -> dict | None:
        """``mod``'s entry for the function ``name``, to read what a lean entry leaves out
        (returns, kept parameters, effects): such a read is noted in ``lean_read``."""
        fn = mod["functions"].get(name)
        if fn is not None and fn.get("lean"):
            self.lean_read.add((mod["root"], mod["module"]))
        return fn

    def _settle(self, root: str, fact: Fact) -> Fact | None:
        """An ``instance`` fact becomes what its class is: a model (softmax or not), a
        thread; a call of a project factory, what the factory returns; anything else
        says nothing."""
        if fact[0] != "instance":
            return fact
        found = self.resolve(root, fact[1])
        if found is None:
            return None
        mod, local = found
        cls = mod["classes"].get(local)
        if cls is None:
            # a project factory's product passed straight on:
            # `Trainer(model, opt, make_scheduler(opt, epochs))`
            fn = self._function_facts(mod, local)
            ret = fn.get("returns") if fn is not None else None
            return ret if ret is not None and ret[0] != "instance" else None
        if cls.get("softmax"):
            return [Role.MODEL.value, local, None, True]
        return None

    def _softmax_model(self, root: str, fact: Fact, cls: str) -> Fact:
        """A model fact (see :func:`model_class`) that says so when its project class's
        ``forward`` ends in a softmax; ``fact`` unchanged otherwise."""
        found = self.resolve(root, cls)
        if found is None or not found[0]["classes"].get(found[1], {}).get("softmax"):
            return fact
        return [fact[0], found[1], fact[2], True, *fact[4:]]

    def _class_qual(self, root: str, qual: str) -> str | None:
        """The one spelling (``pkg.state.Training``) of a project class, however the
        caller imported it; None for anything else."""
        found = self.resolve(root, qual)
        if found is None or found[1] not in found[0]["classes"]:
            return None
        mod, local = found
        return f"{mod['module']}.{local}" if mod["module"] else local

    def _attribute_facts(self, root: str, qual: str) -> dict[str, Fact]:
        """``self.x = x`` in ``qual``'s constructor: attribute -> what every call site
        passes for ``x`` (a role, or an instance of one project class); a parameter
        given a role at one site and an instance at another says nothing."""
        found = self.resolve(root, qual)
        if found is None:
            return {}
        mod, local = found
        attrs = mod["classes"].get(local, {}).get("attrs") or {}
        key = (mod["root"], mod["module"], f"{local}.__init__")
        roles, instances = self._params.get(key, {}), self._instances.get(key, {})
        out: dict[str, Fact] = {}
        for attr, param in attrs.items():
            facts, classes = roles.get(param, []), set(instances.get(param, ()))
            if facts and not classes:
                merged = _merge([f[:4] for f in facts])
                if merged is not None:
                    out[attr] = merged
            elif len(classes) == 1 and not facts:
                out[attr] = ["instance", classes.pop(), None, False]
        return out

    def _chains(
        self, root: str, module: str
    ) -> tuple[dict[str, dict[str, str]], dict[str, dict[str, Fact]]]:
        """The file's parameters every call site fills with an instance of one project
        class (function -> parameter -> class), and the attribute facts of those
        classes and of the instances they hold in turn (class -> attribute -> fact),
        bounded by MAX_HOPS, a cycle cut; only classes that lead to a role."""
        given: dict[str, dict[str, str]] = {}
        for fn_name in self._filled_of(root, module):
            for name, classes in self._instances.get((root, module, fn_name), {}).items():
                if len(set(classes)) == 1 and not self._params.get((root, module, fn_name), {}).get(
                    name
                ):
                    given.setdefault(fn_name, {})[name] = classes[0]
        attrs: dict[str, dict[str, Fact]] = {}
        todo = sorted({c for p in given.values() for c in p.values()})
        depth = 0
        while todo and depth <= MAX_HOPS:
            nxt: list[str] = []
            for qual in todo:
                if qual in attrs:
                    continue
                attrs[qual] = facts = self._attribute_facts(root, qual)
                nxt.extend(f[1] for f in facts.values() if f[0] == "instance")
            todo, depth = nxt, depth + 1

        def leads(qual: str, seen: frozenset[str]) -> bool:
            return qual not in seen and any(
                f[0] != "instance" or leads(f[1], seen | {qual})
                for f in attrs.get(qual, {}).values()
            )

        useful = {q for q in attrs if leads(q, frozenset())}
        given = {
            fn: kept
            for fn, p in given.items()
            if (kept := {n: c for n, c in p.items() if c in useful})
        }
        return given, {q: attrs[q] for q in sorted(useful)}

    def is_thread_class(
        self, root: str, mod: dict, local: str, seen: frozenset[tuple[str, str]] = frozenset()
    ) -> bool:
        """``local`` in ``mod`` subclasses ``threading.Thread``, directly or through other
        project classes (``class TrainWorker(BaseWorker)``, ``BaseWorker(Thread)`` in
        another module); an inheritance cycle or an unresolved base says no."""
        cls = mod["classes"].get(local)
        if cls is None or (mod["module"], local) in seen or len(seen) > MAX_HOPS:
            return False
        if cls.get("thread"):
            return True
        seen = seen | {(mod["module"], local)}
        for base in cls["bases"]:
            found = self.resolve(root, base) if "." in base else None
            if found is None and mod["module"]:
                found = self.resolve(root, f"{mod['module']}.{base}")
            if found is not None and self.is_thread_class(root, *found, seen):
                return True
        return False

    def _class_fact(self, mod: dict, local: str) -> Fact | None:
        cls = mod["classes"].get(local)
        if cls is None:
            fn = self._function_facts(mod, local)
            return fn.get("returns") if fn is not None else None
        if cls.get("softmax"):
            return [Role.MODEL.value, local, None, True]
        if cls.get("applies"):  # a wrapper module: what it returns depends on its caller
            return [Role.MODEL.value, local, None, False]
        if self.is_thread_class(mod["root"], mod, local):
            return ["thread", local, None, False]
        return None

    # -- views --------------------------------------------------------------------------
    def view(self, root: str, module: str) -> dict | None:
        """What the file ``module`` may read from the index; None when nothing."""
        s = self.modules.get((root, module))
        if s is None:
            return None
        refs: dict[str, Fact] = {}
        workers: dict[str, dict] = {}
        for raw, full in s["imports"].values():
            found = self.resolve(root, full)
            if found is not None:
                fact = self._class_fact(*found)
                if fact is not None:
                    refs[raw] = fact
                self._note_worker(workers, raw, *found)
                continue
            mod = self.modules.get((root, full))
            if mod is not None:  # `from . import sched` / `import pkg.sched as s`
                for name in (*mod["classes"], *mod["functions"]):
                    if "." not in name:
                        fact = self._class_fact(mod, name)
                        if fact is not None:
                            refs[f"{raw}.{name}"] = fact
                        self._note_worker(workers, f"{raw}.{name}", mod, name)
        stars: dict[str, str] = {}
        self._star_names(root, s, stars, refs, 0, set())
        for name in [n for n in stars if n in s["imports"] or n in s["defs"]]:
            del stars[name]  # bound by the file itself: the star import changes nothing
        params: dict[str, dict[str, Fact]] = {}
        for fn_name in self._filled_of(root, module):
            for name, facts in self._params.get((root, module, fn_name), {}).items():
                merged = _merge(facts)
                if merged is not None:
                    params.setdefault(fn_name, {})[name] = merged
        calls = self._calls_of(root, s)
        instances, attrs = self._chains(root, module)
        saves = self._checkpoint_saves(root, module, s)
        joined = self._settings.get(root)
        settings = joined.view(s.get("settings")) if joined is not None else {}
        own = s.get("data", {})
        told = own.get("samples") or own.get("loads")
        after = {k: sorted(v) for k, v in sorted(self._after.get((root, module), {}).items())}
        if not (refs or stars or params or calls or instances or saves or settings or told
                or workers or after):
            return None
        out: dict[str, Any] = {"refs": refs, "stars": stars, "params": params}
        # the project's defaults for the config values the file reads, and the numbers
        # the constructions of its classes agree on (analysis.settings)
        out.update(settings)
        if told:  # a file that builds a sampler or a loader: what does the project do?
            split = self._data_facts.get(checkpoints.project_dir(root), set())
            out["data"] = sorted(split - {"loads"})
        if workers:  # imported functions a process or remote may run (escape_targets)
            out["workers"] = workers
        if after:  # what callers in other files read after calling this file's functions
            out["after"] = after
        applies = self._applies(root, s)
        if applies:  # which parameter the wrappers among them apply (analysis.activations)
            out["applies"] = applies
        if calls:
            out["calls"] = calls
        if instances:  # `ctx.training.scheduler` (foreign_binding follows the chain)
            out["instances"] = instances
            out["attrs"] = attrs
        if saves:  # the saves of other files this file's loads read (TL704)
            out["checkpoints"] = saves
        return out

    def _note_worker(self, out: dict[str, dict], raw: str, mod: dict, local: str) -> None:
        """``raw`` (as the viewing file spells it) names a function whose summary says what
        it trains when run as a process or remote target: its entry for the view."""
        fn = mod["functions"].get(local)  # (a lean entry says nothing: not asked again)
        if fn is not None and "worker" in fn:
            entry = {"params": fn["params"], **fn["worker"]}
            if fn.get("kwonly"):
                entry["kwonly"] = fn["kwonly"]
            out[raw] = entry

    def _applies(self, root: str, s: dict) -> dict[str, list[Any]]:
        """Class name -> [position, name] of the ``forward`` parameter it applies, for the
        wrapper modules among the classes the file imports."""
        out: dict[str, list[Any]] = {}
        for _, full in s["imports"].values():
            found = self.resolve(root, full)
            cls = found[0]["classes"].get(found[1]) if found is not None else None
            if found is not None and cls is not None and cls.get("applies"):
                if not cls.get("softmax"):
                    out[found[1]] = cls["applies"]
        return out

    def _checkpoint_saves(self, root: str, module: str, s: dict) -> list[list[Any]]:
        ck = s.get("ckpt")
        if not ck or not ck.get("loads"):
            return []
        project = checkpoints.project_dir(root)
        if project not in self._saves:  # once per project, not once per file
            self._saves[project] = checkpoints.project_saves(
                self._ckpt_summaries.get(project, []), self.resolve
            )
        return checkpoints.view_saves(self._saves[project], root, module, ck)

    # -- effects across files (analysis.effects) ------------------------------------------
    def _calls_of(self, root: str, s: dict) -> dict[str, dict]:
        """The project functions and methods the file's imports name, with their effects:
        ``raw qualname -> entry`` (``.engine.train_step``, ``.helpers.Tracker.record``)."""
        out: dict[str, dict] = {}
        uses = set(s.get("uses", ()))
        if not uses:
            return out
        for raw, full in s["imports"].values():
            found = self.resolve(root, full)
            if found is not None:
                mod, local = found
                if local in mod["functions"] and raw in uses:
                    self._add_entry(out, raw, root, mod, local)
                elif local in mod["classes"]:
                    for name in mod["functions"]:
                        method = name[len(local) + 1 :]
                        if (
                            name.startswith(local + ".")
                            and f"?.{method}" in uses
                            and (method != "__init__")
                        ):
                            self._add_entry(out, f"{raw}.{method}", root, mod, name)
                continue
            whole = self.modules.get((root, full))
            if whole is not None:  # `from . import engine` / `import engine`
                for name in whole["functions"]:
                    if f"{raw}.{name}" in uses:
                        self._add_entry(out, f"{raw}.{name}", root, whole, name)
        return out

    def _add_entry(self, out: dict[str, dict], key: str, root: str, mod: dict, name: str) -> None:
        fn = self._function_facts(mod, name)
        assert fn is not None  # (the callers found it there)
        keeps = fn.get("keeps")
        if "effects" not in fn:
            paths: list[Any] = [[]]
            precise = True
            if not keeps:
                return
        else:
            paths, precise = self._effects(root, mod, name, 0, ())
        if precise and not any(paths) and not keeps:
            return
        method = "." in name and fn["params"][:1] == ["self"]
        entry: dict[str, Any] = {
            "fn": f"{mod['module']}.{name}" if mod["module"] else name,
            "params": fn["params"][1:] if method else fn["params"],
        }
        if fn.get("kwonly"):
            entry["kwonly"] = fn["kwonly"]
        if method:
            entry["method"] = True
        if precise:
            entry["paths"] = paths
        else:
            entry["imprecise"] = True
        if keeps:
            entry["keeps"] = keeps
        if fn.get("returns_graph"):  # the caller receives the graph of the step's loss
            entry["returns_graph"] = True
        out[key] = entry

    def _effects(
        self, root: str, mod: dict, name: str, depth: int, stack: tuple[str, ...]
    ) -> tuple[list[list[Any]], bool]:
        """A function's effect paths with other files' calls replaced by their callees'
        (bounded by MAX_EFFECT_DEPTH, a cycle cut); (paths, precise)."""

        key = f"{mod['module']}.{name}"
        cached = self._effect_memo.get(f"{root}:{key}") if depth == 0 else None
        if cached is not None:
            return cached
        eff = mod["functions"][name].get("effects") or {}
        if eff.get("imprecise"):
            return [], False
        precise = True
        out: list[list[Any]] = []
        for path in eff.get("paths", ()):
            expanded: list[list[Any]] = [[]]
            for effect in path:
                if effect[0] != "CALL":
                    expanded = [p + [effect] for p in expanded]
                    continue
                alts, ok = self._call_effects(root, effect, depth, (*stack, key))
                precise = precise and ok
                expanded = [p + a for p in expanded for a in alts]
                if len(expanded) > MAX_EFFECT_PATHS:
                    return [], False
            for p in expanded:
                if p not in out:
                    out.append(p)
        if len(out) > MAX_EFFECT_PATHS:
            return [], False
        if depth == 0:
            self._effect_memo[f"{root}:{key}"] = (out, precise)
        return out, precise

    def _call_effects(
        self, root: str, call: list[Any], depth: int, stack: tuple[str, ...]
    ) -> tuple[list[list[Any]], bool]:
        """The effect paths of a placeholder ``["CALL", qualname, args, depth, flags]`` in
        the calling function's terms; [[]] when it is no project function with effects,
        too deep, or a cycle."""
        _, qual, args, d, flags = call
        found = self.resolve(root, qual)
        if found is None or depth + 1 >= MAX_EFFECT_DEPTH:
            return [[]], True
        mod, local = found
        fn = self._function_facts(mod, local)
        if fn is None or "effects" not in fn or f"{mod['module']}.{local}" in stack:
            return [[]], True
        paths, precise = self._effects(root, mod, local, depth + 1, stack)
        if not precise:
            return [[]], False
        params = fn["params"]
        given = {
            (params[w] if isinstance(w, int) and w < len(params) else w): enc for w, enc in args
        }

        def remap(target: list[Any] | None) -> list[Any] | None:
            if target is None or target[0] != "p":
                return target if target is None or target[0] == "o" else ["o", qual + ":self"]
            enc = given.get(target[1])
            if enc is None:
                return ["o", f"{qual}:{target[1]}"]
            if enc[0] == "p":
                rest = ".".join(x for x in (enc[2], target[2]) if x)
                return ["p", enc[1], rest]
            if enc[0] == "s":
                return ["s", ".".join(x for x in (enc[1], target[2]) if x)]
            return enc

        return [[[k, remap(t), dd + d, ff | flags] for k, t, dd, ff in p] for p in paths] or [
            []
        ], True

    def _star_names(
        self,
        root: str,
        s: dict,
        stars: dict[str, str],
        refs: dict[str, Fact],
        depth: int,
        seen: set[str],
    ) -> None:
        for star in s["stars"]:
            mod = self.modules.get((root, star))
            if mod is None or star in seen or depth > MAX_HOPS:
                continue
            seen.add(star)
            for local, qual in mod["exported"].items():
                if not local.startswith("_"):
                    stars.setdefault(local, qual)
            for name in mod["defs"]:
                if name.startswith("_"):
                    continue
                fact = self._class_fact(mod, name)
                if fact is not None:
                    full = f"{star}.{name}"
                    stars.setdefault(name, full)
                    refs[full] = fact
            self._star_names(root, mod, stars, refs, depth + 1, seen)


def _merge(facts: list[Fact]) -> Fact | None:
    """One fact from every call site's: the role must agree; class and unit only when
    every site agrees on them too."""
    roles = {f[0] for f in facts}
    if len(roles) != 1:
        return None
    first = facts[0]
    same = all(f == first for f in facts)
    return first if same else [first[0], None, None, all(f[3] for f in facts)]


def own_view(summary: dict) -> dict | None:
    """The part of a file's view its own summary gives: the facts its own call sites
    settle (``layer_init(nn.Linear(...))`` in the file that defines ``layer_init``).
    Other files' summaries can only add to it; None when it is empty."""
    if not summary["calls"]:
        return None
    return ProjectIndex([summary]).view(summary["root"], summary["module"])


def digest(view: dict | None) -> str:
    if not view:
        return ""
    return hashlib.sha256(json.dumps(view, sort_keys=True).encode()).hexdigest()[:32]


# -- one file's view without a run (``trainlint debug model``) ----------------------------------


def view_of_file(path: str, tree: ast.Module) -> dict[str, Any] | None:
    """The project view of ``path`` from the files it imports (transitively, within its
    project root): enough for its cross-file calls. Call-site facts about its own
    parameters need the whole project (a ``check`` run) and are not gathered here."""
    info = module_of(path)
    root = info[0]
    summaries: dict[str, dict[str, Any]] = {}
    todo: list[tuple[FsPath, ast.Module | None, int]] = [(FsPath(path).absolute(), tree, 0)]
    seen: set[str] = set()
    while todo:
        file, parsed, depth = todo.pop()
        if str(file) in seen:
            continue
        seen.add(str(file))
        try:
            data = file.read_bytes()
            text, _ = decode(data)
            parsed = parsed if parsed is not None else parse(text, str(file))
        except Exception:  # noqa: BLE001 - an unreadable neighbour says nothing
            continue
        mod_info = module_of(file)
        facts = any(w in data for w in SUMMARY_WORDS)
        model = (
            FileModel(parsed, Source(text), str(file))
            if facts or any(w in data for w in EFFECT_WORDS)
            else None
        )
        summary = summarize(model, parsed, mod_info, facts)
        if model is not None:
            model.release()
        summaries[str(file)] = summary
        if depth > MAX_EFFECT_DEPTH:
            continue
        for _, full in summary["imports"].values():
            parts = full.split(".")
            for i in range(len(parts), 0, -1):
                base = FsPath(root, *parts[:i])
                for candidate in (base.with_suffix(".py"), base / "__init__.py"):
                    if candidate.is_file():
                        todo.append((candidate, None, depth + 1))
                        break
                else:
                    continue
                break
    index = ProjectIndex(list(summaries.values()))
    return index.view(root, info[1])
