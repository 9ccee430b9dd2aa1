"""Background services started in sessions of their own, found and stopped again by a later command.

A service is known by its session leader's pid and start time (so a pid the system reused is never taken
for it); stopping it reaches every process in its session and every descendant of those, including the
ones that moved to a process group or session of their own (Ray's workers, a Prefect worker's flow runs).
Linux only: the process table is read from /proc.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pwd
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

POLL_S = 0.2


@dataclasses.dataclass(frozen=True)
class Proc:
    pid: int
    started: int  # clock ticks after boot (/proc/PID/stat field 22)


@dataclasses.dataclass(frozen=True)
class Row:
    ppid: int
    session: int
    state: str
    started: int


def parse_stat(text: str) -> Row:
    """One line of /proc/PID/stat; the command name, in parentheses, may itself hold spaces and parentheses."""
    fields = text[text.rindex(")") + 2:].split()  # from field 3 (state) on
    return Row(ppid=int(fields[1]), session=int(fields[3]), state=fields[0], started=int(fields[19]))


def table() -> dict[int, Row]:
    rows = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):  # it ended while we looked
                rows[int(entry.name)] = parse_stat(Path(entry.path, "stat").read_text())
    return rows


def family(rows: dict[int, Row], leader: Proc) -> set[int]:
    """The live processes `leader` started: its session's members (the leader itself may be gone), and
    every descendant of those. A process older than the leader is never one of them."""
    ours = {pid for pid, row in rows.items() if row.session == leader.pid and row.started >= leader.started}
    grown = True
    while grown:
        children = {pid for pid, row in rows.items() if row.ppid in ours and row.started >= leader.started} - ours
        ours |= children
        grown = bool(children)
    return {pid for pid in ours if rows[pid].state != "Z"}  # a zombie has ended; only its parent can reap it


def alive(proc: Proc, rows: dict[int, Row] | None = None) -> bool:
    rows = table() if rows is None else rows
    row = rows.get(proc.pid)
    return row is not None and row.started == proc.started and row.state != "Z"


def spawn(command: list[str], log: Path, cwd: Path, env: dict[str, str], user: str | None = None) -> subprocess.Popen:
    """Start `command` as the leader of a new session (a Ctrl-C in the terminal does not reach it), its
    output appended to `log`; `user`: run it as that user (for a server that refuses to run as root)."""
    with open(log, "ab") as out:
        return subprocess.Popen(command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, **as_user(user))


def as_user(user: str | None) -> dict:
    """subprocess options that run a program as `user` (and its group only), or as this process's user."""
    if not user:
        return {}
    entry = pwd.getpwnam(user)
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


def proc_of(popen: subprocess.Popen) -> Proc:
    return Proc(popen.pid, table()[popen.pid].started)


def stop(leaders: Sequence[tuple[Proc, int, bool]], grace_s: float, kill_wait_s: float = 10.0) -> set[int]:
    """For each (leader, signal, to_all): send the signal to the leader, which stops what it started (or,
    `to_all`, to every process it started), wait up to `grace_s` for all of those to end, then SIGKILL
    what is left. Returns the pids still alive after that (none, normally)."""
    doomed: dict[int, int] = {}  # pid -> start time, growing with what the services start while they stop

    def left() -> set[int]:
        rows = table()
        doomed.update({pid: rows[pid].started for leader, _, _ in leaders for pid in family(rows, leader)})
        return {pid for pid, started in doomed.items() if alive(Proc(pid, started), rows)}

    rows = table()
    for leader, sig, to_all in leaders:
        for pid in family(rows, leader):
            doomed[pid] = rows[pid].started
            if to_all or pid == leader.pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
    if not wait_until_none(left, grace_s):
        for pid in left():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait_until_none(left, kill_wait_s)
    return left()


def wait_until_none(left, timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while left():
        if time.monotonic() > end:
            return False
        time.sleep(POLL_S)
    return True
