"""`MLFlowLogger`: one run of an MLflow experiment, behind the ``mlflow`` extra."""

from __future__ import annotations

import importlib
import os
import re
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar, cast

from typing_extensions import override

from plait.core import (
    ConfigurationError,
    MissingDependencyError,
    is_module_available,
    rank_zero_only,
    rank_zero_warn,
)
from plait.trainer.loggers.base import flatten_params

if TYPE_CHECKING:
    from collections.abc import Callable

    from plait.trainer.metrics import Number

__all__ = ["MLFlowLogger", "TrackingClient"]

_T = TypeVar("_T")

# The characters MLflow takes in a metric name (colons not on Windows): others become "_".
_MLFLOW_NAME = re.compile(r"[^\w./\- :]")
_MLFLOW_STATUS = {"success": "FINISHED", "finished": "FINISHED", "failed": "FAILED"}
# MLflow's limits per logging call (mlflow.utils.validation), for MLflow versions that
# do not say.
_MLFLOW_PARAMS_PER_BATCH = 100
_MLFLOW_METRICS_PER_BATCH = 1000


class _Experiment(Protocol):
    @property
    def experiment_id(self) -> str: ...
    @property
    def lifecycle_stage(self) -> str: ...


class _RunInfo(Protocol):
    @property
    def run_id(self) -> str: ...
    @property
    def experiment_id(self) -> str: ...
    @property
    def artifact_uri(self) -> str | None: ...
    @property
    def status(self) -> str: ...


class _RunData(Protocol):
    @property
    def params(self) -> Mapping[str, str]: ...
    @property
    def tags(self) -> Mapping[str, str]: ...


class _Run(Protocol):
    @property
    def info(self) -> _RunInfo: ...
    @property
    def data(self) -> _RunData: ...


class _Metric(Protocol):
    @property
    def key(self) -> str: ...
    @property
    def value(self) -> float: ...
    @property
    def step(self) -> int: ...


class _Flag(Protocol):
    def get(self) -> bool: ...


class TrackingClient(Protocol):
    """What `MLFlowLogger` calls of ``mlflow.tracking.MlflowClient`` (its `experiment`)."""

    def get_experiment_by_name(self, name: str) -> _Experiment | None:
        """The experiment of that name (deleted ones too), or None."""
        ...

    def create_experiment(self, name: str, artifact_location: str | None = None) -> str:
        """Make an experiment; its id."""
        ...

    def create_run(
        self, experiment_id: str, *, tags: Mapping[str, str], run_name: str | None
    ) -> _Run:
        """Make a run of an experiment."""
        ...

    def get_run(self, run_id: str) -> _Run:
        """The run of that id (raises MLflow's exception when there is none)."""
        ...

    def log_batch(
        self, run_id: str, *, metrics: Sequence[object] = (), params: Sequence[object] = ()
    ) -> object:
        """Log metrics and parameters (``mlflow.entities.Metric`` and ``Param``)."""
        ...

    def set_terminated(self, run_id: str, status: str) -> None:
        """End a run with a status (``FINISHED``, ``FAILED``, ...)."""
        ...

    def get_metric_history(self, run_id: str, key: str) -> Sequence[_Metric]:
        """Every value logged for a metric, in the order logged."""
        ...

    def log_artifact(self, run_id: str, local_path: str, artifact_path: str | None = None) -> None:
        """Copy a file (a checkpoint, say) into the run's artifacts."""
        ...


class MLFlowLogger:
    """Send metrics and settings to an MLflow tracking store, as one run of an experiment.

    Needs the ``mlflow`` module: ``pip install 'plait-trainer[mlflow]'`` installs
    ``mlflow-skinny``, MLflow's client; where the full ``mlflow`` distribution is
    installed, nothing more is needed. The experiment and the run are made on first use,
    in the process of global rank 0: the trainer logs from there only, and a call
    of ``log_metrics``, ``log_hyperparams`` or ``finalize`` on another rank does
    nothing (as Lightning's). A run that
    ends well is marked ``FINISHED``, one that raised ``FAILED``; a later
    ``validate`` or ``test`` with the same logger logs to the same run.

    The store is ``tracking_uri``, else the ``MLFLOW_TRACKING_URI`` environment
    variable, else ``save_dir`` as a file store. MLflow 3.13 and later take a file
    store only with ``MLFLOW_ALLOW_FILE_STORE=true`` in the environment; a database
    (``sqlite:///mlflow.db``, which needs ``sqlalchemy`` and ``alembic``) or a
    tracking server (``http://host:5000``) needs nothing more.

    Args:
        experiment_name: The experiment the run belongs to; made when missing.
        run_name: The run's name in MLflow; MLflow makes one up by default.
        tracking_uri: The tracking store's URI.
        tags: Tags set on the run when it is made.
        save_dir: The file store's directory, when no URI is given.
        prefix: Put before every metric name, joined with ``-`` (``prefix="fold1"``
            logs ``fold1-val_loss``).
        artifact_location: Where a new experiment keeps its artifacts (the store's
            default otherwise).
        run_id: Log to this existing run instead of making one: to go on with a
            run after resuming training from a checkpoint.

    Raises:
        MissingDependencyError: mlflow is not installed.
        ConfigurationError: An argument is not of its kind.
    """

    def __init__(
        self,
        experiment_name: str = "plait_logs",
        run_name: str | None = None,
        tracking_uri: str | None = None,
        *,
        tags: Mapping[str, object] | None = None,
        save_dir: str | os.PathLike[str] = "./mlruns",
        prefix: str = "",
        artifact_location: str | None = None,
        run_id: str | None = None,
    ) -> None:
        if not is_module_available("mlflow"):
            raise MissingDependencyError(
                feature="MLFlowLogger", install="plait-trainer[mlflow]", module="mlflow"
            )
        checked: dict[str, object] = {"experiment_name": experiment_name, "prefix": prefix}
        for argument, value in checked.items():
            if not isinstance(value, str) or (argument == "experiment_name" and not value):
                raise ConfigurationError(
                    f"{argument}={value!r} is not a{' non-empty' * (argument != 'prefix')} string",
                    value=value,
                    fix=f"pass e.g. {argument}='plait_logs'"
                    if argument == "experiment_name"
                    else "pass a string, or leave it out",
                )
        optional: dict[str, object] = {
            "run_name": run_name,
            "tracking_uri": tracking_uri,
            "artifact_location": artifact_location,
            "run_id": run_id,
        }
        for argument, value in optional.items():
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigurationError(
                    f"{argument}={value!r} is neither None nor a non-empty string",
                    value=value,
                    fix=f"pass {argument} as a string, or leave it out",
                )
        given_tags: object = tags  # checked as given
        if given_tags is not None and not isinstance(given_tags, Mapping):
            raise ConfigurationError(
                f"tags={tags!r} is a {type(given_tags).__name__}, not a mapping",
                value=tags,
                fix="pass tags as a dict of names to values, e.g. tags={'team': 'vision'}",
            )
        self.experiment_name = experiment_name
        self.run_name = run_name
        self.save_dir = os.fspath(save_dir)
        self.tracking_uri = (
            tracking_uri
            or os.environ.get("MLFLOW_TRACKING_URI")
            or "file:" + os.path.abspath(self.save_dir)
        )
        self.tags = {str(key): str(value) for key, value in (tags or {}).items()}
        self.prefix = prefix
        self.artifact_location = artifact_location
        self._run_id = run_id
        self._client: TrackingClient | None = None
        self._experiment_id: str | None = None
        self._artifact_uri = ""
        self._params: dict[str, str] = {}
        self._renamed: set[str] = set()

    @override
    def __getstate__(self) -> dict[str, object]:
        # A client (and the store's connections) does not travel: each process
        # connects on first use.
        return {**self.__dict__, "_client": None}

    @property
    def experiment(self) -> TrackingClient:
        """The MLflow client, connected to the store (the run made, on first use)."""
        return self._connect()

    @property
    def run_id(self) -> str:
        """The run's id (the run is made on first use)."""
        self._connect()
        assert self._run_id is not None
        return self._run_id

    @property
    def experiment_id(self) -> str:
        """The experiment's id (the run is made on first use)."""
        self._connect()
        assert self._experiment_id is not None
        return self._experiment_id

    @property
    def name(self) -> str:
        """The experiment's name."""
        return self.experiment_name

    @property
    def version(self) -> str:
        """The run's id, as Lightning's loggers name it."""
        return self.run_id

    @property
    def log_dir(self) -> str:
        """Where the run's artifacts go: a directory for a local store, else their URI."""
        self._connect()
        location = urllib.parse.urlparse(self._artifact_uri)
        if location.scheme == "file":
            return urllib.request.url2pathname(location.path)
        return self._artifact_uri

    def connect(self) -> None:
        """Reach the store and make (or find) the run; the trainer calls it as a run starts.

        Raises:
            ConfigurationError: A file store MLflow refuses, a deleted experiment, or a
                ``run_id`` the store does not hold.
        """
        self._connect()

    def _connect(self) -> TrackingClient:
        if self._client is not None:
            return self._client
        self._refuse_a_file_store_mlflow_refuses()
        # Imported where first needed (importing mlflow takes seconds), by name: the
        # Protocols above type what is used of it.
        client_type = cast(
            "Callable[..., TrackingClient]",
            importlib.import_module("mlflow.tracking").MlflowClient,
        )
        error_type = cast(
            "type[Exception]", importlib.import_module("mlflow.exceptions").MlflowException
        )
        client = client_type(tracking_uri=self.tracking_uri)
        if self._run_id is None:
            experiment = client.get_experiment_by_name(self.experiment_name)
            if experiment is None:
                experiment_id = client.create_experiment(
                    self.experiment_name, artifact_location=self.artifact_location
                )
            elif experiment.lifecycle_stage == "deleted":
                raise ConfigurationError(
                    f"experiment_name={self.experiment_name!r} is a deleted experiment "
                    f"of {self.tracking_uri}",
                    value=self.experiment_name,
                    fix=f"restore it (mlflow experiments restore --experiment-id "
                    f"{experiment.experiment_id}), or pass another experiment_name",
                )
            else:
                experiment_id = experiment.experiment_id
            run = client.create_run(experiment_id, run_name=self.run_name, tags=self.tags)
        else:
            try:
                run = client.get_run(self._run_id)
            except error_type as error:
                raise ConfigurationError(
                    f"run_id={self._run_id!r} is no run of {self.tracking_uri} ({error})",
                    value=self._run_id,
                    fix="pass the id of a run of this store (MLFlowLogger.run_id of the "
                    "run to go on with), or leave run_id out for a new run",
                ) from error
            self._params = dict(run.data.params)
        self._run_id = run.info.run_id
        self._experiment_id = run.info.experiment_id
        self._artifact_uri = run.info.artifact_uri or ""
        self._client = client
        return client

    def _refuse_a_file_store_mlflow_refuses(self) -> None:
        scheme = urllib.parse.urlparse(self.tracking_uri).scheme
        if len(scheme) > 1 and scheme != "file":  # one letter is a Windows drive
            return
        variables = importlib.import_module("mlflow.environment_variables")
        allowed: _Flag | None = getattr(variables, "MLFLOW_ALLOW_FILE_STORE", None)
        # None: an MLflow from before file stores were refused. MLflow reads the
        # variable its own way (true/false/1/0, any case).
        if allowed is None or allowed.get():
            return
        raise ConfigurationError(
            f"the tracking store {self.tracking_uri!r} is a file store, which this MLflow "
            "takes only with MLFLOW_ALLOW_FILE_STORE=true in the environment",
            value=self.tracking_uri,
            fix="pass tracking_uri='sqlite:///mlflow.db' (pip install sqlalchemy alembic) "
            "or a tracking server's 'http://host:5000' (or set MLFLOW_TRACKING_URI), or "
            "set MLFLOW_ALLOW_FILE_STORE=true to keep the file store",
        )

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, Number], step: int) -> None:
        """Log each metric at ``step`` (a name MLflow refuses has its characters replaced)."""
        client = self._connect()
        metric = cast(
            "Callable[[str, float, int, int], object]",
            importlib.import_module("mlflow.entities").Metric,
        )
        now = int(time.time() * 1000)
        entries = [
            metric(self._metric_name(name), float(value), now, step)
            for name, value in metrics.items()
        ]
        run_id = self.run_id
        for chunk in _chunks(entries, _MLFLOW_METRICS_PER_BATCH):
            client.log_batch(run_id, metrics=chunk)

    def _metric_name(self, name: str) -> str:
        named = f"{self.prefix}-{name}" if self.prefix else name
        valid = _MLFLOW_NAME.sub("_", named)
        if valid != named and named not in self._renamed:
            self._renamed.add(named)
            rank_zero_warn(
                f"MLflow takes only letters, digits and '_-./: ' in a metric name: "
                f"{named!r} is logged as {valid!r}"
            )
        return valid

    @rank_zero_only
    def log_hyperparams(self, params: Mapping[str, object]) -> None:
        """Log the settings as the run's parameters (nested mappings as ``outer/inner``).

        A value longer than MLflow takes is cut, with a warning. MLflow keeps a
        parameter's first value: logging it again with another value (to a run
        given by ``run_id``, say) raises.

        Raises:
            ConfigurationError: A parameter the run already has is given another value.
        """
        client = self._connect()
        param = cast(
            "Callable[[str, str], object]", importlib.import_module("mlflow.entities").Param
        )
        validation = importlib.import_module("mlflow.utils.validation")
        limit = int(getattr(validation, "MAX_PARAM_VAL_LENGTH", 250))
        new: dict[str, str] = {}
        for key, value in flatten_params(params):
            text = str(value)
            if len(text) > limit:
                rank_zero_warn(
                    f"the hyperparameter {key!r} is {len(text)} characters long, more than "
                    f"MLflow takes: its first {limit} are logged"
                )
                text = text[:limit]
            logged = self._params.get(key)
            if logged is None:
                new[key] = text
            elif logged != text:
                raise ConfigurationError(
                    f"the hyperparameter {key!r} is {text!r}, and run {self.run_id} "
                    f"already logged it as {logged!r} (MLflow keeps a parameter's first value)",
                    value=text,
                    fix="log to a new run (leave run_id out), or keep the hyperparameter's value",
                )
        entries = [param(key, text) for key, text in new.items()]
        run_id = self.run_id
        for chunk in _chunks(entries, _MLFLOW_PARAMS_PER_BATCH):
            client.log_batch(run_id, params=chunk)
        self._params.update(new)

    @rank_zero_only
    def finalize(self, status: str) -> None:
        """Mark the run ``FINISHED`` (``"success"``) or ``FAILED`` (``"failed"``).

        Raises:
            ConfigurationError: ``status`` is neither.
        """
        ended = _MLFLOW_STATUS.get(status)
        if ended is None:
            raise ConfigurationError(
                f"status={status!r} is not a run's end",
                value=status,
                fix=f"pass one of {sorted(_MLFLOW_STATUS)}",
            )
        if self._client is not None and self._run_id is not None:
            self._client.set_terminated(self._run_id, ended)

    @override
    def __repr__(self) -> str:
        return (
            f"MLFlowLogger(experiment_name={self.experiment_name!r}, "
            f"tracking_uri={self.tracking_uri!r})"
        )


def _chunks(entries: list[_T], size: int) -> Iterator[list[_T]]:
    for start in range(0, len(entries), size):
        yield entries[start : start + size]
