"""`MeshStrategy`: a strategy whose module lives as DTensors over a device mesh.

FSDP shards each parameter over the mesh's data-parallel ranks; model parallelism
splits them over tensor-parallel ranks too. Either way the module's and optimizers'
state is read and loaded through ``torch.distributed.checkpoint.state_dict`` (each
rank its own shards), and checkpoints through DCP: what this base class holds.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch
import torch.distributed as dist
from typing_extensions import override

from plait.core import ConfigurationError, SupportsLoadInPlace
from plait.strategies import meta
from plait.strategies.mesh_plan import FLATTENED_DIMENSIONS, MeshDim, MeshShape
from plait.strategies.self_launching import SelfLaunchingStrategy
from plait.strategies.state import (
    check_state_fits,
    first_ranks_buffers,
    is_dtensor,
    load_param_groups,
    module_state_of,
    optimizer_parameter_names,
    optimizer_state_keyed,
    optimizer_states_of,
    unwrapped_name,
)

if TYPE_CHECKING:
    from torch.distributed.checkpoint.state_dict import StateDictOptions
    from torch.distributed.device_mesh import DeviceMesh

    from plait.core.typing import Checkpoint, PathLike, StateDict

__all__ = [
    "MeshStrategy",
    "NamedAsWhole",
    "check_parallelized",
    "is_dtensor",
    "names_parts_as_whole",
]


@runtime_checkable
class NamedAsWhole(Protocol):
    """A module whose state is keyed by another module's names: a pipeline's stages."""

    def whole_names(self) -> dict[str, str]:
        """Each parameter's and buffer's name here to its name in the whole module."""
        ...


def _renaming(module: torch.nn.Module) -> dict[str, str]:
    # Names in the module to names in its state: those of every submodule named as
    # a whole (a pipeline's stages, wherever they sit).
    names: dict[str, str] = {}
    for prefix, submodule in module.named_modules():
        if isinstance(submodule, NamedAsWhole):
            within = unwrapped_name(prefix)
            for own, whole in submodule.whole_names().items():
                names[f"{within}{own}"] = f"{within}{whole}"
    return names


def names_parts_as_whole(module: torch.nn.Module) -> bool:
    """Whether ``module`` holds parts keyed by another module's names (a pipeline's)."""
    return any(isinstance(submodule, NamedAsWhole) for submodule in module.modules())


def _renamed_model(state: Mapping[str, object], names: Mapping[str, str]) -> StateDict:
    return {names.get(key, key): value for key, value in state.items()}


def _renamed_optimizer(state: Mapping[str, object], names: Mapping[str, str]) -> StateDict:
    # torch's optimizer state by name: per-parameter state, and groups listing names.
    if not names:
        return dict(state)
    per_parameter = state.get("state", {})
    groups = state.get("param_groups", [])
    assert isinstance(per_parameter, Mapping)
    assert isinstance(groups, list)
    return {
        **state,
        "state": {names.get(key, key): value for key, value in per_parameter.items()},
        "param_groups": [
            {**group, "params": [names.get(name, name) for name in group["params"]]}
            for group in groups
        ],
    }


def _repoint(
    optimizer: torch.optim.Optimizer,
    names: Mapping[int, str],
    parameters: Mapping[str, torch.nn.Parameter],
    index: int,
) -> torch.optim.Optimizer:
    # Sharding replaces each parameter by a DTensor: the optimizer's groups are
    # pointed at the new ones, in place, so the optimizer stays the object the user
    # (and a learning-rate scheduler made over it) holds.
    groups = [
        [parameters[names[id(p)]] for p in group["params"]] for group in optimizer.param_groups
    ]
    moved = any(
        new is not old
        for group, params in zip(optimizer.param_groups, groups, strict=True)
        for old, new in zip(group["params"], params, strict=True)
    )
    if moved and optimizer.state:
        raise ConfigurationError(
            f"optimizer {index} ({type(optimizer).__name__}) has stepped already, over the "
            "whole parameters: its state cannot move to the shards",
            value=optimizer,
            fix="make the optimizer (or load its state) after the module is set up, or pass "
            "it to setup_module_and_optimizers before its first step",
        )
    for group, params in zip(optimizer.param_groups, groups, strict=True):
        group["params"] = params
    return optimizer


class MeshStrategy(SelfLaunchingStrategy):
    """A process-group strategy whose module's parameters are DTensors over `device_mesh`.

    Subclasses build the mesh (`setup_environment`), turn the module into DTensors
    (`wrap_module`, recording the parameters' names first with
    `remember_parameter_names`), and set ``state_dict_type``: ``"sharded"`` (each
    rank its shards; checkpoints through DCP, loadable at any world size or mesh
    shape) or ``"full"`` (the whole state gathered on rank 0).
    """

    state_dict_type: str = "sharded"
    _mesh: DeviceMesh | None = None
    _optimizers: Sequence[torch.optim.Optimizer] = ()
    _names: Mapping[int, str] = {}

    @property
    def device_mesh(self) -> DeviceMesh:
        """The mesh the module's parameters live on.

        Raises:
            ConfigurationError: `setup_environment` has not run yet.
        """
        if self._mesh is None:
            raise ConfigurationError(
                "the strategy has no device mesh before it joins its process group",
                fix="call strategy.setup_environment() first",
            )
        return self._mesh

    def subgroup(self, rows: torch.Tensor) -> dist.ProcessGroup:
        """A process group per row of ``rows`` (global ranks); this rank's is returned.

        Every rank makes every group, in the same order, with the strategy's
        collective timeout and backend (a mesh made by ``init_device_mesh`` would
        take torch's defaults).
        """
        mine, _ = dist.new_subgroups_by_enumeration(  # type: ignore[no-untyped-call]
            [row.tolist() for row in rows],
            timeout=self.timeout,
            backend=self.process_group_backend,
        )
        group: dist.ProcessGroup = mine
        return group

    @contextlib.contextmanager
    @override
    def model_sharded_context(self) -> Iterator[None]:
        """Build the model on the meta device: no memory until set-up shards it.

        Set-up gives each rank only its shards and calls every submodule's
        ``reset_parameters()`` to initialise them; a submodule with tensors of its own
        and no ``reset_parameters()`` is refused (named) before anything is sharded.
        """
        with torch.device("meta"):
            yield

    @property
    @override
    def shards_module(self) -> bool:
        """Each rank holds only its shards of the parameters (DTensors over the mesh)."""
        return True

    @override
    def model_to_device(self, module: torch.nn.Module) -> torch.nn.Module:
        """Move ``module`` to the device, unless it is on the meta device (sharded first)."""
        if meta.is_meta(module):
            return module
        return super().model_to_device(module)

    def remember_parameter_names(self, module: torch.nn.Module) -> None:
        """Record ``module``'s parameters' names, before they are replaced by DTensors.

        Optimizers made over the parameters before set-up are pointed at their
        DTensor twins by name (`setup_optimizers`).
        """
        self._names = {id(parameter): name for name, parameter in module.named_parameters()}

    @override
    def setup_optimizers(
        self, optimizers: Sequence[torch.optim.Optimizer]
    ) -> list[torch.optim.Optimizer]:
        """Point each optimizer at the sharded parameters of the set-up module, in place.

        The optimizers, made over the module's parameters before set-up, are the
        ones returned: their groups now hold the shards, so a learning-rate
        scheduler made over one drives it as it is.

        Raises:
            ConfigurationError: No module was set up yet, or an optimizer has stepped
                over the whole parameters already.
        """
        if self._model is None:
            raise ConfigurationError(
                "the optimizers are pointed at the sharded parameters, and no module "
                "was set up yet",
                fix="call strategy.setup_module(module) first, or "
                "setup_module_and_optimizers(module, optimizers)",
            )
        sharded = dict(self._model.named_parameters())
        self._optimizers = [
            _repoint(optimizer, self._names, sharded, index)
            for index, optimizer in enumerate(optimizers)
        ]
        return list(self._optimizers)

    # State.

    def _options(self, *, full: bool) -> StateDictOptions:
        from torch.distributed.checkpoint.state_dict import StateDictOptions  # noqa: PLC0415

        if full:
            return StateDictOptions(full_state_dict=True, cpu_offload=True)
        return StateDictOptions(full_state_dict=False)

    def _optimizer_state(
        self, module: torch.nn.Module, optimizer: torch.optim.Optimizer, options: StateDictOptions
    ) -> StateDict:
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict  # noqa: PLC0415

        fresh = not optimizer.state
        state = get_optimizer_state_dict(module, optimizer, options=options)
        if fresh:
            # torch initialises an optimizer that never stepped by stepping it (with a
            # learning rate of 0), which counts a step in Adam's bias correction: an
            # optimizer that never stepped is left, and saved, as it was.
            optimizer.state.clear()
            state = {**state, "state": {}}
        return _renamed_optimizer(state, _renaming(module))

    def _module_state(self, module: torch.nn.Module, options: StateDictOptions) -> StateDict:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict  # noqa: PLC0415

        state = get_model_state_dict(module, options=options)
        if not options.full_state_dict:
            state = first_ranks_buffers(module, state, self.buffer_sources())
        return _renamed_model(state, _renaming(module))

    def buffer_sources(self) -> list[tuple[dist.ProcessGroup | None, int]]:
        """Where a sharded checkpoint's buffers come from: broadcasts, in order.

        Each is a group (None: the world) and the global rank it takes them from;
        by default rank 0's, over the world. Every rank holding the same buffers
        must end with one rank's values.
        """
        return [(None, 0)]

    @override
    def get_state_dict(
        self, module: torch.nn.Module, optimizers: Sequence[torch.optim.Optimizer] = ()
    ) -> Checkpoint:
        """The state of ``module`` and ``optimizers``, by parameter name; every rank calls it.

        With ``state_dict_type="sharded"``, each rank's shards (DTensors); with
        ``"full"``, the whole state on rank 0 (on the CPU) and nothing elsewhere.
        """
        options = self._options(full=self.state_dict_type == "full")
        return {
            "state_dict": self._module_state(module, options),
            "optimizer_states": [self._optimizer_state(module, o, options) for o in optimizers],
            "precision": self.precision.state_dict(),
        }

    @override
    def full_module_state(self, module: torch.nn.Module) -> StateDict:
        """The whole state, gathered shard by shard to rank 0's CPU (empty elsewhere)."""
        return self._module_state(module, self._options(full=True))

    @override
    def set_state_dict(
        self,
        module: torch.nn.Module,
        optimizers: Sequence[torch.optim.Optimizer],
        state: Mapping[str, object],
        *,
        source: object = "the state",
    ) -> None:
        """Load a sharded or a full state (saved at any world size) into the shards.

        Every rank calls it. A full state is one each rank can read whole (it takes
        its shards from it); a sharded one holds this rank's DTensors.

        Raises:
            CheckpointError: The state does not fit the module (each key that differs
                is named), or holds another number of optimizer states.
        """
        from torch.distributed.checkpoint.state_dict import (  # noqa: PLC0415
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        module_state = module_state_of(state, source)
        live = self._module_state(module, self._options(full=False))
        check_state_fits(live, module_state, source)
        full = not any(is_dtensor(value) for value in module_state.values())
        options = self._options(full=full)
        outward = _renaming(module)
        inward = {whole: own for own, whole in outward.items()}
        set_model_state_dict(module, _renamed_model(module_state, inward), options=options)
        if not optimizers:
            return
        saved = optimizer_states_of(state, len(optimizers), source)
        for optimizer, keyed in zip(optimizers, saved, strict=True):
            # Another strategy's (torch's) states are keyed by index; DCP's by name.
            names = [outward.get(n, n) for n in optimizer_parameter_names(module, optimizer)]
            optimizer_state = optimizer_state_keyed(keyed, names, by_name=True, source=source)
            if optimizer_state["state"]:
                own = _renamed_optimizer(optimizer_state, inward)
                set_optimizer_state_dict(module, optimizer, own, options=options)
                continue
            # No per-parameter state (saved before the first step, or plain SGD): the
            # groups' hyper-parameters alone, as torch's loader would initialise the
            # state by stepping (which counts a step in Adam's bias correction).
            load_param_groups(optimizer, optimizer_state.get("param_groups"), source)
        precision_state = state.get("precision")
        self.precision.load_state_dict(
            dict(precision_state) if isinstance(precision_state, Mapping) else {}
        )

    @override
    def read_in_place(
        self,
        path: PathLike,
        module: torch.nn.Module | None,
        *,
        weights_only: bool,
        recognized: bool,
    ) -> Checkpoint | None:
        """A sharded checkpoint read in place (with ``module``, after set-up).

        Each rank reads its shards of the module's and the optimizers' state,
        whatever the world size that saved it. A full one (``None``) is read whole on
        every rank, on the CPU, by the checkpoint IO.
        """
        io = self.checkpoint_io
        if module is None or not isinstance(io, SupportsLoadInPlace):
            return None
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict  # noqa: PLC0415

        # The live shards to read into; an optimizer that never stepped is given its
        # state first (torch steps it with a learning rate of 0), to be overwritten.
        options = self._options(full=False)
        target: StateDict = {"state_dict": self._module_state(module, options)}
        outward = _renaming(module)
        if self._optimizers and not weights_only:  # to go on training
            target["optimizer_states"] = [
                _renamed_optimizer(
                    get_optimizer_state_dict(module, optimizer, options=options), outward
                )
                for optimizer in self._optimizers
            ]
        return io.load_checkpoint_into(path, target)

    @override
    def teardown(self) -> None:
        """Reshard the module, forget the mesh and the optimizers, release the parts.

        The module is left holding its shards (an FSDP root that keeps its
        parameters gathered after forward frees them): the next run of the job, and
        the optimizers it makes, see the sharded parameters.
        """
        if self._model is not None:
            from torch.distributed.fsdp import FSDPModule  # noqa: PLC0415

            for module in self._model.modules():
                if isinstance(module, FSDPModule):
                    module.reshard()
        self._mesh = None
        self._optimizers = []
        self._names = {}
        super().teardown()


def check_parallelized(module: torch.nn.Module, shape: MeshShape) -> None:
    """Refuse a module that was not parallelized over the mesh of ``shape`` as it must be.

    Raises:
        ConfigurationError: No parameter is a DTensor (nothing parallelized the
            module), or, with several data-parallel or context-parallel ranks, some
            parameters are not sharded over those dimensions (nothing would average
            or sum their gradients).
    """
    parameters = list(module.named_parameters())
    if not parameters or shape.world_size == shape.pipeline:
        # One rank per stage: each holds its stages whole.
        return
    # Named as its user knows it: the module inside a wrapper (the Trainer's).
    described = type(getattr(module, "module", module)).__name__
    if not any(is_dtensor(p) for _, p in parameters):
        raise ConfigurationError(
            f"ModelParallelStrategy got a {described} that nothing "
            "parallelized: the strategy never guesses a plan, and every rank would "
            "train a whole copy",
            value=described,
            fix="parallelize it over strategy.device_mesh: with the Trainer, in the "
            "module's configure_model (self.device_mesh); in your own loop, before "
            "setup_module (parallelize_module(..., mesh['tp'], plan), then "
            "fully_shard(..., mesh=mesh['dp_shard']))",
        )
    needed = [
        name for name in (MeshDim.REPLICATE, MeshDim.SHARD, MeshDim.CONTEXT) if shape.enabled(name)
    ]
    unsynced = [name for name, p in parameters if not set(needed) <= set(_mesh_dimensions_of(p))]
    shown = ", ".join(unsynced[:3]) + (", ..." if len(unsynced) > 3 else "")
    if unsynced and MeshDim.CONTEXT in needed:
        raise ConfigurationError(
            f"{len(unsynced)} parameters ({shown}) are not sharded over a mesh that "
            f"includes cp: each of the {shape.context} context-parallel ranks computes "
            "their gradients from its own slice of the sequences, and nothing would "
            "sum them",
            value=unsynced,
            fix="call fully_shard on each block and on the root over "
            "strategy.data_parallel_mesh (dp_shard and cp flattened, 'dp_shard_cp')",
        )
    needed = [name for name in needed if name != MeshDim.CONTEXT]
    if unsynced:
        raise ConfigurationError(
            f"{len(unsynced)} parameters ({shown}) are not sharded over the mesh's "
            f"data-parallel dimensions {needed}: their gradients would not be averaged "
            f"across the {shape.data_parallel} data-parallel ranks, which would drift apart",
            value=unsynced,
            fix="after parallelize_module, call fully_shard on each block and on the "
            "root over mesh['dp_shard'] (mesh['dp_replicate', 'dp_shard'] with "
            "replicas)",
        )


def _mesh_dimensions_of(parameter: torch.Tensor) -> tuple[str, ...]:
    # The named dimensions a DTensor parameter is laid out over (none for a tensor),
    # a flattened one as the dimensions it flattens.
    if not is_dtensor(parameter):
        return ()
    names = getattr(getattr(parameter, "device_mesh", None), "mesh_dim_names", None)
    return tuple(
        dimension for name in names or () for dimension in FLATTENED_DIMENSIONS.get(name, (name,))
    )
