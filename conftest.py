"""Settings and fixtures shared by every test in the repository.

Hypothesis profiles: ``default`` is fast, for the edit-test loop; ``ci`` is thorough,
and ``tools/check`` selects it when the CI variable is set. Choose one with
``pytest --hypothesis-profile=ci``. Neither sets a deadline: on shared machines a
per-example time limit fails tests for the machine's load, not for the code.

Each test process computes on one intra-op thread (``OMP_NUM_THREADS``, unless the
environment sets it), and so do the processes it starts.

``start_ranks`` starts a script as the ranks of a job on this machine. Each test is
a program of its own: a job's process group that a test's strategy joined in this
process ends with the test (`plait.strategies.end_job`), as it would with a program.
"""

import gc
import itertools
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Final

import pytest
import torch
from hypothesis import HealthCheck, settings
from tests import warm
from tests.warm import WarmProcess

from plait.core import free_port
from plait.strategies.deepspeed.library import check_extension_locks
from plait.strategies.job import end_job

# C++ extensions (which DeepSpeed builds on first use of some ops) go to a directory of
# the tests' own, cleared of locks left by a build that died: a lock makes every later
# build wait for it forever. The strategies build none; this guards against one that would.
os.environ.setdefault(
    "TORCH_EXTENSIONS_DIR", str(Path(tempfile.gettempdir()) / "plait-tests-torch-extensions")
)
check_extension_locks(Path(os.environ["TORCH_EXTENSIONS_DIR"]), remove=True)

# Each test process computes on one intra-op thread, and every process it starts
# inherits the variable: pytest's workers take a core each, and the ranks their tests
# start share those cores, where a thread per core each would only spin waiting on one
# another (measured on 2 cores, five files of ranks: 416 CPU-s with torch's default,
# 333 with one thread). A value the environment already sets is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# What the fork server imports (plait_preload in pyproject.toml): no tests, and not for
# the test processes themselves, which import what their own tests need.
collect_ignore = ["tests/preload.py"]

settings.register_profile("default", max_examples=60, deadline=None)
settings.register_profile(
    "ci",
    max_examples=600,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("default")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the tests of hardware lanes this machine lacks, saying why; slow tests first.

    pytest-xdist hands out single tests in this order (with ``--dist loadgroup``,
    after the groups, largest first: the conformance lanes): the long ones start while
    the other workers have the short ones to share, instead of one long test ending
    the run with the other workers idle. The order is otherwise kept (a stable sort).
    """
    if torch.cuda.device_count() == 0:
        skip = pytest.mark.skip(reason="needs a CUDA device: this machine has none")
        for item in items:
            if "cuda" in item.keywords:
                item.add_marker(skip)
    items.sort(key=lambda item: "slow" not in item.keywords)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze what this process holds once the tests are collected (``gc.freeze``).

    torch, Hypothesis and the collected tests live as long as the session: the cycle
    collector need never scan them again, where each full collection over them costs
    a fraction of a second (the scripts tests start as processes do the same).
    """
    gc.freeze()


def _cpu_seconds() -> float:
    # User and system time of this process, of its children that have been waited for,
    # and of the scripts it ran warm (children of the fork server, not of this process).
    return warm.cpu_seconds() + warm.own_cpu_seconds()


_CPU_STARTED = pytest.StashKey[float]()
_STARTS_LOG = pytest.StashKey[Path]()
STARTS_LOG = "PLAIT_STARTS_LOG"
"""Where each interpreter of the environment notes its start: its process id, its
parent's and its command line, a line each (``tools/interpreter-starts.pth``, which tools/bootstrap
installs). A test sets it for what it starts; a process started with an environment
of its own making, without this variable, is not counted."""
_starts_folder = Path(tempfile.mkdtemp(prefix="plait-starts-"))
_tests_run = itertools.count()


MULTIPROCESSING_HELPERS: Final = (
    "from multiprocessing.forkserver import main",
    "from multiprocessing.resource_tracker import main",
)
"""The helpers multiprocessing starts once per process, for whichever test needs them
first (`tests.warm`, a conformance lane's rank pool): not counted to that test when
the test process itself started them."""


def interpreters_started(log: Path) -> list[str]:
    """The command lines of the interpreters that noted their start in ``log``, once each
    (an environment whose ``lib64`` links to ``lib`` reads its ``.pth`` files twice), but
    this process's own multiprocessing helpers (`MULTIPROCESSING_HELPERS`).

    An entry is a line that starts with two process ids; the lines after it that do not
    are the rest of its command line (a ``python -c`` program of several lines).
    """
    if not log.exists():
        return []
    by_process: dict[str, str] = {}
    for line in log.read_text(errors="replace").splitlines():
        process, parent, command = [*line.split(" ", 2), "", ""][:3]
        if not (process.isdigit() and parent.isdigit()):
            continue  # a command line's next line
        if parent == str(os.getpid()) and any(h in command for h in MULTIPROCESSING_HELPERS):
            continue
        by_process.setdefault(process, command)
    return list(by_process.values())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, object, object]:
    """Record each test's CPU seconds and the interpreters it started (JUnit XML).

    Counted: the test's process, the processes it started and waited for and the
    scripts it ran warm (`tests.warm`), from the start of its set-up to the end of its
    tear-down. Not counted: processes that outlive the test (a conformance lane's rank
    pool, reaped when the session ends). The interpreters are those started during the
    test, whether it waited for them or not (a rank forked from a server that has
    imported torch is none), but this process's multiprocessing helpers.
    """
    item.stash[_CPU_STARTED] = _cpu_seconds()
    log = _starts_folder / f"{next(_tests_run)}.log"
    item.stash[_STARTS_LOG] = log
    os.environ[STARTS_LOG] = str(log)
    try:
        return (yield)
    finally:
        os.environ.pop(STARTS_LOG, None)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Remove the interpreters' start logs of this process."""
    shutil.rmtree(_starts_folder, ignore_errors=True)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, object, object]:
    """Add the ``cpu``, ``interpreters`` and ``file`` properties once the tear-down is
    done, before its report."""
    try:
        return (yield)
    finally:
        spent = _cpu_seconds() - item.stash.get(_CPU_STARTED, _cpu_seconds())
        item.user_properties.append(("cpu", f"{spent:.2f}"))
        started = interpreters_started(item.stash[_STARTS_LOG]) if _STARTS_LOG in item.stash else []
        item.user_properties.append(("interpreters", str(len(started))))
        item.user_properties.append(("file", item.nodeid.partition("::")[0]))


@pytest.fixture(autouse=True)
def _job_ends_with_the_test() -> Iterator[None]:
    yield
    end_job()


StartRanks = Callable[..., list[str]]


@pytest.fixture(scope="session")
def start_ranks() -> StartRanks:
    """Run ``script ARGS`` as ``world_size`` ranks on gloo; return their outputs.

    Each rank gets ``MASTER_ADDR``/``MASTER_PORT`` (a free port), ``WORLD_SIZE``,
    ``RANK`` and ``LOCAL_RANK``, one intra-op thread, and ``environ`` on top; no
    ``SLURM_`` variable of the machine's; ``per_rank(rank)`` adds or replaces
    variables of one rank. Every rank must exit 0 within ``timeout``
    seconds; all are killed at the end, whatever happens.

    The ranks start warm (`tests.warm`): forked from a server that has imported torch
    and plait, each runs the script as ``python SCRIPT ARGS`` would. These tests are
    about what ranks do, not how they start; the launchers' own tests start theirs.
    """

    def start(
        script: Path,
        args: Sequence[str],
        world_size: int,
        *,
        environ: Mapping[str, str] | None = None,
        timeout: float = 120,
        per_rank: Callable[[int], Mapping[str, str]] | None = None,
    ) -> list[str]:
        base = {key: value for key, value in os.environ.items() if not key.startswith("SLURM_")}
        base |= {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()),
            "WORLD_SIZE": str(world_size),
            "OMP_NUM_THREADS": "1",
            **(environ or {}),
        }
        ranks = [
            WarmProcess(
                script,
                args,
                {
                    **base,
                    "RANK": str(rank),
                    "LOCAL_RANK": str(rank),
                    **(per_rank(rank) if per_rank else {}),
                },
            )
            for rank in range(world_size)
        ]
        deadline = time.monotonic() + timeout
        try:
            for process in ranks:
                process.wait(max(1.0, deadline - time.monotonic()))
            codes = [process.returncode for process in ranks]
            outputs = [process.output() for process in ranks]
        finally:
            for process in ranks:
                process.close()
        assert codes == [0] * world_size, "\n".join(
            f"--- rank {rank} exited {code}:\n{output}"
            for rank, (code, output) in enumerate(zip(codes, outputs, strict=True))
        )
        return outputs

    return start
