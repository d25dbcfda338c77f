"""What a `torch.distributed.checkpoint` directory cannot hold as it is, kept anyway or refused.

DCP flattens a checkpoint into dotted paths of string keys: a dictionary's other
keys (a torch optimizer's integer parameter ids, say) would come back as strings,
and an empty dictionary, or one in a list, would not come back at all. A
dictionary that has such keys, or none, is written with string keys and the list
of its real keys beside them (`encoded`), and rebuilt on reading (`decoded`), so
that the checkpoint reads back as ``torch.save`` would give it. Keys that would
meet on one dotted path, and two keys of one dictionary that read the same as
text, cannot be kept apart: they are refused, by name, before anything is written.

DCP also writes a plain (not sharded) tensor once, from one rank, as if every rank
held the same. `plain_tensor_digests` and `differing` find the keys whose tensors
the ranks hold differently (a digest of their bytes), which are refused rather than
mixed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Final

import torch

from plait.core import CheckpointError

if TYPE_CHECKING:
    from plait.core.typing import Checkpoint, PathLike

__all__ = ["KEYS", "decoded", "differing", "encoded", "plain_tensor_digests"]

KEYS: Final = "__plait_keys__"
"""Beside the string keys of a dictionary DCP could not keep as it was: its real keys."""

Path = tuple[object, ...]
Digest = tuple[tuple[int, ...], str, str]


def _shown(path: Path) -> str:
    return "".join(f"[{key!r}]" for key in path) or "the checkpoint"


def encoded(checkpoint: Mapping[str, object], where: PathLike) -> Checkpoint:
    """``checkpoint`` with every dictionary DCP cannot keep as it is made keepable.

    Raises:
        CheckpointError: Two keys of one dictionary read the same as text, a key is
            `KEYS`, or two keys would meet on one dotted path (each is named).
    """
    made = _encoded(checkpoint, (), where)
    assert isinstance(made, dict)
    seen: dict[str, Path] = {}
    for path, _ in _leaves(made, ()):
        dotted = ".".join(str(key) for key in path)
        if dotted in seen and seen[dotted] != path:
            raise CheckpointError(
                os.fspath(where),
                f"cannot be written as a torch.distributed.checkpoint: the keys "
                f"{_shown(seen[dotted])} and {_shown(path)} meet on one path, {dotted!r}",
                fix="rename one of them (a key with a '.' in it reads as a nested one)",
            )
        seen[dotted] = path
    return made


def _encoded(value: object, path: Path, where: PathLike) -> object:
    if isinstance(value, Mapping):
        keys = list(value)
        plain = bool(keys) and all(isinstance(key, str) for key in keys)
        items: dict[str, object] = {}
        for key, item in value.items():
            text = key if isinstance(key, str) else str(key)
            if text == KEYS:
                raise _unkeepable(where, f"{_shown((*path, key))} uses the name plait keeps "
                                  "for a dictionary's keys")  # fmt: skip
            if text in items:
                other = next(k for k in keys if k is not key and str(k) == text)
                raise _unkeepable(
                    where, f"the keys {other!r} and {key!r} of {_shown(path)} read the same as text"
                )
            items[text] = _encoded(item, (*path, key), where)
        if not plain:
            items[KEYS] = keys
        return items
    if isinstance(value, list):
        return [_encoded(item, (*path, index), where) for index, item in enumerate(value)]
    return value


def _unkeepable(where: PathLike, why: str) -> CheckpointError:
    return CheckpointError(
        os.fspath(where),
        f"cannot be written as a torch.distributed.checkpoint: {why}",
        fix="give the dictionary keys that differ as text (or save this checkpoint with "
        "checkpoint_io='torch', which keeps any key)",
    )


def _leaves(value: object, path: Path) -> list[tuple[Path, object]]:
    # What DCP stores at one path: a value that is not a container, or an empty list.
    if isinstance(value, Mapping):
        return [leaf for key, item in value.items() for leaf in _leaves(item, (*path, key))]
    if isinstance(value, list) and value:
        return [leaf for index, item in enumerate(value) for leaf in _leaves(item, (*path, index))]
    return [(path, value)]


def decoded(value: object) -> object:
    """What `encoded` wrote, as it was given: each dictionary with its real keys."""
    if isinstance(value, Mapping):
        if KEYS in value:
            keys = value[KEYS]
            assert isinstance(keys, list)
            return {key: decoded(value[key if isinstance(key, str) else str(key)]) for key in keys}
        return {key: decoded(item) for key, item in value.items()}
    if isinstance(value, list):
        return [decoded(item) for item in value]
    return value


def _digest(tensor: torch.Tensor) -> Digest:
    # The tensor's bytes summed as 64-bit words, wrapping: exact and the same in any
    # order of summation (so on any machine and thread count), at memory speed
    # (25 ms a GB here). Ranks whose values differ in any bit differ in it, but for
    # a permutation of whole words.
    raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    whole = raw.numel() - raw.numel() % 8
    words = int(raw[:whole].view(torch.int64).sum()) if whole else 0
    tail = int(raw[whole:].to(torch.int64).sum()) if whole < raw.numel() else 0
    return (tuple(tensor.shape), str(tensor.dtype), f"{words}+{tail}")


def plain_tensor_digests(checkpoint: Mapping[str, object]) -> dict[str, Digest]:
    """A digest of each plain tensor (not sharded: DCP writes it once), by its path."""
    from torch.distributed.tensor import DTensor  # noqa: PLC0415

    digests: dict[str, Digest] = {}
    for path, value in _leaves(checkpoint, ()):
        if isinstance(value, torch.Tensor) and not isinstance(value, DTensor):
            digests[_shown(path)] = _digest(value)
    return digests


def differing(per_rank: Sequence[Mapping[str, Digest]]) -> dict[str, list[list[int]]]:
    """The paths whose tensors the ranks hold differently: each with its groups of ranks."""
    ranks_of: dict[str, dict[Digest, list[int]]] = {}
    for rank, digests in enumerate(per_rank):
        for path, digest in digests.items():
            ranks_of.setdefault(path, {}).setdefault(digest, []).append(rank)
    return {path: list(groups.values()) for path, groups in ranks_of.items() if len(groups) > 1}
