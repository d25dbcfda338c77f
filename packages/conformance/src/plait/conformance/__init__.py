"""The conformance suite: the collective contract, proved for any strategy.

The contract of `plait.core` as Hypothesis properties, run on a persistent
multi-process rank pool against any strategy, ours or a third party's:

- `ConformanceSuite`: subclass it in a test module and name your strategy; the
  pytest plugin runs every property at each world size and backend you choose.
- `RankPool` and `prove`: the same, from Python; `RankPool.along` runs the
  properties over one dimension of a strategy's device mesh (`MeshDimension`).
- `TrainingSuite`: what a strategy does to training (its declared
  `plait.core.TrainingSemantics`, checkpoint round trips, exact resumes, moves), on
  the same pools; `TRAINING_PROPERTIES` and `prove_moves` from Python.
- `reproduce`: rerun one example, as a failure report prints it.
- `preload`: what the ranks' fork server imports once, for all of a process's ranks
  (the ``plait_preload`` ini option).
- `ExampleKind` and `EXAMPLE_KINDS`: what each kind of example is (its case, its
  property, what a rank runs, how it is judged); a kind of your own is one class
  and a registration (`CollectiveKind` for one collective call per rank).
"""

from plait.conformance.cases import Case, StoppedCase, TensorSpec, TrainingCase, TrainingRun
from plait.conformance.kind import ExampleKind, Property, RankContext
from plait.conformance.kinds import PROPERTIES, CollectiveKind
from plait.conformance.kinds.all_gather import AllGatherCase
from plait.conformance.kinds.bad_arguments import BadArgumentCase
from plait.conformance.kinds.barrier import BarrierCase, BarrierTimeoutCase
from plait.conformance.kinds.broadcast import BroadcastCase
from plait.conformance.kinds.decision import DecisionCase
from plait.conformance.kinds.groups import GroupCase
from plait.conformance.kinds.mismatch import Call, MismatchCase
from plait.conformance.kinds.point_to_point import Message, PointToPointCase
from plait.conformance.kinds.reduce import ReduceCase
from plait.conformance.lanes import LANES, backend_unavailable
from plait.conformance.mesh import MeshLayout
from plait.conformance.pool import (
    GroupOutcomes,
    MeshDimension,
    PoolError,
    PoolStartError,
    RankCrashError,
    RankHangError,
    RankPool,
    preload,
)
from plait.conformance.properties import (
    ContractViolation,
    Refusal,
    property_of,
    prove,
    reproduce,
    run_example,
)
from plait.conformance.registry import EXAMPLE_KINDS, KindRegistry
from plait.conformance.spec import check
from plait.conformance.suite import ConformanceSuite, TrainingSuite
from plait.conformance.target import StrategyFactory, StrategyTarget
from plait.conformance.training import (
    MOVES,
    TRAINING_PROPERTIES,
    MoveCase,
    MoveViolation,
    ReplicasCase,
    ResumeCase,
    RoundTripCase,
    TrainingKind,
    prove_moves,
    reproduce_move,
)

__all__ = [
    "EXAMPLE_KINDS",
    "LANES",
    "MOVES",
    "PROPERTIES",
    "TRAINING_PROPERTIES",
    "AllGatherCase",
    "BadArgumentCase",
    "BarrierCase",
    "BarrierTimeoutCase",
    "BroadcastCase",
    "Call",
    "Case",
    "CollectiveKind",
    "ConformanceSuite",
    "ContractViolation",
    "DecisionCase",
    "ExampleKind",
    "GroupCase",
    "GroupOutcomes",
    "KindRegistry",
    "MeshDimension",
    "MeshLayout",
    "Message",
    "MismatchCase",
    "MoveCase",
    "MoveViolation",
    "PointToPointCase",
    "PoolError",
    "PoolStartError",
    "Property",
    "RankContext",
    "RankCrashError",
    "RankHangError",
    "RankPool",
    "ReduceCase",
    "Refusal",
    "ReplicasCase",
    "ResumeCase",
    "RoundTripCase",
    "StoppedCase",
    "StrategyFactory",
    "StrategyTarget",
    "TensorSpec",
    "TrainingCase",
    "TrainingKind",
    "TrainingRun",
    "TrainingSuite",
    "backend_unavailable",
    "check",
    "preload",
    "property_of",
    "prove",
    "prove_moves",
    "reproduce",
    "reproduce_move",
    "run_example",
]
