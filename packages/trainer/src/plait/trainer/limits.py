"""How far each loop runs: epochs, steps, batches per stage and the validation cadence."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Final, Literal, TypeAlias

import attrs

from plait.core import ConfigurationError, rank_zero_info
from plait.trainer.checks import check_count
from plait.trainer.data import check_limit, limit_batches

if TYPE_CHECKING:
    from plait.trainer.progress import Progress

__all__ = ["Limits", "Stage"]

Stage: TypeAlias = Literal["fit", "validate", "test", "predict"]
"""What a run does."""

_DEFAULT_MAX_EPOCHS: Final = 1000

_LIMIT_NAMES: Final[dict[Stage, str]] = {
    "fit": "limit_train_batches",
    "validate": "limit_val_batches",
    "test": "limit_test_batches",
    "predict": "limit_predict_batches",
}


@attrs.frozen
class Limits:
    """Where the loops stop, checked once when the trainer is made; the loops only read it.

    Attributes:
        max_epochs: Epochs to train (``None``: no limit, ``max_steps`` stops).
        max_steps: Optimizer steps to take (-1: no limit).
        batches: Per stage, a count of batches or a fraction of each loader.
        val_check_interval: Validate every this many training batches (an int) or
            this fraction of an epoch (a float; 1.0 is the epoch's end).
        check_val_every_n_epoch: Validate in every n-th epoch only.
        fast_dev_run: Batches of each stage in a debugging run (0: not one).
        in_order: Train on the same batches every epoch (``overfit_batches``).
        sanity_batches: Validation batches run before training (-1: all of them).
        min_epochs: Epochs to train before a stop that was asked for is taken.
        min_steps: Optimizer steps to take before a stop that was asked for is taken.
    """

    max_epochs: int | None
    max_steps: int
    batches: dict[Stage, int | float]
    val_check_interval: int | float
    check_val_every_n_epoch: int
    fast_dev_run: int = 0
    in_order: bool = False
    sanity_batches: int = 0
    min_epochs: int = 0
    min_steps: int = 0

    @classmethod
    def resolve(
        cls,
        *,
        max_epochs: int | None,
        max_steps: int,
        limit_train_batches: int | float,
        min_epochs: int | None = None,
        min_steps: int | None = None,
        limit_val_batches: int | float,
        limit_test_batches: int | float,
        limit_predict_batches: int | float,
        val_check_interval: int | float,
        check_val_every_n_epoch: int,
        fast_dev_run: bool | int = False,
        overfit_batches: int | float = 0.0,
        num_sanity_val_steps: int = 0,
    ) -> Limits:
        """The limits the trainer's arguments ask for (1000 epochs when neither limit is given).

        ``fast_dev_run=n`` (``True`` is 1) runs n batches of each stage in one epoch
        and no sanity check, whatever the other limits say. ``overfit_batches``
        trains and validates on the same first batches (a count or a fraction of
        the training loader), in order, every epoch.

        Raises:
            ConfigurationError: A value is out of range; the message names it.
        """
        debug = _check_fast_dev_run(fast_dev_run)
        overfit = check_limit("overfit_batches", overfit_batches)
        check_count(
            "num_sanity_val_steps",
            num_sanity_val_steps,
            minimum=-1,
            example="num_sanity_val_steps=2 (or -1: every validation batch)",
        )
        if max_epochs is not None:
            check_count("max_epochs", max_epochs, minimum=1, example="max_epochs=10")
        check_count("max_steps", max_steps, minimum=-1, example="max_steps=1000 (or -1: no limit)")
        least_epochs = 0
        if min_epochs is not None:
            least_epochs = check_count("min_epochs", min_epochs, minimum=0, example="min_epochs=5")
            if max_epochs is not None and least_epochs > max_epochs:
                raise ConfigurationError(
                    f"min_epochs={min_epochs} is above max_epochs={max_epochs}: training "
                    "would have to stop before it may",
                    value=min_epochs,
                    fix=f"pass min_epochs={max_epochs} or less, or a larger max_epochs",
                )
        least_steps = 0
        if min_steps is not None:
            least_steps = check_count("min_steps", min_steps, minimum=0, example="min_steps=100")
            if max_steps != -1 and least_steps > max_steps:
                raise ConfigurationError(
                    f"min_steps={min_steps} is above max_steps={max_steps}: training "
                    "would have to stop before it may",
                    value=min_steps,
                    fix=f"pass min_steps={max_steps} or less, or a larger max_steps",
                )
        given: dict[Stage, int | float] = {
            "fit": limit_train_batches,
            "validate": limit_val_batches,
            "test": limit_test_batches,
            "predict": limit_predict_batches,
        }
        batches: dict[Stage, int | float] = {
            stage: check_limit(_LIMIT_NAMES[stage], value) for stage, value in given.items()
        }
        interval = check_limit("val_check_interval", val_check_interval)
        if interval == 0:
            raise ConfigurationError(
                "val_check_interval=0 would validate without training in between",
                value=val_check_interval,
                fix="pass limit_val_batches=0 to turn validation off",
            )
        check_count(
            "check_val_every_n_epoch",
            check_val_every_n_epoch,
            minimum=1,
            example="check_val_every_n_epoch=1",
        )
        if debug:
            return cls(
                max_epochs=1,
                max_steps=debug,
                batches=dict.fromkeys(_LIMIT_NAMES, debug),
                val_check_interval=1.0,
                check_val_every_n_epoch=1,
                fast_dev_run=debug,
            )
        if overfit != 0:
            batches["fit"] = batches["validate"] = overfit
        return cls(
            max_epochs=(
                max_epochs if max_epochs is not None or max_steps != -1 else _DEFAULT_MAX_EPOCHS
            ),
            max_steps=max_steps,
            batches=batches,
            val_check_interval=interval,
            check_val_every_n_epoch=check_val_every_n_epoch,
            in_order=overfit != 0,
            sanity_batches=num_sanity_val_steps,
            min_epochs=least_epochs,
            min_steps=least_steps,
        )

    def batches_of(self, stage: Stage, available: int | None) -> int | None:
        """How many of a loader's ``available`` batches ``stage`` runs (``None``: unknown)."""
        return limit_batches(available, self.batches[stage], _LIMIT_NAMES[stage])

    def steps_reached(self, progress: Progress) -> bool:
        """Whether ``max_steps`` optimizer steps have been taken."""
        return self.max_steps != -1 and progress.global_step >= self.max_steps

    def done(self, progress: Progress) -> bool:
        """Whether training is over: a limit reached, or asked to stop once it may.

        A stop asked for before ``min_epochs`` and ``min_steps`` are reached waits
        for them (``should_stop`` stays set, and is taken then).
        """
        if self.steps_reached(progress):
            return True
        if self.max_epochs is not None and progress.current_epoch >= self.max_epochs:
            return True
        if not progress.should_stop:
            return False
        if self.may_stop(progress):
            return True
        rank_zero_info(
            f"a stop was asked for at epoch {progress.current_epoch}, step "
            f"{progress.global_step}; training goes on to min_epochs={self.min_epochs} "
            f"and min_steps={self.min_steps}"
        )
        return False

    def may_stop(self, progress: Progress) -> bool:
        """Whether ``min_epochs`` and ``min_steps`` are reached."""
        return progress.current_epoch >= self.min_epochs and progress.global_step >= self.min_steps

    @property
    def validates_at_epoch_end(self) -> bool:
        """Whether a fit's validation runs at each epoch's end only (not within one)."""
        interval = self.val_check_interval
        return isinstance(interval, float) and interval == 1.0

    def validation_every(self, total: int | None) -> int | None:
        """Validate every this many batches of an epoch of ``total`` (``None``: at its end)."""
        interval = self.val_check_interval
        if isinstance(interval, int):
            return interval
        if self.validates_at_epoch_end or total is None:
            return None
        return max(1, math.floor(total * interval))

    def validation_due(self, progress: Progress) -> bool:
        """Whether this epoch validates at all."""
        return (progress.current_epoch + 1) % self.check_val_every_n_epoch == 0


def _check_fast_dev_run(value: object) -> int:
    if value is True:
        return 1
    if value is False:
        return 0
    if isinstance(value, int) and value >= 0:
        return value
    raise ConfigurationError(
        f"fast_dev_run={value!r} is neither a bool nor a count of batches",
        value=value,
        fix="pass fast_dev_run=True (one batch of each stage) or fast_dev_run=5",
    )
