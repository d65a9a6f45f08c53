"""Content-hash cache: an unchanged file under the same configuration is never re-linted.

Keyed on (file bytes, trainlint version, effective configuration for that file).
Entries are plain JSON (never pickle), one file per entry written atomically, so
concurrent runs sharing a cache directory are safe; an unreadable, partial or
corrupted entry is a miss, never an error.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from trainlint import __version__
from trainlint.engine import FileResult
from trainlint.findings import Finding

SCHEMA = 2


def content_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Cache:
    def __init__(self, directory: Path, fingerprint: str, code: str = "") -> None:
        self.directory = directory / f"v{SCHEMA}-{__version__}"
        self.fingerprint = fingerprint
        # the build that wrote a summary: what a summary holds changes with the analysis
        # (a checkout of the same version), and a stale one silently hides facts
        self.code = code
        self._ready = False

    @staticmethod
    def fingerprint_of(parts: list[Any]) -> str:
        blob = json.dumps(parts, sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()

    def key(self, data: bytes, kind: str, ignored: list[str], extra: str = "") -> str:
        return self.key_of_hash(content_hash(data), kind, ignored, extra)

    def key_of_hash(self, content: str, kind: str, ignored: list[str], extra: str = "") -> str:
        """The findings key of a file whose bytes hash to ``content``; ``extra`` carries
        what else its findings depend on (its torch pin, its project view's digest)."""
        h = hashlib.sha256()
        h.update(self.fingerprint.encode())
        h.update(kind.encode())
        h.update(",".join(sorted(ignored)).encode())
        h.update(b"\0" + extra.encode())
        h.update(b"\0")
        h.update(content.encode())
        return h.hexdigest()

    # -- project summaries: keyed on the bytes and the module name only (never on the
    # configuration: a summary does not depend on which rules are selected)
    def _summary_key(self, content: str, module: tuple[str, str, bool]) -> str:
        h = hashlib.sha256(b"summary\0" + self.code.encode() + b"\0")
        h.update(json.dumps(list(module)).encode())
        h.update(content.encode())
        return "s" + h.hexdigest()

    def get_summary(self, content: str, module: tuple[str, str, bool]) -> dict[str, Any] | None:
        key = self._summary_key(content, module)
        try:
            data = json.loads(self._path(key).read_text(encoding="utf-8"))
            if data.get("key") != key or not isinstance(data.get("summary"), dict):
                return None
            summary: dict[str, Any] = data["summary"]
            return summary
        except (OSError, ValueError):
            return None

    def put_summary(
        self, content: str, module: tuple[str, str, bool], summary: dict[str, Any]
    ) -> None:
        key = self._summary_key(content, module)
        self._write(key, {"key": key, "summary": summary})

    def _path(self, key: str) -> Path:
        return self.directory / key[:2] / f"{key}.json"

    def get(self, key: str, shown: str) -> FileResult | None:
        try:
            raw = self._path(key).read_text(encoding="utf-8")
            data = json.loads(raw)
            if data.get("key") != key:
                return None
            findings = []
            for item in data["findings"]:
                item = dict(item)
                item["path"] = shown
                findings.append(Finding.from_dict(item))
            return FileResult(shown, findings=findings, parsed=bool(data.get("parsed")))
        except (OSError, ValueError, KeyError, TypeError):
            return None  # missing or damaged: lint again

    def put(self, key: str, result: FileResult) -> None:
        if result.errors:
            return  # an internal error must show up again next run
        entry = {
            "key": key,
            "parsed": result.parsed,
            "findings": [
                {k: v for k, v in f.to_dict().items() if k != "path"} for f in result.findings
            ],
        }
        self._write(key, entry)

    def _write(self, key: str, entry: dict[str, Any]) -> None:
        target = self._path(key)
        try:
            if not self._ready:
                self.directory.mkdir(parents=True, exist_ok=True)
                marker = self.directory.parent / ".gitignore"
                if not marker.exists():
                    marker.write_text("# created by trainlint\n*\n", encoding="utf-8")
                self._ready = True
            target.parent.mkdir(parents=True, exist_ok=True)
            import tempfile  # here: a run that writes nothing never imports it

            fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(entry, fh)
            os.replace(tmp, target)
        except OSError:
            with contextlib.suppress(OSError, UnboundLocalError):
                os.unlink(tmp)
