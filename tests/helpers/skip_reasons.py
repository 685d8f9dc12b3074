"""The test run's skips counted by reason: one line per distinct reason at the end of the run
(a pytest plugin; tests/conftest.py installs its hook)."""

from __future__ import annotations

import collections

__all__ = ["pytest_terminal_summary", "skip_reason", "skip_summary"]

_PREFIX = "Skipped: "  # what pytest.skip() puts before its message


def skip_reason(report) -> str:
    """The reason a skipped test report gives, without pytest's ``Skipped:`` prefix."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # (path, line, reason)
        text = str(longrepr[2])
    else:
        text = str(longrepr or "no reason given")
    text = text.strip().splitlines()[0] if text.strip() else "no reason given"
    return text[len(_PREFIX) :] if text.startswith(_PREFIX) else text


def skip_summary(reports) -> list[str]:
    """``skipped N: reason`` lines, the most frequent reason first (ties by reason)."""
    counts = collections.Counter(skip_reason(r) for r in reports)
    return [f"skipped {n}: {reason}" for reason, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    # -rs lists each skip with its file and line; this gives the reasons at a glance, also in -q
    lines = skip_summary(terminalreporter.stats.get("skipped", []))
    if lines:
        terminalreporter.write_sep("-", "skips by reason")
        for line in lines:
            terminalreporter.write_line(line)
