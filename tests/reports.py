"""Assertions on a failing check's report, shared by the tests of every check."""

import re


def assert_hint_under(report: str, case: str, hint: str) -> None:
    """`hint` is the hint of the case whose line holds `case`, not another case's."""
    case_then_hint = re.escape(case) + r".*\n(\s+.*\n)*?\s+hint: .*" + re.escape(hint)
    assert re.search(case_then_hint, report), report


def assert_no_other_family(report: str, families: set[str], table: dict) -> None:
    """No hint of the report belongs to a family of `table` outside `families`."""
    hints = re.findall(r"hint: (.*)", report)
    for family, texts in table.items():
        if family not in families:
            assert not any(t in h for h in hints for t in texts), (family, report)
