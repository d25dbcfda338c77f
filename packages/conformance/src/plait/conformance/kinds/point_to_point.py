"""``point_to_point``: the messages a pipeline's stages pass arrive whole, from the right rank.

A pipeline schedule passes activations forward and gradients back between the
ranks of the mesh's ``pp`` groups, with ``torch.distributed``'s point-to-point
calls over the group the strategy built. The strategy's part is that group: the
ranks its mesh says, the backend and devices that carry the tensors, the timeout.
So the property runs along each dimension of a mesh (the group is the mesh's,
``device_mesh.get_group(dimension)``), not over the whole job, where the group
is torch's default one and proves nothing of the strategy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

import attrs
import torch
import torch.distributed as dist
from hypothesis import strategies as st
from typing_extensions import override

from plait.conformance.cases import DTYPES, TensorSpec
from plait.conformance.generate import any_tensor
from plait.conformance.grid import rank_spec
from plait.conformance.kind import ExampleKind, Property
from plait.conformance.outcomes import Outcome
from plait.conformance.registry import EXAMPLE_KINDS
from plait.conformance.spec import tensor_problem
from plait.conformance.worker import describe_tensor, materialize, raised
from plait.core import ConfigurationError, SupportsDeviceMesh

if TYPE_CHECKING:
    from plait.conformance.cases import Case
    from plait.conformance.kind import RankContext

__all__ = [
    "POINT_TO_POINT",
    "Message",
    "PointToPointCase",
    "PointToPointKind",
    "point_to_point_cases",
    "point_to_point_grid",
]


@attrs.frozen
class Message:
    """A tensor the rank at place ``src`` sends to the rank at place ``dst``."""

    src: int
    dst: int
    tensor: TensorSpec

    def __attrs_post_init__(self) -> None:
        if self.src == self.dst:
            raise ValueError(f"a message goes to another rank, not from {self.src} to itself")
        if self.tensor.layout != "contiguous":
            raise ValueError("a message's tensor is contiguous, as a pipeline stage sends it")


@attrs.frozen
class PointToPointCase:
    """Each rank posts its sends and receives of ``messages`` at once, in their order.

    As a pipeline schedule passes activations and gradients between stages: every
    rank makes one ``torch.distributed.batch_isend_irecv`` over its group, an
    ``isend`` of each message it is ``src`` of and an ``irecv`` of each it is
    ``dst`` of, in the order of ``messages``, then waits for them all.
    """

    messages: tuple[Message, ...]


@st.composite
def point_to_point_cases(draw: st.DrawFn, world_size: int) -> PointToPointCase:
    """A pipeline's traffic, posted in any order, each message of any dtype and shape.

    Each place sends to the next (activations, stage to stage), so every rank sends
    or receives; then up to four more messages between any two places (gradients
    back, the last stage's to the first in a looped schedule, several between one
    pair).
    """
    places = st.integers(0, world_size - 1)
    chain = [(place, place + 1) for place in range(world_size - 1)]
    more = draw(
        st.lists(st.tuples(places, places).filter(lambda pair: pair[0] != pair[1]), max_size=4),
        label="more",
    )
    pairs = draw(st.permutations([*chain, *more]), label="order")
    return PointToPointCase(
        tuple(Message(src, dst, draw(_contiguous_tensor())) for src, dst in pairs)
    )


@st.composite
def _contiguous_tensor(draw: st.DrawFn) -> TensorSpec:
    return attrs.evolve(draw(any_tensor()), layout="contiguous")


def _sent(
    pairs: Sequence[tuple[int, int]], dtype: str, world_size: int, shape: tuple[int, ...] = (2,)
) -> list[Message]:
    # Each sender's values are its own, so a message from another rank shows.
    return [Message(src, dst, rank_spec(dtype, None, world_size, src, shape)) for src, dst in pairs]


def point_to_point_grid(world_size: int) -> list[Case]:
    """A pipeline's traffic: forward, back, around, every dtype, empty and scalar, all pairs.

    The chain (each place to the next) is every schedule's forward; gradients go back
    along it; a looped schedule's last stage sends to the first. Two messages between
    one pair (of other shapes, then alike but for their values) go in the order they
    were posted; every rank sending to every other shows a message delivered from or
    to the wrong rank.
    """
    if world_size < 2:  # a message goes between two ranks
        return []
    chain = [(place, place + 1) for place in range(world_size - 1)]
    back = [(dst, src) for src, dst in chain]
    cases: list[Case] = [
        PointToPointCase(tuple(_sent(chain, "float32", world_size))),
        PointToPointCase(
            tuple(
                _sent(chain, "float32", world_size, (2, 3))
                + _sent(back, "float64", world_size, (3,))
            )
        ),
        PointToPointCase(tuple(_sent([*chain, (world_size - 1, 0)], "bfloat16", world_size, (4,)))),
    ]
    cases += [PointToPointCase(tuple(_sent(chain, dtype, world_size))) for dtype in DTYPES]
    cases.append(
        PointToPointCase(
            tuple(_sent(chain, "int64", world_size, (0,)) + _sent(chain, "int64", world_size, ()))
        )
    )
    # Twice between each pair, alike but for the values: only the order tells them apart.
    first = _sent(chain, "float32", world_size, (3,))
    second = [
        Message(m.src, m.dst, attrs.evolve(m.tensor, values=tuple(-2 * v for v in m.tensor.values)))
        for m in first
    ]
    cases.append(PointToPointCase((*first, *second)))
    every = [(src, dst) for src in range(world_size) for dst in range(world_size) if src != dst]
    cases.append(PointToPointCase(tuple(_sent(every, "float32", world_size))))
    return cases


POINT_TO_POINT: Final = Property(
    "point_to_point",
    "along each dimension of the mesh, sends and receives posted at once over the "
    "dimension's group (as a pipeline schedule posts them) deliver every contiguous "
    "tensor whole: its dtype, shape and values, from the rank that sent it, in the "
    "order sent, on the receiver's root_device, with the sender's tensor unchanged",
    point_to_point_cases,
    grid=point_to_point_grid,
    min_world_size=2,
    over_job=False,
)


def dimension_group(context: RankContext) -> dist.ProcessGroup | None:
    """The process group of this rank's group along ``context.dimension``.

    The mesh's own group (``device_mesh.get_group``), the one torch's pipeline
    stages, FSDP and tensor parallelism take; ``None`` (the job's default group)
    over the whole job.

    Raises:
        ConfigurationError: The example runs along a dimension, and the strategy has
            no ``device_mesh``, or its group holds other ranks than the mesh's
            coordinates say.
    """
    if context.dimension is None:
        return None
    strategy = context.strategy
    if not isinstance(strategy, SupportsDeviceMesh):
        raise ConfigurationError(
            f"point_to_point runs along the dimension {context.dimension!r}, but "
            f"{type(strategy).__name__} has no device_mesh to take its group from",
            fix="give the strategy a device_mesh property (plait.core.SupportsDeviceMesh)",
        )
    group: dist.ProcessGroup = strategy.device_mesh.get_group(context.dimension)
    held = dist.get_process_group_ranks(group)
    placed = [context.src(place) for place in range(context.world_size)]
    if held != placed:
        raise ConfigurationError(
            f"device_mesh.get_group({context.dimension!r}) holds the global ranks {held}, "
            f"but the mesh's coordinates put global rank {context.global_rank} in the group "
            f"{placed}: a pipeline's stages would pass their tensors to the wrong ranks",
            fix="build the mesh from each dimension's groups in the mesh's order of "
            "dimensions (DeviceMesh.from_group(groups, mesh=..., mesh_dim_names=...))",
        )
    return group


class PointToPointKind(ExampleKind[PointToPointCase]):
    """Each rank posts its sends and receives in one ``batch_isend_irecv``, then waits."""

    case_type = PointToPointCase
    properties = (POINT_TO_POINT,)
    snippet_names = ("Message", "TensorSpec")

    @override
    def run(self, context: RankContext, case: PointToPointCase) -> Outcome:
        place = context.rank
        sent: list[torch.Tensor] = []
        received: list[torch.Tensor] = []
        try:
            group = dimension_group(context)
            ops = []
            for message in case.messages:
                if message.src == place:
                    tensor = materialize(message.tensor, context.device)
                    sent.append(tensor)
                    ops.append(dist.P2POp(dist.isend, tensor, context.src(message.dst), group))
                elif message.dst == place:
                    spec = message.tensor
                    buffer = torch.empty(
                        spec.shape, dtype=getattr(torch, spec.dtype), device=context.device
                    )
                    received.append(buffer)
                    ops.append(dist.P2POp(dist.irecv, buffer, context.src(message.src), group))
            before = [tensor.clone() for tensor in sent]
            for work in dist.batch_isend_irecv(ops) if ops else ():
                work.wait()
        except Exception as error:  # noqa: BLE001 - every error is reported, not raised
            return Outcome(place, error=raised(error))
        changed = next(
            (
                f"the tensor it sent became {after.tolist()}"
                for first, after in zip(before, sent, strict=True)
                if not torch.equal(first, after)
            ),
            None,
        )
        return Outcome(
            place, result=tuple(describe_tensor(tensor) for tensor in received), mutated=changed
        )

    @override
    def judge(
        self, case: PointToPointCase, outcomes: Sequence[Outcome], devices: Sequence[str]
    ) -> list[str]:
        problems = []
        for outcome in outcomes:
            expected = [message for message in case.messages if message.dst == outcome.rank]
            got = outcome.result
            if not isinstance(got, tuple) or len(got) != len(expected):
                problems.append(
                    f"rank {outcome.rank}: received {got!r}, not one tensor per message "
                    f"sent to it ({len(expected)})"
                )
                continue
            for index, (tensor, message) in enumerate(zip(got, expected, strict=True)):
                problem = tensor_problem(
                    tensor,
                    message.tensor,
                    rank=outcome.rank,
                    shape=message.tensor.shape,
                    values=message.tensor.values,
                    device=devices[outcome.rank],
                )
                if problem:
                    problems.append(f"{problem} ({_which(message, index, expected)})")
        return problems

    @override
    def labels(self, case: PointToPointCase) -> dict[str, object]:
        return {"messages": len(case.messages)}


def _which(message: Message, index: int, expected: Sequence[Message]) -> str:
    """``the message from rank 1`` (``the 2nd message from rank 1``, of several)."""
    same = [other for other in expected[:index] if other.src == message.src]
    if not same and sum(other.src == message.src for other in expected) == 1:
        return f"the message from rank {message.src}"
    return f"message {len(same) + 1} from rank {message.src}, in the order sent"


EXAMPLE_KINDS.register(PointToPointKind())
