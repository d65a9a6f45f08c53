"""The corpus runner (bench/corpus.py, research.py, bugs.py), offline.

A tiny git repository built in tmp_path, cloned bare into ``MIRROR/owner+name/repo``,
stands in for the mirror of GitHub repositories. Tests that run trainlint's CLI in a
subprocess are marked slow; the rest take milliseconds.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.fixture(scope="module")
def bench():
    """The bench modules, imported as the scripts import each other (bench/ on sys.path)."""
    sys.path.insert(0, str(BENCH))
    try:
        yield tuple(importlib.import_module(m) for m in ("corpus", "research", "bugs"))
    finally:
        sys.path.remove(str(BENCH))
        for m in ("corpus", "research", "bugs"):
            sys.modules.pop(m, None)


@pytest.fixture
def corpus(bench):
    return bench[0]


def rec(corpus, line=1, text="x.item()", code="TL401", pin="1.0", context="ctx", path="a.py",
        message="`x.item()` on every training step", source="pkg"):
    return {"package": source, "version": pin, "path": path, "line": line, "code": code, "text": text,
            "message": message, "template": corpus.template(message), "context": context}


def entry(corpus, verdict, reason="r", **kw):
    return {**rec(corpus, **kw), "verdict": verdict, "reason": reason}


def compare(corpus, current, ledger, pin="1.0", codes=None):
    return corpus.compare(corpus.ECOSYSTEM, current, ledger, pins={"pkg": pin}, codes=codes)


RULES = {"TL401": {"name": "host-sync-in-loop", "default": True, "options": {"allow-loss-item": True}},
         "TL207": {"name": "x", "default": False, "options": {}}}


# --------------------------------------------------------------------------- the key


def test_template_masks_backquotes_quoted_strings_and_numbers_only(corpus):
    msg = "`loss.item()` on torch < 2.6 reads 'cuda:0' 3 times; the batch's graph stays"
    assert corpus.template(msg) == "`_` on torch < # reads '_' # times; the batch's graph stays"
    assert corpus.template(msg) == corpus.template(msg.replace("loss", "acc").replace("3", "12"))
    assert corpus.template("step 1.") == "step #."


def test_the_key_holds_the_message_template(corpus):
    """Loophole: the key ignored the message, so a finding that now says something else
    (another claim on the same line) kept the old review."""
    ledger = [entry(corpus, "true", message="`a.item()` on every training step")]
    same_claim = [rec(corpus, message="`b.item()` on every training step")]
    assert compare(corpus, same_claim, ledger).matched
    other_claim = [rec(corpus, message="`a.item()` in a loop over parameters")]
    cmp = compare(corpus, other_claim, ledger)
    assert len(cmp.new) == 1 and len(cmp.gone) == 1
    assert any("reviewed as true are GONE" in f for f in corpus.gate_failures(cmp, RULES))


def test_a_reworded_message_is_reviewed_again_with_the_old_review_at_hand(corpus):
    ledger = [entry(corpus, "true", reason="real", message="`a.item()` on every training step")]
    cmp = compare(corpus, [rec(corpus, message="`a.item()` syncs every step")], ledger)
    (fresh,) = [e for e in corpus.updated_ledger(cmp, prune=True)]
    assert fresh["verdict"] == "unreviewed"
    assert fresh["reopened"] == "1.0 true: real (message then: `a.item()` on every training step)"


def test_context_hash_sees_nearby_edits_not_far_ones_or_shifts(corpus):
    lines = [f"line {i}" for i in range(20)]
    h = corpus.context_hash(lines, 10)
    assert corpus.context_hash(["# new"] * 5 + lines, 15) == h  # shifted, same neighbours
    assert corpus.context_hash(lines[:18] + ["edited", "x"], 10) == h  # far edit
    near = list(lines)
    near[11] = "    line 11"
    assert corpus.context_hash(near, 10) != h  # indentation counts


# --------------------------------------------------------------------------- repeated keys


def test_a_lost_true_finding_cannot_hide_behind_an_identical_line(corpus):
    """Loophole: true at line 10, noise at line 50, same text. Line 10 stops firing and
    an identical line at 80 starts: the old pairing (line order) handed line 10's true
    review to line 80 and nothing was GONE."""
    ledger = [entry(corpus, "true", line=10, context="A"), entry(corpus, "noise", line=50, context="B")]
    current = [rec(corpus, line=50, context="B"), rec(corpus, line=80, context="C")]
    cmp = compare(corpus, current, ledger)
    assert [(c["line"], e["verdict"]) for c, e in cmp.matched] == [(50, "noise")]
    assert [e["line"] for e in cmp.gone] == [10]
    assert [r["line"] for r in cmp.new] == [80]
    failures = corpus.gate_failures(cmp, RULES)
    assert any("reviewed as true are GONE" in f for f in failures)


def test_repeated_keys_pair_by_context_then_occurrence(corpus):
    ledger = [entry(corpus, "true", line=5, context="A"), entry(corpus, "false", line=50, context="B")]
    current = [rec(corpus, line=7, context="B"), rec(corpus, line=60, context="A")]  # reordered
    cmp = compare(corpus, current, ledger)
    assert sorted((c["line"], e["verdict"]) for c, e in cmp.matched) == [(7, "false"), (60, "true")]
    # Entries without a context (written before it existed): k findings take k entries in order.
    legacy = [{k: v for k, v in e.items() if k != "context"} for e in ledger]
    cmp = compare(corpus, [rec(corpus, line=6)], legacy)
    assert [(c["line"], e["verdict"]) for c, e in cmp.matched] == [(6, "true")]
    assert [e["verdict"] for e in cmp.gone] == ["false"]


# --------------------------------------------------------------------------- version bumps


def test_a_bump_keeps_a_verdict_only_where_the_lines_around_are_unchanged(corpus):
    """Loophole: a verdict carried across a version bump unread, whatever changed around it."""
    ledger = [entry(corpus, "true", line=10, context="A", text="a.item()"),
              entry(corpus, "noise", line=20, context="B", text="b.item()")]
    current = [rec(corpus, line=12, context="A", text="a.item()", pin="2.0"),
               rec(corpus, line=22, context="B2", text="b.item()", pin="2.0")]
    cmp = compare(corpus, current, ledger, pin="2.0")
    assert [(c["line"], e["verdict"]) for c, e in cmp.matched] == [(12, "true")]
    assert [(c["line"], e["verdict"]) for c, e in cmp.reopened] == [(22, "noise")]
    assert sorted(v for _, v in cmp.verdict_of()) == ["true", "unreviewed"]
    assert any("not reviewed" in f for f in corpus.gate_failures(cmp, RULES))
    updated = {e["text"]: e for e in corpus.updated_ledger(cmp, prune=False)}
    assert updated["a.item()"]["verdict"] == "true" and updated["a.item()"]["version"] == "2.0"
    assert updated["b.item()"]["verdict"] == "unreviewed"
    assert updated["b.item()"]["reopened"] == "1.0 noise: r"
    assert updated["b.item()"]["context"] == "B2"


def test_at_the_same_pin_a_changed_context_is_another_place(corpus):
    cmp = compare(corpus, [rec(corpus, line=30, context="Z")], [entry(corpus, "true", context="A")])
    assert cmp.matched == [] and cmp.reopened == [] and len(cmp.gone) == 1 and len(cmp.new) == 1


# --------------------------------------------------------------------------- opt_in


def test_opt_in_must_name_an_option_of_the_entry_rule(corpus):
    assert corpus.parse_opt_in("TL401.allow-loss-item = false", "TL401", RULES) == ("allow-loss-item", False)
    assert "not of the form" in corpus.parse_opt_in("allow loss item off", "TL401", RULES)
    assert "no option" in corpus.parse_opt_in("TL401.allow-item = false", "TL401", RULES)
    assert "names TL207" in corpus.parse_opt_in("TL207.x = 1", "TL401", RULES)
    assert "TOML" in corpus.parse_opt_in("TL401.allow-loss-item = nope", "TL401", RULES)


def test_a_gone_true_finding_needs_its_opt_in_option_to_report_it(corpus):
    """Loophole: `opt_in` was free text, never checked: any true finding could leave."""
    gone = entry(corpus, "true", context="A")
    calls = []

    def relint_back(source, paths, code, option, value):
        calls.append((source, tuple(paths), code, option, value))
        return [rec(corpus, line=3, context="other")]

    def relint_nothing(*args):
        return []

    for opt_in, relint, ok in (("free text", relint_back, False),
                               ("TL401.no-such-option = 1", relint_back, False),
                               ("TL401.allow-loss-item = false", relint_nothing, False),
                               ("TL401.allow-loss-item = false", None, False),
                               ("TL401.allow-loss-item = false", relint_back, True)):
        cmp = compare(corpus, [], [{**gone, "opt_in": opt_in}])
        assert (corpus.gate_failures(cmp, RULES, relint) == []) is ok, opt_in
    assert calls[-1] == ("pkg", ("a.py",), "TL401", "allow-loss-item", False)


def test_opt_in_may_be_the_bare_code_of_an_off_by_default_rule(corpus):
    """A rule turned opt-in takes its true findings with it: `opt_in = "TL401"` says the
    finding is back with the rule selected, and the gate re-lints to hold that up."""
    off = {**RULES, "TL401": {**RULES["TL401"], "default": False}}
    assert corpus.parse_opt_in("TL401", "TL401", off) == (corpus.SELECT_RULE, True)
    assert "on by default" in corpus.parse_opt_in("TL401", "TL401", RULES)
    assert "names TL207" in corpus.parse_opt_in("TL207", "TL401", off)
    gone = {**entry(corpus, "true", context="A"), "opt_in": "TL401"}
    calls = []

    def relint_back(source, paths, code, option, value):
        calls.append((code, option, value))
        return [rec(corpus, line=3, context="other")]

    cmp = compare(corpus, [], [gone])
    assert corpus.gate_failures(cmp, off, relint_back) == []
    assert calls == [("TL401", corpus.SELECT_RULE, True)]
    assert corpus.gate_failures(cmp, off, lambda *a: []) != []
    assert corpus.gate_failures(cmp, RULES, relint_back) != []


def test_two_gone_entries_need_two_findings_back(corpus):
    entries = [{**entry(corpus, "true", line=n, context=str(n)), "opt_in": "TL401.allow-loss-item = false"}
               for n in (1, 2)]
    cmp = compare(corpus, [], entries)
    failures = corpus.gate_failures(cmp, RULES, lambda *a: [rec(corpus)])
    assert len(failures) == 1 and "does not report it either" in failures[0]


@pytest.mark.slow
def test_relint_with_option_sets_the_rule_option(corpus, tmp_path):
    root = tmp_path / "src" / "pkg"
    root.mkdir(parents=True)
    corpus.write_config_stop(tmp_path / "src")
    (root / "train.py").write_text(
        "import torch\n\nmodel = torch.nn.Linear(4, 1).cuda()\nopt = torch.optim.SGD(model.parameters())\n"
        "for batch in loader:\n    opt.zero_grad()\n    loss = model(batch.cuda()).sum()\n"
        "    loss.backward()\n    opt.step()\n    print(loss.item())\n", encoding="utf-8")
    assert corpus.lint_tree(root, ["train.py"], select="TL401") == []
    (found,) = corpus.relint_with_option(corpus.ECOSYSTEM, "pkg", "1.0", root, ["train.py"],
                                         "TL401", "allow-loss-item", False)
    assert (found["line"], found["text"]) == (10, "print(loss.item())")
    assert not list((tmp_path / "src").glob(".opt-in-*"))  # the temporary config is gone


# --------------------------------------------------------------------------- the gate, the ledger


def test_gate_precision_counts_default_rules_only(corpus):
    ledger = [entry(corpus, "true", line=i, text=f"t{i}", context=str(i)) for i in range(8)]
    ledger += [entry(corpus, "false", line=100, text="f", context="f"),
               entry(corpus, "noise", line=101, text="n", context="n"),
               entry(corpus, "false", code="TL207", text="off", context="o")]
    current = [{k: e[k] for k in rec(corpus)} for e in ledger]
    cmp = compare(corpus, current, ledger)
    per_rule = corpus.tally(cmp.verdict_of(), "code")
    assert per_rule["TL401"] == {"findings": 10, "true": 8, "false": 1, "noise": 1, "unreviewed": 0}
    failures = corpus.gate_failures(cmp, RULES)
    assert failures == ["TL401: precision 0.80 < 0.9 (default-enabled)"]
    assert corpus.precision({"unreviewed": 3}) is None


def test_update_marks_gone_entries_and_the_report_skips_them(corpus, tmp_path):
    ledger = [entry(corpus, "true", line=1, text="kept", context="k"),
              entry(corpus, "noise", line=2, text="lost", context="l"),
              {**entry(corpus, "false", line=3, text="back", context="b"), "gone": True}]
    current = [rec(corpus, line=1, text="kept", context="k"), rec(corpus, line=3, text="back", context="b"),
               rec(corpus, line=4, text="fresh", context="f")]
    updated = {e["text"]: e for e in corpus.updated_ledger(compare(corpus, current, ledger), prune=False)}
    assert updated["lost"]["gone"] is True and "gone" not in updated["back"]
    assert updated["fresh"]["verdict"] == "unreviewed" and updated["kept"]["verdict"] == "true"
    path = tmp_path / "ledger.jsonl"
    corpus.write_ledger(updated.values(), path, corpus.ECOSYSTEM)
    report = corpus.cross_report([(corpus.ECOSYSTEM, path)])
    assert "3 findings as of the last --update (1 gone entries not counted)" in report
    row = next(line.split() for line in report.splitlines() if line.startswith("TL401"))
    # (the column says whether the real rule is on by default: TL401 is opt-in)
    assert row == ["TL401", "host-sync-in-loop", "off", "3", "1", "1", "0", "1", "0.50"]


def test_ledger_round_trip_keeps_field_order_and_extra_fields(corpus, tmp_path):
    path = tmp_path / "ledger.jsonl"
    corpus.write_ledger([entry(corpus, "true", line=2, text="b"),
                         {**entry(corpus, "noise", line=1, text="a"), "opt_in": "TL401.x = 1"}],
                        path, corpus.ECOSYSTEM)
    rows = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]
    assert [r["text"] for r in rows] == ["a", "b"]
    assert list(rows[1]) == list(corpus.ECOSYSTEM.fields)
    assert rows[0]["opt_in"] == "TL401.x = 1"
    path.write_text(json.dumps(entry(corpus, "maybe")) + "\n", encoding="utf-8")
    with pytest.raises(SystemExit, match="verdict must be one of"):
        corpus.read_ledger(path, corpus.ECOSYSTEM)


def test_migrate_takes_template_and_context_from_the_finding_under_the_old_key(corpus, tmp_path):
    (tmp_path / "a.py").write_text("x = 1\nx.item()\n", encoding="utf-8")
    old = {k: v for k, v in entry(corpus, "true", line=2, message="stale wording").items()
           if k not in ("template", "context")}
    old["opt_in"] = "allow-loss-item = false"
    current = [rec(corpus, line=2, message="`x.item()` today's wording", context="C")]
    (migrated,) = corpus.migrate([old], corpus.ECOSYSTEM, {"pkg": tmp_path}, current)
    assert migrated["template"] == "`_` today's wording" and migrated["context"] == "C"
    assert migrated["opt_in"] == "TL401.allow-loss-item = false" and migrated["verdict"] == "true"
    (alone,) = corpus.migrate([old], corpus.ECOSYSTEM, {"pkg": tmp_path}, [])
    assert alone["template"] == "stale wording"
    assert alone["context"] == corpus.context_hash(["x = 1", "x.item()"], 2)


def test_python_files_skip_vendored_folders_and_excludes(corpus, tmp_path):
    for rel in ("pkg/a.py", "pkg/third_party/v.py", "examples/b.py", "docs/conf.py", "pkg/d.json",
                "pkg.egg-info/x.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("", encoding="utf-8")
    assert corpus.python_files(tmp_path, ["docs"]) == ["examples/b.py", "pkg/a.py"]


# --------------------------------------------------------------------------- a fake mirror

TRAIN_BUGGY = """\
import torch
from torch import nn

model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for batch in loader:
    loss = model(batch).sum()
    loss.backward()
    opt.zero_grad()
    opt.step()
"""
TRAIN_FIXED = TRAIN_BUGGY.replace("    loss.backward()\n    opt.zero_grad()\n",
                                  "    opt.zero_grad()\n    loss.backward()\n")


def _git(cwd: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(cwd)}
    return subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.fixture
def mirror(tmp_path):
    """``MIRROR/acme+trainer/repo`` with two commits: the bug, then its fix."""
    work = tmp_path / "work"
    (work / "vendor").mkdir(parents=True)
    _git(work, "init", "-q")
    (work / "train.py").write_text(TRAIN_BUGGY, encoding="utf-8")
    (work / "vendor" / "copied.py").write_text(TRAIN_BUGGY + "# a copy\n", encoding="utf-8")
    _git(work, "add", ".")
    _git(work, "commit", "-qm", "bug")
    buggy = _git(work, "rev-parse", "HEAD")
    (work / "train.py").write_text(TRAIN_FIXED, encoding="utf-8")
    _git(work, "commit", "-qam", "fix")
    fixed = _git(work, "rev-parse", "HEAD")
    mirror = tmp_path / "mirror"
    (mirror / "acme+trainer").mkdir(parents=True)
    _git(tmp_path, "clone", "-q", "--bare", str(work), str(mirror / "acme+trainer" / "repo"))
    return mirror, buggy, fixed


def test_git_sources_extract_a_commit_once_with_a_config_stop(corpus, mirror, tmp_path):
    mirror_dir, buggy, fixed = mirror
    sources = corpus.GitSources(tmp_path / "cache", mirror_dir)
    root = sources.tree("acme/trainer", buggy)
    assert root.name == f"acme+trainer@{buggy[:12]}"
    assert (root / "train.py").read_text(encoding="utf-8") == TRAIN_BUGGY
    assert (tmp_path / "cache" / "trainlint.toml").is_file()
    (root / "marker").write_text("", encoding="utf-8")
    assert sources.tree("acme/trainer", buggy) == root and (root / "marker").exists()  # reused
    assert sources.show("acme/trainer", fixed, "train.py") == TRAIN_FIXED
    assert sources.show("acme/trainer", fixed, "nope.py") is None
    with pytest.raises(RuntimeError, match="not in"):
        sources.tree("acme/trainer", "0" * 40)


def test_a_mirror_entry_may_be_a_plain_clone(corpus, mirror, tmp_path):
    mirror_dir, buggy, _ = mirror
    _git(tmp_path, "clone", "-q", str(mirror_dir / "acme+trainer" / "repo"), str(mirror_dir / "acme+plain" / "repo"))
    sources = corpus.GitSources(tmp_path / "cache", mirror_dir)
    assert sources.git_dir("acme/plain") == mirror_dir / "acme+plain" / "repo" / ".git"
    assert (sources.tree("acme/plain", buggy) / "train.py").is_file()


def test_a_mirror_missing_a_blob_still_gives_the_other_files(corpus, mirror, tmp_path):
    mirror_dir, buggy, _ = mirror
    git_dir = mirror_dir / "acme+trainer" / "repo"
    blob = _git(git_dir, "rev-parse", f"{buggy}:vendor/copied.py")
    (git_dir / "objects" / blob[:2] / blob[2:]).unlink()  # as a snapshot drops a large file
    root = corpus.GitSources(tmp_path / "cache", mirror_dir).tree("acme/trainer", buggy)
    assert (root / "train.py").read_text(encoding="utf-8") == TRAIN_BUGGY
    assert not (root / "vendor" / "copied.py").exists()
    assert "missing vendor/copied.py" in (root / ".corpus-complete").read_text(encoding="utf-8")


def _instance(buggy, fixed, **kw):
    data = {"id": "acme__trainer__zero_grad", "repo": "acme/trainer", "family": "gradients",
            "rules": ["TL102"], "evidence": "acme/trainer#1", "evidence_kind": "issue",
            "buggy": buggy, "fixed": fixed, "path": "train.py", "lines": [[9, 9]],
            "fixed_path": "train.py", "fixed_lines": [[7, 9]], "summary": "zero_grad after backward."}
    data.update(kw)
    return data


def _write_instance(directory: Path, data: dict) -> None:
    directory.mkdir(parents=True, exist_ok=True)

    def val(v):
        return json.dumps(v)

    text = "".join(f"{k} = {val(v)}\n" for k, v in data.items())
    (directory / f"{data['id']}.toml").write_text(text, encoding="utf-8")


def test_bug_instance_fields_are_checked(bench):
    _, _, bugs = bench
    rules = {"TL102", "TL101"}
    good = _instance("a" * 40, "b" * 40)
    assert bugs.field_problems(good, good["id"], rules) == []
    bad = _instance("a" * 39, "a" * 39, family="magic", rules=["TL999"], evidence="#1",
                    lines=[[5, 3]], note="x")
    found = bugs.field_problems(bad, "other", rules)
    assert found == ["unknown field `note`"]
    del bad["note"]
    found = " | ".join(bugs.field_problems(bad, "other", rules))
    for part in ("`id`", "`family`", "`rules`", "`evidence`", "`buggy` must", "same commit", "`lines`"):
        assert part in found


def test_validate_checks_commits_and_labelled_lines_in_the_mirror(bench, mirror, tmp_path, capsys):
    _, _, bugs = bench
    mirror_dir, buggy, fixed = mirror
    instances = tmp_path / "instances"
    _write_instance(instances, _instance(buggy, fixed))
    _write_instance(instances, _instance(buggy, "f" * 40, id="acme__trainer__absent"))
    _write_instance(instances, _instance(buggy, fixed, id="acme__trainer__blank", lines=[[3, 3]]))
    _write_instance(instances, _instance(buggy, fixed, id="acme__trainer__long", lines=[[9, 40]]))
    args = ["--validate", "--mirror", str(mirror_dir), "--instances-dir", str(instances),
            "--cache-dir", str(tmp_path / "cache")]
    assert bugs.main(args) == 1
    out = capsys.readouterr().out
    assert "acme__trainer__absent: `fixed` ffffffffffff is not in" in out
    assert "acme__trainer__blank: `lines` [3, 3] starts or ends on a blank line" in out
    assert "acme__trainer__long: `lines` [9, 40] beyond train.py's 10 lines" in out
    assert "4 instance(s), 1 valid, 3 with problems" in out
    assert bugs.main([*args, "--ids", "acme__trainer__zero_grad"]) == 0


def test_scoring_caught_silent_and_misses(bench):
    _, _, bugs = bench
    inst = bugs.Instance(id="i", repo="r/r", family="gradients", rules=("TL102", "TL207"), evidence="r/r#1",
                         evidence_kind="issue", buggy="b", fixed="f", path="t.py", lines=((9, 9),),
                         fixed_path="t.py", fixed_lines=((7, 9),), summary="s")

    def f(line, code="TL102", path="t.py"):
        return {"path": path, "line": line, "code": code, "message": "m"}

    linted = {("r/r", "b"): [f(9), f(9, "TL207"), f(9, path="u.py")], ("r/r", "f"): []}
    s = bugs.score(inst, linted, default_rules={"TL102"})
    assert s.caught_by == ["TL102", "TL207"] and s.silent_on_fix and not s.needs_opt_in
    assert s.opt_in == ["TL207"]
    linted = {("r/r", "b"): [f(9, "TL207"), f(15, "TL401")], ("r/r", "f"): [f(8)]}
    s2 = bugs.score(inst, linted, default_rules={"TL102"})
    assert s2.caught_by == ["TL207"] and s2.needs_opt_in and s2.on_fix == ["t.py:8 TL102"]
    s3 = bugs.score(inst, {("r/r", "b"): [f(15, "TL401"), f(40, "TL401")], ("r/r", "f"): []}, {"TL102"})
    assert not s3.caught and s3.near == ["15: TL401 m"]
    res = bugs.results([s, s2, s3, bugs.score(inst, {}, {"TL102"})])
    assert (res["linted"], res["caught"], res["silent_on_fix"]) == (3, 2, 2)
    assert res["rules"]["TL102"] == {"caught": 1, "instances": 3, "recall": pytest.approx(1 / 3)}
    assert res["opt_in"] == ["i"] and res["recall_default_only"] == pytest.approx(1 / 3)
    failures = bugs.check_failures(res)
    assert any(x.startswith("recall 0.67") for x in failures)
    assert any("silence 0.67" in x for x in failures) and any("not linted" in x for x in failures)


@pytest.mark.slow
def test_bugs_end_to_end_caught_at_the_bug_silent_at_the_fix(bench, mirror, tmp_path, capsys):
    _, _, bugs = bench
    mirror_dir, buggy, fixed = mirror
    instances = tmp_path / "instances"
    _write_instance(instances, _instance(buggy, fixed))
    args = ["--mirror", str(mirror_dir), "--instances-dir", str(instances),
            "--cache-dir", str(tmp_path / "cache")]
    assert bugs.main([*args, "--check", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert (res["recall"], res["silence"], res["check_failures"]) == (1.0, 1.0, [])


@pytest.mark.slow
def test_research_end_to_end_on_a_fake_mirror(bench, mirror, tmp_path, capsys):
    corpus, research, _ = bench
    mirror_dir, buggy, fixed = mirror
    repos = tmp_path / "repos.toml"
    ledger = tmp_path / "ledger.jsonl"

    def pin(commit):
        repos.write_text(f'[[repo]]\nname = "acme/trainer"\ncommit = "{commit}"\narea = "toy"\n',
                         encoding="utf-8")

    base = ["--mirror", str(mirror_dir), "--repos-file", str(repos), "--ledger", str(ledger),
            "--cache-dir", str(tmp_path / "cache")]
    pin(buggy)
    assert research.main([*base, "--update", "--check"]) == 1  # unreviewed
    out = capsys.readouterr().out
    assert "NEW  acme/trainer train.py:9: TL102" in out and "vendor" not in out
    (written,) = corpus.read_ledger(ledger, corpus.RESEARCH)
    assert (written["repo"], written["commit"], written["verdict"]) == ("acme/trainer", buggy, "unreviewed")
    corpus.write_ledger([{**written, "verdict": "true", "reason": "no update"}], ledger, corpus.RESEARCH)
    assert research.main([*base, "--check"]) == 0
    pin(fixed)  # the bump fixes the bug: a true finding is GONE
    assert research.main([*base, "--check"]) == 1
    assert "GONE acme/trainer train.py:9: TL102 [true]" in capsys.readouterr().out
    repos.write_text(f'[[repo]]\nname = "acme/absent"\ncommit = "{buggy}"\n', encoding="utf-8")
    assert research.main([*base, "--check"]) == 1
    assert "acme/absent: not linted" in capsys.readouterr().err


def test_research_reads_notebook_cells_as_trainlint_locates_them(corpus, tmp_path):
    # a notebook finding's line is within its cell: the key's text is that cell's line
    nb = {"cells": [{"cell_type": "markdown", "source": ["# title\n"]},
                    {"cell_type": "code", "source": ["import torch\n", "loss.backward()\n"]}]}
    (tmp_path / "nb.ipynb").write_text(json.dumps(nb), encoding="utf-8")
    (tmp_path / "a.py").write_text("x = 1\n", encoding="utf-8")
    assert corpus.python_files(tmp_path) == ["a.py"]
    assert corpus.python_files(tmp_path, notebooks=True) == ["a.py", "nb.ipynb"]
    lines = corpus.SourceLines(tmp_path)
    assert lines.line("nb.ipynb:cell 2", 2) == "loss.backward()"
    assert lines.line("nb.ipynb:cell 9", 1) == ""
