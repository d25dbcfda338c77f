"""Every checkpoint IO gives back what it was given, as ``torch.save`` does, or refuses by name.

Hypothesis draws checkpoints of nested dictionaries (string, integer, boolean and
float keys; empty ones), lists and tuples, tensors of every dtype (0-d and empty
ones too) and plain values, and each IO, alone or composed with another, saves and
loads them in one process.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plait.checkpoint_io import (
    AsyncCheckpointIO,
    DistributedCheckpointIO,
    TorchCheckpointIO,
    XLACheckpointIO,
)
from plait.core import CheckpointError, CheckpointIO

DTYPES = (
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.uint16, torch.uint32, torch.uint64, torch.float16, torch.bfloat16, torch.float32,
    torch.float64, torch.float8_e4m3fn, torch.float8_e5m2, torch.complex64, torch.complex128,
)  # fmt: skip

UNSIGNED = (torch.bool, torch.uint8, torch.uint16, torch.uint32, torch.uint64)

IOS: dict[str, Callable[[], CheckpointIO]] = {
    "torch": TorchCheckpointIO,
    "xla": XLACheckpointIO,
    "distributed": DistributedCheckpointIO,
    "async(torch)": AsyncCheckpointIO,
    "async(distributed)": lambda: AsyncCheckpointIO(DistributedCheckpointIO()),
}


@st.composite
def tensors(draw: st.DrawFn) -> torch.Tensor:
    dtype = draw(st.sampled_from(DTYPES), label="dtype")
    shape = draw(st.lists(st.integers(0, 3), max_size=3), label="shape")
    count = 1
    for size in shape:
        count *= size
    low = 0 if dtype in UNSIGNED else -100
    values = draw(st.lists(st.integers(low, 100), min_size=count, max_size=count))
    return torch.tensor(values, dtype=torch.int64).reshape(shape).to(dtype)


KEYS = st.one_of(
    st.text(alphabet="ab_", min_size=1, max_size=3),
    st.integers(-3, 3),
    st.booleans(),
    st.sampled_from([0.5, -1.5]),
)
LEAVES = st.one_of(
    tensors(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=False, allow_infinity=False, width=64),
    st.text(max_size=4),
    st.none(),
)
VALUES = st.recursive(
    LEAVES,
    lambda inner: st.one_of(
        st.dictionaries(KEYS, inner, max_size=3),
        st.lists(inner, max_size=3),
        st.tuples(inner, inner),
    ),
    max_leaves=8,
)
CHECKPOINTS = st.dictionaries(st.text(alphabet="abc_", min_size=1, max_size=4), VALUES, max_size=4)


def _as_torch_save_gives(checkpoint: dict[str, object]) -> object:
    buffer = io.BytesIO()
    torch.save(checkpoint, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def _same(a: object, b: object, path: str = "") -> None:
    assert type(a) is type(b), (path, type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor)
        assert (a.dtype, a.shape) == (b.dtype, b.shape), path
        assert torch.equal(a, b), path
    elif isinstance(a, dict):
        assert isinstance(b, dict)
        assert list(a) == list(b), path  # the same keys, of the same types, in order
        for key in a:
            assert type(key) is type(next(k for k in b if k == key)), (path, key)
            _same(a[key], b[key], f"{path}[{key!r}]")
    elif isinstance(a, list | tuple):
        assert isinstance(b, list | tuple)
        assert len(a) == len(b), path
        for index, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{path}[{index}]")
    else:
        assert a == b, path


@pytest.mark.parametrize("name", sorted(IOS))
def test_every_io_gives_back_what_torch_save_gives_back_or_names_what_it_refuses(
    name: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    root = tmp_path_factory.mktemp(re.sub(r"\W", "_", name))
    made = IOS[name]()
    count = iter(range(10**6))

    # The profile's examples (60; CI's 600), at most 150 for each of the five IOs.
    @settings(
        max_examples=min(settings().max_examples, 150), suppress_health_check=[HealthCheck.too_slow]
    )
    @given(checkpoint=CHECKPOINTS)
    def round_trip(checkpoint: dict[str, object]) -> None:
        path = Path(root) / f"c{next(count)}"
        refusal, loaded = None, None
        try:
            made.save_checkpoint(checkpoint, path)
            loaded = made.load_checkpoint(path, map_location="cpu")
        except CheckpointError as error:
            refusal = str(error)
        if refusal is not None:
            # Only a refusal that names the keys it cannot keep apart.
            assert re.search(r"the keys .+ (read the same as text|meet on one path)", refusal)
            return
        _same(_as_torch_save_gives(checkpoint), loaded)

    try:
        round_trip()
    finally:
        made.teardown()


def test_integer_keys_and_empty_dictionaries_come_back_from_a_sharded_checkpoint(
    tmp_path: Path,
) -> None:
    optimizer_state = {"state": {0: {"step": torch.tensor(3.0)}, 2: {}}, "param_groups": []}
    saved: dict[str, object] = {
        "outer": optimizer_state,
        "empty": {},
        "in_a_list": [{}, {1: "one"}],
    }
    DistributedCheckpointIO().save_checkpoint(saved, tmp_path / "c")

    loaded = DistributedCheckpointIO().load_checkpoint(tmp_path / "c")

    _same(_as_torch_save_gives(saved), loaded)


def test_keys_that_read_the_same_are_refused_naming_both_before_anything_is_written(
    tmp_path: Path,
) -> None:
    io_ = DistributedCheckpointIO()
    with pytest.raises(CheckpointError, match=r"the keys 1 and '1' of \['extra'\] read the same"):
        io_.save_checkpoint({"extra": {1: 1, "1": 2}}, tmp_path / "c")
    with pytest.raises(CheckpointError, match=r"the keys \['a\.b'\] and \['a'\]\['b'\] meet"):
        io_.save_checkpoint({"a.b": 1, "a": {"b": 2}}, tmp_path / "d")
    assert not (tmp_path / "c").exists()
    assert not (tmp_path / "c.partial").exists()
