"""MLFlowLogger against a real MLflow tracking store in a temporary directory."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset
from typing_extensions import override

from plait.core import ConfigurationError, MissingDependencyError
from plait.trainer import MLFlowLogger, Module, Trainer
from plait.trainer.loggers import mlflow_logger

pytest.importorskip("mlflow")


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A file store: MLflow takes one only with MLFLOW_ALLOW_FILE_STORE set."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return (tmp_path / "mlruns").as_uri()


class Fitted(Module):
    """A model that logs a step value, an epoch value and a validation value."""

    def __init__(self, width: int = 4, optimizer: dict[str, object] | None = None) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Linear(2, width)

    @override
    def training_step(self, batch: object, batch_idx: int) -> torch.Tensor:
        assert isinstance(batch, list)
        (x,) = batch
        loss: torch.Tensor = self.net(x).pow(2).mean()
        self.log("train_loss", loss, on_epoch=True)
        return loss

    @override
    def validation_step(self, batch: object, batch_idx: int) -> None:
        assert isinstance(batch, list)
        (x,) = batch
        self.log("val_loss", self.net(x).pow(2).mean())

    @override
    def test_step(self, batch: object, batch_idx: int) -> None:
        assert isinstance(batch, list)
        (x,) = batch
        self.log("test@loss", self.net(x).pow(2).mean())

    @override
    def configure_optimizers(self) -> object:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _loader() -> DataLoader[tuple[torch.Tensor, ...]]:
    return DataLoader(TensorDataset(torch.randn(16, 2)), batch_size=4)


def _trainer(tmp_path: Path, logger: MLFlowLogger, **settings: object) -> Trainer:
    options: dict[str, object] = {
        "accelerator": "cpu",
        "default_root_dir": tmp_path,
        "enable_progress_bar": False,
        "enable_checkpointing": False,
        "logger": logger,
        "max_epochs": 2,
        "log_every_n_steps": 2,
        **settings,
    }
    return Trainer(**options)  # type: ignore[arg-type]


def test_a_fit_then_a_test_log_to_one_run_that_ends_finished(tmp_path: Path, store: str) -> None:
    logger = MLFlowLogger(
        "regression", run_name="first", tracking_uri=store, tags={"team": "vision"}
    )
    trainer = _trainer(tmp_path, logger)
    model = Fitted(optimizer={"name": "sgd", "lr": 0.1})

    trainer.fit(model, _loader(), _loader())
    with pytest.warns(UserWarning, match="'test@loss' is logged as 'test_loss'"):
        trainer.test(model, _loader())

    client = logger.experiment
    run = client.get_run(logger.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["team"] == "vision"
    assert run.data.tags["mlflow.runName"] == "first"
    # Nested settings are flattened with "/".
    assert dict(run.data.params) == {
        "width": "4",
        "optimizer/name": "sgd",
        "optimizer/lr": "0.1",
    }
    steps = [m.step for m in client.get_metric_history(logger.run_id, "train_loss_step")]
    assert steps == [2, 4, 6, 8]
    assert [m.step for m in client.get_metric_history(logger.run_id, "val_loss")] == [4, 8]
    assert len(client.get_metric_history(logger.run_id, "train_loss_epoch")) == 2
    assert len(client.get_metric_history(logger.run_id, "test_loss")) == 1
    # The run's artifacts are a directory of the file store, which the trainer reports.
    assert trainer.log_dir == logger.log_dir
    assert Path(logger.log_dir).is_relative_to(tmp_path / "mlruns")
    assert logger.name == "regression"
    assert logger.version == logger.run_id
    experiment = client.get_experiment_by_name("regression")
    assert experiment is not None
    assert experiment.experiment_id == logger.experiment_id


def test_a_run_given_by_id_goes_on_after_resuming(tmp_path: Path, store: str) -> None:
    first = MLFlowLogger(tracking_uri=store, prefix="fold1")
    _trainer(tmp_path, first, max_epochs=1, enable_checkpointing=True).fit(Fitted(), _loader())
    checkpoint = tmp_path / "checkpoints" / "last.ckpt"
    assert checkpoint.exists()

    resumed = MLFlowLogger(tracking_uri=store, prefix="fold1", run_id=first.run_id)
    _trainer(tmp_path, resumed, max_epochs=2).fit(Fitted(), _loader(), ckpt_path=str(checkpoint))

    assert resumed.run_id == first.run_id
    history = first.experiment.get_metric_history(first.run_id, "fold1-train_loss_step")
    assert [m.step for m in history] == [2, 4, 6, 8]
    # A checkpoint kept with the run, as Lightning's log_model would.
    resumed.experiment.log_artifact(resumed.run_id, str(checkpoint), "checkpoints")
    assert (Path(resumed.log_dir) / "checkpoints" / "last.ckpt").is_file()
    # The same settings again are nothing new; another value is refused, naming both.
    with pytest.raises(ConfigurationError, match=r"'width' is '8', and run \w+ already logged"):
        MLFlowLogger(tracking_uri=store, run_id=first.run_id).log_hyperparams({"width": 8})


def test_a_failed_fit_ends_its_run_failed(tmp_path: Path, store: str) -> None:
    class Broken(Fitted):
        @override
        def training_step(self, batch: object, batch_idx: int) -> torch.Tensor:
            if batch_idx == 1:
                raise RuntimeError("broken at batch 1")
            return super().training_step(batch, batch_idx)

    logger = MLFlowLogger(tracking_uri=store)
    with pytest.raises(RuntimeError, match="broken at batch 1"):
        _trainer(tmp_path, logger).fit(Broken(), _loader())

    assert logger.experiment.get_run(logger.run_id).info.status == "FAILED"


def test_long_values_are_cut_with_a_warning(store: str) -> None:
    logger = MLFlowLogger(tracking_uri=store)
    limit = int(importlib.import_module("mlflow.utils.validation").MAX_PARAM_VAL_LENGTH)

    with pytest.warns(UserWarning, match=f"'notes' is {limit + 5} characters long"):
        logger.log_hyperparams({"notes": "x" * (limit + 5)})

    assert logger.experiment.get_run(logger.run_id).data.params["notes"] == "x" * limit


def test_a_file_store_mlflow_refuses_is_named_with_the_fixes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    variables = importlib.import_module("mlflow.environment_variables")
    if getattr(variables, "MLFLOW_ALLOW_FILE_STORE", None) is None:
        pytest.skip("this MLflow takes file stores")
    logger = MLFlowLogger(save_dir=tmp_path / "runs")
    assert logger.tracking_uri == "file:" + str(tmp_path / "runs")
    trainer = _trainer(tmp_path, logger)

    # Said as the run starts, before a step is taken or a file written.
    with pytest.raises(ConfigurationError, match="MLFLOW_ALLOW_FILE_STORE=true") as caught:
        trainer.fit(Fitted(), _loader())

    assert "sqlite:///mlflow.db" in str(caught.value)
    assert trainer.global_step == 0
    assert not (tmp_path / "runs").exists()


def test_the_environment_names_the_store(store: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)

    assert MLFlowLogger().tracking_uri == store
    assert MLFlowLogger(tracking_uri="http://tracking:5000").tracking_uri == "http://tracking:5000"


def test_a_run_id_of_no_run_is_refused(store: str) -> None:
    logger = MLFlowLogger(tracking_uri=store, run_id="0123456789abcdef0123456789abcdef")

    with pytest.raises(ConfigurationError, match=r"run_id='0123456789abcdef.*' is no run of"):
        logger.log_metrics({"loss": 1.0}, step=1)


def test_a_deleted_experiment_is_refused_with_how_to_restore_it(store: str) -> None:
    first = MLFlowLogger("gone", tracking_uri=store)
    first.log_metrics({"loss": 1.0}, step=1)
    importlib.import_module("mlflow.tracking").MlflowClient(store).delete_experiment(
        first.experiment_id
    )

    with pytest.raises(ConfigurationError, match="'gone' is a deleted experiment") as caught:
        MLFlowLogger("gone", tracking_uri=store).log_metrics({"loss": 1.0}, step=1)

    assert f"mlflow experiments restore --experiment-id {first.experiment_id}" in str(caught.value)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"experiment_name": ""}, "experiment_name='' is not a non-empty string"),
        ({"prefix": 3}, "prefix=3 is not a string"),
        ({"run_id": ""}, "run_id='' is neither None nor a non-empty string"),
        ({"tracking_uri": 5}, "tracking_uri=5 is neither None nor a non-empty string"),
        ({"tags": ["team"]}, r"tags=\['team'\] is a list, not a mapping"),
    ],
)
def test_bad_arguments_are_refused_when_made(arguments: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        MLFlowLogger(**arguments)  # type: ignore[arg-type]


def test_an_unknown_status_is_refused(store: str) -> None:
    with pytest.raises(ConfigurationError, match=r"(?s)status='done'.*\['failed', 'finished'"):
        MLFlowLogger(tracking_uri=store).finalize("done")


def test_without_mlflow_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mlflow_logger, "is_module_available", lambda name: name != "mlflow")

    with pytest.raises(MissingDependencyError, match=r"plait-trainer\[mlflow\]"):
        MLFlowLogger()


def test_the_logger_travels_to_other_processes_without_its_connection(store: str) -> None:
    import pickle  # noqa: PLC0415 (only here)

    logger = MLFlowLogger(tracking_uri=store)
    logger.log_metrics({"loss": 1.0}, step=1)

    copy = pickle.loads(pickle.dumps(logger))

    assert copy.run_id == logger.run_id
    copy.log_metrics({"loss": 0.5}, step=2)
    history = logger.experiment.get_metric_history(logger.run_id, "loss")
    assert [m.value for m in history] == [1.0, 0.5]
