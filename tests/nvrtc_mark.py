"""The skip mark of the tests that compile CUDA sources for sm_90 with NVRTC on this machine."""
import pytest

from backends.cupy import nvrtc

needs_nvrtc = pytest.mark.skipif(not (nvrtc.nvrtc_version() and nvrtc.include_dirs()),
                                 reason="NVRTC or cuda_fp16.h not available")
