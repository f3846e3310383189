"""What the doctor found: :class:`Finding` lines, gathered in a :class:`DoctorReport`.

The report renders as a checklist (``render``) or as JSON (``to_json``), its findings
grouped by check in reading order (:data:`CHECK_ORDER`), whatever order the checks ran in.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stoker._printable import printable

__all__ = ["CHECK_ORDER", "DoctorReport", "FAIL", "Finding", "OK", "SKIP", "WARN"]

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"

# The order findings are shown in. The labels check runs after the statistics pass (it
# counts the labels that pass saw) but reads best beside the batches; "checks" is the
# line saying the remaining checks were skipped.
CHECK_ORDER = (
    "length",
    "files",
    "sample",
    "transform",
    "workers",
    "batches",
    "labels",
    "shuffle",
    "stats",
    "checks",
)


@dataclass(frozen=True, slots=True)
class Finding:
    """One line of the report.

    Attributes:
        check: which check: ``length``, ``files``, ``sample``, ``transform``, ``workers``,
            ``batches``, ``labels``, ``shuffle`` or ``stats``.
        status: ``"ok"``, ``"warn"``, ``"fail"`` or ``"skip"``.
        message: one readable sentence.
        details: further lines (figures, code to paste), shown indented.
        data: the figures, JSON-ready, for ``--json``.

    Example:
        >>> Finding("length", "ok", "1,000 samples").status
        'ok'
    """

    check: str
    status: str
    message: str
    details: tuple[str, ...] = ()
    data: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DoctorReport:
    """What :func:`stoker.doctor.check` found: the findings, and the normalisation statistics.

    Attributes:
        target: what was checked (a description).
        findings: every finding, in the order the checks ran.
        stats_field: the field the statistics are about (``sample[0]``), or None.
        mean, std: per-channel statistics on the scale ``Normalize`` expects (0-1 for
            pixel data), or None when they could not be computed.

    Example:
        >>> report = DoctorReport("demo", (Finding("length", "ok", "3 samples"),))
        >>> report.ok, report.exit_code, report.render().splitlines()[1]
        (True, 0, '  OK    length: 3 samples')
    """

    target: str
    findings: tuple[Finding, ...]
    stats_field: str | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None

    @property
    def failures(self) -> list[Finding]:
        return [f for f in self.findings if f.status == FAIL]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.status == WARN]

    @property
    def ok(self) -> bool:
        """True when no check failed (warnings are fine)."""
        return not self.failures

    @property
    def exit_code(self) -> int:
        """0 when no check failed, 1 otherwise (what ``stoker doctor`` exits with)."""
        return 0 if self.ok else 1

    def render(self) -> str:
        """The readable report: one ``OK`` / ``WARN`` / ``FAIL`` / ``SKIP`` line per finding.

        Control characters in file names and messages are shown escaped (``\\x1b``), so a
        name cannot clear the screen or fake a line of the report."""
        lines = [f"stoker doctor: {printable(self.target)}"]
        for finding in self.findings:
            message = printable(finding.message)
            lines.append(f"  {finding.status.upper():<5} {finding.check}: {message}")
            lines.extend(f"          {printable(detail)}" for detail in finding.details)
        counts = Counter(f.status for f in self.findings)
        summary = (
            f"{counts[OK]} ok, {counts[WARN]} {plural(counts[WARN], 'warning')}, "
            f"{counts[FAIL]} {plural(counts[FAIL], 'failure')}"
        )
        if counts[SKIP]:
            summary += f", {counts[SKIP]} skipped"
        lines.append(f"result: {'OK' if self.ok else 'FAILED'} ({summary})")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data."""
        return {
            "target": self.target,
            "ok": self.ok,
            "exit_code": self.exit_code,
            "findings": [
                {
                    "check": f.check,
                    "status": f.status,
                    "message": f.message,
                    "details": list(f.details),
                    "data": _jsonable(f.data),
                }
                for f in self.findings
            ],
            "normalize": None
            if self.mean is None
            else {"field": self.stats_field, "mean": list(self.mean), "std": list(self.std or ())},
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def __str__(self) -> str:
        return self.render()


def in_reading_order(findings: Iterable[Finding]) -> tuple[Finding, ...]:
    """Findings grouped by check in :data:`CHECK_ORDER`, each check's in the order found."""
    rank = {name: i for i, name in enumerate(CHECK_ORDER)}
    return tuple(sorted(findings, key=lambda f: rank.get(f.check, len(rank))))


def target_name(dataset: Any) -> str:
    """How the report names ``dataset`` when the caller does not: its ``repr``, shortened."""
    text = repr(dataset)
    if text.startswith("<") and " object at 0x" in text:  # the default repr says little
        try:
            size = f"len={len(dataset)}"
        except Exception:  # no length, or a broken one: the length check reports it
            size = ""
        text = f"{type(dataset).__name__}({size})"
    return text if len(text) <= 120 else text[:117] + "..."


def plural(n: int, word: str) -> str:
    return word if n == 1 else word + ("es" if word.endswith(("s", "ch")) else "s")


def _jsonable(value: Any) -> Any:
    # not _tree.map_leaves: JSON wants plain dicts and lists, not each container's own type
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist())
    if isinstance(value, np.generic):
        return _jsonable(value.item())
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)
