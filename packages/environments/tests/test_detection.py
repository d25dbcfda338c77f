import pytest

from plait.core import ConfigurationError, EnvironmentRegistry
from plait.environments import (
    ENVIRONMENT_VARIABLE,
    KubeflowEnvironment,
    LocalEnvironment,
    LSFEnvironment,
    MPIEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
    detect_environment,
)


def test_nothing_detected_means_plait_starts_the_processes() -> None:
    detection = detect_environment(environ={"HOME": "/root"})

    assert isinstance(detection.environment, LocalEnvironment)
    assert detection.variables == {}
    assert "no scheduler's variables found" in detection.reason


def test_each_scheduler_is_detected_with_the_variables_that_decided_it(
    torchrun: dict[str, str],
    slurm: dict[str, str],
    kubeflow: dict[str, str],
    open_mpi: dict[str, str],
    lsf: dict[str, str],
) -> None:
    assert type(detect_environment(environ=torchrun).environment) is TorchElasticEnvironment
    assert type(detect_environment(environ=kubeflow).environment) is KubeflowEnvironment
    assert type(detect_environment(environ=open_mpi).environment) is MPIEnvironment
    detection = detect_environment(environ=slurm)
    assert type(detection.environment) is SLURMEnvironment
    assert detection.variables == {"SLURM_NTASKS": "4", "SLURM_JOB_NAME": "train.sh"}
    assert detection.reason == (
        "cluster environment 'slurm' detected from SLURM_NTASKS=4, SLURM_JOB_NAME=train.sh"
    )
    with pytest.raises(ConfigurationError, match="is not among the job's compute hosts"):
        detect_environment(environ=lsf)  # detected; this machine is not nodeA or nodeB
    assert LSFEnvironment.matches(lsf) is not None


def test_a_pytorchjob_with_nproc_per_node_runs_torchrun_in_each_pod(
    torchrun: dict[str, str], kubeflow: dict[str, str]
) -> None:
    # With nprocPerNode, the operator sets PET_* for torchrun, the pod's command;
    # torchrun's workers carry both sets of variables.
    pet = {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "2", "PET_NODE_RANK": "1"}
    pet |= {"PET_MASTER_ADDR": "mnist-master-0", "PET_MASTER_PORT": "23456"}
    detection = detect_environment(environ={**kubeflow, **pet, **torchrun})

    assert type(detection.environment) is TorchElasticEnvironment
    assert detection.environment.node_rank == 1
    detection.environment.validate_settings(num_devices=2, num_nodes=2)


def test_torchrun_inside_a_slurm_allocation_is_torchrun(
    torchrun: dict[str, str], slurm: dict[str, str]
) -> None:
    detection = detect_environment(environ={**slurm, **torchrun})

    assert type(detection.environment) is TorchElasticEnvironment
    assert detection.variables == {"TORCHELASTIC_RUN_ID": "none"}


@pytest.mark.parametrize("job_name", ["bash", "interactive"])
def test_an_interactive_slurm_allocation_leaves_the_processes_to_plait(
    slurm: dict[str, str], job_name: str
) -> None:
    detection = detect_environment(environ={**slurm, "SLURM_JOB_NAME": job_name})

    assert type(detection.environment) is LocalEnvironment
    assert f"SLURM_JOB_NAME={job_name}" in detection.reason


def test_the_variable_turns_detection_off(slurm: dict[str, str]) -> None:
    detection = detect_environment(environ={**slurm, ENVIRONMENT_VARIABLE: "local"})

    assert type(detection.environment) is LocalEnvironment
    assert detection.variables == {ENVIRONMENT_VARIABLE: "local"}
    assert "chosen by PLAIT_CLUSTER_ENVIRONMENT=local" in detection.reason


def test_a_name_turns_detection_off(slurm: dict[str, str]) -> None:
    detection = detect_environment("Local", environ=slurm)

    assert type(detection.environment) is LocalEnvironment
    assert detection.reason == "cluster environment 'local' chosen by name"


def test_an_unknown_name_lists_the_environments_and_suggests_one() -> None:
    with pytest.raises(ConfigurationError) as caught:
        detect_environment(environ={ENVIRONMENT_VARIABLE: "slrum"})

    assert caught.value.suggestion == "slurm"
    assert set(caught.value.choices) >= {
        "local",
        "slurm",
        "torchelastic",
        "lsf",
        "kubeflow",
        "mpi",
        "xla",
    }


def test_every_built_in_environment_is_registered_by_name() -> None:
    assert set(EnvironmentRegistry.available()) == {
        "auto",
        "local",
        "torchelastic",
        "slurm",
        "lsf",
        "kubeflow",
        "mpi",
        "xla",
    }
    assert isinstance(EnvironmentRegistry.get("local"), LocalEnvironment)
    assert isinstance(EnvironmentRegistry.get("auto"), LocalEnvironment)  # nothing detected here
