"""Jobs across real network hosts: torchrun's c10d rendezvous, elastic restarts, checks.

Each host is a Linux network namespace on this machine (`tests.multinode.hosts`),
with an address of its own and no route anywhere but to the other hosts. In each,
``torchrun --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d`` starts two ranks,
as it would on two machines. The hosts share this machine's host name (as
containers often do): host 0 is told it runs the rendezvous (``is_host``), and each
agent its own address (``--local-addr``).
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import torch
from tests.multinode.hosts import Host, hosts, unavailable
from tests.reliability.jobs import (
    LONG_JOB_TIMEOUT,
    SCRIPT,
    TORCHRUN,
    Finished,
    Job,
    finish_all,
)

JOB_TIMEOUT = LONG_JOB_TIMEOUT
"""Each job's bound: torchrun on two hosts."""

# One worker runs the module, so that the undisturbed run its tests share runs once.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("multinode_hosts")]

PLACED = Path(__file__).resolve().parent / "placed_main.py"
PLAIT = Path(sys.executable).with_name("plait")
RENDEZVOUS_PORT = 29400
"""The rendezvous's port on host 0. The host is a network namespace made for the
test alone, where nothing else runs: no other process can hold the port."""


@pytest.fixture
def two_hosts() -> Iterator[list[Host]]:
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    with hosts(2) as made:
        yield made


def torchrun(
    host: Host, every: Sequence[Host], program: Sequence[str], *, restarts: int = 0
) -> list[str]:
    """torchrun's command on ``host``, for a job over ``every`` host, two ranks each.

    ``program`` is a Python script and its arguments, or ``--no-python`` and a
    command.
    """
    first = every[0]
    return host.command(
        [
            sys.executable, str(TORCHRUN),
            f"--nnodes={len(every)}", "--nproc-per-node=2",
            "--rdzv-backend=c10d", f"--rdzv-endpoint={first.address}:{RENDEZVOUS_PORT}",
            "--rdzv-id=plait-test", f"--local-addr={host.address}",
            *(["--rdzv-conf=is_host=1"] if host == first else []),
            f"--max-restarts={restarts}", "--monitor-interval=0.1",
            *program,
        ]
    )  # fmt: skip


def on_every_host(
    every: Sequence[Host],
    program: Sequence[str],
    root: Path,
    environment: dict[str, str] | None = None,
    *,
    restarts: int = 0,
) -> list[Finished]:
    """Run ``program`` under torchrun on every host at once; each host's outcome."""
    variables = {"OMP_NUM_THREADS": "1", **(environment or {})}
    jobs = [
        Job(torchrun(host, every, program, restarts=restarts), root, variables) for host in every
    ]
    return finish_all(jobs, JOB_TIMEOUT)  # every job is reaped, even after one failed


def plait_fit(root: Path, *options: str, devices: int = 2, strategy: str = "ddp") -> list[str]:
    """``plait fit`` of the digits example, as a user types it."""
    return [
        str(PLAIT), "fit", "--example", "digits", "--strategy", strategy, "--accelerator", "cpu",
        "--devices", str(devices), "--max-epochs", "2", "--no-progress-bar",
        "--default-root-dir", str(root), *options,
    ]  # fmt: skip


def on_one_host(root: Path, strategy: str) -> subprocess.CompletedProcess[str]:
    """The same training as four processes on this machine, started by plait itself."""
    done = subprocess.run(
        plait_fit(root, devices=4, strategy=strategy),
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT,
        check=False,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def ended_well(done: Sequence[Finished]) -> None:
    """Every host's torchrun ended with status 0 (else, the failure's output)."""
    assert [run.returncode for run in done] == [0] * len(done), "\n".join(
        run.stderr[-3000:] for run in done
    )


def parameters(root: Path) -> dict[str, torch.Tensor]:
    saved = torch.load(root / "checkpoints" / "last.ckpt", weights_only=True)
    state: dict[str, torch.Tensor] = saved["state_dict"]
    return state


@pytest.mark.timeout(JOB_TIMEOUT + 60)
def test_every_rank_knows_its_place_across_two_hosts(two_hosts: list[Host], tmp_path: Path) -> None:
    done = on_every_host(two_hosts, [str(PLACED)], tmp_path)

    ended_well(done)
    [line] = [line for line in done[0].stdout.splitlines() if line.startswith("placed: ")]
    placed = json.loads(line.removeprefix("placed: "))
    networks = [os.stat(f"/run/netns/{host.namespace}").st_ino for host in two_hosts]
    assert placed == [
        {"global_rank": rank, "local_rank": rank % 2, "node_rank": rank // 2,
         "world_size": 4, "network": networks[rank // 2]}
        for rank in range(4)
    ]  # fmt: skip


@pytest.mark.timeout(2 * JOB_TIMEOUT + 60)  # across the hosts, then on one
def test_plait_fit_across_two_hosts_trains_as_one_host_of_four_ranks(
    two_hosts: list[Host], tmp_path: Path
) -> None:
    across, alone = tmp_path / "across", tmp_path / "alone"
    across.mkdir()
    before = [host.bytes_received() for host in two_hosts]

    done = on_every_host(two_hosts, ["--no-python", *plait_fit(across, "--num-nodes", "2")], across)

    ended_well(done)
    assert "trained digits with ddp on 4 process(es) (cpu) for 2 epoch(s)" in done[0].stdout
    # The gradients crossed between the hosts, over their own addresses.
    received = [
        host.bytes_received() - start for host, start in zip(two_hosts, before, strict=True)
    ]
    assert min(received) > 100_000, received
    one_host = on_one_host(alone, "ddp")
    expected = parameters(alone)
    assert parameters(across).keys() == expected.keys()
    for name, value in parameters(across).items():
        assert torch.equal(value, expected[name]), name
    accuracy = [line for line in done[0].stdout.splitlines() if line.startswith("val_acc")]
    assert accuracy == [line for line in one_host.stdout.splitlines() if line.startswith("val_acc")]


@pytest.mark.timeout(2 * JOB_TIMEOUT + 60)  # across the hosts, then on one
def test_plait_fit_with_fsdp_across_two_hosts_ends_as_on_one_host(
    two_hosts: list[Host], tmp_path: Path
) -> None:
    across, alone = tmp_path / "across", tmp_path / "alone"
    across.mkdir()

    done = on_every_host(
        two_hosts,
        ["--no-python", *plait_fit(across, "--num-nodes", "2", strategy="fsdp")],
        across,
    )

    ended_well(done)
    assert "trained digits with fsdp on 4 process(es) (cpu) for 2 epoch(s)" in done[0].stdout
    # Every rank, on either host, wrote its shards of the checkpoint.
    assert (across / "checkpoints" / "last.ckpt" / ".metadata").is_file()
    one_host = on_one_host(alone, "fsdp")
    final = [line for line in done[0].stdout.splitlines() if line.startswith("final validation")]
    assert final
    assert final == [
        line for line in one_host.stdout.splitlines() if line.startswith("final validation")
    ]


@pytest.mark.timeout(JOB_TIMEOUT + 60)
def test_a_num_nodes_that_disagrees_with_torchrun_is_refused_on_every_host(
    two_hosts: list[Host], tmp_path: Path
) -> None:
    done = on_every_host(
        two_hosts, ["--no-python", *plait_fit(tmp_path, "--num-nodes", "1")], tmp_path
    )

    refusal = "torchrun formed a job of 2 node(s) (GROUP_WORLD_SIZE), but num_nodes=1"
    # No host hangs, and the refusal is said. A host whose worker had not said it yet
    # may instead see its torchrun agent lose the rendezvous store, which the other
    # host's agent held and took with it when its worker refused (a race of torchrun's).
    assert any(refusal in run.stderr for run in done), [run.stderr[-4000:] for run in done]
    for run in done:
        assert run.returncode != 0
        assert refusal in run.stderr or "RendezvousConnectionError" in run.stderr, run.stderr[
            -4000:
        ]


ELASTIC_PROGRAM = (str(SCRIPT), "ddp", "2", "max_epochs=2", "ckpt_path='last'", "num_nodes=2")
"""The user's script, resuming from its last checkpoint when torchrun restarts it."""


@pytest.fixture(scope="module")
def undisturbed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Finished]]:
    """The elastic job across two hosts, run to its end without a failure: its folder
    and each host's outcome, for every disturbed run to be compared with."""
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("undisturbed")
    with hosts(2) as two:
        program = [*ELASTIC_PROGRAM, f"default_root_dir={str(root)!r}"]
        return root, on_every_host(two, program, root, restarts=1)


@pytest.mark.timeout(2 * JOB_TIMEOUT + 60)  # the undisturbed run (the first), and its own
@pytest.mark.parametrize("failing_rank", [2, 0])
def test_an_elastic_restart_across_hosts_resumes_and_ends_as_an_undisturbed_run(
    two_hosts: list[Host],
    tmp_path: Path,
    failing_rank: int,
    undisturbed: tuple[Path, list[Finished]],
) -> None:
    calm_root, calm = undisturbed
    disturbed = tmp_path / "disturbed"
    disturbed.mkdir()

    failed_once = on_every_host(
        two_hosts,
        [*ELASTIC_PROGRAM, f"default_root_dir={str(disturbed)!r}"],
        disturbed,
        {"FAIL_RANK": str(failing_rank), "FAIL_STEP": "5", "FAIL_ONCE": str(disturbed / "failed")},
        restarts=1,
    )

    for run in (*calm, *failed_once):
        assert run.returncode == 0, run.stderr[-3000:]
    assert (disturbed / "failed").exists()  # it did fail, in the second epoch
    assert failed_once[0].result() == calm[0].result() == {"global_step": 8, "epoch": 2}
    expected = parameters(calm_root)
    for name, value in parameters(disturbed).items():
        # The resumed processes may round the last bit of a float otherwise.
        torch.testing.assert_close(value, expected[name], rtol=0, atol=1e-6)


def test_gloo_binds_the_interface_that_reaches_the_other_hosts(two_hosts: list[Host]) -> None:
    # The hosts share this machine's host name; where it resolves to loopback, gloo's
    # default would tell the other hosts to reach each rank at 127.0.0.1.
    asked = "from plait.strategies.network import gloo_interface; print(gloo_interface(*{}))"
    found = subprocess.run(
        two_hosts[0].command(
            [sys.executable, "-c", asked.format((two_hosts[1].address, RENDEZVOUS_PORT))]
        ),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={key: value for key, value in os.environ.items() if key != "GLOO_SOCKET_IFNAME"},
    )

    resolved = socket.gethostbyname(socket.gethostname())
    expected = "eth0" if ipaddress.ip_address(resolved).is_loopback else "None"
    assert found.stdout.strip() == expected
