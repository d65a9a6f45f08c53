"""``sarif``: SARIF 2.1.0, with rule metadata and help URIs, for GitHub code scanning."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from trainlint import __version__
from trainlint.findings import Finding
from trainlint.reporting import NotebookFiles

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
DOCS_URL = "https://github.com/trainlint/trainlint/blob/main/docs/rules/{code}.md"


def _region(f: Finding, notebooks: NotebookFiles) -> dict[str, Any]:
    if f.cell is None:
        return {
            "startLine": f.line,
            "startColumn": f.column,
            "endLine": f.end_line,
            "endColumn": f.end_column,
        }
    # GitHub code scanning reads a region as lines and columns of the artifact, here the
    # notebook's JSON text; the cell and the position inside it go in the region's
    # property bag (SARIF 2.1.0 §3.8) for tools that open notebooks.
    cell = {
        "cell": f.cell,
        "cellLine": f.line,
        "cellColumn": f.column,
        "cellEndLine": f.end_line,
        "cellEndColumn": f.end_column,
    }
    span = notebooks.region(f)
    if span is None:  # the file changed or is not ours to map: point at the notebook only
        return {"startLine": 1, "properties": cell}
    line, col, end_line, end_col = span
    return {
        "startLine": line,
        "startColumn": col,
        "endLine": end_line,
        "endColumn": end_col,
        "properties": cell,
    }


def format_sarif(findings: Sequence[Finding], rules: Sequence[Any] = ()) -> str:
    rule_list = sorted(rules, key=lambda r: r.code)
    index = {r.code: i for i, r in enumerate(rule_list)}
    descriptors = []
    for r in rule_list:
        sections = r.doc_sections()
        descriptors.append(
            {
                "id": r.code,
                "name": r.name,
                "shortDescription": {"text": r.message},
                "fullDescription": {"text": sections.get("What it does", r.message)},
                "help": {"text": r.documentation(), "markdown": r.documentation()},
                "helpUri": DOCS_URL.format(code=r.code),
                "defaultConfiguration": {
                    "level": "error" if r.severity == "error" else "warning",
                    "enabled": bool(r.default_enabled),
                },
                "properties": {"tags": ["training", r.code[:3]]},
            }
        )
    results = []
    notebooks = NotebookFiles()
    for f in findings:
        region = _region(f, notebooks)
        result: dict[str, Any] = {
            "ruleId": f.code,
            "level": "error" if f.severity == "error" else "warning",
            "message": {"text": f.message},
            "locations": [
                {
                    "physicalLocation": {
                        "artifactLocation": {"uri": f.path, "uriBaseId": "%SRCROOT%"},
                        "region": region,
                    }
                }
            ],
        }
        if f.related:
            result["relatedLocations"] = [
                {
                    "id": i,
                    "physicalLocation": {
                        "artifactLocation": {"uri": f.path, "uriBaseId": "%SRCROOT%"},
                        "region": _region(
                            f._replace(
                                line=r.line,
                                column=r.column,
                                end_line=r.end_line,
                                end_column=r.end_column,
                                cell=r.cell,
                            ),
                            notebooks,
                        ),
                    },
                    "message": {"text": r.message},
                }
                for i, r in enumerate(f.related, 1)
            ]
        if f.code in index:
            result["ruleIndex"] = index[f.code]
        results.append(result)
    doc = {
        "$schema": SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "trainlint",
                        "version": __version__,
                        "informationUri": "https://github.com/trainlint/trainlint",
                        "rules": descriptors,
                    }
                },
                "results": results,
            }
        ],
    }
    return json.dumps(doc, indent=2) + "\n"
