#!/usr/bin/env bash
# Rewrites the "Now" table of tests/SCENARIOS.md from the suite as it is (every tier); "Before" and "Moved" stay.
set -euo pipefail
cd "$(dirname "$0")/.."
now=$(.venv/bin/python -m pytest tests -p tests.scenarios --collect-only -q -m "" -p no:cacheprovider | grep '^|')
head=$(sed '/^## Now$/q' tests/SCENARIOS.md)
printf '%s\n\nWhat the suite collects today, every tier (`-m ""`); `make test` runs all but `soak` and `gpu`.\n\n%s\n' "$head" "$now" >tests/SCENARIOS.md
