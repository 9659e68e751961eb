"""Host-side planning that several kernel backends share: pure Python, no GPU and no framework
needed, so it is unit-tested on any machine.

    <op>.py       the op's decomposition that every kernel backend of the op starts from
                  (binary_backward.py: the K x RA x RB broadcast box, merged dims, strides)
    <op>_cuda.py  the launch plan of the device code backends/cuda/<op>.cuh: which kernel, grid,
                  tiles and chunks, and the parameter words it takes; the one plan that both
                  hosts of that code use (cupy through NVRTC, torch_ext through nvcc)

What may be touched: a module here is the single home of its plan; a backend imports it and
never re-derives it.  Constants shared with C++ (word counts, kinds, limits) are checked against
the headers in backends/cuda/ by tests/test_cuda_compile.py.  Not a backend: harness discovery
skips names with a leading underscore.
"""
