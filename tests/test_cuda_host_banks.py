"""The CPU stand-in's shared-memory bank model (tests/cuda_host/cuda_host_runtime.h, BankStats):
ldmatrix phases and cp.async rounds counted in wavefronts against 32 banks of 4 bytes, on probe
kernels whose conflicts are known by hand.  Kernels' tests use it to assert conflict-free sites."""
from __future__ import annotations

import numpy as np
import pytest

from backends.cupy import nvrtc as _nvrtc
from tests import cuda_host

WHY = cuda_host.available()
pytestmark = pytest.mark.skipif(WHY is not None, reason=f"CUDA-on-CPU stand-in unavailable: {WHY}")

PROBE = r"""

// One warp.  Rows of `pitch` bytes in dynamic shared memory: cp.async fills 32 rows' first 16 bytes
// (lane l row l), then ldmatrix.x4 reads rows 0..31 (lane l row l), x4.trans the same, and x1 rows
// 0..7 (lanes 8..31 pass row 0: ignored).  out: lane 0's first register of each, to use them.
__global__ void bank_probe(const __nv_bfloat16* src, int pitch, unsigned* out) {
  TC_DYNAMIC_SHARED(unsigned char, sm);
  const int l = threadIdx.x;
  tc_cp_async16(sm + l * pitch, src + 8 * l);
  tc_cp_commit();
  tc_cp_wait<0>();
  __syncthreads();
  unsigned r[4], t[4], o[1];
  tc_ldmatrix_x4(r, sm + l * pitch);
  tc_ldmatrix_x4_trans(t, sm + l * pitch);
  tc_ldmatrix_x1(o, sm + (l < 8 ? l : 0) * pitch);
  if (l == 0) {
    out[0] = r[0];
    out[1] = t[0];
    out[2] = o[0];
  }
}
"""


@pytest.fixture(scope="module")
def probe():
    return cuda_host.Kernels("bank-probe", f'#include "{_nvrtc.CUDA_DIR / "mma.cuh"}"\n' + PROBE, {"bank_probe": ["const __nv_bfloat16*", "int", "unsigned*"]})


def _run(probe, pitch: int) -> dict:
    src = np.arange(32 * 8, dtype=np.uint16)
    out = np.zeros(3, np.uint32)
    probe.bank_stats()  # reset
    probe.launch("bank_probe", 1, 32, [src, pitch, out], smem=32 * pitch)
    assert out[0] == (1 << 16) | 0  # row 0's first two elements: the probe really read the rows
    return probe.bank_stats()


# pitch (bytes) -> excess wavefronts per 8-row (8-lane) phase.  16 * odd: 8 rows in 8 distinct
# 16-byte bank groups; 128: all in banks 0-3 (8 words each); 64: two rows per bank group; 256: as 128.
@pytest.mark.parametrize("pitch,extra", [(16, 0), (144, 0), (272, 0), (48, 0), (32, 1), (64, 3), (128, 7),
                                         (256, 7)])
def test_wavefronts_per_phase(probe, pitch, extra):
    s = _run(probe, pitch)
    assert s["ld_instr"] == 3 and s["ld_phases"] == 4 + 4 + 1
    assert s["ld_extra"] == extra * (4 + 4 + 1)  # the same rows in every phase pattern
    assert s["cp_rounds"] == 1 and s["cp_phases"] == 4
    assert s["cp_extra"] == extra * 4
    assert (s["first"] == "") == (extra == 0), s["first"]
    if extra:
        assert f"{extra + 1} wavefronts" in s["first"]


def test_stats_reset_after_reading(probe):
    _run(probe, 128)
    assert probe.bank_stats()["ld_instr"] == 0
