"""The setup every run makes before it builds a model, synthetic or checkpoint: the platform
file read once, the device, the refusal of an fp8 bank the CPU would compute, and the cold
bank's NUMA policy. It allocates nothing, so a refusal here costs no memory."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hotsplit_cli.config.knobs import Knobs
from hotsplit_cli.config.platform_file import load_platform
from hotsplit_cli.config.recipe import Recipe
from hotsplit_cli.core.errors import UsageError

from .cold_split import FP8_REFUSAL
from .device import DeviceInfo, choose_device
from .pinned import NumaPolicy, PinnedAllocator, numa_policy_for


@dataclass
class RunSetup:
    platform: object | None  # the --platform file's contents, or None
    info: DeviceInfo
    numa: NumaPolicy  # where the cold bank goes

    def allocator(self) -> PinnedAllocator:
        """A private pinned cold bank (an expert-parallel rank maps its node's shared one)."""
        return PinnedAllocator(pin=self.info.pinned, numa=self.numa)


def setup_run(recipe: Recipe, knobs: Knobs, platform_path: str | Path | None, device: str,
              fp8_kept: Callable[[DeviceInfo], bool]) -> RunSetup:
    """`device`: the device requested of this rank; `fp8_kept(info)`: whether the banks would
    hold fp8 experts on that device (the CPU cold path cannot compute them)."""
    platform = load_platform(platform_path) if platform_path is not None else None  # read once, before the work
    info = choose_device(device)
    if recipe.model.expert_dtype == "fp8" and knobs.cold_path != "gpu" and fp8_kept(info):
        raise UsageError(FP8_REFUSAL.format(mode=knobs.cold_path))
    return RunSetup(platform, info, numa_policy_for(knobs.numa_policy, info.numa_node, info.reasons.get("numa_node")))
