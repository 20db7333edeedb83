#!/usr/bin/env python3
# Usage: check_selection.py EXECUTABLE SELECTION...
# Each SELECTION is a Catch2 test spec over file-name tags ("[#test_stager],[#staging_suite]"),
# the cases one Meson test of EXECUTABLE runs. Passes when every case of EXECUTABLE is selected
# by exactly one SELECTION: none is left out, none runs twice.
import subprocess
import sys


def names(executable, *spec):
    # --list-test-names-only exits with the number of cases listed: the status says nothing.
    out = subprocess.run([executable, "-#", "--list-test-names-only", *spec], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if line.strip()]


executable, selections = sys.argv[1], sys.argv[2:]
every = names(executable)
if not every:
    sys.exit(f"{executable} lists no test cases")
owner = {}
problems = []
for selection in selections:
    for name in names(executable, selection):
        if name in owner:
            problems.append(f"'{name}' is selected by both {owner[name]} and {selection}")
        owner[name] = selection
for name in every:
    if name not in owner:
        problems.append(f"'{name}' is selected by no test (add its file's tag to a selection)")
for problem in problems:
    print(problem)
print(f"{len(every)} cases in {len(selections)} selections" + (f", {len(problems)} problems" if problems else ""))
sys.exit(1 if problems else 0)
