"""Assertions on a failing check's report, shared by the tests of every check."""

import re


def assert_hint_under(report: str, case: str, hint: str) -> None:
    """`hint` is the hint of the case whose line holds `case`, not another case's: it is
    read from the lines below that case's line, up to the next case's."""
    lines = report.splitlines()
    for i, line in enumerate(lines):
        if case not in line or not line.lstrip().startswith(("✗", "✓")):
            continue
        for below in lines[i + 1 :]:
            if below.lstrip().startswith(("✗", "✓")):
                break
            if below.lstrip().startswith("hint:") and hint in below:
                return
    raise AssertionError(f"no hint {hint!r} under {case!r}:\n{report}")


def assert_no_other_family(report: str, families: set[str], table: dict) -> None:
    """No hint of the report belongs to a family of `table` outside `families`."""
    hints = re.findall(r"hint: (.*)", report)
    for family, texts in table.items():
        if family not in families:
            assert not any(t in h for h in hints for t in texts), (family, report)
