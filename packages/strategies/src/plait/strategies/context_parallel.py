"""Context parallelism: a sequence split over the ``cp`` ranks, attention exact across them.

Each rank of a context-parallel group holds a slice of every sequence (its tokens'
queries, keys and values). `context_parallel_attention` is called where a module
would call ``scaled_dot_product_attention``: it gathers the keys and values of the
whole sequence from the group (an autograd all-gather, whose backward sums each
rank's gradients back to the rank that holds the tokens) and masks by the tokens'
global positions, so a causal mask means what it means on the whole sequence,
whatever order the slices are in. Outputs and gradients equal unsharded attention's
to float rounding.

`sequence_positions` says which global positions a rank holds: a contiguous slice,
or (``load_balanced=True``, for causal masks) chunks ``r`` and ``2W - 1 - r`` of
``2W``, so that every rank has as many early (cheap) tokens as late (dear) ones.
`shard_sequence` takes those positions out of a tensor. `ContextParallel` is the part
`ModelParallelStrategy` is built from: the same, for this rank of its mesh.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from typing_extensions import override

from plait.core import ConfigurationError
from plait.strategies.mesh_plan import MeshDim

if TYPE_CHECKING:
    import torch.distributed as dist

    from plait.strategies.mesh_plan import MeshHost

__all__ = [
    "ContextParallel",
    "context_parallel_attention",
    "sequence_positions",
    "shard_sequence",
]


def _check_rank(rank: object, size: object) -> None:
    for name, value, low in (("size", size, 1), ("rank", rank, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigurationError(
                f"a context-parallel {name} of {value!r} is not an int >= {low}",
                value=value,
                fix="pass the rank's cp coordinate and the cp size "
                "(strategy.layout.rank_in('cp'), strategy.layout.size_of('cp'))",
            )
    assert isinstance(rank, int)
    assert isinstance(size, int)
    if rank >= size:
        raise ConfigurationError(
            f"context-parallel rank {rank} is outside [0, {size})",
            value=rank,
            fix="pass the rank's coordinate along cp, which is below the cp size",
        )


def sequence_positions(
    length: int, *, rank: int, size: int, load_balanced: bool = True
) -> torch.Tensor:
    """The global positions (ascending, int64) of the tokens context-parallel ``rank`` holds.

    Args:
        length: The whole sequence's length.
        rank: This rank's index along ``cp``.
        size: The ranks of the ``cp`` group.
        load_balanced: Chunks ``rank`` and ``2 * size - 1 - rank`` of ``2 * size``
            (each rank as much causal attention work as the others); ``False``: the
            ``rank``-th of ``size`` contiguous slices.

    Raises:
        ConfigurationError: ``length`` does not split evenly (``size`` slices, or
            ``2 * size`` chunks when load-balanced), or a rank outside ``size``.
    """
    _check_rank(rank, size)
    pieces = 2 * size if load_balanced else size
    given: object = length  # an int by its annotation only: checked
    if isinstance(given, bool) or not isinstance(given, int) or length < 1 or length % pieces:
        kind = "load-balanced chunks" if load_balanced else "contiguous slices"
        raise ConfigurationError(
            f"a sequence of length {length!r} does not split into {pieces} equal {kind} "
            f"over {size} context-parallel ranks",
            value=length,
            fix=f"pad the sequences to a multiple of {pieces}"
            + (
                ""
                if not load_balanced or size == 1
                else ", or split them contiguously (load_balanced=False; on the strategy, "
                "context_parallel_load_balancing=False)"
            ),
        )
    chunk = length // pieces
    if not load_balanced:
        return torch.arange(rank * chunk, (rank + 1) * chunk)
    late = pieces - 1 - rank
    return torch.cat(
        [
            torch.arange(rank * chunk, (rank + 1) * chunk),
            torch.arange(late * chunk, (late + 1) * chunk),
        ]
    )


def shard_sequence(
    tensor: torch.Tensor, *, rank: int, size: int, dim: int = 1, load_balanced: bool = True
) -> torch.Tensor:
    """The tokens of ``tensor`` (along ``dim``) that context-parallel ``rank`` holds.

    Raises:
        ConfigurationError: ``dim`` is not a dimension of ``tensor``, or its length does
            not split evenly (see `sequence_positions`).
    """
    if not -tensor.dim() <= dim < tensor.dim():
        raise ConfigurationError(
            f"dim={dim} is not a dimension of a tensor of shape {tuple(tensor.shape)}",
            value=dim,
            fix="pass the sequence's dimension (1 for (batch, sequence, ...) tensors)",
        )
    positions = sequence_positions(
        tensor.shape[dim], rank=rank, size=size, load_balanced=load_balanced
    )
    return tensor.index_select(dim, positions.to(tensor.device))


class _AllGather(torch.autograd.Function):
    # Forward: every rank's part, concatenated along ``dim``. Backward: the sum over
    # the group of the gradients of this rank's part (a reduce-scatter).

    @staticmethod
    @override
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        tensor: torch.Tensor,
        group: dist.ProcessGroup,
        dim: int,
    ) -> torch.Tensor:
        import torch.distributed as dist  # noqa: PLC0415

        ctx.group, ctx.dim = group, dim  # type: ignore[attr-defined]
        ctx.rank = dist.get_rank(group)  # type: ignore[attr-defined]
        return _concatenated(tensor, group, dim)

    @staticmethod
    @override
    def backward(
        ctx: torch.autograd.function.FunctionCtx, gradient: torch.Tensor
    ) -> tuple[torch.Tensor, None, None]:
        import torch.distributed as dist  # noqa: PLC0415

        group: dist.ProcessGroup = ctx.group  # type: ignore[attr-defined]
        dim: int = ctx.dim  # type: ignore[attr-defined]
        size = dist.get_world_size(group)
        parts = list(gradient.chunk(size, dim=dim))
        if dist.get_backend(group) == "nccl":
            mine = torch.empty_like(parts[0].contiguous())
            dist.reduce_scatter(mine, [part.contiguous() for part in parts], group=group)
            return mine, None, None
        # Gloo has no reduce-scatter: the whole gradient summed, this rank's part kept.
        whole = gradient.contiguous()
        dist.all_reduce(whole, group=group)
        return whole.chunk(size, dim=dim)[ctx.rank].contiguous(), None, None  # type: ignore[attr-defined]


def _concatenated(tensor: torch.Tensor, group: dist.ProcessGroup, dim: int) -> torch.Tensor:
    # Every rank's ``tensor``, in rank order, concatenated along ``dim``.
    import torch.distributed as dist  # noqa: PLC0415

    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, tensor.contiguous(), group=group)
    return torch.cat(parts, dim=dim)


def _gather(
    tensor: torch.Tensor, group: dist.ProcessGroup, dim: int, *, grad: bool
) -> torch.Tensor:
    if grad:
        gathered: torch.Tensor = _AllGather.apply(tensor, group, dim)  # type: ignore[no-untyped-call]
        return gathered
    return _concatenated(tensor, group, dim)


def context_parallel_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    group: dist.ProcessGroup | None,
    positions: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> torch.Tensor:
    """``scaled_dot_product_attention`` over a sequence split between the ranks of ``group``.

    Every rank passes its own tokens' queries, keys and values, shaped
    ``(batch, heads, local_length, head_dim)``, and gets its tokens' outputs: each
    query attends to the keys of the whole sequence (gathered from the group), and
    with ``is_causal`` only to those at or before its global position. With
    ``group=None`` (no context parallelism) it is ``scaled_dot_product_attention``.

    Args:
        query: This rank's queries.
        key: This rank's keys (the same tokens as ``query``).
        value: This rank's values.
        group: The ``cp`` group (``strategy.context_parallel_group``); ``None``: one rank
            holds the whole sequence.
        positions: The global positions of this rank's tokens, one per token
            (`sequence_positions`, or ``strategy.sequence_positions(length)``);
            needed with ``is_causal`` over several ranks.
        is_causal: Each token attends only to itself and the tokens before it.
        scale: The scale of the dot products (``1 / sqrt(head_dim)`` by default).

    Raises:
        ConfigurationError: ``query``, ``key`` and ``value`` hold different numbers of
            tokens, ``positions`` is not one per token, or a causal mask over several
            ranks has no ``positions``.
    """
    functional = torch.nn.functional
    tokens = {name: t.shape[-2] for name, t in (("query", query), ("key", key), ("value", value))}
    if len(set(tokens.values())) != 1:
        raise ConfigurationError(
            f"query, key and value hold different numbers of tokens ({tokens}): each rank "
            "passes its own tokens' queries, keys and values",
            value=tokens,
            fix="shard query, key and value along the sequence alike (strategy.shard_sequence)",
        )
    length = tokens["query"]
    if positions is not None and tuple(positions.shape) != (length,):
        raise ConfigurationError(
            f"positions of shape {tuple(positions.shape)} for {length} tokens: one global "
            "position per token of this rank is needed",
            value=tuple(positions.shape),
            fix="pass strategy.sequence_positions(whole_length), for the whole sequence's length",
        )
    import torch.distributed as dist  # noqa: PLC0415

    if group is None or dist.get_world_size(group) == 1:
        if positions is None or not is_causal:
            return functional.scaled_dot_product_attention(
                query, key, value, is_causal=is_causal, scale=scale
            )
        mask = positions[:, None] >= positions[None, :]
        return functional.scaled_dot_product_attention(
            query, key, value, attn_mask=mask.to(query.device), scale=scale
        )
    if is_causal and positions is None:
        raise ConfigurationError(
            "a causal mask over a sequence split between context-parallel ranks needs each "
            "token's global position: a mask over the local slice alone attends to the "
            "wrong tokens",
            value=None,
            fix="pass positions=strategy.sequence_positions(whole_length)",
        )
    keys = _gather(key, group, -2, grad=True)
    values = _gather(value, group, -2, grad=True)
    if not is_causal:
        return functional.scaled_dot_product_attention(query, keys, values, scale=scale)
    assert positions is not None
    mine = positions.to(query.device, torch.int64)
    everywhere = _gather(mine, group, 0, grad=False)
    mask = mine[:, None] >= everywhere[None, :]
    return functional.scaled_dot_product_attention(query, keys, values, attn_mask=mask, scale=scale)


class ContextParallel:
    """A mesh strategy's context parallelism: this rank's ``cp`` slice and attention over it.

    Made with the strategy (``context_parallel_load_balancing`` is checked then); it
    reads the mesh from its host once the host has joined its job.

    Args:
        host: The strategy (its mesh, rank and groups).
        load_balancing: Chunks ``r`` and ``2W - 1 - r`` of ``2W`` of each sequence;
            ``False``: the ``r``-th contiguous slice.

    Raises:
        ConfigurationError: ``load_balancing`` is not a bool.
    """

    def __init__(self, host: MeshHost, load_balancing: bool = True) -> None:
        if not isinstance(load_balancing, bool):
            raise ConfigurationError(
                f"context_parallel_load_balancing={load_balancing!r} is not a bool",
                value=load_balancing,
                fix="pass True (chunks r and 2W-1-r, for causal masks) or False",
            )
        self._host = host
        self.load_balancing = load_balancing

    @property
    def group(self) -> dist.ProcessGroup | None:
        """This rank's ``cp`` group (``None``: no context parallelism)."""
        if self._host.mesh_shape.context == 1:
            return None
        return self._host.mesh_group(MeshDim.CONTEXT)

    def _place(self) -> tuple[int, int]:
        shape = self._host.mesh_shape
        return shape.coordinates(self._host.global_rank)[MeshDim.CONTEXT], shape.context

    def sequence_positions(self, length: int) -> torch.Tensor:
        """The global positions of this rank's tokens of a sequence of ``length``.

        Raises:
            ConfigurationError: ``length`` does not split evenly over the ``cp`` ranks.
        """
        rank, size = self._place()
        return sequence_positions(
            length, rank=rank, size=size, load_balanced=self.load_balancing and size > 1
        )

    def shard_sequence(self, tensor: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """This rank's tokens of ``tensor`` along ``dim`` (all of them without cp).

        Raises:
            ConfigurationError: ``dim`` is not one of ``tensor``'s, or its length does
                not split evenly over the ``cp`` ranks.
        """
        rank, size = self._place()
        return shard_sequence(
            tensor, rank=rank, size=size, dim=dim, load_balanced=self.load_balancing and size > 1
        )

    def attention(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        *,
        is_causal: bool = False,
    ) -> torch.Tensor:
        """`context_parallel_attention` of this rank's tokens over its ``cp`` group."""
        group = self.group
        positions = (
            None
            if group is None
            else self.sequence_positions(query.shape[-2] * self._host.mesh_shape.context)
        )
        return context_parallel_attention(
            query, key, value, group=group, positions=positions, is_causal=is_causal
        )
