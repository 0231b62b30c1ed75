"""A kernel that runs the Triton kernels' e2m1 and e8m0 decoders (runtime/triton_kernels.py) on
every input, for test_runtime_bank.py. Imported inside the tests that use it: triton.jit reads
TRITON_INTERPRET when it is applied."""

import triton
import triton.language as tl
from hotsplit_runtime.triton_kernels import _e2m1, _e8m0


@triton.jit
def decode_kernel(codes_ptr, bytes_ptr, values_ptr, scales_ptr, N: tl.constexpr):
    """values[n] = e2m1 value of code codes[n] (0..15), scales[n] = e8m0 scale of byte bytes[n]."""
    offs = tl.arange(0, N)
    tl.store(values_ptr + offs, _e2m1(tl.load(codes_ptr + offs).to(tl.int32)))
    tl.store(scales_ptr + offs, _e8m0(tl.load(bytes_ptr + offs).to(tl.int32)))
