"""Running jobs as an unprivileged user of their own (`loom serve nodeagent --job-user`).

A job is a tenant's code. Run as the agent's own user it could read what the agent can: its
credentials file, its process environment (/proc/<pid>/environ), other jobs' checkpoints. As
Slurm runs a job as its submitter and Kubernetes a container as its runAsUser, the agent
starts each trainer as this user instead, with a home and identity of that user, and hands
it the job's checkpoint directory.

The agent must run as root (as slurmd does), with CAP_SETUID, CAP_SETGID, CAP_CHOWN and
CAP_KILL: a
switch from root to another user clears every capability, while a non-root agent given those
capabilities would pass them on to the job (a switch between two non-root users keeps them),
and the job could make itself root.
"""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass
from pathlib import Path

# Bits of the capability sets in /proc/self/status (linux/capability.h).
# CAP_KILL: the agent stops jobs that run as another user.
CAP_CHOWN, CAP_KILL, CAP_SETGID, CAP_SETUID = 0, 5, 6, 7
NEEDED = {CAP_CHOWN: "CAP_CHOWN", CAP_KILL: "CAP_KILL", CAP_SETGID: "CAP_SETGID",
          CAP_SETUID: "CAP_SETUID"}


def effective_capabilities(status: Path = Path("/proc/self/status")) -> int:
    """This process's effective capability set (0 where /proc cannot say)."""
    try:
        for line in status.read_text().splitlines():
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    except OSError:
        pass
    return 0


@dataclass(frozen=True, slots=True)
class JobUser:
    name: str
    uid: int
    gid: int
    home: str

    @classmethod
    def lookup(cls, name: str, capabilities: int | None = None,
               agent_uid: int | None = None) -> JobUser:
        """The user `name`, checked to be usable: it exists, is not root, and this process
        (root, with the capabilities to switch) may switch to it without passing on any
        privilege. Errors name the flag and what to change."""
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            raise ValueError(f"--job-user {name!r}: no such user on this host") from None
        if entry.pw_uid == 0:
            raise ValueError(f"--job-user {name!r} is root: jobs must not run as root")
        uid = os.getuid() if agent_uid is None else agent_uid
        if uid != 0:
            raise ValueError(f"--job-user {name!r}: the node agent must run as root to start "
                             f"jobs as another user (it runs as uid {uid}); see "
                             "deploy/systemd/loom-nodeagent@.service")
        caps = effective_capabilities() if capabilities is None else capabilities
        missing = [label for bit, label in NEEDED.items() if not caps >> bit & 1]
        if missing:
            raise ValueError(f"--job-user {name!r}: the node agent cannot switch users "
                             f"(it lacks {', '.join(missing)}; keep them in its "
                             "CapabilityBoundingSet)")
        return cls(entry.pw_name, entry.pw_uid, entry.pw_gid, entry.pw_dir)

    def identity(self) -> dict[str, str]:
        """The variables that say who a process is: the job user's, not the agent's."""
        return {"HOME": self.home, "USER": self.name, "LOGNAME": self.name}

    def hand_over(self, directory: Path) -> None:
        """Make the job's checkpoint directory (made by the agent) the job user's own."""
        directory.chmod(0o700)  # first: once it is the job user's, changing it needs CAP_FOWNER
        os.chown(directory, self.uid, self.gid)
