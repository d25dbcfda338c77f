"""A strategy's checkpoints: saved, loaded, read, removed and exported, on every rank.

`Checkpoints` is the collaborator every strategy holds (`BaseStrategy.checkpoints`):
it turns the live objects a caller hands over (a module, its optimizers, `Stateful`
values) into a checkpoint through the strategy's state-dict functions, writes it
through the strategy's checkpoint IO, and restores one in place. The strategy
supplies only how it takes and sets state (`get_state_dict`, `set_state_dict`,
`full_module_state`) and, where it reads its own checkpoints in place (a mesh's
shards, DeepSpeed's engine), how (`CheckpointsHost.read_in_place`). A read is decided
here once: the checkpoint's format detected once, then read whole (another
strategy's), in place, or through the checkpoint IO.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

import torch

from plait.core import (
    CheckpointError,
    CheckpointFormat,
    CheckpointIORegistry,
    ConfigurationError,
    Strategy,
    SupportsAsyncCheckpoint,
    SupportsFormat,
    SupportsLoadInPlace,
    detect_checkpoint_format,
    is_collective,
)
from plait.strategies.state import (
    NAMES_KEY,
    Leftover,
    LiveState,
    module_state_of,
    saved_optimizer_names,
)

if TYPE_CHECKING:
    from plait.core.typing import Checkpoint, PathLike, StateDict

__all__ = ["Checkpoints", "CheckpointsHost", "checkpoint_and_path"]


def checkpoint_and_path(
    first: Mapping[str, object] | PathLike, second: PathLike | Mapping[str, object]
) -> tuple[Mapping[str, object], PathLike]:
    """``(checkpoint, path)`` from a save's two arguments, in either order.

    Lightning's strategies take ``(checkpoint, path)`` and Fabric's ``(path, state)``;
    a path is never a mapping, so either order is read unambiguously.

    Raises:
        ConfigurationError: Not one mapping and one path (a string or ``os.PathLike``).
    """
    if isinstance(first, Mapping) and isinstance(second, str | os.PathLike):
        return first, second
    if isinstance(second, Mapping) and isinstance(first, str | os.PathLike):
        return second, first
    raise ConfigurationError(
        f"save_checkpoint takes a checkpoint (a mapping) and a path, and was given a "
        f"{type(first).__name__} and a {type(second).__name__}",
        value=(first, second),
        fix="strategy.save_checkpoint({'model': model, 'optimizer': optimizer}, path)",
    )


def bare_module_state(checkpoint: Checkpoint) -> Checkpoint:
    """``checkpoint`` as a checkpoint of a module, if it is a module's bare ``state_dict()``.

    A mapping without the module's entry (``"state_dict"``) whose values are all
    tensors (``_extra_state`` entries aside) is a module's state as
    ``torch.save(model.state_dict(), path)`` writes it; anything else is returned as
    it is.
    """
    if "state_dict" in checkpoint or NAMES_KEY in checkpoint or not checkpoint:
        return checkpoint
    bare = all(
        isinstance(value, torch.Tensor) or key.endswith("_extra_state")
        for key, value in checkpoint.items()
    )
    return {"state_dict": dict(checkpoint)} if bare else checkpoint


class CheckpointsHost(Strategy, Protocol):
    """What `Checkpoints` needs of its strategy: a `Strategy` that also gives module states."""

    def module_state_dict(self, module: torch.nn.Module) -> StateDict:
        """The state of the user's module, without wrapper prefixes."""
        ...

    def full_module_state(self, module: torch.nn.Module) -> StateDict:
        """The module's whole state, on the CPU, with the user module's keys."""
        ...

    def module_state_fitted(
        self, module: torch.nn.Module, state_dict: Mapping[str, object]
    ) -> dict[str, object]:
        """The module's whole state, with ``state_dict``'s keys the module has over it."""
        ...

    def read_in_place(
        self,
        path: PathLike,
        module: torch.nn.Module | None,
        *,
        weights_only: bool,
        recognized: bool,
    ) -> Checkpoint | None:
        """A checkpoint of the IO's own format read the strategy's way; ``None``: the IO's.

        ``recognized``: whether a registered format recognized ``path`` (it is then the
        IO's own; a foreign one never comes here).
        """
        ...


class Checkpoints:
    """Save, load, read, remove and export a strategy's checkpoints.

    Args:
        strategy: The strategy whose state and checkpoint IO it uses.
    """

    def __init__(self, strategy: CheckpointsHost) -> None:
        self._strategy = strategy
        # Whether the checkpoint IO's load_checkpoint takes map_location, by the IO
        # it was decided for (a part may be assigned later): looked up once.
        self._map_location: tuple[object, bool] | None = None

    @property
    def collective(self) -> bool:
        """Whether every rank saves, loads and removes checkpoints, or rank 0 alone."""
        return is_collective(self._strategy.checkpoint_io)

    @property
    def native_format(self) -> str:
        """The name of the format the checkpoint IO writes, and reads itself.

        An IO that does not say (`plait.core.SupportsFormat`) is taken to write
        ``"distributed"`` directories if it loads in place, one ``"file"`` otherwise.
        """
        io = self._strategy.checkpoint_io
        if isinstance(io, SupportsFormat):
            return io.format
        return "distributed" if isinstance(io, SupportsLoadInPlace) else "file"

    def foreign(self, path: PathLike) -> CheckpointFormat | None:
        """The registered format of ``path`` if it is not `native_format`: read it whole.

        ``None`` for a checkpoint of the IO's own format, or of none registered (a
        URL the IO reads, say), which the checkpoint IO reads.
        """
        return self._foreign(detect_checkpoint_format(path))

    def _foreign(self, found: CheckpointFormat | None) -> CheckpointFormat | None:
        return found if found is not None and found.name != self.native_format else None

    def save(self, checkpoint: Mapping[str, object], path: PathLike) -> None:
        """Write ``checkpoint`` (live objects or plain entries) through the checkpoint IO.

        Every rank calls it; rank 0 alone writes, unless the checkpoint IO is
        collective (each rank writes its part). Its values may be the live objects::

            strategy.save_checkpoint(
                {"model": model, "optimizer": optimizer, "scheduler": scheduler, "step": step},
                path,
            )

        The module's and its optimizers' states are taken as `get_state_dict` takes
        them (shards, or the engine's partitions, where the strategy keeps them so),
        each `Stateful`'s with its ``state_dict()``, and other values as they are;
        `load_checkpoint` with the same mapping restores each one in place. A
        checkpoint of plain entries (a `get_state_dict` result, say) is written as it is.

        Fabric's order, ``(path, state)``, is read as well (`checkpoint_and_path`).

        Raises:
            ConfigurationError: The mapping holds two modules, optimizers without
                their module, or a name the checkpoint keeps for itself; or the two
                arguments are not a mapping and a path.

        Where rank 0 writes alone, the other ranks return before it has written: a
        loop that reads it back on them waits first (``strategy.barrier()``; the
        Trainer waits with its ``checkpoint_timeout``, a save may outlast the
        collective timeout). An IO that saves in the background
        (`plait.core.SupportsAsyncCheckpoint`) returns before writing on rank 0 too;
        `load` waits for such a save on every rank.
        """
        strategy = self._strategy
        checkpoint, path = checkpoint_and_path(checkpoint, path)
        live = LiveState.of(checkpoint)
        if live.is_live:
            checkpoint = self.of(live)
        if strategy.is_global_zero or self.collective:
            strategy.checkpoint_io.save_checkpoint(checkpoint, path)

    def of(self, live: LiveState) -> Checkpoint:
        """The checkpoint of ``live``: plain values, `Stateful` states, the module's state."""
        checkpoint: Checkpoint = dict(live.values)
        for name, stateful in live.stateful.items():
            checkpoint[name] = dict(stateful.state_dict())
        if live.module is not None:
            optimizers = list(live.optimizers.values())
            checkpoint.update(self._strategy.get_state_dict(live.module, optimizers))
            checkpoint[NAMES_KEY] = live.names()
        return checkpoint

    def load(
        self,
        path: PathLike,
        state: torch.nn.Module | Mapping[str, object] | None = None,
        *,
        weights_only: bool = False,
        strict: bool = True,
    ) -> Checkpoint:
        """Restore the checkpoint at ``path`` into ``state``, in place; what it did not take.

        ``state`` is the module `setup_module` returned, or a mapping like the one
        `save_checkpoint` was given: the module, its optimizers (their states and
        the precision's go on training), `Stateful` objects (``load_state_dict``)
        and values (the mapping's entries are replaced). Every strategy restores the
        same way: on a sharding strategy each rank reads only its shards. Every rank
        calls it.

        Without ``state`` nothing is restored: the whole checkpoint is returned, its
        tensors on the CPU (`read_checkpoint`).

        Given the module alone, a file of its bare ``state_dict()`` (``torch.save(
        model.state_dict(), path)``, what Fabric's ``load_raw`` reads) loads too.

        Where rank 0 alone writes through an IO that saves in the background
        (``checkpoint_io="async"``), every rank first waits until rank 0's saves are
        written: a checkpoint saved just before is read whole on every rank.

        The module alone (or a state without optimizers) restores the module and
        leaves every optimizer exactly as it was, its state not even read, on every
        strategy; ``weights_only=True`` does the same for a state with optimizers:
        to fine-tune with a fresh optimizer, or to start from a checkpoint of
        another kind of optimizer.

        A checkpoint of any registered format loads (`plait.core.CheckpointFormat`),
        the optimizers' states with it: a file into FSDP's shards, FSDP's shards
        into DDP, DeepSpeed's ZeRO partitions, rebuilt whole, anywhere (a DeepSpeed
        run of another stage or world size too), any of them into DeepSpeed's
        partitions, and a format a package of yours registers.

        ``strict=False`` (as Lightning's): the module takes the checkpoint's keys it
        has and keeps the rest of its values, the checkpoint's keys it lacks are
        dropped, and entries of ``state`` the checkpoint lacks are left as they were;
        the checkpoint is read whole on each rank. The optimizers' states must still
        fit.

        Returns:
            The checkpoint's entries that nothing in ``state`` took; where no
            optimizer was restored, the run's entries alone (never the module's or
            an optimizer's state). `set_state_dict` refuses it, naming the line to
            write: `read_checkpoint` is what returns states to restore by hand.

        Raises:
            CheckpointError: The checkpoint holds no state for the module, or of
                another model (each key that differs is named), another number of
                optimizers, or no entry for one of the state's names.
            ConfigurationError: ``state`` holds two modules, or optimizers without
                their module.
        """
        strategy = self._strategy
        self.settle()
        if state is None:
            return self.read(path)
        given: Mapping[str, object] = (
            {"module": state} if isinstance(state, torch.nn.Module) else state
        )
        live = LiveState.of(given)
        if weights_only:
            live.optimizers = {}
        # Without optimizers (the module alone, or weights_only) no optimizer's state
        # is read or restored: each optimizer of the strategy's stays as it was.
        alone = not live.optimizers
        # The module alone may be given a file of its bare state_dict() (Fabric's load_raw).
        raw = isinstance(state, torch.nn.Module)
        if strict:
            checkpoint = self.read(path, live.module, weights_only=alone)
            checkpoint = bare_module_state(checkpoint) if raw else checkpoint
        else:
            checkpoint = self._loose(path, live, weights_only=alone, raw=raw)
        live.check_held(checkpoint, given, os.fspath(path))  # before anything is restored
        if live.module is not None:
            module_state_of(checkpoint, os.fspath(path))  # a checkpoint of a module at all
            optimizers = live.order_optimizers(checkpoint, os.fspath(path))
            if optimizers and "optimizer_states" not in checkpoint:
                raise CheckpointError(
                    os.fspath(path),
                    "holds no optimizer state (the run that saved it had no optimizer, as "
                    "an engine made to evaluate has none, or saved the weights alone)",
                    fix="pass weights_only=True to load the weights and the rest alone (the "
                    "optimizers start afresh), or leave the optimizers out of the state",
                )
            strategy.set_state_dict(live.module, optimizers, checkpoint, source=os.fspath(path))
        left = live.restore(checkpoint, given, os.fspath(path))
        unread: list[str] = []
        if alone:
            for key in ("optimizer_states", "precision", NAMES_KEY):
                left.pop(key, None)
            unread = saved_optimizer_names(checkpoint) or []
        return Leftover(left, unread=unread, source=os.fspath(path))

    def _loose(
        self, path: PathLike, live: LiveState, *, weights_only: bool, raw: bool
    ) -> Checkpoint:
        """The checkpoint, read whole, fitted to what ``live`` holds (``strict=False``).

        The state's entries the checkpoint lacks are taken out of ``live`` (they stay
        as they were); the module's state is the module's own, with the checkpoint's
        keys the module has put over it.
        """
        strategy = self._strategy
        checkpoint = dict(self.read(path, weights_only=weights_only))
        checkpoint = bare_module_state(checkpoint) if raw else checkpoint
        live.stateful = {k: v for k, v in live.stateful.items() if k in checkpoint}
        live.values = {k: v for k, v in live.values.items() if k in checkpoint}
        saved = checkpoint.get("state_dict")
        if live.module is not None and isinstance(saved, Mapping):
            checkpoint["state_dict"] = strategy.module_state_fitted(live.module, saved)
        return checkpoint

    def settle(self) -> None:
        """Wait until rank 0's background saves are written, on every rank (every rank calls it).

        Where rank 0 alone writes through an IO that saves in the background, the
        other ranks cannot tell whether a checkpoint they are about to read is
        complete: rank 0 waits for its saves, then every rank meets it. Nothing to
        do for a collective IO (each rank waits for its own part) or for one process.
        """
        strategy = self._strategy
        io = strategy.checkpoint_io
        if self.collective or strategy.world_size == 1:
            return
        if not isinstance(io, SupportsAsyncCheckpoint):
            return
        if strategy.is_global_zero:
            io.wait()
        strategy.barrier("load_checkpoint")

    def read(
        self, path: PathLike, module: torch.nn.Module | None = None, *, weights_only: bool = False
    ) -> Checkpoint:
        """Read the checkpoint at ``path`` without restoring it, its tensors on the CPU.

        For a loop that restores the state itself (`set_state_dict`), after looking
        at the checkpoint (the Trainer's hooks do); `load_checkpoint` does both.

        `set_state_dict` copies them into the module's and optimizers' own tensors on
        their devices, so no device holds a second copy of the state. With ``module``
        (set up) and a checkpoint IO that loads in place, the module's state is read
        straight into its tensors instead, each rank reading only what it holds.
        """
        strategy = self._strategy
        io = strategy.checkpoint_io
        found = detect_checkpoint_format(path)  # once per read
        foreign = self._foreign(found)
        if foreign is not None:
            # Another strategy's checkpoint (a DeepSpeed directory, a sharded one for a
            # strategy that writes files, a file for one that writes shards): whole.
            return foreign.read_whole(path, optimizers=not weights_only)
        own = strategy.read_in_place(
            path, module, weights_only=weights_only, recognized=found is not None
        )
        if own is not None:
            return own
        if module is not None and isinstance(io, SupportsLoadInPlace):
            return io.load_checkpoint_into(path, {"state_dict": strategy.module_state_dict(module)})
        if self._takes_map_location(io):
            return io.load_checkpoint(path, map_location="cpu")
        return io.load_checkpoint(path)

    def _takes_map_location(self, io: object) -> bool:
        # A checkpoint IO of the user's may take no map_location (as Lightning's
        # examples write them): its signature is read once, not on every read.
        decided = self._map_location
        if decided is None or decided[0] is not io:
            load = getattr(io, "load_checkpoint", None)
            parameters = inspect.signature(load).parameters if callable(load) else {}
            takes = "map_location" in parameters or any(
                p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
            )
            decided = self._map_location = (io, takes)
        return decided[1]

    def remove(self, path: PathLike) -> None:
        """Delete the checkpoint at ``path``.

        Every rank calls it; rank 0 alone removes, unless the checkpoint IO is collective.
        """
        strategy = self._strategy
        if strategy.is_global_zero or self.collective:
            strategy.checkpoint_io.remove_checkpoint(path)

    def export(self, module: torch.nn.Module, path: PathLike) -> None:
        """Write the module's whole state as one file that a plain module loads.

        ``{"state_dict": ...}`` by ``torch.save`` (any fsspec URL), whatever the
        strategy and however it holds the module::

            model.load_state_dict(torch.load(path)["state_dict"])

        Every rank calls it; rank 0 writes, and every rank returns once the file is
        complete. For a checkpoint already written, `plait.strategies.consolidate_checkpoint`
        does the same in one process.
        """
        strategy = self._strategy
        state = strategy.full_module_state(module)
        if strategy.is_global_zero:
            CheckpointIORegistry.get("torch").save_checkpoint({"state_dict": state}, path)
        strategy.barrier("export_checkpoint")
