"""Data parallel training over XLA replicas: one process per device, started by torch_xla."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING

import torch
from typing_extensions import override

from plait.strategies.parallel import (
    DEFAULT_START_TIMEOUT,
    DEFAULT_TIMEOUT,
    ParallelStrategy,
    process_group_options,
)
from plait.strategies.xla import library
from plait.strategies.xla.device import OnXLADevice
from plait.strategies.xla.launcher import DEBUG_VARIABLES, XLALauncher

if TYPE_CHECKING:
    from plait.core import (
        Accelerator,
        CheckpointIO,
        ClusterEnvironment,
        GradientClipAlgorithm,
        Launcher,
        Precision,
    )

__all__ = ["XLAStrategy"]


class XLAStrategy(OnXLADevice, ParallelStrategy):
    """Data parallel training over XLA devices (TPU chips), one process each.

    torch_xla's launcher (``xmp.spawn``) starts one replica per device of the host;
    each holds the whole model, and before every optimizer step the gradients are
    averaged across replicas by XLA's all-reduce on the devices' own interconnect
    (XLA sums; the strategy scales, so the update is that of the mean gradient, as
    under DDP). The graph is cut after every step, and batches reach the device
    through torch_xla's device loader.

    The collective contract (`reduce`, `broadcast`, `barrier`, `all_gather`) runs
    over a gloo group among the replicas' host processes, with its store: it carries
    the loop's small values (metrics, decisions, checkpoint paths), copied from the
    device and back, and keeps checked mode, which names a rank that disagrees or
    never arrives, where XLA's own rendezvous would hang.

    Checkpoints are copied to the CPU and written by rank 0 (the ``"xla"`` IO).

    Several replicas need XLA devices that torch_xla can join: TPUs. On XLA:CPU the
    launcher refuses more than one, since torch_xla cannot run collectives across
    XLA:CPU replicas (pytorch/xla issue 9089); one replica runs anywhere.

    ``accelerator``, ``cluster_environment``, ``precision`` (``precision_plugin``),
    ``timeout``, ``start_timeout`` and ``checked_collectives`` are `ParallelStrategy`'s;
    the accelerator is ``"xla"`` and the cluster environment ``"xla"`` (ranks read from
    torch_xla's runtime) by default.

    Args:
        parallel_devices: One XLA device per replica on this host (its length is
            what counts: each replica uses its own device).
        checkpoint_io: The checkpoint IO, or its name; ``"xla"`` by default.
        debug: Turn on torch_xla's debug output in the replicas (``PT_XLA_DEBUG_LEVEL``):
            why and where each step compiled or ran, and what moved between host and
            device. ``"xla_debug"`` is this strategy with ``debug=True``.

    Raises:
        ConfigurationError: torch_xla is not installed (the message names the extra)
            or does not import beside this torch, or a parallel device is not an XLA
            device.
    """

    def __init__(
        self,
        *,
        accelerator: Accelerator | str | None = None,
        parallel_devices: Sequence[torch.device] | None = None,
        cluster_environment: ClusterEnvironment | str | None = None,
        precision: Precision | str | None = None,
        precision_plugin: Precision | str | None = None,
        checkpoint_io: CheckpointIO | str | None = None,
        debug: bool = False,
        timeout: timedelta = DEFAULT_TIMEOUT,
        start_timeout: timedelta = DEFAULT_START_TIMEOUT,
        checked_collectives: bool = True,
    ) -> None:
        self._xla = library.import_torch_xla()
        for device in parallel_devices or ():
            library.require_xla_device(device)
        self.debug = debug
        self._averaged: set[int] = set()
        self._device_fixed = False
        super().__init__(
            **process_group_options(
                locals(),
                accelerator=accelerator or "xla",
                cluster_environment=cluster_environment or "xla",
                checkpoint_io=checkpoint_io or "xla",
                process_group_backend="gloo",
            )
        )

    @override
    def default_device_type(self) -> str:
        return "xla"

    @override
    def _choose_device(self) -> torch.device:
        # The replica's own device is known once torch_xla has started it (asking
        # earlier would start the runtime in the launching process, which keeps
        # torch_xla's launcher from starting replicas): see `root_device`.
        return torch.device("xla")

    @property
    @override
    def root_device(self) -> torch.device:
        """This replica's XLA device (asked of torch_xla once the replica runs)."""
        if not self._device_fixed and library.runtime_is_initialized():
            self._root_device = self._xla.device()
            self._device_fixed = True
        return self._root_device

    @property
    def num_processes(self) -> int:
        """How many replicas on this host: one per parallel device (1 by default)."""
        return len(self._parallel_devices) if self._parallel_devices else 1

    @property
    def launcher(self) -> Launcher:
        """torch_xla's launcher, with the debug switches when ``debug`` is on."""
        return XLALauncher(
            self.num_processes,
            self.cluster_environment,
            devices_on_host=self.accelerator.auto_device_count(),
            variables=DEBUG_VARIABLES if self.debug else None,
        )

    @override
    def setup_environment(self) -> None:
        """Fix this replica's device, then join the group as every parallel strategy does."""
        self._root_device = self._xla.device()
        self._device_fixed = True
        super().setup_environment()

    def _average_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        # Once per step: clipping, then the step, see the averaged gradients.
        if id(optimizer) not in self._averaged:
            library.xla_model().reduce_gradients(optimizer)
            self._averaged.add(id(optimizer))

    @override
    def clip_gradients(
        self,
        module: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        clip_val: float,
        algorithm: GradientClipAlgorithm = "norm",
    ) -> torch.Tensor | None:
        """Clip the gradients averaged across replicas, as DDP does."""
        self._average_gradients(optimizer)
        return super().clip_gradients(module, optimizer, clip_val, algorithm)

    @override
    def optimizer_step(
        self,
        optimizer: torch.optim.Optimizer,
        closure: Callable[[], object] | None = None,
    ) -> object:
        """Average the gradients across replicas, step, then run the step's graph.

        With a ``closure`` (which computes the gradients), they are averaged after it.
        """
        if closure is None:
            self._average_gradients(optimizer)
            stepped = closure
        else:
            given = closure

            def stepped() -> object:
                self._averaged.discard(id(optimizer))
                loss = given()
                self._average_gradients(optimizer)
                return loss

        try:
            result = super().optimizer_step(optimizer, stepped)
        finally:
            self._averaged.discard(id(optimizer))
        self._xla.sync()
        return result

    @override
    def __repr__(self) -> str:
        debug = ", debug=True" if self.debug else ""
        return f"{type(self).__name__}(num_processes={self.num_processes}{debug})"
