"""Formats for CI systems and log processors: ``json-lines`` (one finding per line),
``gitlab`` (GitLab's Code Quality report) and ``junit`` (one test case per finding, one
suite per file), with the same fields ruff writes in its formats of these names."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from xml.sax.saxutils import quoteattr

from trainlint.findings import Finding
from trainlint.reporting import location


def format_json_lines(findings: Sequence[Finding], rules: Sequence[object] = ()) -> str:
    return "".join(json.dumps(f.to_dict()) + "\n" for f in findings)


def format_gitlab(findings: Sequence[Finding], rules: Sequence[object] = ()) -> str:
    items = []
    for f in findings:
        # GitLab matches findings across pipelines by this: the same finding at a moved
        # line keeps its fingerprint
        key = f"{f.path}\0{f.code}\0{f.message}\0{f.cell}"
        items.append(
            {
                "check_name": f.code,
                "description": f"{f.code} {f.name}: {f.message}",
                "severity": "major" if f.severity == "error" else "minor",
                "fingerprint": hashlib.sha256(key.encode()).hexdigest()[:32],
                "location": {"path": f.path, "lines": {"begin": f.line, "end": f.end_line}},
            }
        )
    return json.dumps(items, indent=2) + "\n"


def format_junit(findings: Sequence[Finding], rules: Sequence[object] = ()) -> str:
    by_file: dict[str, list[Finding]] = {}
    for f in findings:
        by_file.setdefault(f.path, []).append(f)
    out = [
        '<?xml version="1.0" encoding="UTF-8"?>\n',
        f'<testsuites name="trainlint" tests="{len(findings)}" failures="{len(findings)}" '
        'errors="0">\n',
    ]
    for path, items in by_file.items():
        out.append(
            f'  <testsuite name={quoteattr(path)} tests="{len(items)}" '
            f'failures="{len(items)}" errors="0">\n'
        )
        for f in items:
            name = quoteattr(f"{f.code} {f.name} at {location(f)}")
            out.append(
                f"    <testcase name={name} classname={quoteattr(path)}>"
                f"<failure message={quoteattr(f.message)}>{location(f)}: {f.code} "
                f"{_text(f.message)}</failure></testcase>\n"
            )
        out.append("  </testsuite>\n")
    out.append("</testsuites>\n")
    return "".join(out)


def _text(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
