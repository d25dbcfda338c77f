import os

import pytest

from plait.core import ClusterEnvironment, ConfigurationError, MissingDependencyError
from plait.environments import (
    KubeflowEnvironment,
    LocalEnvironment,
    LSFEnvironment,
    MPIEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
    XLAEnvironment,
)


def ranks(env: ClusterEnvironment) -> tuple[str, int, int, int, int, int]:
    return (
        env.main_address,
        env.main_port,
        env.world_size,
        env.global_rank,
        env.local_rank,
        env.node_rank,
    )


def test_torchrun(torchrun: dict[str, str]) -> None:
    env = TorchElasticEnvironment.from_environ(torchrun)

    assert ranks(env) == ("node0.cluster", 29500, 4, 3, 1, 1)
    assert env.local_world_size == 2
    assert env.creates_processes_externally
    assert isinstance(env, ClusterEnvironment)
    env.validate_settings(num_devices=2, num_nodes=2)


def test_torchrun_with_other_nproc_per_node_says_which_flag(torchrun: dict[str, str]) -> None:
    env = TorchElasticEnvironment.from_environ(torchrun)

    with pytest.raises(
        ConfigurationError, match=r"torchrun started 2 processes on this node"
    ) as caught:
        env.validate_settings(num_devices=4, num_nodes=2)
    assert caught.value.fix is not None
    assert "--nproc-per-node=4" in caught.value.fix


def test_torchrun_with_another_nnodes_says_which_flag(torchrun: dict[str, str]) -> None:
    env = TorchElasticEnvironment.from_environ(torchrun)

    assert env.num_nodes == 2
    with pytest.raises(
        ConfigurationError,
        match=r"torchrun formed a job of 2 node\(s\) \(GROUP_WORLD_SIZE\), but num_nodes=1",
    ) as caught:
        env.validate_settings(num_devices=2, num_nodes=1)
    assert caught.value.fix is not None
    assert "--nnodes=1" in caught.value.fix
    assert "num_nodes=2" in caught.value.fix


def test_torchrun_without_group_world_size_checks_the_world_alone(
    torchrun: dict[str, str],
) -> None:
    del torchrun["GROUP_WORLD_SIZE"]
    env = TorchElasticEnvironment.from_environ(torchrun)

    assert env.num_nodes is None
    with pytest.raises(ConfigurationError, match="launched 4 processes"):
        env.validate_settings(num_devices=2, num_nodes=1)


def test_slurm(slurm: dict[str, str]) -> None:
    env = SLURMEnvironment.from_environ(slurm)

    assert ranks(env) == ("gpu-017", 15000 + 4242, 4, 3, 1, 1)
    assert (env.num_nodes, env.tasks_per_node, env.job_id) == (2, 2, 4242)
    assert env.creates_processes_externally
    env.validate_settings(num_devices=2, num_nodes=2)


@pytest.mark.parametrize(
    ("nodelist", "host"),
    [("alpha beta gamma", "alpha"), ("1.2.3.[089, 100-110]", "1.2.3.089")],
)
def test_slurm_rendezvous_is_the_first_host_of_a_list_with_spaces(
    slurm: dict[str, str], nodelist: str, host: str
) -> None:
    env = SLURMEnvironment.from_environ({**slurm, "SLURM_NODELIST": nodelist})

    assert env.main_address == host


def test_slurm_prefers_master_addr_and_port(slurm: dict[str, str]) -> None:
    env = SLURMEnvironment.from_environ(
        {**slurm, "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "31000"}
    )

    assert (env.main_address, env.main_port) == ("10.0.0.5", 31000)


@pytest.mark.parametrize(
    ("devices", "nodes", "message", "fix"),
    [
        (4, 1, "SLURM allocated 2 node(s) (SLURM_NNODES), but num_nodes=1", "--nodes=1"),
        (4, 2, "SLURM started 2 task(s) per node", "--ntasks-per-node=4"),
        (1, 2, "SLURM started 2 task(s) per node", "PLAIT_CLUSTER_ENVIRONMENT=local"),
    ],
)
def test_slurm_task_counts_that_disagree_with_the_settings_are_caught(
    slurm: dict[str, str], devices: int, nodes: int, message: str, fix: str
) -> None:
    env = SLURMEnvironment.from_environ(slurm)

    with pytest.raises(ConfigurationError) as caught:
        env.validate_settings(num_devices=devices, num_nodes=nodes)

    assert message in str(caught.value)
    assert caught.value.fix is not None
    assert fix in caught.value.fix


def test_slurm_with_fewer_tasks_than_nodes_times_tasks_per_node_names_each_nodes_count(
    slurm: dict[str, str],
) -> None:
    # sbatch --nodes=2 --ntasks=3 --ntasks-per-node=2: the last node gets one task.
    short = {**slurm, "SLURM_NTASKS": "3", "SLURM_NPROCS": "3", "SLURM_TASKS_PER_NODE": "2,1"}
    short |= {"SLURM_STEP_NUM_TASKS": "3", "SLURM_PROCID": "2", "SLURM_LOCALID": "0"}
    env = SLURMEnvironment.from_environ(short)

    assert env.task_counts == (2, 1)
    with pytest.raises(ConfigurationError) as caught:
        env.validate_settings(num_devices=2, num_nodes=2)
    assert "SLURM started different numbers of tasks on its nodes (2, 1" in str(caught.value)
    assert caught.value.fix is not None
    assert "--ntasks=4" in caught.value.fix


@pytest.mark.parametrize(
    ("text", "counts"),
    [("2(x2)", (2, 2)), ("4(x2),3", (4, 4, 3)), ("1", (1,)), ("", None), ("2(x", None)],
)
def test_slurm_tasks_per_node_is_read_node_by_node(
    slurm: dict[str, str], text: str, counts: tuple[int, ...] | None
) -> None:
    env = SLURMEnvironment.from_environ({**slurm, "SLURM_TASKS_PER_NODE": text})

    assert env.task_counts == counts
    assert env.tasks_per_node == (counts[0] if counts else None)


def test_slurm_interactive_allocation_is_left_to_plait(slurm: dict[str, str]) -> None:
    # salloc, then srun --pty bash: plait starts the processes from the one task.
    for name in ("bash", "interactive"):
        assert SLURMEnvironment.matches({**slurm, "SLURM_JOB_NAME": name}) is None
    assert SLURMEnvironment.matches(slurm) is not None


def test_lsf(lsf: dict[str, str]) -> None:
    env = LSFEnvironment.from_environ(lsf, hostname="nodeB")

    # The port Lightning derives for job 7001: 10000 + 7001 % 1000.
    assert ranks(env) == ("nodeA", 10001, 4, 3, 1, 1)
    env.validate_settings(num_devices=2, num_nodes=2)
    assert LSFEnvironment.from_environ(
        {**lsf, "LSB_JOBID": "1234"}, hostname="nodeB"
    ).main_port == (10234)


def test_lsf_is_detected_by_the_variables_lightning_reads(lsf: dict[str, str]) -> None:
    # JSM_NAMESPACE_LOCAL_RANK, not JSM_NAMESPACE_RANK, shows jsrun's processes.
    without_local = {k: v for k, v in lsf.items() if k != "JSM_NAMESPACE_LOCAL_RANK"}
    assert LSFEnvironment.matches(without_local) is None
    without_global = {k: v for k, v in lsf.items() if k != "JSM_NAMESPACE_RANK"}
    assert LSFEnvironment.matches(without_global) is not None
    with pytest.raises(ConfigurationError, match="JSM_NAMESPACE_RANK"):
        LSFEnvironment.from_environ(without_global, hostname="nodeB")


def test_lsf_on_a_host_outside_the_job(lsf: dict[str, str]) -> None:
    with pytest.raises(ConfigurationError, match=r"this host 'elsewhere' is not among"):
        LSFEnvironment.from_environ(lsf, hostname="elsewhere")


def test_lsf_without_a_readable_rank_file(lsf: dict[str, str]) -> None:
    with pytest.raises(ConfigurationError, match="cannot read the rank file"):
        LSFEnvironment.from_environ({**lsf, "LSB_DJOB_RANKFILE": "/no/such/file"}, hostname="nodeA")


def test_kubeflow(kubeflow: dict[str, str]) -> None:
    env = KubeflowEnvironment.from_environ(kubeflow)

    assert ranks(env) == ("mnist-master-0", 23456, 4, 2, 0, 2)
    env.validate_settings(num_devices=1, num_nodes=4)
    with pytest.raises(ConfigurationError, match="one process per pod, but devices=2"):
        env.validate_settings(num_devices=2, num_nodes=2)


def test_open_mpi(open_mpi: dict[str, str]) -> None:
    env = MPIEnvironment.from_environ(open_mpi)

    assert ranks(env) == ("node0", 29500, 4, 3, 1, 1)


def test_mpich(mpich: dict[str, str]) -> None:
    env = MPIEnvironment.from_environ(mpich)

    assert ranks(env) == ("node0", 29500, 4, 1, 1, 0)


def test_mpi_without_a_rendezvous_needs_mpi4py(open_mpi: dict[str, str]) -> None:
    del open_mpi["MASTER_ADDR"], open_mpi["MASTER_PORT"]

    with pytest.raises(MissingDependencyError) as caught:
        MPIEnvironment.from_environ(open_mpi)
    assert caught.value.install == "plait-environments[mpi]"


def test_xla_needs_torch_xla() -> None:
    with pytest.raises(MissingDependencyError) as caught:
        XLAEnvironment.from_environ({"PJRT_DEVICE": "TPU"})
    assert caught.value.install == "plait-environments[xla]"


def test_local_before_launch_is_one_process_on_loopback() -> None:
    env = LocalEnvironment.from_environ({})

    assert (env.main_address, env.world_size, env.global_rank) == ("127.0.0.1", 1, 0)
    assert 1 <= env.main_port <= 65535
    assert not env.creates_processes_externally
    env.validate_settings(num_devices=4, num_nodes=1)  # plait will start 4 processes


def test_local_in_a_launched_process_reads_the_launcher(torchrun: dict[str, str]) -> None:
    env = LocalEnvironment.from_environ(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "40123",
            "WORLD_SIZE": "2",
            "RANK": "1",
            "LOCAL_RANK": "1",
        }
    )

    assert ranks(env) == ("127.0.0.1", 40123, 2, 1, 1, 0)
    assert env.creates_processes_externally
    env.validate_settings(num_devices=2, num_nodes=1)
    with pytest.raises(ConfigurationError, match="launched 2 processes"):
        env.validate_settings(num_devices=3, num_nodes=1)


def test_local_cannot_start_other_nodes() -> None:
    with pytest.raises(
        ConfigurationError, match="num_nodes=2, but no cluster environment was detected"
    ):
        LocalEnvironment.from_environ({}).validate_settings(num_devices=1, num_nodes=2)


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("RANK", "three", "RANK='three' is not an integer"),
        (
            "RANK",
            "4",
            "global rank 4 (from RANK) is outside the world of 4 processes (from WORLD_SIZE)",
        ),
        ("RANK", "-1", "RANK=-1 is below 0"),
        ("WORLD_SIZE", "0", "WORLD_SIZE=0 is below 1"),
        ("MASTER_PORT", "70000", "MASTER_PORT=70000 is not a port"),
        ("LOCAL_WORLD_SIZE", "", "LOCAL_WORLD_SIZE='' is not an integer"),
    ],
)
def test_malformed_torchrun_variables_are_named(
    torchrun: dict[str, str], variable: str, value: str, message: str
) -> None:
    with pytest.raises(ConfigurationError, match="torchelastic") as caught:
        TorchElasticEnvironment.from_environ({**torchrun, variable: value})

    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("SLURM_PROCID", "x", "SLURM_PROCID='x' is not an integer"),
        ("SLURM_PROCID", "9", "global rank 9 (from SLURM_PROCID) is outside the world of 4"),
        ("SLURM_NODELIST", "gpu-[017-", "the host list 'gpu-[017-' is malformed"),
        ("SLURM_JOB_ID", "abc", "SLURM_JOB_ID='abc' is not an integer"),
    ],
)
def test_malformed_slurm_variables_are_named(
    slurm: dict[str, str], variable: str, value: str, message: str
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        SLURMEnvironment.from_environ({**slurm, variable: value})

    assert message in str(caught.value)


def test_a_missing_variable_the_scheduler_always_sets_is_named(torchrun: dict[str, str]) -> None:
    del torchrun["GROUP_RANK"]

    with pytest.raises(ConfigurationError, match="the variable GROUP_RANK is not set"):
        TorchElasticEnvironment.from_environ(torchrun)


def test_every_built_in_environment_tears_down_as_lightnings_do_leaving_the_variables(
    monkeypatch: pytest.MonkeyPatch, torchrun: dict[str, str]
) -> None:
    # Read, never written: tearing one down leaves the process's variables as they were.
    for name, value in torchrun.items():
        monkeypatch.setenv(name, value)
    before = dict(os.environ)
    for environment in (TorchElasticEnvironment.from_environ(), LocalEnvironment.from_environ()):
        environment.teardown()
    assert dict(os.environ) == before


def test_lightnings_setters_take_the_value_an_environment_holds_and_refuse_another(
    slurm: dict[str, str],
) -> None:
    # A strategy ported from Lightning sets what it read: that goes on. Another value
    # is refused, naming the variable, rather than ignored.
    env = SLURMEnvironment.from_environ(slurm)
    env.set_world_size(4)
    env.set_global_rank(3)

    with pytest.raises(ConfigurationError, match=r"holds world_size=4 \(from SLURM_NTASKS\)"):
        env.set_world_size(8)
    with pytest.raises(ConfigurationError, match=r"set_global_rank\(0\)") as caught:
        env.set_global_rank(0)
    assert caught.value.fix is not None
    assert "attrs.evolve(environment, global_rank=0)" in caught.value.fix
    assert (env.world_size, env.global_rank) == (4, 3)
