"""tests/SCENARIOS.md keeps the suite honest: every test listed under "Before" is still collected, under its
own id or under the ids the "Moved" table gives it, so a scenario cannot be dropped without saying where it
went; and the "Now" table is what the suite collects today."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.conftest import REPO

SCENARIOS = REPO / "tests" / "SCENARIOS.md"
ROW = re.compile(r"^\| `(.+?)` \| (?:unit|backends|cluster|soak|gpu) \|")  # an id may hold a backtick


def section(title: str) -> list[str]:
    text = SCENARIOS.read_text()
    body = text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]
    return body.splitlines()


def ids(title: str) -> list[str]:
    return [m.group(1) for line in section(title) if (m := ROW.match(line))]


def moved() -> dict[str, list[str]]:
    """``| `before id` | `now id`, `now id` | why |`` rows: where a test that changed its id went."""
    table = {}
    for line in section("Moved"):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].startswith("`"):
            table[cells[0].strip("`")] = re.findall(r"`([^`]+)`", cells[1])
    return table


def collected() -> set[str]:
    """Every test of every tier (soak and gpu included: -m "" lifts make test's default deselection)."""
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "tests", "--collect-only", "-q", "-m", "", "-p", "no:cacheprovider"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    # a test id may carry the checkout's folder name (test_shellcheck's golden scripts): the list says main/
    return {line.replace(f"[{REPO.name}/", "[main/") for line in out.stdout.splitlines() if line.startswith("tests/")}


def test_every_scenario_of_before_is_still_checked_and_the_list_is_today_s():
    now, where = collected(), moved()
    before = ids("Before")
    assert len(before) >= 955  # the list as it was written, before the suite was made faster
    lost = [test for test in before if test not in now and not (where.get(test) and set(where[test]) <= now)]
    assert not lost, f"{len(lost)} scenarios of SCENARIOS.md are no longer collected and not moved: {lost[:10]}"
    listed = set(ids("Now"))
    assert listed == now, (
        f"SCENARIOS.md's 'Now' table is not today's suite: missing {sorted(now - listed)[:10]}, "
        f"gone {sorted(listed - now)[:10]}; regenerate it (python -m pytest tests -p tests.scenarios --collect-only -q -m '')"
    )
