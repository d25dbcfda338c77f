import pytest
import torch

from plait.core import ConfigurationError, Precision, PrecisionRegistry
from plait.precision import MixedPrecision, TruePrecision, parse_precision


@pytest.mark.parametrize(
    ("written", "name"),
    [
        ("32-true", "32-true"),
        (32, "32-true"),
        ("32", "32-true"),
        (64, "64-true"),
        (16, "16-mixed"),
        ("16", "16-mixed"),
        ("bf16", "bf16-mixed"),
        (" BF16-Mixed ", "bf16-mixed"),
        ("16-true", "16-true"),
        ("bf16-true", "bf16-true"),
    ],
)
def test_precisions_as_users_write_them(written: object, name: str) -> None:
    assert parse_precision(written) == name


@pytest.mark.parametrize("written", ["16-mix", 8, True, None, 32.0, "fp32"])
def test_anything_else_lists_the_formats(written: object) -> None:
    with pytest.raises(ConfigurationError, match="invalid precision") as caught:
        parse_precision(written)

    assert {"32-true", "16-mixed", "bf16-mixed", "bf16"} <= set(caught.value.choices)


def test_a_typo_gets_a_suggestion() -> None:
    with pytest.raises(ConfigurationError, match="did you mean '16-mixed'"):
        parse_precision("16-mix")


@pytest.mark.parametrize(
    ("name", "plugin", "dtype"),
    [
        ("32-true", TruePrecision, torch.float32),
        ("32", TruePrecision, torch.float32),
        ("64-true", TruePrecision, torch.float64),
        ("16-true", TruePrecision, torch.float16),
        ("bf16-true", TruePrecision, torch.bfloat16),
        ("16-mixed", MixedPrecision, torch.float16),
        ("16", MixedPrecision, torch.float16),
        ("bf16-mixed", MixedPrecision, torch.bfloat16),
        ("bf16", MixedPrecision, torch.bfloat16),
    ],
)
def test_every_name_is_registered(name: str, plugin: type, dtype: torch.dtype) -> None:
    built = PrecisionRegistry.get(name)

    assert type(built) is plugin
    assert isinstance(built, Precision)
    assert built.dtype == dtype  # type: ignore[attr-defined]


@pytest.mark.parametrize("device_type", ["mps", "xla"])
def test_a_format_the_device_cannot_run_is_refused(device_type: str) -> None:
    with pytest.raises(ConfigurationError, match=f"'64-true' cannot run on {device_type}"):
        PrecisionRegistry.get("64-true", device_type=device_type)


def test_bf16_mixed_refuses_a_scaler() -> None:
    with pytest.raises(ConfigurationError, match="needs no gradient scaler"):
        MixedPrecision(torch.bfloat16, scaler=torch.amp.GradScaler("cpu"))


def test_a_dtype_without_a_format_is_refused() -> None:
    with pytest.raises(
        ConfigurationError, match=r"mixed precision has no format for torch\.float64"
    ):
        MixedPrecision(torch.float64)
