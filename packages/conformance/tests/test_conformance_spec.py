"""The reference semantics, the drawn examples, and the harness's checks of its input."""

from __future__ import annotations

import importlib.metadata
import math
import os

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import plait.conformance
import plait.conformance.pool as pool_module
from plait.conformance import (
    PROPERTIES,
    AllGatherCase,
    BadArgumentCase,
    BarrierCase,
    BroadcastCase,
    Call,
    ContractViolation,
    GroupCase,
    Message,
    MismatchCase,
    PointToPointCase,
    RankPool,
    ReduceCase,
    StrategyTarget,
    TensorSpec,
    backend_unavailable,
    check,
)
from plait.conformance.cases import OPS
from plait.conformance.generate import dtypes_for, shapes, tensor_specs
from plait.conformance.kinds.all_gather import all_gather_cases
from plait.conformance.kinds.bad_arguments import bad_argument_cases
from plait.conformance.kinds.barrier import barrier_cases
from plait.conformance.kinds.broadcast import broadcast_cases
from plait.conformance.kinds.groups import group_cases
from plait.conformance.kinds.mismatch import mismatch_cases
from plait.conformance.kinds.reduce import reduce_cases, reduce_tensor_grid
from plait.conformance.lanes import RANK_THREADS
from plait.conformance.outcomes import Outcome, RaisedError, TensorData
from plait.conformance.properties import merge_ranks
from plait.conformance.spec import failing_parts, reference_reduce, same_object, tolerance
from plait.conformance.worker import describe_tensor, materialize
from plait.core import ConfigurationError
from plait.strategies import DDPStrategy


def _tensor(values: tuple[object, ...], dtype: str = "float32") -> TensorData:
    return TensorData(dtype, (len(values),), "cpu", values)


def _ints(*values: int) -> TensorSpec:
    return TensorSpec("int64", (len(values),), values)


def test_the_distribution_registers_its_pytest_plugin() -> None:
    plugins = importlib.metadata.entry_points(group="pytest11")

    assert [p.value for p in plugins if p.name == "plait-conformance"] == [
        "plait.conformance.plugin"
    ]
    assert plait.conformance.__doc__


def test_the_reference_is_exact_for_integers_and_never_truncates_a_mean() -> None:
    assert reference_reduce("sum", [2**62, 2**62], exact=True) == 2**63
    assert reference_reduce("mean", [1, 2], exact=True) == 1.5
    assert reference_reduce("sum", [True, True, False], exact=True) == 2
    assert reference_reduce("product", [-3, 3], exact=True) == -9
    assert reference_reduce("min", [0.5, -0.25], exact=False) == -0.25
    assert reference_reduce("sum", [1e16, 1.0, -1e16], exact=False) == 1.0  # fsum


def test_the_tolerance_follows_the_op_and_dtype() -> None:
    assert tolerance("sum", [1, 2], "int64", 2) == 0.0
    assert tolerance("max", [1.0, 2.0], "float32", 2) == 0.0
    assert tolerance("sum", [1.0, -1.0], "float16", 2) > tolerance("sum", [1.0, -1.0], "float32", 2)
    assert tolerance("sum", [100.0, 100.0], "float32", 2) > tolerance(
        "sum", [1.0, 1.0], "float32", 2
    )


def test_a_mean_that_sums_is_a_violation_on_every_rank() -> None:
    case = ReduceCase(
        "mean", (TensorSpec("float32", (1,), (1.0,)), TensorSpec("float32", (1,), (3.0,)))
    )
    right = [Outcome(rank, result=_tensor((2.0,))) for rank in range(2)]
    wrong = [Outcome(rank, result=_tensor((4.0,))) for rank in range(2)]

    assert check(case, right, ("cpu", "cpu")) == []
    problems = check(case, wrong, ("cpu", "cpu"))
    assert len(problems) == 2
    assert "element 0 is 4.0, expected 2.0" in problems[0]


def test_a_group_keeps_the_contract_among_its_ranks_and_refuses_outsiders() -> None:
    case = GroupCase((0, 2), "sum", 2, (_ints(1), _ints(5), _ints(3)))
    member = (
        _tensor((4,), "int64"),
        TensorData("int64", (2, 1), "cpu", (1, 3)),
        _tensor((3,), "int64"),
    )
    refused = RaisedError("ValueError", frozenset({"ValueError"}), "not in the group", "")
    right = [Outcome(0, result=member), Outcome(1, error=refused), Outcome(2, result=member)]

    assert check(case, right, ("cpu",) * 3) == []
    # The whole job's sum (9), and an outsider that reduced instead of raising.
    whole = (_tensor((9,), "int64"), *member[1:])
    wrong = [Outcome(0, result=whole), Outcome(1, result=_tensor((9,), "int64")), right[2]]
    problems = check(case, wrong, ("cpu",) * 3)
    assert any("rank 1 is not in the group [0, 2]" in problem for problem in problems)
    problems = check(case, [Outcome(0, result=whole), right[1], right[2]], ("cpu",) * 3)
    assert any("expected 4" in problem and "ranks [0, 2]" in problem for problem in problems)


def test_integer_means_must_be_floating_and_bool_sums_must_count() -> None:
    mean = ReduceCase("mean", (_ints(1), _ints(2)))
    truncated = [Outcome(rank, result=_tensor((1,), "int64")) for rank in range(2)]
    flags = ReduceCase("sum", (TensorSpec("bool", (1,), (True,)),) * 2)
    saturated = [Outcome(rank, result=_tensor((True,), "bool")) for rank in range(2)]

    assert "must be floating, got int64" in check(mean, truncated, ("cpu", "cpu"))[0]
    assert "must count" in check(flags, saturated, ("cpu", "cpu"))[0]


def test_ranks_must_agree_bit_for_bit_and_keep_their_inputs() -> None:
    case = ReduceCase(
        "sum", (TensorSpec("float32", (1,), (0.1,)), TensorSpec("float32", (1,), (0.2,)))
    )
    near = 0.30000001192092896
    outcomes = [
        Outcome(0, result=_tensor((near,))),
        Outcome(1, result=_tensor((near + 2**-25,)), mutated="0.2 became 0.3"),
    ]

    problems = check(case, outcomes, ("cpu", "cpu"))

    assert any("rank 1 changed its input" in p for p in problems)
    outcomes[1] = Outcome(1, result=_tensor((near + 2**-25,)))
    assert any("different result from rank 0" in p for p in check(case, outcomes, ("cpu", "cpu")))


def test_each_rank_may_hold_its_result_on_its_own_device() -> None:
    case = ReduceCase("sum", (_ints(1), _ints(2)))
    outcomes = [
        Outcome(rank, result=TensorData("int64", (1,), f"cuda:{rank}", (3,))) for rank in range(2)
    ]

    assert check(case, outcomes, ("cuda:0", "cuda:1")) == []
    assert (
        "result on cuda:1, expected the input's device cuda:0"
        in check(case, outcomes, ("cuda:0", "cuda:0"))[0]
    )


def test_python_numbers_come_back_as_python_numbers_of_the_right_type() -> None:
    case = ReduceCase("sum", (2, 3))

    assert check(case, [Outcome(r, result=5) for r in range(2)], ("cpu", "cpu")) == []
    assert (
        "must return a Python int"
        in check(case, [Outcome(r, result=5.0) for r in range(2)], ("cpu", "cpu"))[0]
    )


def test_broadcast_results_must_be_the_same_object_all_the_way_down() -> None:
    assert same_object({"a": [1, (2.0, "x")]}, {"a": [1, (2.0, "x")]})
    assert not same_object([1], (1,))
    assert not same_object(1, True)  # noqa: FBT003 - a bool is not the int it equals
    assert not same_object({"a": 1.0}, {"a": 1})
    case = BroadcastCase(1, ({"lr": 0.1}, {"lr": 0.2}))
    assert check(case, [Outcome(r, result={"lr": 0.2}) for r in range(2)], ("cpu", "cpu")) == []
    assert (
        "expected src=1's"
        in check(case, [Outcome(r, result={"lr": 0.1}) for r in range(2)], ("cpu", "cpu"))[0]
    )


def test_a_barrier_that_lets_a_rank_out_early_is_seen_in_the_evidence() -> None:
    case = BarrierCase(None, None, late_rank=1, delay_ms=3)
    early = [Outcome(0, entered=1), Outcome(1, entered=2)]

    assert check(case, early, ("cpu", "cpu")) == [
        "rank 0 left the barrier when only 1 of 2 ranks had entered (rank 1 came 3 ms late)"
    ]


def test_a_mismatch_error_must_group_the_ranks_as_they_called() -> None:
    reduce_sum = Call("reduce", _ints(0), "sum")
    case = MismatchCase((reduce_sum, reduce_sum, Call("barrier")))

    def error(groups: tuple[tuple[int, str], ...]) -> RaisedError:
        return RaisedError(
            "CollectiveMismatchError", frozenset({"CollectiveMismatchError"}), "", "", calls=groups
        )

    right = error(((0, "reduce(op=sum)"), (1, "reduce(op=sum)"), (2, "barrier()")))
    wrong = error(((0, "reduce(op=sum)"), (1, "barrier()"), (2, "barrier()")))
    assert check(case, [Outcome(r, error=right) for r in range(3)], ("cpu",) * 3) == []
    assert (
        "groups the ranks"
        in check(case, [Outcome(r, error=wrong) for r in range(3)], ("cpu",) * 3)[0]
    )
    hung = check(case, [Outcome(r, result=None) for r in range(3)], ("cpu",) * 3)
    assert "must raise CollectiveMismatchError" in hung[0]


def test_a_bad_argument_error_must_name_what_was_wrong() -> None:
    case = BadArgumentCase("broadcast", "src", 5, "ValueError")
    vague = RaisedError("ValueError", frozenset({"ValueError"}), "bad src", "")

    assert "does not name '5'" in check(case, [Outcome(0, error=vague)], ("cpu",))[0]


@given(st.data())
def test_every_drawn_case_repr_is_the_python_that_rebuilds_it(data: st.DataObject) -> None:
    world_size = data.draw(st.integers(2, 4))
    strategy = data.draw(
        st.sampled_from(
            [
                reduce_cases(world_size),
                reduce_cases(world_size, numbers=True),
                broadcast_cases(world_size),
                all_gather_cases(world_size),
                barrier_cases(world_size),
                mismatch_cases(world_size),
                bad_argument_cases(world_size),
                group_cases(world_size),
            ]
        )
    )
    case = data.draw(strategy)

    assert eval(repr(case), vars(plait.conformance)) == case  # the reproduction snippet's promise


@given(st.sampled_from(["float16", "bfloat16", "int16", "complex64", "bool"]), st.data())
def test_a_spec_materialises_in_its_layout_with_its_values(dtype: str, data: st.DataObject) -> None:
    spec = data.draw(tensor_specs(dtype, data.draw(shapes())))

    tensor = materialize(spec, torch.device("cpu"))

    if spec.layout == "strided" and tensor.numel() and tensor.shape[-1] > 1:
        assert not tensor.is_contiguous()
    if spec.layout == "transposed" and tensor.numel() and min(tensor.shape[-2:]) > 1:
        assert not tensor.is_contiguous()
    described = describe_tensor(tensor)
    assert (described.dtype, described.shape, described.values) == (dtype, spec.shape, spec.values)


_SMALLEST_NORMAL = {"float16": 2.0**-14, "bfloat16": 2.0**-126, "float32": 2.0**-126}


@given(st.integers(1, 4), st.data())
def test_products_never_pass_through_the_subnormals_in_any_order(
    world_size: int, data: st.DataObject
) -> None:
    case = data.draw(reduce_cases(world_size))
    specs = [spec for spec in case.inputs if isinstance(spec, TensorSpec)]
    if case.op != "product" or not specs or specs[0].dtype not in _SMALLEST_NORMAL:
        return
    for column in zip(*(spec.values for spec in specs), strict=True):
        magnitudes = [abs(float(value)) for value in column if value]
        # The smallest partial product of any order multiplies every factor below 1.
        smallest = math.prod(value for value in magnitudes if value < 1)
        assert smallest >= _SMALLEST_NORMAL[specs[0].dtype], column


def test_a_spec_rejects_values_that_do_not_fill_its_shape() -> None:
    with pytest.raises(ValueError, match=r"shape \(2, 2\) holds 4 values, not 3"):
        TensorSpec("float32", (2, 2), (1.0, 2.0, 3.0))
    with pytest.raises(ValueError, match="transposed tensor needs two dimensions"):
        TensorSpec("float32", (3,), (1.0, 2.0, 3.0), "transposed")


def test_targets_name_what_they_cannot_find() -> None:
    with pytest.raises(ConfigurationError, match="did you mean 'ddp'"):
        StrategyTarget.of("ddpp").factory()
    with pytest.raises(ConfigurationError, match=r"cannot import 'no_such_package\.mod'"):
        StrategyTarget.of("no_such_package.mod:make").factory()
    with pytest.raises(ConfigurationError, match=r"conformance has no attribute 'nothing_here'"):
        StrategyTarget.of("plait.conformance:nothing_here").factory()
    with pytest.raises(ConfigurationError, match=r"did you mean 'plait\.conformance:RankPool'"):
        StrategyTarget.of("plait.conformance:RankPol").factory()
    with pytest.raises(ConfigurationError, match=r"write 'plait\.conformance:RankPool'"):
        StrategyTarget.of("plait.conformance.RankPool").factory()
    with pytest.raises(ConfigurationError, match="no file"):
        StrategyTarget.of("missing/strategy.py:make").factory()
    with pytest.raises(ConfigurationError, match="not defined at module level"):
        StrategyTarget.of(lambda: None)  # type: ignore[arg-type, return-value]
    with pytest.raises(ConfigurationError, match="not a callable"):
        StrategyTarget.of("plait.conformance:LANES").factory()
    assert StrategyTarget.of(materialize).name == "worker:materialize"  # type: ignore[arg-type]


def test_a_pool_checks_its_arguments_before_starting_anything() -> None:
    with pytest.raises(ConfigurationError, match="world_size=0 must be a positive int"):
        RankPool("ddp", world_size=0)
    with pytest.raises(ConfigurationError, match="did you mean 'nccl'"):
        RankPool("ddp", world_size=2, backend="ncl")
    with pytest.raises(ConfigurationError, match="deadline=0 must be a positive"):
        RankPool("ddp", world_size=2, deadline=0)


def test_a_lane_this_machine_lacks_says_why() -> None:
    assert backend_unavailable("gloo", 4) is None
    if torch.cuda.device_count() < 2:
        assert backend_unavailable("nccl", 2) == (
            f"the nccl lane needs 2 CUDA devices: this machine has {torch.cuda.device_count()}"
        )
    # Ranks share the GPUs on gloo-cuda: one device serves any number of them.
    if torch.cuda.device_count() == 0:
        assert backend_unavailable("gloo-cuda", 2) == (
            "the gloo-cuda lane needs a CUDA device, which its ranks share: this machine has 0"
        )
    else:
        assert backend_unavailable("gloo-cuda", 4) is None


def test_only_the_gloo_lane_hides_the_gpus_from_its_ranks() -> None:
    from plait.conformance.pool import _rank_environ  # noqa: PLC0415

    assert _rank_environ(0, 2, "gloo", 1234, "run")["CUDA_VISIBLE_DEVICES"] == ""
    for lane in ("gloo-cuda", "nccl"):
        environ = _rank_environ(1, 2, lane, 1234, "run")
        assert "CUDA_VISIBLE_DEVICES" not in environ
        assert environ["PLAIT_CONFORMANCE_BACKEND"] == lane
        assert environ["LOCAL_WORLD_SIZE"] == "2"


def test_the_dtypes_of_an_example_are_found_wherever_its_tensors_are() -> None:
    from plait.conformance import BroadcastCase, Call, MismatchCase  # noqa: PLC0415
    from plait.conformance.cases import dtypes_of as _dtypes_of  # noqa: PLC0415

    nested = BroadcastCase(
        src=0, objects=({"a": [TensorSpec("complex128", (1,), (1j,))]}, 3, "text")
    )
    assert _dtypes_of(nested) == {"complex128"}
    calls = MismatchCase(
        calls=(
            Call("reduce", TensorSpec("int8", (1,), (1,))),
            Call("barrier"),
        )
    )
    assert _dtypes_of(calls) == {"int8"}
    assert _dtypes_of(ReduceCase("sum", (2.5,))) == set()


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 8])
def test_the_grid_covers_every_op_and_dtype_and_tells_the_ops_apart(world_size: int) -> None:
    cases = [case for case in reduce_tensor_grid(world_size) if isinstance(case, ReduceCase)]
    covered = {(case.op, case.inputs[0].dtype) for case in cases}  # type: ignore[union-attr]

    assert covered >= {(op, dtype) for op in OPS for dtype in dtypes_for(op)}
    assert {case.inputs[0].layout for case in cases} == {"contiguous", "transposed", "strided"}  # type: ignore[union-attr]
    for case in cases:
        specs = [spec for spec in case.inputs if isinstance(spec, TensorSpec)]
        exact = specs[0].dtype in ("bool", "uint8", "int8", "int16", "int32", "int64")
        columns = list(zip(*(spec.values for spec in specs), strict=True))
        if not columns or world_size == 1 or case.op == "sum":
            continue
        # A slip to a sum shows: some element's sum is not the op's result.
        results = [reference_reduce(case.op, column, exact=exact) for column in columns]
        sums = [reference_reduce("sum", column, exact=exact) for column in columns]
        if specs[0].dtype != "bool":
            assert results != sums, case
    for case in cases:
        if case.inputs[0].dtype == "float64" and world_size > 1:  # type: ignore[union-attr]
            values = [v for spec in case.inputs for v in spec.values]  # type: ignore[union-attr]
            narrowed = torch.tensor(values, dtype=torch.float64).float().double().tolist()
            assert narrowed != values, f"float32 holds every value of {case}"


def test_a_result_that_shares_memory_breaks_the_contract_even_when_its_values_are_right() -> None:
    case = ReduceCase("sum", (_ints(1), _ints(2)))
    right = _tensor((3,), "int64")
    outcomes = [
        Outcome(0, result=right),
        Outcome(1, result=right, aliased="its result shares memory with its input tensor"),
    ]

    problem = "its result shares memory with its input tensor (a result must be the caller's own)"
    assert check(case, outcomes, ["cpu", "cpu"]) == [f"rank 1: {problem}"]


def test_an_all_gather_failure_shows_row_by_row_with_the_layout_and_the_likely_cause() -> None:
    inputs = (
        TensorSpec("int64", (2, 2), (1, 2, 3, 4), "transposed"),
        TensorSpec("int64", (2, 2), (5, 6, 7, 8), "transposed"),
    )
    # Each rank's storage read in memory order: the rows in place, wrong inside.
    read_in_memory_order = TensorData("int64", (2, 2, 2), "cpu", (1, 3, 2, 4, 5, 7, 6, 8))
    (problem,) = check(AllGatherCase(inputs), [Outcome(0, result=read_in_memory_order)], ["cpu"])
    lines = problem.splitlines()
    assert lines[0] == (
        "rank 0: all_gather of int64 tensors of shape (2, 2) (transposed): rows that differ "
        "from the ranks' tensors:"
    )
    assert lines[1] == "    row 0: got [1, 3, 2, 4], expected rank 0's [1, 2, 3, 4]"
    assert lines[2] == "    row 1: got [5, 7, 6, 8], expected rank 1's [5, 6, 7, 8]"
    assert "the input is transposed (not contiguous)" in lines[3]
    assert "out of order" not in problem

    swapped = TensorData("int64", (2, 2, 2), "cpu", (5, 6, 7, 8, 1, 2, 3, 4))
    (problem,) = check(AllGatherCase(inputs), [Outcome(0, result=swapped)], ["cpu"])
    assert problem.splitlines()[-1] == (
        "    every row is some rank's tensor, out of order: rows 0 to 1 hold the tensors of "
        "ranks [1, 0]"
    )


def test_long_rows_are_cut_alike_on_both_sides() -> None:
    inputs = (TensorSpec("int64", (10,), tuple(range(10))),)
    got = TensorData("int64", (1, 10), "cpu", tuple(range(1, 11)))
    (problem,) = check(AllGatherCase(inputs), [Outcome(0, result=got)], ["cpu"])
    row = problem.splitlines()[1]
    assert row == (
        "    row 0: got [1, 2, 3, 4, 5, 6, 7, 8, ... (10 values)], expected rank 0's "
        "[0, 1, 2, 3, 4, 5, 6, 7, ... (10 values)]"
    )


def test_what_ranks_did_alike_is_said_once() -> None:
    problems = ["rank 0: got 1, expected 2", "rank 1: got 1, expected 2", "rank 2: got 3"]
    assert merge_ranks(problems, 3) == ["ranks 0 and 1: got 1, expected 2", "rank 2: got 3"]
    assert merge_ranks(problems[:2], 2) == ["every rank: got 1, expected 2"]
    assert merge_ranks(["the pool died"], 2) == ["the pool died"]


def test_a_failure_through_a_collective_that_failed_before_is_marked_its_consequence() -> None:
    pool = RankPool("ddp", world_size=2)  # never started: the violation only reads it
    sub_groups = next(prop for prop in PROPERTIES if prop.name == "sub_groups")
    case = GroupCase((1,), "mean", 1, (_ints(1, 2), _ints(3, 4)))
    violation = ContractViolation(
        sub_groups, pool, case, ["rank 1: a mean"], depends_on=("reduce_tensors",)
    )
    assert violation.headline == (
        "sub_groups failed for 'ddp' (gloo, world size 2): rank 1: a mean"
    )

    violation.follows(["broadcast"])
    assert not violation.consequence_of
    violation.follows(["broadcast", "reduce_tensors"])
    assert violation.consequence_of == ("reduce_tensors",)
    assert str(violation).splitlines()[0] == (
        "sub_groups failed for 'ddp' (gloo, world size 2), likely a consequence of "
        "reduce_tensors, which failed before it on this lane through the same collective "
        "(fix that first): rank 1: a mean"
    )
    assert (
        repr(sub_groups)
        == "Property(name='sub_groups', contract=" + repr(sub_groups.contract) + ")"
    )


def test_a_sub_group_failure_names_the_collectives_that_broke() -> None:
    case = GroupCase((0, 1), "sum", 1, (_ints(1, 2), _ints(3, 4)))
    summed = _tensor((4, 6), "int64")
    gathered = TensorData("int64", (2, 2), "cpu", (1, 2, 3, 4))
    sent = _tensor((3, 4), "int64")
    right = [Outcome(rank, result=(summed, gathered, sent)) for rank in (0, 1)]
    assert failing_parts(case, right, ["cpu", "cpu"]) == ()
    wrong_sum = [Outcome(rank, result=(sent, gathered, sent)) for rank in (0, 1)]
    assert failing_parts(case, wrong_sum, ["cpu", "cpu"]) == ("reduce_tensors",)
    wrong_src = [Outcome(rank, result=(summed, gathered, _ints_data(1, 2))) for rank in (0, 1)]
    assert failing_parts(case, wrong_src, ["cpu", "cpu"]) == ("broadcast",)


def _ints_data(*values: int) -> TensorData:
    return _tensor(values, "int64")


def test_a_point_to_point_failure_names_the_receiver_the_sender_and_the_order() -> None:
    one = TensorSpec("float32", (2,), (1.5, -2.0))
    two = TensorSpec("float32", (2,), (3.0, 4.0))
    case = PointToPointCase((Message(0, 1, one), Message(0, 1, two), Message(1, 0, two)))
    received = [describe_tensor(materialize(spec, torch.device("cpu"))) for spec in (one, two)]
    whole = [Outcome(0, result=(received[1],)), Outcome(1, result=tuple(received))]
    assert check(case, whole, ["cpu", "cpu"]) == []

    crossed = [whole[0], Outcome(1, result=tuple(reversed(received)))]
    problems = check(case, crossed, ["cpu", "cpu"])
    assert problems == [
        "rank 1: got [3.0, 4.0], expected [1.5, -2.0] (message 1 from rank 0, in the order sent)",
        "rank 1: got [1.5, -2.0], expected [3.0, 4.0] (message 2 from rank 0, in the order sent)",
    ]

    lost = [Outcome(0, result=()), whole[1]]
    assert check(case, lost, ["cpu", "cpu"]) == [
        "rank 0: received (), not one tensor per message sent to it (1)"
    ]
    elsewhere = check(case, whole, ["cpu", "meta"])
    assert elsewhere[0].startswith("rank 1: tensor on cpu, expected its root_device meta")
    assert elsewhere[0].endswith("(message 1 from rank 0, in the order sent)")


def test_a_message_goes_contiguous_to_another_rank() -> None:
    spec = TensorSpec("float32", (2,), (1.0, 2.0))
    with pytest.raises(ValueError, match="to another rank, not from 1 to itself"):
        Message(1, 1, spec)
    with pytest.raises(ValueError, match="contiguous, as a pipeline stage sends it"):
        Message(0, 1, TensorSpec("float32", (2,), (1.0, 2.0), "strided"))


def ddp_counting_threads() -> DDPStrategy:
    """``ddp``, refused where the rank computes on other than the threads it was given."""
    given = int(os.environ["OMP_NUM_THREADS"])
    if torch.get_num_threads() != given:
        raise ConfigurationError(
            f"this rank computes on {torch.get_num_threads()} threads, not the {given} it was given"
        )
    return DDPStrategy()


def test_a_pool_rank_computes_on_the_threads_its_environment_gives_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The ranks are forks of a server that imported torch before OMP_NUM_THREADS was
    # theirs, and kept the count it read then: 3 is neither that (one per core, or the
    # tests' one) nor, on its own, what a fork would keep.
    monkeypatch.setattr(pool_module, "RANK_THREADS", 3)
    with RankPool(f"{__file__}:ddp_counting_threads", world_size=2, deadline=30) as pool:
        pool.start()
        assert pool.devices == ("cpu", "cpu")
    assert RANK_THREADS == 1  # what the pools give their ranks
