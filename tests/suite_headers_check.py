#!/usr/bin/env python3
# Usage: suite_headers_check.py DOCS_BACKENDS_MD TESTS_DIR
# The headers docs/backends.md tells a backend author to copy for the contract suites (the
# first column of its table) are a complete set: every header one of them includes from tests/
# is in the table too, and that header's row names the including one (or says "all of them"),
# so copying what the table says a suite needs compiles.
import re
import sys
from pathlib import Path

docs, tests = Path(sys.argv[1]), Path(sys.argv[2])
text = docs.read_text()
section = text[text.index("### Running the contract suites") :]
next_heading = re.compile(r"^#{1,3} ", re.M).search(section, section.index("\n"))
section = section[: next_heading.start()] if next_heading else section
rows = dict(re.findall(r"^\| `([\w.]+\.hpp)` \|(.*)$", section, re.M))
listed = set(rows)
if not listed:
    sys.exit(f"{docs}: no header table in 'Running the contract suites'")
problems = []
for header in sorted(listed):
    path = tests / header
    if not path.exists():
        problems.append(f"{header} is listed but is not in {tests}")
        continue
    for included in re.findall(r'^#include "([\w./]+)"', path.read_text(), re.M):
        if included.startswith("devstage/"):
            continue
        if included not in listed:
            problems.append(f"{header} includes {included}, which the table does not list")
        elif f"`{header}`" not in rows[included] and "all of them" not in rows[included]:
            problems.append(f"{header} includes {included}, whose row does not say that {header} needs it")
for problem in problems:
    print(problem)
print(f"{len(listed)} documented headers" + (f", {len(problems)} problems" if problems else ": a complete set"))
sys.exit(1 if problems else 0)
