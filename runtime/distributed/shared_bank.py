"""The node-shared cold bank: each expert once per node, in host memory every rank of the node maps.

Every MoE layer's cold bank (all E experts) is one file in /dev/shm, created, sized, NUMA-placed
and filled by the node's local rank 0 and mapped shared by the node's other ranks
(`probes.hostmem.HostPages.shared`: the one owner of host pages, their placement, CUDA
registration and lifetime). Each rank registers its own mapping for its own GPU. Once every rank
has mapped the files, local rank 0 unlinks them: the pages live while a rank maps them, and
nothing stays behind in /dev/shm when a rank dies. A rank's private memory holds only its hot
slots (on the device) and what a single-rank run holds besides the banks.

`SharedAllocator` has the interface of `runtime.pinned.PinnedAllocator` (`alloc`, `device_address`
and the byte counters), so `ExpertBank` builds on it unchanged; `fills` tells a bank whether this
rank writes the weights (local rank 0) or finds them written.
"""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass, field

import torch
from hotsplit_probes.hostmem import HostPages

from ..pinned import NumaPolicy, _Slab, slab_device_address
from .leftovers import SHM_DIR, names_in, owner_tag


def _job_name(job: str) -> str:
    """The job id as it appears in the file names (`hotsplit-<name>-node<n>-<slab>`)."""
    return "hotsplit-" + "".join(c if c.isalnum() or c in "-_" else "_" for c in job)


def shm_prefix(job: str, node: int) -> str:
    """Where one node's cold bank files of one job live (`<prefix><slab>`). The name records the
    job's owner on this node, the ranks' parent (the launcher, or torchrun's agent), so that a
    later run can tell the files of a job killed during set-up (`leftovers.remove_ended`)."""
    return os.path.join(SHM_DIR, f"{_job_name(job)}-node{node}-{owner_tag(os.getppid())}-")


@dataclass
class SharedAllocator:
    """Allocates cold bank slabs shared by the ranks of one node (see the module docstring).
    `creator`: this rank creates and fills the files (the node's local rank 0)."""

    prefix: str
    creator: bool
    numa: NumaPolicy
    pin: bool = False  # register each mapping with CUDA (a GPU run)
    requested_bytes: int = 0
    reserved_bytes: int = 0
    method: str = ""
    fallback: str | None = None
    slabs: list[_Slab] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)

    @property
    def fills(self) -> bool:
        return self.creator

    def alloc(self, n_bytes: int) -> torch.Tensor:
        path = f"{self.prefix}{len(self.paths)}"
        node, mode = self.numa.node_mode()
        pages = HostPages.shared(path, n_bytes, self.creator, node, mode,
                                 torch.cuda.cudart() if self.pin else None)
        self.paths.append(path)
        if pages.bind_error:
            self.numa.applied, self.numa.reason = False, pages.bind_error
        registered = pages.registered
        if self.pin and not registered:
            self.fallback = f"{pages.register_error}: the cold bank is read through pageable memory"
        self.method = "shared, cudaHostRegister" if registered else "shared"
        if self.creator:
            self.numa.count_located(pages.location)
        self.requested_bytes += n_bytes
        self.reserved_bytes += pages.size_bytes
        self.slabs.append(_Slab(pages.address, pages.device_address, pages.size_bytes, weakref.ref(pages),
                                pages.location))
        return pages.tensor()

    def device_address(self, host_tensor: torch.Tensor) -> int:
        return slab_device_address(self.slabs, host_tensor)

    def unlink(self) -> None:
        """Remove the files (the creator, once every rank has mapped them); mappings stay valid."""
        if not self.creator:
            return
        for path in self.paths:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


def remove_leftovers(prefix_dir: str, job: str) -> list[str]:
    """Unlink the cold bank files of every job whose id starts with `job` left in /dev/shm (ranks
    killed before they were unlinked); returns what was removed. Called by the launcher after
    its ranks are gone."""
    removed = []
    for name in names_in(prefix_dir):
        if name.startswith(f"{_job_name(job)}-"):
            try:
                os.unlink(os.path.join(prefix_dir, name))
            except OSError:
                continue
            removed.append(name)
    return removed
