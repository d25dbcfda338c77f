"""Variables as each scheduler sets them, recorded from its documentation.

Each describes rank 3 (or the rank noted) of a job of 2 nodes x 2 processes.
"""

from pathlib import Path

import pytest

TORCHRUN = {  # torchrun --nnodes=2 --nproc-per-node=2, rank 3
    "MASTER_ADDR": "node0.cluster",
    "MASTER_PORT": "29500",
    "WORLD_SIZE": "4",
    "RANK": "3",
    "LOCAL_RANK": "1",
    "GROUP_RANK": "1",
    "ROLE_RANK": "3",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_WORLD_SIZE": "2",
    "ROLE_WORLD_SIZE": "4",
    "ROLE_NAME": "default",
    "TORCHELASTIC_RUN_ID": "none",
    "TORCHELASTIC_RESTART_COUNT": "0",
    "TORCHELASTIC_MAX_RESTARTS": "0",
    "TORCHELASTIC_USE_AGENT_STORE": "True",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    "OMP_NUM_THREADS": "1",
}

SLURM = {  # sbatch --nodes=2 --ntasks-per-node=2 train.sh; srun python train.py, task 3
    "SLURM_JOB_ID": "4242",
    "SLURM_JOBID": "4242",
    "SLURM_JOB_NAME": "train.sh",
    "SLURM_NTASKS": "4",
    "SLURM_NPROCS": "4",
    "SLURM_NNODES": "2",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_NODELIST": "gpu-[017-018]",
    "SLURM_JOB_NODELIST": "gpu-[017-018]",
    "SLURM_TASKS_PER_NODE": "2(x2)",
    "SLURM_NTASKS_PER_NODE": "2",
    "SLURM_PROCID": "3",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_SUBMIT_DIR": "/home/user/project",
}

KUBEFLOW = {  # PyTorchJob with 4 replicas, worker pod of rank 2
    "KUBERNETES_PORT": "tcp://10.96.0.1:443",
    "KUBERNETES_SERVICE_HOST": "10.96.0.1",
    "MASTER_ADDR": "mnist-master-0",
    "MASTER_PORT": "23456",
    "WORLD_SIZE": "4",
    "RANK": "2",
    "PYTHONUNBUFFERED": "0",
}

OPEN_MPI = {  # mpirun -np 4 --map-by ppr:2:node, rank 3
    "OMPI_COMM_WORLD_SIZE": "4",
    "OMPI_COMM_WORLD_RANK": "3",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    "OMPI_COMM_WORLD_NODE_RANK": "1",
    "OMPI_UNIVERSE_SIZE": "4",
    "MASTER_ADDR": "node0",
    "MASTER_PORT": "29500",
}

MPICH = {  # mpiexec (Hydra) -n 4 -ppn 2, rank 1
    "PMI_SIZE": "4",
    "PMI_RANK": "1",
    "MPI_LOCALRANKID": "1",
    "MPI_LOCALNRANKS": "2",
    "MASTER_ADDR": "node0",
    "MASTER_PORT": "29500",
}

LSF_RANKFILE = "batch01\nnodeA\nnodeA\nnodeB\nnodeB\n"  # the launch node, then a line per slot


@pytest.fixture
def torchrun() -> dict[str, str]:
    return dict(TORCHRUN)


@pytest.fixture
def slurm() -> dict[str, str]:
    return dict(SLURM)


@pytest.fixture
def kubeflow() -> dict[str, str]:
    return dict(KUBEFLOW)


@pytest.fixture
def open_mpi() -> dict[str, str]:
    return dict(OPEN_MPI)


@pytest.fixture
def mpich() -> dict[str, str]:
    return dict(MPICH)


@pytest.fixture
def lsf(tmp_path: Path) -> dict[str, str]:
    """jsrun -n 4 -a 1 in an LSF job on nodeA and nodeB, rank 3 (on nodeB)."""
    rankfile = tmp_path / "rankfile"
    rankfile.write_text(LSF_RANKFILE)
    return {
        "LSB_JOBID": "7001",
        "LSB_JOBNAME": "train",
        "LSB_DJOB_RANKFILE": str(rankfile),
        "JSM_NAMESPACE_SIZE": "4",
        "JSM_NAMESPACE_RANK": "3",
        "JSM_NAMESPACE_LOCAL_RANK": "1",
    }
