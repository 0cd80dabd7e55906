"""Processes as Linux's /proc shows them: which a process started, and which still run."""

from __future__ import annotations

from pathlib import Path


def stat(pid: int) -> list[str] | None:
    """/proc/PID/stat after the command name: state, parent PID, ...; None once reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def children(pid: int) -> list[int]:
    """PIDs whose parent is `pid`."""
    return [int(d.name) for d in Path("/proc").iterdir() if d.name.isdigit()
            and (fields := stat(int(d.name))) is not None and int(fields[1]) == pid]


def alive(pid: int) -> bool:
    """Still running: not reaped, and not a zombie (which has exited)."""
    fields = stat(pid)
    return fields is not None and fields[0] != "Z"
