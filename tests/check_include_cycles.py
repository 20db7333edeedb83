#!/usr/bin/env python3
# Usage: check_include_cycles.py INCLUDE_DIR
# Builds the include graph of the headers under INCLUDE_DIR from their #include lines (quoted or
# angled, resolved against INCLUDE_DIR; system headers are left out) and fails when it has a
# cycle, naming each one as a chain of headers. A header that includes itself counts too.
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]')


def headers(root):
    for directory, _, files in os.walk(root):
        for name in files:
            if name.endswith((".hpp", ".h")):
                yield os.path.relpath(os.path.join(directory, name), root)


def edges(root, header):
    with open(os.path.join(root, header), encoding="utf-8") as source:
        for line in source:
            match = INCLUDE.match(line)
            if match and os.path.isfile(os.path.join(root, match.group(1))):
                yield os.path.normpath(match.group(1))


def cycles(graph):
    """Every elementary cycle found by a depth-first search, each reported once (by its set of
    edges), as the list of headers along it."""
    found, seen = [], set()
    state = {}  # header -> 1 while on the stack, 2 when done
    stack = []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                cycle = stack[stack.index(target):] + [target]
                key = frozenset(zip(cycle, cycle[1:]))
                if key not in seen:
                    seen.add(key)
                    found.append(cycle)
            elif target not in state:
                visit(target)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: check_include_cycles.py INCLUDE_DIR")
    root = sys.argv[1]
    graph = {header: set(edges(root, header)) for header in headers(root)}
    if not graph:
        sys.exit(f"no headers under {root}")
    found = cycles(graph)
    for cycle in found:
        print("include cycle: " + " -> ".join(cycle))
    if found:
        sys.exit(f"{len(found)} include cycle(s) among the {len(graph)} headers under {root}")
    print(f"no include cycle among the {len(graph)} headers under {root}")


if __name__ == "__main__":
    main()
