"""The cold bank's host slabs (docs/runtime.md, "Layout"): exact-size mappings
(`probes.hostmem.HostPages`), placed per the `numa_policy` knob with mbind before the first
touch and registered with `cudaHostRegister` on a GPU, pageable without CUDA. torch's pinned
allocator rounds up to a power of two (a DeepSeek-V3 layer of fp8 experts, 11.3 GB, would lock
16 GiB), so it is only the fallback where registration fails, with the reason recorded. A slab
lives as long as any tensor or device view of it, and is unregistered before it is unmapped.
Every slab's pages are located (move_pages(2) on a sample), so the report says where the bank
really is; whatever cannot be done is recorded with a reason, never raised."""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch
from hotsplit_probes.hostmem import (
    MPOL_BIND,
    MPOL_DEFAULT,
    MPOL_PREFERRED,
    VERIFIED_SHARE,
    HostPages,
    PageLocation,
    locate,
    set_mempolicy,
)
from hotsplit_probes.sysfs import list_numa_nodes


def round_up_pow2(n_bytes: int) -> int:
    """Smallest power of two >= n_bytes (1 for 0)."""
    if n_bytes < 0:
        raise ValueError(f"cannot allocate {n_bytes} bytes")
    return 1 if n_bytes <= 1 else 1 << (n_bytes - 1).bit_length()


@dataclass
class NumaPolicy:
    """The `numa_policy` knob as applied to the cold bank's slabs, and where their pages landed."""

    policy: str  # preferred | bind | off
    node: int | None  # target node
    applied: bool
    reason: str | None  # why not applied (or None)
    pages_by_node: dict[int, int] = field(default_factory=dict)  # located sample pages per node
    located: str | None = None  # why pages could not be located (or None)

    @property
    def verified(self) -> bool | None:
        """True when the policy was applied and the located pages sit on the target node;
        None when there is nothing to verify (no policy, or pages not located)."""
        total = sum(self.pages_by_node.values())
        if not self.applied or not total:
            return None
        return self.pages_by_node.get(self.node, 0) / total >= VERIFIED_SHARE

    def describe(self) -> str:
        """One line: the policy, whether it was applied, where the pages are."""
        total = sum(self.pages_by_node.values())
        where = ", ".join(f"{100 * c / total:.0f}% on node {n}" for n, c in sorted(self.pages_by_node.items()))
        where = f"pages {where}" if total else f"pages not located ({self.located})"
        if self.policy == "off":
            return f"numa_policy off; {where}"
        target = f" node {self.node}" if self.node is not None else ""
        head = f"numa_policy {self.policy}{target}: " + ("applied" if self.applied else f"not applied ({self.reason})")
        tail = {True: " (verified)", False: " (NOT on the target node)", None: ""}[self.verified]
        return f"{head}; {where}{tail}"

    def node_mode(self) -> tuple[int | None, int]:
        """(node, mbind mode) for the next slab: no node when the policy is not applied."""
        if not self.applied:
            return None, MPOL_PREFERRED
        return self.node, MPOL_BIND if self.policy == "bind" else MPOL_PREFERRED

    def note_bind_error(self, error: str | None) -> None:
        """A slab's pages could not be placed: the policy is no longer applied, and this is why."""
        if error:
            self.applied, self.reason = False, error

    def count_located(self, location: PageLocation) -> None:
        """Count where a new slab's sampled pages are (located once, when the slab was made)."""
        for node, n in location.pages_by_node.items():
            self.pages_by_node[node] = self.pages_by_node.get(node, 0) + n
        self.located = self.located or location.why_not_located

    def to_doc(self) -> dict:
        total = sum(self.pages_by_node.values())
        return {"policy": self.policy, "node": self.node, "applied": self.applied, "reason": self.reason,
                "share_by_node": {str(n): c / total for n, c in sorted(self.pages_by_node.items())} if total else {},
                "verified": self.verified, "located": self.located}


def numa_policy_for(policy: str, node: int | None, node_reason: str | None = None) -> NumaPolicy:
    """The NUMA policy the cold bank gets on this host: whether `policy` can be applied toward the
    GPU's `node` (without applying it), and if not, why."""
    if policy == "off":
        return NumaPolicy(policy, None, False, "numa_policy is off")
    if node is None:
        return NumaPolicy(policy, None, False, node_reason or "the GPU's NUMA node is unknown")
    nodes = list(list_numa_nodes("/") or ())
    if not nodes:
        return NumaPolicy(policy, node, False, "no NUMA information in /sys/devices/system/node")
    if node not in nodes:
        return NumaPolicy(policy, node, False, f"node {node} is not among {nodes}")
    if len(nodes) == 1:
        return NumaPolicy(policy, node, False, "one NUMA node: every page is already local")
    return NumaPolicy(policy, node, True, None)


@dataclass
class _Slab:
    """Where a slab is, for `device_address`; it does not keep the slab alive."""

    host_address: int
    device_address: int | None  # where kernels read it (None: not mapped for a device)
    n_bytes: int
    owner: weakref.ref | None  # the slab's HostPages (None: torch's pinned allocator owns the memory)
    location: PageLocation  # where its pages landed, located once (by HostPages, or here for torch's)

    @classmethod
    def of(cls, pages: HostPages) -> _Slab:
        return cls(pages.address, pages.device_address, pages.size_bytes, weakref.ref(pages), pages.location)

    @property
    def alive(self) -> bool:
        return self.owner is None or self.owner() is not None


@dataclass
class PinnedAllocator:
    """The cold bank's slabs, page-locked and device-mapped when `pin`, NUMA-placed; it remembers the
    live ones. `method`: "cudaHostRegister", "torch pinned" (`fallback` says why) or "pageable"."""

    pin: bool
    numa: NumaPolicy
    requested_bytes: int = 0
    reserved_bytes: int = 0
    method: str = ""
    fallback: str | None = None
    slabs: list[_Slab] = field(default_factory=list)

    fills = True  # this process writes what it allocates (a node-shared bank: only the rank that creates it)

    def alloc(self, n_bytes: int) -> torch.Tensor:
        """A uint8 host tensor of at least n_bytes, zeroed, its pages placed and located."""
        tensor, slab = self._slab(n_bytes)
        if self.fills:  # pages are counted where they were placed, once
            self.numa.count_located(slab.location)
        self.requested_bytes += n_bytes
        self.reserved_bytes += slab.n_bytes
        self.slabs = [s for s in self.slabs if s.alive] + [slab]
        return tensor

    def _slab(self, n_bytes: int) -> tuple[torch.Tensor, _Slab]:
        made = self._host_pages(n_bytes, torch.cuda.cudart()) if self.pin and self.fallback is None else None
        if made is None:
            made = self._torch_pinned(n_bytes) if self.pin else self._host_pages(n_bytes, None)
        return made

    def _host_pages(self, n_bytes: int, cudart) -> tuple[torch.Tensor, _Slab] | None:
        """Exact-size pages, registered with CUDA when `cudart` is given; None (and `fallback`
        set) if registration fails here (the first failure stops further attempts)."""
        pages = HostPages(n_bytes, *self.numa.node_mode(), cudart=cudart)
        self.numa.note_bind_error(pages.bind_error)
        if cudart is not None and not pages.registered:
            self.fallback = f"{pages.register_error}: torch's pinned allocator (power of two)"
            return None  # the mapping goes with `pages`
        self.method = "pageable" if cudart is None else "cudaHostRegister"
        return pages.tensor(), _Slab.of(pages)

    def _torch_pinned(self, n_bytes: int) -> tuple[torch.Tensor, _Slab]:
        """torch's pinned allocator (cudaHostAlloc, rounded up to a power of two, mapped under UVA),
        its pages placed by the thread's memory policy while they are first touched."""
        node, mode = self.numa.node_mode()
        err = set_mempolicy(mode, node) if node is not None else None
        self.numa.note_bind_error(err)
        try:
            t = _torch_pinned(round_up_pow2(n_bytes))
        finally:
            if node is not None and err is None:
                set_mempolicy(MPOL_DEFAULT, None)
        self.method = "torch pinned"
        return t, _Slab(t.data_ptr(), t.data_ptr(), t.numel(), None, locate(t.data_ptr(), t.numel(), node))

    def device_address(self, host_tensor: torch.Tensor) -> int:
        """Where the device reads `host_tensor` (a view into one of the live slabs)."""
        ptr = host_tensor.data_ptr()
        for s in reversed(self.slabs):  # the newest first: a freed slab's range may be reused
            if s.alive and s.host_address <= ptr < s.host_address + s.n_bytes:
                if s.device_address is None:
                    raise ValueError("the slab is not mapped for a device (pageable memory)")
                return s.device_address + (ptr - s.host_address)
        raise ValueError("the tensor is not in a slab of this allocator")


def _torch_pinned(size: int) -> torch.Tensor:
    """torch's pinned allocator (cudaHostAlloc, rounded up to a power of two), zeroed."""
    return torch.empty(size, dtype=torch.uint8, pin_memory=True).zero_()
