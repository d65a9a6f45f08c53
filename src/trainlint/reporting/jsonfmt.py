"""``json``: a list of findings with stable field names."""

from __future__ import annotations

import json
from collections.abc import Sequence

from trainlint.findings import Finding


def format_json(findings: Sequence[Finding], rules: Sequence[object] = ()) -> str:
    return json.dumps([f.to_dict() for f in findings], indent=2) + "\n"
