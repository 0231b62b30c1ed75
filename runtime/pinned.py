"""Pinned host slabs for the cold bank, placed on a NUMA node per the `numa_policy` knob.

On a GPU a slab is an anonymous mapping of exactly the bytes asked for (page-rounded), faulted in
under the memory policy, then page-locked and mapped for the device with
`cudaHostRegister(Portable | Mapped)`. torch's own pinned allocator rounds every allocation up to
a power of two: a DeepSeek-V3 layer of fp8 experts (11.3 GB) would lock 16 GiB, 42% more host
memory than the bank holds. Where registration fails, the slab falls back to torch's pinned
allocator (power of two) and the reason is recorded. Without CUDA a slab is plain memory of the
exact size. Slabs live as long as the process (or until `release`).

Placement: `preferred` asks the kernel for pages on the GPU's node and falls back elsewhere,
`bind` insists on it, `off` leaves the default (first touch). It is applied with the
set_mempolicy system call around the first touch of the pages and restored afterwards. Every
slab's pages are then located (move_pages(2) in query mode, on a sample of pages), so the
report says where the cold bank really is, policy or not. Whatever cannot be done is recorded
with a reason, never raised.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import platform
from dataclasses import dataclass, field

import torch

MPOL_DEFAULT, MPOL_PREFERRED, MPOL_BIND = 0, 1, 2
_SYS_SET_MEMPOLICY = {"x86_64": 238, "aarch64": 237, "ppc64le": 261}
_SYS_MOVE_PAGES = {"x86_64": 279, "aarch64": 239, "ppc64le": 301}
PAGE_SAMPLES = 256  # pages located per slab
VERIFIED_SHARE = 0.99  # share of located pages that must sit on the target node


def round_up_pow2(n_bytes: int) -> int:
    """Smallest power of two >= n_bytes (1 for 0)."""
    if n_bytes < 0:
        raise ValueError(f"cannot allocate {n_bytes} bytes")
    return 1 if n_bytes <= 1 else 1 << (n_bytes - 1).bit_length()


@dataclass
class NumaPlacement:
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

    def to_doc(self) -> dict:
        total = sum(self.pages_by_node.values())
        return {"policy": self.policy, "node": self.node, "applied": self.applied, "reason": self.reason,
                "share_by_node": {str(n): c / total for n, c in sorted(self.pages_by_node.items())} if total else {},
                "verified": self.verified, "located": self.located}


def page_nodes(address: int, n_bytes: int, samples: int = PAGE_SAMPLES) -> tuple[dict[int, int], str | None]:
    """NUMA node of up to `samples` pages spread evenly over [address, address + n_bytes):
    ({node: pages}, None), or ({}, why not). Pages not faulted in yet are not counted."""
    nr = _SYS_MOVE_PAGES.get(platform.machine())
    if nr is None:
        return {}, f"move_pages syscall number unknown on {platform.machine()}"
    page = os.sysconf("SC_PAGE_SIZE")
    first, last = address // page, (address + max(n_bytes, 1) - 1) // page
    count = min(samples, last - first + 1)
    step = (last - first + 1) / count
    pages = (ctypes.c_void_p * count)(*[(first + int(i * step)) * page for i in range(count)])
    status = (ctypes.c_int * count)()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    rc = libc.syscall(ctypes.c_long(nr), ctypes.c_int(0), ctypes.c_ulong(count), pages, None, status, ctypes.c_int(0))
    if rc != 0:
        return {}, f"move_pages failed: {os.strerror(ctypes.get_errno())}"
    found: dict[int, int] = {}
    for st in status:
        if st >= 0:  # negative: -errno, e.g. -ENOENT for a page not present
            found[st] = found.get(st, 0) + 1
    return found, None if found else "no page of the slab is present"


def _numa_nodes() -> list[int]:
    try:
        names = os.listdir("/sys/devices/system/node")
    except OSError:
        return []
    return sorted(int(n[4:]) for n in names if n.startswith("node") and n[4:].isdigit())


def _set_mempolicy(mode: int, node: int | None) -> str | None:
    """Set the calling thread's memory policy; returns an error text or None."""
    nr = _SYS_SET_MEMPOLICY.get(platform.machine())
    if nr is None:
        return f"set_mempolicy syscall number unknown on {platform.machine()}"
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if node is None:
        rc = libc.syscall(nr, ctypes.c_int(mode), None, ctypes.c_ulong(0))
    else:
        words = node // 64 + 1
        mask = (ctypes.c_ulong * words)()
        mask[node // 64] = 1 << (node % 64)
        rc = libc.syscall(nr, ctypes.c_int(mode), mask, ctypes.c_ulong(words * 64 + 1))
    if rc != 0:
        err = ctypes.get_errno()
        return f"set_mempolicy failed: {os.strerror(err)}"
    return None


def plan_placement(policy: str, node: int | None, node_reason: str | None = None) -> NumaPlacement:
    """Decide whether a policy can be applied on this host (without applying it)."""
    if policy == "off":
        return NumaPlacement(policy, None, False, "numa_policy is off")
    if node is None:
        return NumaPlacement(policy, None, False, node_reason or "the GPU's NUMA node is unknown")
    nodes = _numa_nodes()
    if not nodes:
        return NumaPlacement(policy, node, False, "no NUMA information in /sys/devices/system/node")
    if node not in nodes:
        return NumaPlacement(policy, node, False, f"node {node} is not among {nodes}")
    if len(nodes) == 1:
        return NumaPlacement(policy, node, False, "one NUMA node: every page is already local")
    return NumaPlacement(policy, node, True, None)


@dataclass
class _Slab:
    tensor: torch.Tensor  # uint8, host memory
    host_address: int
    device_address: int | None  # where kernels read it (None: not mapped for a device)
    n_bytes: int
    mapping: mmap.mmap | None  # the anonymous mapping of a registered slab


@dataclass
class PinnedAllocator:
    """Allocates the cold bank's slabs: page-locked and device-mapped when `pin`, NUMA-placed.

    `method` says how the last slab was made: "cudaHostRegister" (exact size), "torch pinned"
    (power of two, when registration failed: `fallback` says why) or "pageable" (no CUDA)."""

    pin: bool
    placement: NumaPlacement
    requested_bytes: int = 0
    reserved_bytes: int = 0
    method: str = ""
    fallback: str | None = None
    slabs: list[_Slab] = field(default_factory=list)

    def alloc(self, n_bytes: int) -> torch.Tensor:
        """A uint8 host tensor of at least n_bytes, its pages placed and located."""
        page = mmap.PAGESIZE
        size = max(page, -(-n_bytes // page) * page)
        applied = False
        if self.placement.applied:
            mode = MPOL_BIND if self.placement.policy == "bind" else MPOL_PREFERRED
            err = _set_mempolicy(mode, self.placement.node)
            if err:
                self.placement.applied, self.placement.reason = False, err
            else:
                applied = True
        try:  # pages are faulted in (zeroed) while the policy holds
            slab = self._registered(size) if self.pin and self.fallback is None else None
            if slab is None and self.pin:
                size = round_up_pow2(n_bytes)
                t = _torch_pinned(size)
                slab = _Slab(t, t.data_ptr(), t.data_ptr(), size, None)  # cudaHostAlloc: mapped, UVA
                self.method = "torch pinned"
            elif slab is None:
                t = torch.zeros(n_bytes, dtype=torch.uint8)
                size, slab = n_bytes, _Slab(t, t.data_ptr(), None, n_bytes, None)
                self.method = "pageable"
        finally:
            if applied:
                _set_mempolicy(MPOL_DEFAULT, None)
        found, why = page_nodes(slab.host_address, size)
        for node, n in found.items():
            self.placement.pages_by_node[node] = self.placement.pages_by_node.get(node, 0) + n
        self.placement.located = self.placement.located or why
        self.requested_bytes += n_bytes
        self.reserved_bytes += size
        self.slabs.append(slab)
        return slab.tensor

    def _registered(self, size: int) -> _Slab | None:
        """An exact-size mapping, touched, then registered with CUDA; None (and `fallback` set) if
        registration fails here (the first failure stops further attempts)."""
        mapping = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        t = torch.frombuffer(mapping, dtype=torch.uint8)
        t.zero_()
        address = t.data_ptr()
        from probes.bandwidth import HOST_REGISTER_FLAGS  # the probe registers its buffers the same way

        rc = int(torch.cuda.cudart().cudaHostRegister(address, size, HOST_REGISTER_FLAGS))
        if rc != 0:
            _clear_cuda_error()
            self.fallback = f"cudaHostRegister failed with cudaError {rc}: torch's pinned allocator (power of two)"
            del t
            mapping.close()
            return None
        self.method = "cudaHostRegister"
        return _Slab(t, address, _device_pointer(address), size, mapping)

    def device_address(self, host_tensor: torch.Tensor) -> int:
        """Where the device reads `host_tensor` (a view into one of the slabs)."""
        ptr = host_tensor.data_ptr()
        for s in self.slabs:
            if s.host_address <= ptr < s.host_address + s.n_bytes:
                if s.device_address is None:
                    raise ValueError("the slab is not mapped for a device (pageable memory)")
                return s.device_address + (ptr - s.host_address)
        raise ValueError("the tensor is not in a slab of this allocator")

    def release(self) -> None:
        """Unregister and unmap every registered slab. Only when nothing reads them any more."""
        registered = [s for s in self.slabs if s.mapping is not None]
        if registered:
            torch.cuda.synchronize()  # no copy or kernel still reads them
        for s in registered:
            torch.cuda.cudart().cudaHostUnregister(s.host_address)
            s.tensor = None
            try:
                s.mapping.close()
            except BufferError:  # a view still exports it: the mapping stays until it dies
                pass
        self.slabs.clear()


def _torch_pinned(size: int) -> torch.Tensor:
    """torch's pinned allocator (cudaHostAlloc, rounded up to a power of two), zeroed."""
    return torch.empty(size, dtype=torch.uint8, pin_memory=True).zero_()


def _device_pointer(host_address: int) -> int:
    from probes.bandwidth import device_pointer

    return device_pointer(host_address)


def _clear_cuda_error() -> None:
    from probes.bandwidth import clear_cuda_error

    clear_cuda_error()
