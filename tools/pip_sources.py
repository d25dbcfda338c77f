"""Print pip's package sources as uv's environment variables, one ``NAME=VALUE`` a line.

uv reads neither pip.conf nor ``PIP_*`` variables. A machine whose pip is set up to
find packages elsewhere (a local mirror as an extra index, a folder of wheels) has
uv look in the same places: ``index-url``, ``extra-index-url`` and ``find-links``,
as ``pip config list`` reports them (its environment variables before its files,
``install`` options before ``global`` ones, as pip itself ranks them).
"""

from __future__ import annotations

import ast
import subprocess
import sys

UV_NAMES = {
    "index-url": "UV_INDEX_URL",
    "extra-index-url": "UV_EXTRA_INDEX_URL",
    "find-links": "UV_FIND_LINKS",
}
RANK = {":env:": 0, "install": 1, "global": 2}


def main() -> int:
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    found: dict[str, tuple[int, str]] = {}
    for line in listed.splitlines():
        key, _, raw = line.partition("=")
        section, _, option = key.rpartition(".")
        if option not in UV_NAMES or section not in RANK:
            continue
        value = ast.literal_eval(raw) if raw[:1] in "'\"" else raw
        rank = RANK[section]
        if option not in found or rank < found[option][0]:
            found[option] = (rank, str(value))
    for option, (_, value) in sorted(found.items()):
        items = value.split()
        # uv takes find-links separated by commas, indexes by spaces.
        joined = ",".join(items) if option == "find-links" else " ".join(items)
        print(f"{UV_NAMES[option]}={joined}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
