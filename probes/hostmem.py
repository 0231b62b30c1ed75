"""Host memory that a GPU reads in place: the one owner of pages that are NUMA-placed, located,
page-locked and mapped for the device. The probe's buffers and the runtime's cold bank both use it.

`HostPages` is an anonymous mapping of exactly the bytes asked for (rounded up to whole pages),
or (`HostPages.shared`) a shared mapping of a file in /dev/shm that every rank of a node maps, so
that the node holds an expert-parallel cold bank once.
Its NUMA policy is set on the range with mbind(2) before the first touch, so the kernel allocates
the pages on that node; `cudaHostRegister(Portable | Mapped)` then locks them and maps them for
every device (under UVA the device address is the host address). Pages are located afterwards
with move_pages(2) in query mode on a sample, so a report says where memory really is.

Lifetime. CUDA refuses any copy whose host range spans registered and unregistered memory
(cudaErrorInvalidValue), and a freed range is soon reused by the next large allocation. So a
range unmapped while still registered crashes whatever loads next. Here the mapping can only go
when nothing can read it: every numpy array, torch tensor and device view made from the pages
holds the owner (as their buffer's base), and the owner's finalizer unregisters the range (once
the device is idle) before it unmaps it, whether the owner dies by reference count, by the cycle
collector or after an exception. At interpreter exit the registrations still alive are undone and
the mappings are left to the operating system. Registration happens once per mapping, so a range
is never registered twice.

Nothing here raises for what a machine cannot do: each step records why it did not happen.
torch is imported lazily (the probe runs without it).
"""

from __future__ import annotations

import atexit
import ctypes
import mmap
import os
import platform
import sys
import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np

MPOL_DEFAULT, MPOL_PREFERRED, MPOL_BIND = 0, 1, 2
MPOL_MF_MOVE = 1 << 1
# Linux uapi unistd tables, per architecture.
SYS_MBIND = {"x86_64": 237, "aarch64": 235, "ppc64le": 259, "ppc64": 259}
SYS_SET_MEMPOLICY = {"x86_64": 238, "aarch64": 237, "ppc64le": 261, "ppc64": 261}
SYS_MOVE_PAGES = {"x86_64": 279, "aarch64": 239, "ppc64le": 301, "ppc64": 301}
# cudaHostRegister flags: usable from every CUDA context, and mapped into the device's address space.
HOST_REGISTER_FLAGS = 1 | 2  # cudaHostRegisterPortable | cudaHostRegisterMapped
PAGE_SAMPLES = 256  # pages located per range
VERIFIED_SHARE = 0.99  # share of located pages that must sit on the wanted node

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value


# ----------------------------------------------------------------------------- NUMA


def _node_mask(node: int) -> tuple[ctypes.Array, int]:
    words = node // 64 + 1
    mask = (ctypes.c_ulong * words)()
    mask[node // 64] = 1 << (node % 64)
    return mask, words * 64 + 1


def set_mempolicy(mode: int, node: int | None) -> str | None:
    """Set the calling thread's memory policy (MPOL_DEFAULT with node None); an error text or None.
    For allocators that own their pages (torch's pinned allocator); ranges of our own use `mbind`."""
    nr = SYS_SET_MEMPOLICY.get(platform.machine())
    if nr is None:
        return f"set_mempolicy syscall number unknown on {platform.machine()}"
    if node is None:
        rc = _libc.syscall(ctypes.c_long(nr), ctypes.c_int(mode), None, ctypes.c_ulong(0))
    else:
        mask, max_node = _node_mask(node)
        rc = _libc.syscall(ctypes.c_long(nr), ctypes.c_int(mode), mask, ctypes.c_ulong(max_node))
    return None if rc == 0 else f"set_mempolicy failed: {os.strerror(ctypes.get_errno())}"


def mbind(address: int, size_bytes: int, mode: int, node: int) -> str | None:
    """Set the NUMA policy of [address, address + size) to `mode` on `node`; an error text or None.
    PREFERRED lets a full node spill elsewhere (the location check then says so); BIND insists."""
    nr = SYS_MBIND.get(platform.machine())
    if nr is None:
        return f"mbind syscall number unknown on {platform.machine()}"
    mask, max_node = _node_mask(node)
    rc = _libc.syscall(ctypes.c_long(nr), ctypes.c_void_p(address), ctypes.c_ulong(size_bytes), ctypes.c_int(mode),
                       mask, ctypes.c_ulong(max_node), ctypes.c_uint(MPOL_MF_MOVE))
    return None if rc == 0 else f"mbind to node {node} failed: {os.strerror(ctypes.get_errno())}"


def page_nodes(address: int, n_bytes: int, samples: int = PAGE_SAMPLES) -> tuple[dict[int, int], str | None]:
    """NUMA node of up to `samples` pages spread evenly over [address, address + n_bytes):
    ({node: pages}, None), or ({}, why not). Pages not faulted in yet are not counted."""
    nr = SYS_MOVE_PAGES.get(platform.machine())
    if nr is None:
        return {}, f"move_pages syscall number unknown on {platform.machine()}"
    page = mmap.PAGESIZE
    first, last = address // page, (address + max(n_bytes, 1) - 1) // page
    count = min(samples, last - first + 1)
    step = (last - first + 1) / count
    pages = (ctypes.c_void_p * count)(*[(first + int(i * step)) * page for i in range(count)])
    status = (ctypes.c_int * count)()
    rc = _libc.syscall(ctypes.c_long(nr), ctypes.c_int(0), ctypes.c_ulong(count), pages, None, status, ctypes.c_int(0))
    if rc != 0:
        return {}, f"move_pages failed: {os.strerror(ctypes.get_errno())}"
    found: dict[int, int] = {}
    for st in status:
        if st >= 0:  # negative: -errno, e.g. -ENOENT for a page not present
            found[st] = found.get(st, 0) + 1
    return found, None if found else "no page of the range is present"


@dataclass(frozen=True)
class PageLocation:
    """Where a range's pages are: share per node, and whether they sit on the wanted node."""

    wanted_node: int | None
    share_by_node: dict[int, float]
    verified: bool | None  # None: nothing to check against (no wanted node, or pages not located)
    detail: str | None = None
    pages_by_node: dict[int, int] = field(default_factory=dict)  # the sample pages located per node
    why_not_located: str | None = None  # set when no sample page could be located


def locate(address: int, n_bytes: int, wanted_node: int | None, bind_error: str | None = None) -> PageLocation:
    """Locate a range's pages and judge them against `wanted_node`."""
    found, why = page_nodes(address, n_bytes)
    total = sum(found.values())
    if not total:
        return PageLocation(wanted_node, {}, None, f"pages not located: {why}", why_not_located=why)
    share = {n: c / total for n, c in sorted(found.items())}
    if wanted_node is None:
        return PageLocation(None, share, None, "not bound to a node", found)
    ok = share.get(wanted_node, 0.0) >= VERIFIED_SHARE
    detail = bind_error or (None if ok else f"only {share.get(wanted_node, 0.0):.0%} of pages on node "
                                            f"{wanted_node} (node short of free memory?)")
    return PageLocation(wanted_node, share, ok, detail, found)


# ----------------------------------------------------------------------------- CUDA runtime


def libcudart() -> ctypes.CDLL | None:
    """The CUDA runtime library torch already loaded (found in /proc/self/maps), or None."""
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                path = line.split()[-1]
                if "libcudart.so" in path:
                    return ctypes.CDLL(path)
    except OSError:
        return None
    return None


def clear_cuda_error() -> None:
    """Reset the CUDA runtime's last error after a call that failed without poisoning the context
    (cudaHostRegister): torch's bindings leave it set, and the next torch kernel launch check
    (cudaGetLastError) would then raise it from an unrelated operation."""
    lib = libcudart()
    if lib is not None:
        lib.cudaGetLastError()


def device_pointer(host_address: int) -> int:
    """The device address of registered host memory (cudaHostGetDevicePointer). Without a
    loadable libcudart, the host address: under UVA (every 64-bit Linux system CUDA supports)
    registered memory has the same address on host and device."""
    lib = libcudart()
    if lib is None:
        return host_address
    ptr = ctypes.c_void_p()
    rc = lib.cudaHostGetDevicePointer(ctypes.byref(ptr), ctypes.c_void_p(host_address), ctypes.c_uint(0))
    return int(ptr.value) if rc == 0 and ptr.value else host_address


class _CudaArray:
    """Raw device memory for torch.as_tensor, without a copy. torch keeps this object alive as long
    as the tensor, and this object keeps `keep` (the memory's owner) alive."""

    def __init__(self, address: int, size_bytes: int, keep: Any):
        self.keep = keep
        self.__cuda_array_interface__ = {"shape": (size_bytes,), "typestr": "|u1", "data": (address, False),
                                         "strides": None, "version": 3}


def uva_view(torch: Any, device_address: int, size_bytes: int, device: Any, keep: Any) -> Any:
    """A uint8 CUDA tensor over registered host memory at `device_address`, holding `keep` (what
    owns the memory) for as long as it lives; raises RuntimeError if torch copied instead of viewing
    (torch < 2.9 copies when the pointer's device differs from the requested one)."""
    view = torch.as_tensor(_CudaArray(device_address, size_bytes, keep), device=device)
    if view.data_ptr() != device_address:
        raise RuntimeError(f"torch copied the pinned host memory to {view.device} instead of viewing it in place")
    return view


# ----------------------------------------------------------------------------- owned pages


class _Range:
    """What the finalizer needs (never the owner itself, or the owner could not die)."""

    def __init__(self, address: int, size_bytes: int):
        self.address, self.size_bytes = address, size_bytes
        self.cudart: Any = None  # set while registered

    def unregister(self) -> None:
        if self.cudart is None:
            return
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            torch.cuda.synchronize()  # no copy or kernel may still read the range
        self.cudart.cudaHostUnregister(self.address)
        self.cudart = None

    def release(self) -> None:
        """Unregister, then unmap: never the other way round."""
        if _capturing():  # a CUDA graph capture forbids synchronising: finish it after the capture
            _DEFERRED.append(self)
            return
        try:
            self.unregister()
        finally:
            _libc.munmap(ctypes.c_void_p(self.address), ctypes.c_size_t(self.size_bytes))
            _LIVE.pop(self.address, None)


# Process-wide on purpose: the exit hook below and the mappings' finalizers (which run with no
# caller to hand them an object) must reach every mapping the process still owns.
_LIVE: dict[int, _Range] = {}  # address -> range of every mapping still owned
_DEFERRED: list[_Range] = []  # process-wide as _LIVE: released during a CUDA graph capture, freed after it


def _capturing() -> bool:
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing())
    except Exception:  # no CUDA, or a context already torn down
        return False


def release_deferred() -> int:
    """Finish the releases a CUDA graph capture postponed; returns how many. Called by every new
    allocation; call it after a capture to return the memory sooner."""
    done = 0
    while _DEFERRED and not _capturing():
        _DEFERRED.pop().release()
        done += 1
    return done


@atexit.register
def _unregister_at_exit() -> None:
    """Undo the registrations still alive while CUDA is still up (this module is imported after
    torch, so this runs before torch's own exit hooks); the mappings go with the process."""
    for r in list(_LIVE.values()) + _DEFERRED:
        try:
            r.unregister()
        except Exception:  # a torn-down context at exit: nothing left to protect
            pass


class HostPages:
    """`size_bytes` (page-rounded) of anonymous host memory, NUMA-placed on `node` with `mode`
    (MPOL_PREFERRED or MPOL_BIND; node None: first touch decides), zero-filled, and registered
    with CUDA through `cudart` (torch.cuda.cudart()) when given.

    `array()`, `tensor()` and `device_view()` give views that keep the pages alive; the pages are
    unregistered and unmapped when the last view and this owner are gone. As a context manager it
    undoes the registration on exit (the memory then goes with the last view). `registered`, `register_error`,
    `bind_error` and `location` say what happened."""

    def __init__(self, size_bytes: int, node: int | None = None, mode: int = MPOL_PREFERRED, cudart: Any = None,
                 fill: int | None = 0, *, shared_fd: int | None = None):
        if size_bytes <= 0:
            raise ValueError(f"cannot map {size_bytes} bytes")
        release_deferred()
        page = mmap.PAGESIZE
        self.size_bytes = -(-size_bytes // page) * page
        flags, fd = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1
        if shared_fd is not None:  # a file other processes map too (see `shared`)
            flags, fd = mmap.MAP_SHARED, shared_fd
        address = _libc.mmap(None, self.size_bytes, mmap.PROT_READ | mmap.PROT_WRITE, flags, fd, 0)
        if address in (None, _MAP_FAILED):
            raise MemoryError(f"mmap of {self.size_bytes} bytes failed: {os.strerror(ctypes.get_errno())}")
        self.address: int = address
        self._range = _Range(address, self.size_bytes)
        _LIVE[address] = self._range
        self._finalizer = weakref.finalize(self, self._range.release)
        self._finalizer.atexit = False  # at exit, _unregister_at_exit undoes the registration only
        self.node = node
        self.bind_error = mbind(address, self.size_bytes, mode, node) if node is not None else None
        if fill is not None:
            ctypes.memset(address, fill, self.size_bytes)  # first touch: the pages are allocated now, under the policy
        self.location = locate(address, self.size_bytes, node, self.bind_error)
        self.register_error: str | None = None
        self.device_address: int | None = None
        if cudart is not None:
            self._register(cudart)

    @classmethod
    def shared(cls, path: str, size_bytes: int, create: bool, node: int | None = None, mode: int = MPOL_PREFERRED,
               cudart: Any = None) -> HostPages:
        """Pages of the file `path` (in /dev/shm: memory, not disk) mapped shared, so that every
        process of a node that maps it holds the same pages once. The creator sizes the file and
        places and zero-fills its pages (first touch, under the NUMA policy); a process that opens
        it maps the pages as they are. Each process registers its own mapping with CUDA, and its
        mapping goes the way of any HostPages; the file stays until it is unlinked."""
        fd = os.open(path, os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0), 0o600)
        try:
            if create:
                os.ftruncate(fd, -(-size_bytes // mmap.PAGESIZE) * mmap.PAGESIZE)
            elif os.fstat(fd).st_size < size_bytes:
                raise ValueError(f"{path} holds {os.fstat(fd).st_size} bytes, {size_bytes} expected")
            return cls(size_bytes, node if create else None, mode, cudart, 0 if create else None, shared_fd=fd)
        finally:
            os.close(fd)  # the mapping keeps the pages

    def _register(self, cudart: Any) -> None:
        rc = int(cudart.cudaHostRegister(self.address, self.size_bytes, HOST_REGISTER_FLAGS))
        if rc != 0:
            clear_cuda_error()
            self.register_error = f"cudaHostRegister failed with cudaError {rc}"
            return
        self._range.cudart = cudart
        self.device_address = device_pointer(self.address)

    @property
    def registered(self) -> bool:
        return self._range.cudart is not None

    @property
    def __array_interface__(self) -> dict:
        return {"shape": (self.size_bytes,), "typestr": "|u1", "data": (self.address, False), "version": 3}

    def array(self) -> np.ndarray:
        """uint8 [size_bytes] over the pages; its base is this owner."""
        return np.asarray(self)

    def tensor(self) -> Any:
        """A uint8 CPU torch tensor over the pages (it keeps them alive)."""
        import torch

        return torch.from_numpy(self.array())

    def device_view(self, torch: Any, device: Any) -> Any:
        """The pages as a uint8 CUDA tensor read in place over PCIe (registered pages only)."""
        if self.device_address is None:
            raise ValueError("the pages are not registered with CUDA (pageable memory)")
        return uva_view(torch, self.device_address, self.size_bytes, device, keep=self)

    def unregister(self) -> None:
        """Undo the registration now, once no device view is used any more. The pages stay mapped
        for the host views still alive and are unmapped with the last of them."""
        self._range.unregister()

    def __enter__(self) -> HostPages:
        return self

    def __exit__(self, *exc) -> None:
        self.unregister()
