"""The fast paths of a lint run answer exactly as the slow ones they replace."""

from __future__ import annotations

import ast
import gc
import sys
import weakref

import pytest

from trainlint import noqa
from trainlint.analysis.model import FileModel
from trainlint.noqa import scan_noqa_comments, tokenize_noqa_comments
from trainlint.plugins import manager
from trainlint.source import Source

TRICKY = [
    'x = "# noqa: TL301"  # noqa: TL302\n',
    "s = '''\n# noqa\n'''  # noqa\n",
    'a = "it\\"s # noqa" # noqa:TL101,TL102\nb = 1\n',
    "f = f'{x!r:>10} # noqa'  # NOQA\n",
    'd = """a \\""" # noqa"""\nc = 2  # see issue # noqa: TL401\n',
    "# trainlint: noqa: TL301\nx = 1  # noqa\n",
    "x = 1  # noqa: TL301\r\ny = 'q # noqa'\r\n",
    "rb'\\' # noqa'  # noqa: X1\n",
    "x = 1  # a comment # NoQa: TL101\ny = 2  # noqa-like, not one\nz = 3  #noqa\n",
    "s = '''it''' '''s'''  # noqa\nt = \"\"\"a''' \\\" # noqa\"\"\"\n",
    "u = 'a\\\nb # noqa'  # noqa: TL2\n",
    "v = ''  # noqa: TL3\nw = ''''''  # noqa: TL4\n",
]


@pytest.mark.parametrize("text", TRICKY)
def test_noqa_scan_matches_tokenize(text, monkeypatch):
    ast.parse(text)
    expected = tokenize_noqa_comments(Source(text))
    assert scan_noqa_comments(text) == expected
    # the comment-by-comment scan, which Python 3.10 runs (it has no possessive repeats)
    monkeypatch.setattr(noqa, "_POSSESSIVE", False)
    assert scan_noqa_comments(text) == expected


def test_released_model_is_freed_without_the_cycle_collector():
    text = "import torch\nopt = torch.optim.SGD(model.parameters())\nfor x in d:\n    opt.step()\n"
    model = FileModel(ast.parse(text), Source(text))
    assert model.roles is not None and model.steps.step_loops is not None  # analyses point back
    ref = weakref.ref(model)
    enabled = gc.isenabled()
    gc.disable()
    try:
        model.release()
        del model
        assert ref() is None
    finally:
        if enabled:
            gc.enable()


def test_entry_point_check(tmp_path, monkeypatch):
    site = tmp_path / "site"
    other = site / "other-1.0.dist-info"
    other.mkdir(parents=True)
    # trainlint's own metadata names it outside a [trainlint] section: no plugin
    (other / "entry_points.txt").write_text(
        "[console_scripts]\ntrainlint = trainlint.cli:main\n\n[pytest11]\ntrainlint = x\n"
    )
    monkeypatch.setattr(sys, "path", [str(site)])
    assert not manager.entry_point_plugins_possible()
    plugin = site / "tl_plugin-0.1.dist-info"
    plugin.mkdir()
    (plugin / "entry_points.txt").write_text("[trainlint]\nexample = tl_plugin\n")
    assert manager.entry_point_plugins_possible()


def test_no_plugins_gives_the_builtin_rules_without_pluggy(monkeypatch):
    monkeypatch.setattr(manager, "entry_point_plugins_possible", lambda: False)
    manager._manager.cache_clear()
    try:
        from trainlint.rules import builtin_rules

        assert manager.load_rules(()) == sorted(builtin_rules(), key=lambda r: r.code)
        assert manager.load_formats(()) == {}
    finally:
        manager._manager.cache_clear()


# A file with the shapes the table-driven answers must get right: nested defs, lambdas
# and classes; decorators and defaults (walked with their def, scoped outside it);
# a torch alias called by a bare name; steps in a method and in a nested helper.
TABLES = """
import torch
from torch.autograd import backward as bw


def deco(f):
    return f


@deco
def train(model, opt, loader, lr=float("1e-3")):
    def helper(loss):
        loss.backward()
        return loss

    for batch in loader:
        loss = model(batch)
        helper(loss)
        opt.step()
        if loss > 0:
            return loss
    return [lambda: opt.step() for _ in range(2)]


class Trainer:
    def fit(self, loss):
        bw(loss)
        return self.step_once(loss) if loss else None

    def step_once(self, loss):
        class Inner:
            def go(self):
                return 1
        for p in self.parameters():
            p.grad = None
        return Inner


def plain(xs):
    total = 0
    for x in xs:
        total += x
    return total
"""


def _model(text: str = TABLES) -> FileModel:
    return FileModel(ast.parse(text), Source(text))


def test_walk_tree_is_ast_walk_without_contexts_and_operators():
    from trainlint.analysis.walk import LEAF_TYPES, walk_tree

    tree = ast.parse(TABLES + "y = a < b < c and not d or -e\n")
    for node in [tree, *(n for n in ast.walk(tree) if not isinstance(n, LEAF_TYPES))]:
        want = [
            id(n)
            for n in ast.walk(node)
            if isinstance(n, ast.cmpop) or not isinstance(n, LEAF_TYPES)
        ]
        assert [id(n) for n in walk_tree(node)] == want


def test_returns_in_is_what_walk_local_meets():
    from trainlint.analysis.model import walk_local

    model = _model()
    for fn in model.functions:
        want = [n for n in walk_local(fn) if isinstance(n, ast.Return)]
        assert model.returns_in(fn) == want


def test_step_tables_answer_as_the_walks():
    from trainlint.analysis.model import walk_local
    from trainlint.analysis.steps import Kind, StepModel

    model = _model()
    steps = model.steps
    scopes = [
        *model.functions,
        *model.classes,
        *(n for n in ast.walk(model.tree) if isinstance(n, ast.Lambda)),
    ]
    for fn in scopes:
        walked = any(
            isinstance(n, ast.Call)
            and (ev := steps.classify(n)) is not None
            and ev.kind in (Kind.BACKWARD, Kind.STEP)
            for n in walk_local(fn)
        )
        assert steps.has_own_step(fn) is walked, ast.dump(fn)[:60]

    # _may_train with and without its table of stopping points
    class Everything:
        def __contains__(self, item: object) -> bool:
            return True

    slow = StepModel(model)
    slow.__dict__["_may_train_owners"] = Everything()
    fast = StepModel(model)
    for node in [*model.loops, *model.functions]:
        assert fast._may_train(node) is slow._may_train(node)
    assert [id(s.node) for s in fast.step_loops] == [id(s.node) for s in slow.step_loops]


def test_trigger_words_pick_the_rules_a_search_of_the_bytes_picks():
    # Words are searched once each, and a word's parts answer for it (no `grad`, no
    # `zero_grad`): every rule must be picked exactly as a plain search of the bytes picks
    # it, words that span punctuation (`step(`, `] =`, ` + `) and words inside longer
    # tokens included.
    from trainlint.config import Settings, select_rules
    from trainlint.engine import Linter
    from trainlint.rules import builtin_rules

    linter = Linter(select_rules(builtin_rules(), Settings(), cli_select=["ALL"]))
    filler = b"".join(b"value_%d = compute(value_%d)  # padding\n" % (i, i) for i in range(80))
    bodies = [
        b"opt.zero_grad()\nloss.backward()\nopt.step()\n",
        b"sched=torch.optim.lr_scheduler.StepLR(opt,30)\nsched.step()\n",
        b"x[0] = y\nz = a + b\nq+=1\n",
        b"model.eval()\nwith torch.no_grad():\n    pass\n",
        b"t = threading.Thread(target=f)\n",
        b"print('%d' % n)\n",
        b"",
    ]
    for body in bodies:
        data = filler + body
        want = [
            r.code
            for r, trig in linter._triggers
            if not trig or any(linter.words.words[i] in data for i in trig)
        ]
        got = [r.code for r in linter._active_rules(data, None, "train.py", ())]
        assert got == want, body


def test_a_view_words_search_answers_as_a_search_of_the_bytes_and_the_words():
    # With a project view, a file's words are its bytes followed by the view's words. The
    # search already made of the bytes is reused, and a word that starts at the bytes' end
    # and ends in the view's words (`import` + ` optim`) is found as a plain search finds it.
    from trainlint.config import Settings, select_rules
    from trainlint.engine import Linter
    from trainlint.rules import builtin_rules
    from trainlint.words import FileWords

    linter = Linter(select_rules(builtin_rules(), Settings(), cli_select=["ALL"]))
    filler = b"".join(b"value_%d = compute(value_%d)  # padding\n" % (i, i) for i in range(80))
    for body, extra in [
        (b"x = 1\nimport", b" optim"),
        (b"y = a]", b" = b"),
        (b"z = 3\n", b" backward step( zero_grad"),
        (b"w = q +", b" x"),
    ]:
        for data in (body, filler + body):
            words = FileWords(linter.words, data)
            words.has(0)  # (some answers already known)
            has = words.followed_by(extra)
            for i, word in enumerate(linter.words.words):
                assert has(i) == (word in data + extra), (data[-20:], extra, word)


def test_paths_are_told_apart_by_their_events_identity():
    # Two events of the same kind at the same node on different paths (inlined from two
    # call sites, say) are different events: the step walker's dedupe keeps both paths,
    # and drops only a path that repeats the very same events.
    from trainlint.analysis.step_paths import _dedupe
    from trainlint.analysis.steps import Event, Kind

    node = ast.parse("opt.step()").body[0]
    first, second = Event(Kind.STEP, node, "opt"), Event(Kind.STEP, node, "opt")
    paths = [(first,), (second,), (first,), (first, second), (first, second)]
    assert _dedupe(paths) == [(first,), (second,), (first, second)]
    assert [p[0] is second for p in _dedupe(paths)[:2]] == [False, True]


GRAMMAR_CORNERS = """
import a.b as c
from . import d
global_x = {**base, "k": 1}
def f(p, /, q=1, *args, r, s=2, t, **kw) -> int:  # type: ignore
    global global_x
    x: int = 1
    y = [i for i in range(3) if i async for j in k] if p else (lambda z=1: z)
    if 1 < q <= 2 is not None and not p or -q:
        del x
    with open(p) as fh, g():
        pass
    try:
        raise ValueError from None
    except* OSError as e:
        pass
    match p:
        case Point(1, y=2) | [1, *rest] | {"k": v, **others} | None:
            pass
    return f"{q!r:>{r}}"
class C(Base, metaclass=M):
    a: int
"""


@pytest.mark.skipif(sys.version_info < (3, 11), reason="`except*` is 3.11 syntax")
def test_children_read_by_the_grammar_plan_are_the_child_nodes():
    # The walks read each class's fields by a plan taken from its grammar line (a list, a
    # node or nothing): they must find exactly the child nodes `ast.iter_child_nodes`
    # finds, less contexts and operators, a `{**d}` key and a missing keyword default.
    from trainlint.analysis.walk import children

    skipped = (ast.expr_context, ast.boolop, ast.operator, ast.unaryop)
    tree = ast.parse(GRAMMAR_CORNERS, type_comments=True)
    seen = set()
    for node in ast.walk(tree):
        seen.add(type(node).__name__)
        want = [c for c in ast.iter_child_nodes(node) if not isinstance(c, skipped)]
        assert children(node) == want, ast.dump(node)[:80]
    assert {
        "Dict",
        "arguments",
        "Compare",
        "Global",
        "MatchClass",
        "MatchMapping",
        "TryStar",
        "comprehension",
        "JoinedStr",
        "FormattedValue",
    } <= seen


def test_a_remembered_value_answers_only_where_its_evaluation_would_make_no_cut():
    """Flow.value remembers a node's value; each name of a chain costs two levels (the
    name, its `+`), and depth 40 cuts. Asked first for x10 (21 deep, no cut), then for
    x25, which reaches x10 at depth 30: the remembered GRAD would hide the cut that a
    fresh evaluation makes."""
    from trainlint.analysis.flow import Flow, Taint

    lines = [
        "import torch",
        "",
        "",
        "def f(batch):",
        "    net = torch.nn.Linear(2, 2)",
        "    x0 = net(batch)",
    ]
    lines += [f"    x{i} = x{i - 1} + 1" for i in range(1, 26)]
    lines += ["    return x10, x25"]
    model = _model("\n".join(lines) + "\n")
    ret = next(n for n in ast.walk(model.tree) if isinstance(n, ast.Return))
    x10, x25 = ret.value.elts  # type: ignore[union-attr]
    fresh = Flow(model).value(x25)
    flow = Flow(model)
    assert flow.value(x10).taint is Taint.GRAD
    assert flow.value(x25) == fresh and fresh.taint is not Taint.GRAD
    assert flow.value(x10).taint is Taint.GRAD  # (remembered: asked again, same answer)


def test_a_word_inside_another_answers_for_it_in_any_order():
    # Bytes without `grad` spell no `zero_grad`: a word whose shorter words (in the same
    # table) are absent is absent without a search of its own, and a word found marks its
    # shorter words found. Whatever order the words are asked in, every answer is a plain
    # search's.
    import random

    from trainlint.words import FileWords, WordTable

    table = WordTable(
        [[b"zero_grad", b".grad", b"no_grad"], [b"grad", b"sched"], [b"lr_scheduler", b"schedul"]]
    )
    assert table.parts[table.words.index(b"zero_grad")] == (table.words.index(b"grad"),)
    filler = b"".join(b"value_%d = compute(value_%d)  # padding\n" % (i, i) for i in range(80))
    rng = random.Random(7)
    for body in (b"", b"opt.zero_grad()\n", b"x.grad\n", b"gradual = 1\n", b"lr_scheduler\n"):
        for data in (body, filler + body):
            for _ in range(20):
                order = list(range(len(table.words)))
                rng.shuffle(order)
                words = FileWords(table, data)
                for i in order:
                    assert words.has(i) == (table.words[i] in data), (body, table.words[i])


def test_a_check_imports_only_the_rules_a_file_triggers(tmp_path):
    # `trainlint check` runs the catalog's stand-ins: a rule's module is imported the first
    # time the rule checks a file, so a file that triggers no rule imports none of them,
    # and one that triggers a few imports those (not their whole family).
    import subprocess

    from trainlint.config import Settings, select_rules
    from trainlint.engine import Linter
    from trainlint.rules import catalog_rules

    quiet = tmp_path / "quiet.py"
    quiet.write_text("import torch\n\nx = torch.zeros(3)\n")
    clip = tmp_path / "clip.py"
    clip.write_text("import torch\n\ntorch.nn.utils.clip_grad_norm_(params, 1.0)\n")
    linter = Linter(select_rules(catalog_rules(), Settings(), cli_select=["TL1"]))
    active = linter._active_rules(clip.read_bytes(), None, str(clip), ())
    assert 0 < len(active) < 5
    script = (
        "import sys\n"
        "from trainlint.cli import main\n"
        "main(['check', '--no-cache', '-q', '--exit-zero', '--select', 'TL1', sys.argv[1]])\n"
        "print(sorted(m for m in sys.modules if m.startswith('trainlint.rules.')"
        " and m.count('.') > 2 and not m.endswith('._shared')))\n"
    )
    imported = {}
    for path in (quiet, clip):
        proc = subprocess.run(
            [sys.executable, "-c", script, str(path)],
            capture_output=True,
            text=True,
            check=True,
            cwd=tmp_path,
        )
        imported[path.name] = proc.stdout.splitlines()[-1]
    assert imported["quiet.py"] == "[]"
    assert imported["clip.py"] == repr(sorted(r.__module__ for r in active))


def test_catalog_stand_ins_travel_to_worker_processes():
    # A selection pickled for a worker started by spawn (macOS, Windows) brings back the
    # same stand-ins, and a rule made there from one reports as the rule itself.
    import pickle

    from trainlint.config import Settings, select_rules
    from trainlint.engine import Linter
    from trainlint.rules import catalog_rules

    selection = select_rules(catalog_rules(), Settings(), cli_select=["ALL"])
    again = pickle.loads(pickle.dumps(selection))
    assert again.rules == selection.rules and again.known == selection.known
    source = (
        b"import torch\n\nfor x in data:\n    loss = f(x)\n    loss.backward(retain_graph=True)\n"
    )
    lazy = Linter(again).lint_bytes(source, "train.py").findings
    assert [f.code for f in lazy] == ["TL301"]


def test_a_run_thaws_what_it_froze_and_leaves_the_callers_frozen(tmp_path, monkeypatch):
    # A run freezes its summaries once the project index is built (the collector's full
    # pass would walk them all): it must thaw them when it ends, and leave alone objects
    # its caller froze (a thaw would thaw those too).
    from trainlint.config import Settings, select_rules
    from trainlint.rules import builtin_rules
    from trainlint.runner import run

    (tmp_path / "model.py").write_text(
        "import torch\n\ndef build():\n    return torch.nn.Linear(2, 2)\n"
    )
    (tmp_path / "train.py").write_text(
        "import torch\nfrom model import build\n\nnet = build()\n"
        "opt = torch.optim.SGD(net.parameters(), lr=0.1)\nopt.step()\n"
    )
    files = sorted(tmp_path.glob("*.py"))
    settings = Settings()
    selection = select_rules(builtin_rules(), settings)
    freezes = []
    freeze = gc.freeze
    monkeypatch.setattr(gc, "freeze", lambda: (freezes.append(1), freeze()))
    assert gc.get_freeze_count() == 0
    run(files, selection, settings, jobs=1)
    assert freezes == [1] and gc.get_freeze_count() == 0
    kept = [object(), []]  # (a tracked object, frozen by the caller)
    freeze()
    try:
        run(files, selection, settings, jobs=1)
        # (not the same count: some of what was frozen is freed as the run goes)
        assert freezes == [1] and gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
    assert kept
