"""The Trainer's callbacks as given, checked, and completed with the ones it adds."""

from __future__ import annotations

from collections.abc import Sequence

from plait.core import ConfigurationError
from plait.trainer.callbacks.base import Callback
from plait.trainer.callbacks.checkpoint import ModelCheckpoint
from plait.trainer.callbacks.model_summary import ModelSummary
from plait.trainer.callbacks.progress import RichProgressBar

__all__ = ["resolve_callbacks"]


def resolve_callbacks(
    callbacks: Sequence[Callback] | Callback | None,
    progress: bool,
    checkpointing: bool,
    *,
    debug: bool,
    summary: bool = False,
) -> list[Callback]:
    """The Trainer's callbacks: checked, with a progress bar and a `ModelCheckpoint` added.

    A progress bar is added where ``progress`` asks and none is given, a
    `ModelSummary` where ``summary`` asks and none is given, a `ModelCheckpoint`
    where ``checkpointing`` asks (and not ``debug``); checkpoint callbacks go last,
    so that they save the others' newest state.

    Raises:
        ConfigurationError: A callback is not a `Callback`, two share a state key, or a
            `ModelCheckpoint` is given with checkpointing off.
    """
    given = [callbacks] if isinstance(callbacks, Callback) else list(callbacks or ())
    for callback in given:
        if not isinstance(callback, Callback):
            raise ConfigurationError(
                f"callbacks holds a {type(callback).__name__}, not a Callback",
                value=callback,
                fix="subclass plait.trainer.Callback",
            )
    keys = [c.state_key for c in given if type(c).state_dict is not Callback.state_dict]
    duplicated = sorted({key for key in keys if keys.count(key) > 1})
    if duplicated:
        raise ConfigurationError(
            f"callbacks with state share the state key(s) {duplicated}: their "
            "checkpointed states would overwrite each other",
            value=duplicated,
            fix="give them different settings, or override state_key",
        )
    if progress and not any(isinstance(c, RichProgressBar) for c in given):
        given.insert(0, RichProgressBar())
    if summary is not False and not isinstance(summary, bool):
        raise ConfigurationError(
            f"enable_model_summary={summary!r} must be True or False",
            value=summary,
            fix="pass enable_model_summary=True",
        )
    if summary and not any(isinstance(c, ModelSummary) for c in given):
        given.append(ModelSummary())
    has_checkpoint = any(isinstance(c, ModelCheckpoint) for c in given)
    if checkpointing and not has_checkpoint and not debug:
        given.append(ModelCheckpoint())
    if not checkpointing and has_checkpoint:
        raise ConfigurationError(
            "enable_checkpointing=False, and a ModelCheckpoint was given",
            fix="drop the ModelCheckpoint, or set enable_checkpointing=True",
        )
    # Checkpoint callbacks last: they save the others' newest state.
    return [c for c in given if not isinstance(c, ModelCheckpoint)] + [
        c for c in given if isinstance(c, ModelCheckpoint)
    ]
