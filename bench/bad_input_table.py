"""Print how many bad inputs the table in tests/test_bad_input.py tries, by kind.

    python3 bench/bad_input_table.py

Counting only: `python3 -m pytest -q tests/test_bad_input.py` runs them (each row checks
the message names what is wrong and where, and that nothing is launched or lost).
"""

from __future__ import annotations

import collections
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from tests.test_bad_input import CASES, PROBES  # noqa: E402


def main() -> None:
    kinds = collections.Counter(case.kind for case in CASES) + collections.Counter(p.kind for p in PROBES)
    print(f"# python3 bench/bad_input_table.py  ({platform.node()}, {platform.python_version()})")
    print(f"bad inputs tried: {len(CASES) + len(PROBES)}  (input files: {len(CASES)}, run-time probes: {len(PROBES)})")
    for kind, count in sorted(kinds.items()):
        print(f"  {kind:10s} {count}")


if __name__ == "__main__":
    main()
