"""The node-shared cold bank (docs/runtime.md, "The shared cold bank"): each layer's cold bank is
one /dev/shm file, created, NUMA-placed and filled by the node's local rank 0 and mapped by its
other ranks (`probes.hostmem.HostPages.shared`), unlinked once every rank has mapped it so that
nothing stays behind when a rank dies. `SharedAllocator` is a `PinnedAllocator` whose slabs are
those files, so the banks build on it unchanged."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch
from hotsplit_probes.hostmem import HostPages

from ..pinned import PinnedAllocator, _Slab
from .leftovers import SHM_DIR, names_in, owner_tag


def _job_name(job: str) -> str:
    """The job id as it appears in the file names (`hotsplit-<name>-node<n>-<slab>`)."""
    return "hotsplit-" + "".join(c if c.isalnum() or c in "-_" else "_" for c in job)


def shm_prefix(job: str, node: int) -> str:
    """Where one node's cold bank files of one job live (`<prefix><slab>`); the name records the
    job's owner on this node, the ranks' parent, so that a later run finds a killed job's files."""
    return os.path.join(SHM_DIR, f"{_job_name(job)}-node{node}-{owner_tag(os.getppid())}-")


@dataclass
class SharedAllocator(PinnedAllocator):
    """Cold bank slabs shared by the ranks of one node. `creator`: this rank creates and fills the
    files (the node's local rank 0); `pin`: each mapping is registered with CUDA."""

    prefix: str = ""
    creator: bool = False
    paths: list[str] = field(default_factory=list)

    @property
    def fills(self) -> bool:
        return self.creator

    def _slab(self, n_bytes: int) -> tuple[torch.Tensor, _Slab]:
        path = f"{self.prefix}{len(self.paths)}"
        pages = HostPages.shared(path, n_bytes, self.creator, *self.numa.node_mode(),
                                 torch.cuda.cudart() if self.pin else None)
        self.paths.append(path)
        self.numa.note_bind_error(pages.bind_error)
        if self.pin and not pages.registered:
            self.fallback = f"{pages.register_error}: the cold bank is read through pageable memory"
        self.method = "shared, cudaHostRegister" if pages.registered else "shared"
        return pages.tensor(), _Slab.of(pages)

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
    """The launcher, once its ranks are gone: unlink the files of every job whose id starts with `job`."""
    removed = []
    for name in names_in(prefix_dir):
        if name.startswith(f"{_job_name(job)}-"):
            try:
                os.unlink(os.path.join(prefix_dir, name))
            except OSError:
                continue
            removed.append(name)
    return removed
