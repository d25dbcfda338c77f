"""The examples by name, each a module and its data."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Final

import attrs

if TYPE_CHECKING:
    from plait.trainer.module import DataModule, Module

__all__ = ["EXAMPLES", "Example"]


def _digits(*, lr: float | None = None, batch_size: int = 64) -> tuple[Module, DataModule]:
    from plait.trainer.examples.digits import DigitsClassifier, DigitsData  # noqa: PLC0415

    module = DigitsClassifier() if lr is None else DigitsClassifier(lr=lr)
    return module, DigitsData(batch_size=batch_size)


def _decoder(*, lr: float | None = None, batch_size: int = 32) -> tuple[Module, DataModule]:
    from plait.trainer.examples.decoder import DecoderLM, RepeatsData  # noqa: PLC0415

    module = DecoderLM() if lr is None else DecoderLM(lr=lr)
    return module, RepeatsData(batch_size=batch_size)


@attrs.frozen
class Example:
    """A bundled example.

    Attributes:
        name: What ``--example`` takes.
        description: One line for ``--help``.
        build: Makes the module and its data: ``build(lr=None, batch_size=64)``, where
            ``lr=None`` keeps the example's own learning rate.
        metric: The validation metric the command reports at the end.
    """

    name: str
    description: str
    build: Callable[..., tuple[Module, DataModule]]
    metric: str


EXAMPLES: Final = {
    "digits": Example(
        name="digits",
        description="classify 8x8 images of handwritten digits (scikit-learn's copy of the "
        "UCI set: 1797 images, no download)",
        build=_digits,
        metric="val_acc",
    ),
    "decoder": Example(
        name="decoder",
        description="a small decoder-only transformer continuing repeating token sequences "
        "(made from a seed); splits over tp and cp with --strategy model_parallel",
        build=_decoder,
        metric="val_acc",
    ),
}
"""Every bundled example, by name."""
