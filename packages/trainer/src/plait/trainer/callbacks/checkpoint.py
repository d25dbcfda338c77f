"""`ModelCheckpoint`: save the run every epoch (or every n steps), keep the best k."""

from __future__ import annotations

import math
import os
import re
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Final, Literal

from typing_extensions import override

from plait.core import (
    ConfigurationError,
    SupportsAsyncCheckpoint,
    SupportsCopyCheckpoint,
    SupportsPartialCleanup,
    is_collective,
    rank_zero_info,
    rank_zero_warn,
)
from plait.core.errors import suggest
from plait.trainer.callbacks.base import Callback
from plait.trainer.checks import check_count

if TYPE_CHECKING:
    from plait.core.typing import StateDict
    from plait.trainer.metrics import Number
    from plait.trainer.module import Module
    from plait.trainer.trainer import Trainer
    from plait.trainer.values import StepOutput

__all__ = ["LAST_NAME", "ModelCheckpoint"]

LAST_NAME: Final = "last"
"""The file name (without suffix) of the checkpoint `ModelCheckpoint` keeps as the latest."""

_FIELD = re.compile(r"{([^{}:!]+)[^{}]*}")


class ModelCheckpoint(Callback):
    """Save checkpoints during `Trainer.fit`: the best ``save_top_k`` and the last.

    By default it saves at the end of every training epoch (after that epoch's
    validation) into ``<default_root_dir>/checkpoints``, keeps the newest
    checkpoint (or, with ``monitor``, the ``save_top_k`` best by that metric) and,
    with ``save_last``, a copy named ``last.ckpt`` that ``fit(ckpt_path="last")``
    resumes from. Decisions are taken on global rank 0 and shared, so every rank
    saves together even when the monitored value differs between ranks.

    Each save is written once: where the checkpoint IO can (`SupportsCopyCheckpoint`),
    ``last.ckpt`` is made from the epoch's file without serialising the state again.
    The state the callback saves already counts the checkpoint it is saved in, so a
    run resumed from any of them goes on keeping and removing the right files. When
    a run starts, rank 0 removes what saves killed midway left in ``dirpath``.

    Args:
        dirpath: The directory (or fsspec URL) to save into.
        filename: A `str.format` template with ``{epoch}``, ``{step}`` and logged
            metric names, e.g. ``"{epoch}-{val_loss:.3f}"``; each field is written
            as ``name=value``. By default ``epoch={epoch}-step={step}``, and the
            monitored metric after them.
        monitor: The logged metric that ranks checkpoints (or ``"epoch"`` or
            ``"step"``, the run's position); ``None`` keeps the newest.
        mode: ``"min"`` or ``"max"``: which values of ``monitor`` are better.
        save_top_k: How many of the best to keep; ``-1`` keeps all, ``0`` none
            (only ``last.ckpt``, if ``save_last``).
        save_last: Also keep ``last.ckpt``, the latest state, for resuming.
        every_n_epochs: Save at the end of every n-th epoch.
        every_n_train_steps: Save every n optimizer steps instead of per epoch.
        train_time_interval: Save once this much time has passed since the last
            save (or the start), checked after each training batch (rank 0's clock
            decides, for every rank).
        save_on_train_epoch_end: Save at each training epoch's end (``True``), or
            after each validation run of the fit instead (``False``: a fit that
            does not validate then saves nothing). By default
            at each epoch's end, and also after a validation in the middle of an
            epoch (``val_check_interval`` below an epoch), as Lightning does.
        save_weights_only: Save the module's weights only (with its hyperparameters
            and where the run stood): smaller files for validate, test, predict or a
            fresh fit, that ``fit(ckpt_path=...)`` refuses to resume from.
        auto_insert_metric_name: Write each field of ``filename`` as ``name=value``;
            ``False`` formats ``filename`` as it is (``"epoch_{epoch:03d}"`` gives
            ``epoch_000.ckpt``).
        verbose: Say on rank 0 what each save keeps and removes, and why.

    Raises:
        ConfigurationError: An argument is out of range, or ``save_top_k`` above 1
            without ``monitor`` (there would be no way to rank them).
    """

    FILE_EXTENSION: Final = ".ckpt"

    def __init__(
        self,
        dirpath: str | os.PathLike[str] | None = None,
        filename: str | None = None,
        *,
        monitor: str | None = None,
        mode: Literal["min", "max"] = "min",
        save_top_k: int = 1,
        save_last: bool = True,
        every_n_epochs: int = 1,
        every_n_train_steps: int | None = None,
        train_time_interval: timedelta | None = None,
        save_on_train_epoch_end: bool | None = None,
        save_weights_only: bool = False,
        auto_insert_metric_name: bool = True,
        verbose: bool = False,
    ) -> None:
        if mode not in ("min", "max"):
            raise ConfigurationError.invalid_choice("mode", mode, ("min", "max"))
        check_count("save_top_k", save_top_k, minimum=-1, example="save_top_k=1 (or -1: all)")
        if monitor is None and save_top_k not in (-1, 0, 1):
            raise ConfigurationError(
                f"save_top_k={save_top_k} needs a metric to rank checkpoints by, and "
                "monitor is None",
                value=save_top_k,
                fix="pass monitor='val_loss' (a metric you log), or save_top_k=1 "
                "(the newest) or -1 (all)",
            )
        check_count("every_n_epochs", every_n_epochs, minimum=1, example="every_n_epochs=1")
        if every_n_train_steps is not None:
            check_count(
                "every_n_train_steps",
                every_n_train_steps,
                minimum=1,
                example="every_n_train_steps=100",
            )
        given: object = train_time_interval  # as called, whatever the annotation says
        if given is not None and (not isinstance(given, timedelta) or given <= timedelta(0)):
            raise ConfigurationError(
                f"train_time_interval={train_time_interval!r} must be a positive timedelta",
                value=train_time_interval,
                fix="pass e.g. train_time_interval=datetime.timedelta(minutes=30)",
            )
        chosen = [
            name
            for name, value in (
                ("every_n_train_steps", every_n_train_steps),
                ("train_time_interval", train_time_interval),
            )
            if value is not None
        ]
        if len(chosen) > 1:
            raise ConfigurationError(
                f"ModelCheckpoint was given both {chosen[0]} and {chosen[1]}: each sets "
                "when to save, and only one can",
                fix="keep one of them (every_n_epochs applies when neither is given)",
            )
        for name, flag in (
            ("save_weights_only", save_weights_only),
            ("auto_insert_metric_name", auto_insert_metric_name),
            ("verbose", verbose),
        ):
            if not isinstance(flag, bool):
                raise ConfigurationError(
                    f"{name}={flag!r} must be True or False", value=flag, fix=f"pass {name}=True"
                )
        if save_on_train_epoch_end not in (None, True, False):
            raise ConfigurationError(
                f"save_on_train_epoch_end={save_on_train_epoch_end!r} must be None, True or False",
                value=save_on_train_epoch_end,
                fix="pass save_on_train_epoch_end=False to save after each validation",
            )
        self.dirpath = os.fspath(dirpath) if dirpath is not None else None
        self.filename = filename
        self.monitor = monitor
        self.mode = mode
        self.save_top_k = save_top_k
        self.save_last = save_last
        self.every_n_epochs = every_n_epochs
        self.every_n_train_steps = every_n_train_steps
        self.train_time_interval = train_time_interval
        self.save_on_train_epoch_end = save_on_train_epoch_end
        self.save_weights_only = save_weights_only
        self.auto_insert_metric_name = auto_insert_metric_name
        self.verbose = verbose
        self._last_time: float | None = None
        self.best_k_models: dict[str, float] = {}
        self.best_model_path = ""
        self.best_model_score: float | None = None
        self.last_model_path = ""
        self._last_saved_at = (-1, -1)  # (epoch, global step) of the last save

    @property
    @override
    def state_key(self) -> str:
        return f"ModelCheckpoint{{monitor={self.monitor!r}, mode={self.mode!r}}}"

    @override
    def state_dict(self) -> StateDict:
        return {
            "dirpath": self.dirpath,
            "best_k_models": dict(self.best_k_models),
            "best_model_path": self.best_model_path,
            "best_model_score": self.best_model_score,
            "last_model_path": self.last_model_path,
        }

    @override
    def load_state_dict(self, state_dict: StateDict) -> None:
        if self.dirpath is None:
            self.dirpath = state_dict.get("dirpath")
        elif state_dict.get("dirpath") != self.dirpath:
            return  # another directory: its files are not this callback's to manage
        self.best_k_models = dict(state_dict["best_k_models"])
        self.best_model_path = state_dict["best_model_path"]
        self.best_model_score = state_dict["best_model_score"]
        self.last_model_path = state_dict["last_model_path"]

    @override
    def setup(self, trainer: Trainer, module: Module, stage: str) -> None:
        if self.dirpath is None:
            self.dirpath = os.path.join(trainer.default_root_dir, "checkpoints")
        checkpoint_io = trainer.strategy.checkpoint_io
        if (
            stage == "fit"
            and trainer.is_global_zero
            and isinstance(checkpoint_io, SupportsPartialCleanup)
        ):
            for path in checkpoint_io.remove_partial(self.dirpath):
                rank_zero_warn(f"removed {path}, left by a save that was interrupted")

    def last_path(self) -> str:
        """Where ``last.ckpt`` is (or will be) written."""
        assert self.dirpath is not None  # set in setup
        return os.path.join(self.dirpath, LAST_NAME + self.FILE_EXTENSION)

    @override
    def on_train_start(self, trainer: Trainer, module: Module) -> None:
        self._last_time = time.monotonic()

    @override
    def on_train_batch_end(
        self, trainer: Trainer, module: Module, outputs: StepOutput, batch: object, batch_idx: int
    ) -> None:
        if trainer.fast_dev_run:  # a debugging run saves nothing
            return
        every = self.every_n_train_steps
        step = trainer.global_step
        if every is not None and step > 0 and step % every == 0 and step != self._last_saved_at[1]:
            self._save(trainer)
        interval = self.train_time_interval
        if interval is not None and step != self._last_saved_at[1]:
            now = time.monotonic()
            started = self._last_time if self._last_time is not None else now
            due = now - started >= interval.total_seconds()
            # Clocks differ between ranks: rank 0's decides, so every rank saves together.
            if trainer.strategy.broadcast(due, src=0):
                self._save(trainer)

    @override
    def on_train_epoch_end(self, trainer: Trainer, module: Module) -> None:
        if trainer.fast_dev_run:  # a debugging run saves nothing
            return
        if (
            self.every_n_train_steps is None
            and self.train_time_interval is None
            and self.save_on_train_epoch_end is not False
            and (trainer.current_epoch + 1) % self.every_n_epochs == 0
            and self._where(trainer) != self._last_saved_at
        ):
            self._save(trainer)

    @override
    def on_validation_end(self, trainer: Trainer, module: Module) -> None:
        if trainer.fast_dev_run or trainer.sanity_checking or trainer.state_stage != "fit":
            return
        if self.every_n_train_steps is not None or self.train_time_interval is not None:
            return
        if self.save_on_train_epoch_end is True:
            return
        if self.save_on_train_epoch_end is None and trainer.limits.validates_at_epoch_end:
            return  # validation at the epoch's end: the epoch's end saves
        epoch_due = (trainer.current_epoch + 1) % self.every_n_epochs == 0
        if epoch_due and self._where(trainer) != self._last_saved_at:
            self._save(trainer)

    @staticmethod
    def _where(trainer: Trainer) -> tuple[int, int]:
        # A validation at an epoch's last batch and the epoch's end are one save.
        return trainer.current_epoch, trainer.global_step

    def _score(self, trainer: Trainer) -> float | None:
        if self.monitor is None:
            return None
        # The run's position may be monitored too (monitor="step" keeps the newest
        # k), as in Lightning; a metric logged under the same name wins.
        metrics: dict[str, Number] = {
            "epoch": trainer.current_epoch,
            "step": trainer.global_step,
            **trainer.callback_metrics,
        }
        if self.monitor not in metrics:
            raise ConfigurationError(
                f"ModelCheckpoint(monitor={self.monitor!r}) found no such metric; "
                f"logged: {', '.join(sorted(metrics)) or 'nothing'}",
                value=self.monitor,
                suggestion=suggest(self.monitor, metrics),
                fix="log it with self.log(name, value) in training_step or validation_step, "
                "or monitor one of the logged names",
            )
        return float(metrics[self.monitor])

    def _is_better(self, score: float, than: float) -> bool:
        return score < than if self.mode == "min" else score > than

    def _format(self, trainer: Trainer, score: float | None) -> str:
        values: dict[str, Number] = {
            **trainer.callback_metrics,
            "epoch": trainer.current_epoch,
            "step": trainer.global_step,
        }
        if self.filename is None:
            name = f"epoch={trainer.current_epoch}-step={trainer.global_step}"
            if self.monitor not in (None, "epoch", "step") and score is not None:
                name += f"-{self.monitor}={score:.4g}"  # epoch and step are named already
        else:
            template = self.filename
            if self.auto_insert_metric_name:
                template = _FIELD.sub(lambda match: f"{match.group(1)}={match.group(0)}", template)
            try:
                name = template.format(**values)
            except KeyError as error:
                raise ConfigurationError(
                    f"ModelCheckpoint(filename={self.filename!r}) names {error.args[0]!r}, "
                    f"which is neither epoch, step nor a logged metric",
                    value=self.filename,
                    fix="use {epoch}, {step} or the name of a metric you log",
                ) from None
        assert self.dirpath is not None
        return os.path.join(self.dirpath, name.replace(os.sep, "_") + self.FILE_EXTENSION)

    def _save(self, trainer: Trainer) -> None:
        self._last_saved_at = self._where(trainer)
        self._last_time = time.monotonic()
        # Rank 0 decides: the monitored value may differ between ranks that do not
        # sync it, and every rank must take part in the same saves.
        plan = self._plan(trainer) if trainer.is_global_zero else None
        keep, remove, score = trainer.strategy.broadcast(plan, src=0) or (None, [], None)
        # The bookkeeping comes first: the state saved in these checkpoints must
        # already count them, or a run resumed from one would remove files that
        # are gone and keep files it no longer knows.
        self._apply(keep, remove, score)
        if self.verbose and trainer.is_global_zero:
            self._say(trainer, keep, remove, score)
        if self.save_last:
            self.last_model_path = self.last_path()
        checkpoint_io = trainer.strategy.checkpoint_io
        weights_only = self.save_weights_only
        if keep is not None:
            trainer.save_checkpoint(keep, weights_only=weights_only)
        if self.save_last:
            if (
                keep is not None
                and isinstance(checkpoint_io, SupportsCopyCheckpoint)
                and not is_collective(checkpoint_io)
            ):
                if trainer.is_global_zero:
                    checkpoint_io.copy_checkpoint(keep, self.last_path())
            else:
                trainer.save_checkpoint(self.last_path(), weights_only=weights_only)
        # Every rank: a collective checkpoint IO removes on every rank, any other on
        # rank 0 alone (the strategy knows which).
        for path in remove:
            self._remove(trainer, path)

    def _say(
        self, trainer: Trainer, keep: str | None, remove: list[str], score: float | None
    ) -> None:
        where = f"epoch {trainer.current_epoch}, global step {trainer.global_step}"
        if self.monitor is None:
            said = f"saving {keep}" if keep else "nothing to keep"
        elif keep is None:
            shown = "none" if score is None else f"{score:.5g}"
            said = f"{self.monitor!r} is {shown}, not among the best {self.save_top_k}"
        else:
            best = "none" if self.best_model_score is None else f"{self.best_model_score:.5g}"
            said = f"{self.monitor!r} reached {score:.5g} (best {best}), saving {keep}"
        gone = f"; removing {', '.join(remove)}" if remove else ""
        rank_zero_info(f"ModelCheckpoint, {where}: {said}{gone}")

    @staticmethod
    def _remove(trainer: Trainer, path: str) -> None:
        fs_path = path if "://" in path else os.path.abspath(path)
        checkpoint_io = trainer.strategy.checkpoint_io
        if isinstance(checkpoint_io, SupportsAsyncCheckpoint):
            # A save still in the background is not on disk yet: it is not gone.
            # (Removing waits for it anyway.)
            checkpoint_io.wait()
        if "://" not in fs_path and not os.path.exists(fs_path):
            # Removed by hand, or by a run that went on from an earlier checkpoint:
            # nothing is lost, so training goes on.
            rank_zero_warn(f"{path} was to be removed, and is already gone")
            return
        trainer.strategy.remove_checkpoint(path)

    def _plan(self, trainer: Trainer) -> tuple[str | None, list[str], float | None]:
        score = self._score(trainer)
        if self.save_top_k == 0:
            return None, [], score
        path = self._format(trainer, score)
        if score is None:
            stale = [p for p in self.best_k_models if p != path] if self.save_top_k == 1 else []
            return path, stale, score
        if math.isnan(score):
            return None, [], score  # a nan never ranks among the best
        if self.save_top_k == -1 or len(self.best_k_models) < self.save_top_k:
            return path, [], score
        worst = self._worst()
        if not self._is_better(score, self.best_k_models[worst]):
            return None, [], score
        return path, [worst] if worst != path else [], score

    def _worst(self) -> str:
        pick = max if self.mode == "min" else min
        return pick(self.best_k_models, key=self.best_k_models.__getitem__)

    def _apply(self, keep: str | None, remove: list[str], score: float | None) -> None:
        for path in remove:
            self.best_k_models.pop(path, None)
        if keep is None:
            return
        self.best_k_models[keep] = score if score is not None else math.nan
        if score is None:
            self.best_model_path = keep
            return
        best = (min if self.mode == "min" else max)(
            self.best_k_models, key=self.best_k_models.__getitem__
        )
        self.best_model_path = best
        self.best_model_score = self.best_k_models[best]

    @override
    def __repr__(self) -> str:
        return (
            f"ModelCheckpoint(dirpath={self.dirpath!r}, monitor={self.monitor!r}, "
            f"mode={self.mode!r}, save_top_k={self.save_top_k}, save_last={self.save_last})"
        )
