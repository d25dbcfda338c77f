"""The live processes of a job: those of its session, and those naming its folder."""

from __future__ import annotations

import os
from pathlib import Path


def processes_mentioning(marker: str) -> list[int]:
    """Live processes (not zombies) whose command line contains ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            command = Path("/proc", entry, "cmdline").read_bytes().decode(errors="replace")
            state = Path("/proc", entry, "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if marker in command and state != "Z":
            found.append(int(entry))
    return found


def processes_in_session(session: int) -> list[int]:
    """Live processes of the session ``session``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path("/proc", entry, "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[3]) == session and fields[0] != "Z":
            found.append(int(entry))
    return found
