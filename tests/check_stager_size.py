#!/usr/bin/env python3
# Usage: check_stager_size.py INCLUDE_DIR [LIMIT]
# The Stager is read file by file: stager.hpp and each component under detail/stager/ stays at
# most LIMIT lines (400). Fails naming every file over it, with its line count.
import os
import sys


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: check_stager_size.py INCLUDE_DIR [LIMIT]")
    root = os.path.join(sys.argv[1], "devstage")
    limit = int(sys.argv[2]) if len(sys.argv) == 3 else 400
    components = os.path.join(root, "detail", "stager")
    files = [os.path.join(root, "stager.hpp")]
    files += sorted(os.path.join(components, name) for name in os.listdir(components) if name.endswith(".hpp"))
    over = []
    for path in files:
        with open(path, encoding="utf-8") as source:
            lines = sum(1 for _ in source)
        if lines > limit:
            over.append(f"{os.path.relpath(path, sys.argv[1])}: {lines} lines")
    for line in over:
        print(f"over {limit} lines: {line}")
    print(f"{len(files)} files of the Stager, {len(over)} over {limit} lines")
    sys.exit(1 if over else 0)


if __name__ == "__main__":
    main()
