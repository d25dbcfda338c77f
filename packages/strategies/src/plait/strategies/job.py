"""The job in this process: its process group lives from the first run that joins it to the end.

A parallel strategy joins the job's process group at its first `setup_environment`
and does not leave it at `teardown`: ``fit``, ``validate``, ``test`` and
``predict`` of one program, and a second strategy or Trainer with the same
settings, run on the same group, so a module sharded by one run goes on to the
next as it is. The job ends:

- when the program ends: an exit handler (registered when the group is joined)
  departs (rank 0, which serves the job's store, waits for every rank to be done
  with it), destroys the group and flushes the output, while the interpreter is
  still whole;
- when `end_job` is called (a program that goes on without the group);
- when a run fails (every rank is stopped), or a strategy with other settings
  (another backend, timeout, world) joins: the old group is ended first.

`leave` is the end of a process whose exit status is known (the ``plait``
command, a rank a spawn launcher started): after success it runs the exit
handlers, ends the job, flushes, and leaves without tearing the interpreter down,
where torch's communication threads can abort a finished process (``terminate
called without an active exception``); a failure exits as usual, with its status.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import sys
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Final, NoReturn

import attrs

if TYPE_CHECKING:
    from plait.strategies.collectives import DistributedCollectives

__all__ = ["Job", "current_job", "end_job", "join_job", "leave"]

_generations: Final = itertools.count(1)


@attrs.define(eq=False)
class Job:
    """The process group this process has joined, and how to end it.

    Attributes:
        settings: What a strategy must share with the one that joined to use the
            group too (backend, world, ranks, timeouts, how calls are checked).
        collectives: plait's collectives over the group.
        generation: Tells this job from earlier ones of the same program (a module
            sharded over a group that has ended cannot be used again).
        destroy: Destroys the group (through the library that holds it, for
            DeepSpeed).
        held: What strategies keep for the job's life, made over its group (FSDP's
            device meshes), by key; it goes with the job.
    """

    settings: Hashable
    collectives: DistributedCollectives
    generation: int
    destroy: Callable[[], None]
    held: dict[Hashable, object] = attrs.field(factory=dict)


_job: Job | None = None
_registered = False


def current_job() -> Job | None:
    """The job this process has joined, if it is still going."""
    return _job


def join_job(
    settings: Hashable,
    join: Callable[[], DistributedCollectives],
    destroy: Callable[[], None],
) -> Job:
    """The job with these settings: the live one, or a new one made by ``join``.

    A live job with other settings is ended first (every rank does the same, as
    every rank runs the same program).
    """
    global _job, _registered  # noqa: PLW0603 (one job per process)
    if _job is not None:
        if _job.settings == settings:
            return _job
        end_job()
    collectives = join()
    _job = Job(
        settings=settings, collectives=collectives, generation=next(_generations), destroy=destroy
    )
    if not _registered:
        # Registered after the launchers' own handlers (a launcher starts its ranks
        # before the work joins): it runs before them, so rank 0 has departed and
        # destroyed its group before it waits for its ranks to exit.
        atexit.register(_at_exit)
        _registered = True
    return _job


def end_job(*, depart: bool = True) -> None:
    """End the job's process group in this process, if it has one; safe to call again.

    Every rank calls it (at exit, it is called for you). With ``depart``, rank 0,
    which serves the job's store, first waits for every rank to be done with it
    (bounded by the collective timeout; a failure posted by a launcher ends the
    wait). A failed run ends the job without departing: nothing waits on it.
    """
    global _job
    job, _job = _job, None
    if job is None:
        return
    if depart:
        job.collectives.depart()
    job.destroy()


def _at_exit() -> None:
    # While the interpreter is whole: a group destroyed later, from finalisation,
    # can abort the process after its work is done.
    with contextlib.suppress(Exception):
        # An uncaught error (a failed run) ends the job without waiting on the others.
        end_job(depart=getattr(sys, "last_value", None) is None)
    _flush()


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def leave(status: int) -> NoReturn:
    """End the process with ``status``; after success, without tearing the interpreter down.

    For a process whose whole program plait runs (the ``plait`` command, a rank a
    spawn launcher started). Status 0: the exit handlers run (the job ends, a
    launcher waits for its ranks, files are closed), the output is flushed, and
    the process leaves by ``os._exit(0)``: torch's communication threads can abort
    an interpreter being torn down after a finished job (``terminate called without
    an active exception``), which would report the job failed. Any other status
    exits as usual, so a failure is reported as one.
    """
    if status != 0:
        sys.exit(status)
    try:
        atexit._run_exitfuncs()
    finally:
        _flush()
        os._exit(0)
