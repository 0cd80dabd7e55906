"""Print how the running environment's packages differ from a lock file's pins.

Used by `scripts/test --latest` to show which new releases a run is trying:
    python scripts/lock_diff.py locks/all.txt
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(lock: Path) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in lock.read_text().splitlines():
        match = PIN.match(line)
        if match:
            found[canonical(match[1])] = match[2]
    return found


def installed() -> dict[str, str]:
    return {canonical(d.metadata["Name"]): d.version for d in metadata.distributions()}


def main() -> int:
    lock = Path(sys.argv[1] if len(sys.argv) > 1 else "locks/all.txt")
    locked, have = pins(lock), installed()
    changed = [(n, locked[n], have[n]) for n in sorted(locked) if n in have
               and have[n] != locked[n]]
    missing = sorted(set(locked) - set(have))
    new = sorted(set(have) - set(locked) - {"loom-scheduler", "pip", "setuptools", "wheel"})
    print(f"against {lock}: {len(changed)} newer or other, {len(new)} new, "
          f"{len(missing)} no longer needed")
    for name, old, now in changed:
        print(f"  {name} {old} -> {now}")
    for name in new:
        print(f"  {name} {have[name]} (new)")
    for name in missing:
        print(f"  {name} {locked[name]} (not installed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
