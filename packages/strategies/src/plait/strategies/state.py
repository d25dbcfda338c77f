"""Loading a module's state with errors that name what does not fit."""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

import torch
import torch.distributed as dist
from typing_extensions import override

from plait.core import CheckpointError, ConfigurationError, Stateful

if TYPE_CHECKING:
    from plait.core.typing import Checkpoint, StateDict

__all__ = [
    "Leftover",
    "LiveState",
    "UnreadEntryError",
    "check_state_fits",
    "first_ranks_buffers",
    "is_dtensor",
    "load_module_state",
    "load_param_groups",
    "module_state_of",
    "optimizer_parameter_names",
    "optimizer_state_keyed",
    "optimizer_states_of",
    "parameter_names",
    "saved_optimizer_names",
    "unwrapped_name",
]

# A checkpoint's own entries: the module's state, the optimizers', the precision's,
# and which of the caller's names each live object was saved under.
STRATEGY_KEYS: Final = ("state_dict", "optimizer_states", "precision")
NAMES_KEY: Final = "plait_names"


@dataclass
class LiveState:
    """A caller's state, split: the module, its optimizers, `Stateful` objects, values.

    ``names`` is what a checkpoint records (``NAMES_KEY``) so that loading gives each
    object back its own entry.
    """

    module: torch.nn.Module | None = None
    module_name: str | None = None
    optimizers: dict[str, torch.optim.Optimizer] = field(default_factory=dict)
    stateful: dict[str, Stateful] = field(default_factory=dict)
    values: dict[str, object] = field(default_factory=dict)

    @classmethod
    def of(cls, state: Mapping[str, object]) -> LiveState:
        """Split ``state``.

        Raises:
            ConfigurationError: It holds two modules, optimizers without their module,
                or a name the checkpoint keeps for itself.
        """
        live = cls()
        for name, value in state.items():
            if isinstance(value, torch.nn.Module):
                if live.module is not None:
                    raise ConfigurationError(
                        f"the state holds two modules, {live.module_name!r} and {name!r}; a "
                        "strategy checkpoints the one module it set up",
                        value=name,
                        fix="save the model setup_module returned; put other modules' "
                        "state_dict() in the state as values",
                    )
                live.module, live.module_name = value, name
            elif isinstance(value, torch.optim.Optimizer):
                live.optimizers[name] = value
            elif isinstance(value, Stateful):
                live.stateful[name] = value
            else:
                live.values[name] = value
        if live.optimizers and live.module is None:
            raise ConfigurationError(
                f"the state holds the optimizer {next(iter(live.optimizers))!r} and no module; "
                "an optimizer's state is saved by the names of its module's parameters",
                value=next(iter(live.optimizers)),
                fix="add the module setup_module returned to the state (e.g. 'model': model)",
            )
        if live.module is not None:
            taken = sorted(set(state) & {*STRATEGY_KEYS, NAMES_KEY})
            if taken:
                raise ConfigurationError(
                    f"the state uses the name {taken[0]!r}, which a checkpoint keeps for "
                    "the strategy's own entries",
                    value=taken[0],
                    choices=[*STRATEGY_KEYS, NAMES_KEY],
                    fix="rename that entry",
                )
        return live

    @property
    def is_live(self) -> bool:
        """Whether anything in it is an object whose state must be taken."""
        return self.module is not None or bool(self.stateful)

    def names(self) -> dict[str, object]:
        """What a checkpoint records of the names."""
        return {"module": self.module_name, "optimizers": list(self.optimizers)}

    def check_held(
        self, checkpoint: Checkpoint, state: Mapping[str, object], source: object
    ) -> None:
        """Check, before anything is restored, that every entry can be.

        Raises:
            CheckpointError: The checkpoint holds no entry for one of the `Stateful`
                objects or values.
            ConfigurationError: Values are given in a mapping that cannot be updated.
        """
        missing = sorted((set(self.stateful) | set(self.values)) - set(checkpoint))
        if missing:
            held = sorted(key for key in checkpoint if key not in (*STRATEGY_KEYS, NAMES_KEY))
            raise CheckpointError(
                str(source),
                f"holds no {', '.join(map(repr, missing))} (it holds "
                f"{', '.join(map(repr, held)) or 'no other entries'})",
                fix="leave that entry out of the state you load into, or save it with the "
                "checkpoint",
            )
        if self.values and not isinstance(state, MutableMapping):
            raise ConfigurationError(
                f"the state's values ({', '.join(map(repr, self.values))}) are given back by "
                f"updating the state, and a {type(state).__name__} cannot be updated",
                value=type(state).__name__,
                fix="pass a dict",
            )

    def restore(
        self, checkpoint: Checkpoint, state: Mapping[str, object], source: object
    ) -> Checkpoint:
        """Give each `Stateful` object and value its entry; the entries left over.

        The module's and the optimizers' states are the strategy's to restore; their
        entries are taken out of what is returned. `check_held` has passed first,
        before anything was restored.

        Raises:
            CheckpointError: A `Stateful`'s entry is not a mapping.
        """
        for name, stateful in self.stateful.items():
            entry = checkpoint[name]
            if not isinstance(entry, Mapping):
                raise CheckpointError(
                    str(source),
                    f"holds a {type(entry).__name__} under {name!r}, and "
                    f"{type(stateful).__name__}.load_state_dict takes a mapping",
                    fix="load into the object the checkpoint was saved from",
                )
            stateful.load_state_dict(dict(entry))
        if isinstance(state, MutableMapping):
            for name in self.values:
                state[name] = checkpoint[name]
        consumed = {*self.stateful, *self.values, NAMES_KEY}
        if self.module is not None:
            consumed.add("state_dict")
        if self.optimizers:
            consumed |= {"optimizer_states", "precision"}
        # The strategy's own entries are left over only when they hold something (the
        # optimizers' states, when the module alone is loaded to evaluate).
        empty = {key for key in STRATEGY_KEYS if key in checkpoint and not checkpoint[key]}
        return {key: value for key, value in checkpoint.items() if key not in consumed | empty}

    def order_optimizers(
        self, checkpoint: Checkpoint, source: object
    ) -> list[torch.optim.Optimizer]:
        """The optimizers in the order the checkpoint saved their states.

        Raises:
            CheckpointError: The checkpoint saved other optimizers by name.
        """
        saved = saved_optimizer_names(checkpoint)
        if saved is None or not self.optimizers:
            return list(self.optimizers.values())  # by position (a Trainer's checkpoint)
        if sorted(saved) != sorted(self.optimizers):
            raise CheckpointError(
                str(source),
                f"holds the optimizers {', '.join(map(repr, saved)) or 'none'}, and the "
                f"state names {', '.join(map(repr, self.optimizers))}",
                fix="load into the names the checkpoint was saved with",
            )
        return [self.optimizers[name] for name in saved]


def saved_optimizer_names(checkpoint: Mapping[str, object]) -> list[str] | None:
    """The names the optimizers were saved under (``NAMES_KEY``), in their order.

    ``None`` for a checkpoint that records none (a Trainer's: its optimizers go by
    position).
    """
    names = checkpoint.get(NAMES_KEY)
    saved = names.get("optimizers") if isinstance(names, Mapping) else None
    if not isinstance(saved, list):
        return None
    return [name for name in saved if isinstance(name, str)]


def load_module_state(module: torch.nn.Module, state: Mapping[str, object], source: object) -> None:
    """Load ``state`` into ``module``, or say which entries do not fit and how.

    Raises:
        CheckpointError: Keys are missing or unexpected, or shapes differ; each is
            named (``source`` is the checkpoint's path, for the message).
    """
    check_state_fits(module.state_dict(), state, source)
    module.load_state_dict(state)


def check_state_fits(
    own: Mapping[str, object], state: Mapping[str, object], source: object
) -> None:
    """Say which entries of ``state`` do not fit a module whose state is ``own``.

    Shapes are compared whole (a sharded tensor's shape is its global one).

    Raises:
        CheckpointError: Keys are missing or unexpected, or shapes differ; each is
            named (``source`` is the checkpoint's path, for the message).
    """
    problems = []
    for key, value in state.items():
        mine = own.get(key)
        if (
            isinstance(value, torch.Tensor)
            and isinstance(mine, torch.Tensor)
            and mine.shape != value.shape
        ):
            problems.append(
                f"{key!r} has shape {tuple(value.shape)} in the checkpoint and "
                f"{tuple(mine.shape)} in the model"
            )
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    if missing:
        problems.append(f"the model's {', '.join(map(repr, missing[:5]))} are not in it")
    if unexpected:
        problems.append(f"it holds {', '.join(map(repr, unexpected[:5]))}, which the model lacks")
    if problems:
        raise CheckpointError(
            str(source),
            "does not fit the model: " + "; ".join(problems),
            fix="build the model with the configuration the checkpoint was saved with, or "
            "load a checkpoint of this model",
        )


class UnreadEntryError(CheckpointError, KeyError):
    """An optimizer's entry asked of what `load_checkpoint` gave back, which left it unread.

    A `KeyError` too, as any missing key of a dictionary raises.
    """

    @override
    def __str__(self) -> str:
        return Exception.__str__(self)  # the message itself, not KeyError's quoted repr


class Leftover(dict[str, object]):
    """What `load_checkpoint` gave back: the checkpoint's entries nothing in the state took.

    A plain dictionary, marked so that passing it on to `set_state_dict` (which
    takes what `read_checkpoint` returns) is refused with the line to write.
    Loading the module without its optimizers leaves their states unread (an
    evaluation never reads gigabytes of moments): asking it for one of them, by
    the name it was saved under (``rest["optimizer"]``), says so, with the calls
    that restore or read it.

    Args:
        entries: The entries left over.
        unread: The names of the optimizers saved in the checkpoint and left unread.
        source: The checkpoint's path, for the message.
    """

    def __init__(
        self, entries: Mapping[str, object], *, unread: Sequence[str] = (), source: str = ""
    ) -> None:
        super().__init__(entries)
        self.unread = tuple(unread)
        self.source = source

    def __missing__(self, key: str) -> object:
        if key not in self.unread:
            raise KeyError(key)
        raise UnreadEntryError(
            self.source,
            f"holds the optimizer {key!r}, whose state load_checkpoint leaves unread when the "
            "state it restores into holds no optimizer (the module alone, or weights_only=True)",
            fix=f"restore it with the module: strategy.load_checkpoint(path, {{'model': model, "
            f"{key!r}: optimizer}}); or read it without restoring anything: "
            "strategy.read_checkpoint(path)['optimizer_states']",
        )


def module_state_of(state: Mapping[str, object], source: object) -> StateDict:
    """The module's entry of a strategy's state (``"state_dict"``).

    Raises:
        CheckpointError: There is none; for what `load_checkpoint` gave back, saying
            that the call restores the module itself, and the line to write.
    """
    module_state = state.get("state_dict")
    if isinstance(state, Leftover) and not isinstance(module_state, Mapping):
        raise CheckpointError(
            str(source),
            "is what load_checkpoint(path, model) gave back: that call restores the module "
            "in place, leaves every optimizer as it was, and gives back only the run's "
            f"entries ({', '.join(map(repr, state)) or 'none'}), never the module's or the "
            "optimizers' states for set_state_dict",
            fix="restore the module and its optimizers in one call: "
            "strategy.load_checkpoint(path, {'model': model, 'optimizer': optimizer}); or read "
            "first and restore after looking: checkpoint = strategy.read_checkpoint(path, "
            "model), then strategy.set_state_dict(model, [optimizer], checkpoint)",
        )
    if not isinstance(module_state, Mapping):
        raise CheckpointError(
            str(source),
            "holds no module state ('state_dict')",
            fix="load a checkpoint saved with the module in it; a file of a module's bare "
            "state_dict() (torch.save(model.state_dict(), path)) loads into the module "
            "alone: strategy.load_checkpoint(path, model)",
        )
    return dict(module_state)


def optimizer_states_of(state: Mapping[str, object], count: int, source: object) -> list[StateDict]:
    """The ``count`` optimizer states of a strategy's state (``"optimizer_states"``).

    Raises:
        CheckpointError: It holds another number of them, or one is not a mapping.
    """
    saved = state.get("optimizer_states")
    saved = list(saved) if isinstance(saved, list | tuple) else []
    if len(saved) != count:
        raise CheckpointError(
            str(source),
            f"holds {len(saved)} optimizer states, and there are {count} optimizers",
            fix="resume with the configuration the checkpoint was written with",
        )
    if not all(isinstance(one, Mapping) for one in saved):
        raise CheckpointError(str(source), "holds an optimizer state that is not a mapping")
    # DCP writes no entry for an empty mapping: an optimizer without per-parameter
    # state (plain SGD) comes back without its "state".
    return [_integer_keys({"state": {}, **one}) for one in saved]


def _integer_keys(optimizer_state: Mapping[str, object]) -> StateDict:
    # torch keys an optimizer's per-parameter state by the integer index its
    # param_groups list. DCP (and torch_xla's planner) write every mapping key as a
    # string, so the state comes back keyed "0", "1", ...: given to load_state_dict
    # so, it would be kept beside the parameters' own state, unused, and training
    # would go on from fresh moments. State keyed by name (FSDP's) is left alone.
    groups = optimizer_state.get("param_groups")
    per_parameter = optimizer_state.get("state")
    indexed = isinstance(groups, list | tuple) and all(
        isinstance(group, Mapping)
        and all(isinstance(index, int) for index in group.get("params", ()))
        for group in groups
    )
    if not indexed or not isinstance(per_parameter, Mapping):
        return dict(optimizer_state)
    restored = {
        int(key) if isinstance(key, str) and key.isdigit() else key: value
        for key, value in per_parameter.items()
    }
    return {**optimizer_state, "state": restored}


# The prefix activation checkpointing adds to a wrapped submodule's names.
WRAPPER_PREFIXES: Final = ("_checkpoint_wrapped_module.", "_orig_mod.")


def optimizer_parameter_names(
    module: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> list[str]:
    """The names in ``module`` of ``optimizer``'s parameters, in the optimizer's order.

    The names are the user module's (no wrapper prefixes): those a checkpoint keys
    an optimizer's state by when it keys it by name.
    """
    return parameter_names(
        module, [parameter for group in optimizer.param_groups for parameter in group["params"]]
    )


def parameter_names(module: torch.nn.Module, parameters: Sequence[torch.Tensor]) -> list[str]:
    """The names in ``module`` of ``parameters``, in their order, without wrapper prefixes.

    A parameter ``module`` does not hold is named ``""``.
    """
    names = {id(parameter): name for name, parameter in module.named_parameters()}
    ordered = []
    for parameter in parameters:
        name = names.get(id(parameter), "")
        for prefix in WRAPPER_PREFIXES:
            name = name.replace(prefix, "")
        ordered.append(name)
    return ordered


def optimizer_state_keyed(
    state: Mapping[str, object], names: list[str], *, by_name: bool, source: object
) -> StateDict:
    """``state`` keyed as a strategy loads it: by parameter name, or by index.

    torch's optimizers key their state by the index of each parameter in their
    groups (DDP, one device, DeepSpeed's whole states); `torch.distributed.checkpoint`
    keys it by the parameter's name (FSDP). ``names`` is the loading optimizer's
    parameters' names in its order, as `optimizer_parameter_names` gives them: a
    checkpoint moves between the two as torch's own loading does, by position.

    Raises:
        CheckpointError: The state holds another number of parameters, or names
            parameters the module does not have.
    """
    groups = state.get("param_groups")
    per_parameter = state.get("state")
    if not isinstance(groups, list | tuple) or not isinstance(per_parameter, Mapping):
        return dict(state)
    saved = [
        key for group in groups if isinstance(group, Mapping) for key in group.get("params", ())
    ]
    named = any(isinstance(key, str) and not key.isdigit() for key in saved)
    if named == by_name or not saved:
        return dict(state)
    mapping: dict[object, object]
    if by_name:
        if len(saved) != len(names):
            raise CheckpointError(
                str(source),
                f"holds optimizer state for {len(saved)} parameters, and the optimizer has "
                f"{len(names)}",
                fix="load into the model and optimizer the checkpoint was saved from",
            )
        mapping = {key: names[position] for position, key in enumerate(saved)}
        mapping |= {str(key): value for key, value in mapping.items()}
    else:
        unknown = sorted(str(key) for key in saved if key not in names)
        if unknown:
            raise CheckpointError(
                str(source),
                f"holds optimizer state for {', '.join(map(repr, unknown[:5]))}, which the "
                "optimizer's parameters do not include",
                fix="load into the model and optimizer the checkpoint was saved from",
            )
        mapping = {name: position for position, name in enumerate(names)}
    return {
        **state,
        "state": {mapping.get(key, key): value for key, value in per_parameter.items()},
        "param_groups": [
            {**group, "params": _in_order([mapping[key] for key in group.get("params", ())])}
            for group in groups
            if isinstance(group, Mapping)
        ],
    }


def _in_order(keys: list[object]) -> list[object]:
    # torch's loader pairs a group's saved parameters with the optimizer's by their
    # order: positions go in the optimizer's order whatever order the names came in
    # (a pipeline's stages list theirs stage by stage).
    positions = [key for key in keys if isinstance(key, int)]
    if len(positions) < len(keys):
        return keys
    ordered: list[object] = [*sorted(positions)]
    return ordered


def load_param_groups(optimizer: torch.optim.Optimizer, groups: object, source: object) -> None:
    """Set ``optimizer``'s groups' hyper-parameters from a state's ``param_groups``.

    In order, a group for a group, leaving each group's parameters: the learning rate
    a scheduler set comes back with the state, as torch's own loading brings it.

    Raises:
        CheckpointError: The state holds another number of groups.
    """
    saved = list(groups) if isinstance(groups, list | tuple) else []
    if len(saved) != len(optimizer.param_groups):
        raise CheckpointError(
            str(source),
            f"holds {len(saved)} optimizer parameter groups, and the optimizer has "
            f"{len(optimizer.param_groups)}",
            fix="build the optimizer with the parameter groups the checkpoint was saved with",
        )
    for group, kept in zip(optimizer.param_groups, saved, strict=True):
        if isinstance(kept, Mapping):
            group.update({key: value for key, value in kept.items() if key != "params"})


def is_dtensor(value: object) -> bool:
    """Whether ``value`` is a DTensor."""
    # By its method, not its class: torch.distributed.tensor is slow to import.
    return isinstance(value, torch.Tensor) and callable(getattr(value, "full_tensor", None))


def unwrapped_name(prefix: str) -> str:
    """A submodule's name as state dicts write it (without a wrapper's), with its dot."""
    name = f"{prefix}." if prefix else ""
    for wrapper in WRAPPER_PREFIXES:
        name = name.replace(wrapper, "")
    return name


def first_ranks_buffers(
    module: torch.nn.Module,
    state: StateDict,
    sources: Sequence[tuple[dist.ProcessGroup | None, int]],
) -> StateDict:
    """``state`` with one rank's values of the module's buffers (every rank calls it).

    Each rank updates its buffers (BatchNorm's running statistics) from its own
    batches: FSDP never exchanges them, DDP sends rank 0's at the start of a forward
    only. A checkpoint holds one value of a tensor that is not sharded, and it is the
    first rank's (rank 0's, as one written from rank 0 alone holds), sent through
    ``sources`` in turn.
    """
    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        return state
    # By the names a state dict writes: without the wrappers' (activation
    # checkpointing's, compilation's).
    named = (unwrapped_name(name).removesuffix(".") for name, _ in module.named_buffers())
    names = [
        name
        for name in named
        if isinstance(state.get(name), torch.Tensor) and not is_dtensor(state[name])
    ]
    if not names:
        return state
    chosen = {}
    for name in names:
        value = state[name]
        assert isinstance(value, torch.Tensor)
        chosen[name] = value.detach().clone()
    for group, source in sources:
        for value in chosen.values():
            dist.broadcast(value, src=source, group=group)
    return {**state, **chosen}
