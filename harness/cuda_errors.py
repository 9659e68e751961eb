"""Recognising the CUDA errors that poison a process.

Most CUDA errors are local to one call (an invalid argument, out of memory).  A few are
*sticky*: after a kernel faults, the context is corrupt and every later CUDA call in the
process fails with the same error, so no later case can run there.  The CUDA runtime
documents these as leaving "the process in an inconsistent state": the process must end.

`sticky_cuda_error(exc)` says whether an exception (or a message) is one of them.  The
frameworks word it differently, so it is matched on the runtime's and the driver's names
and on their message strings:

    torch   RuntimeError / torch.AcceleratorError: "CUDA error: an illegal memory access was encountered"
    cupy    CUDARuntimeError: "cudaErrorIllegalAddress: an illegal memory access was encountered"
            CUDADriverError:  "CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered"
    triton  "Triton Error [CUDA]: an illegal memory access was encountered"
    jax     XlaRuntimeError: "INTERNAL: ... CUDA_ERROR_ILLEGAL_ADDRESS ..."
"""
from __future__ import annotations

# (runtime enum, driver enum, message): the errors after which the context is unusable.
STICKY = (
    ("cudaErrorIllegalAddress", "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"),
    ("cudaErrorLaunchFailure", "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"),
    ("cudaErrorMisalignedAddress", "CUDA_ERROR_MISALIGNED_ADDRESS", "misaligned address"),
    ("cudaErrorIllegalInstruction", "CUDA_ERROR_ILLEGAL_INSTRUCTION", "an illegal instruction was encountered"),
    ("cudaErrorInvalidPc", "CUDA_ERROR_INVALID_PC", "invalid program counter"),
    ("cudaErrorInvalidAddressSpace", "CUDA_ERROR_INVALID_ADDRESS_SPACE",
     "operation not supported on global/shared address space"),
    ("cudaErrorHardwareStackError", "CUDA_ERROR_HARDWARE_STACK_ERROR", "hardware stack error"),
    ("cudaErrorAssert", "CUDA_ERROR_ASSERT", "device-side assert triggered"),
    ("cudaErrorLaunchTimeout", "CUDA_ERROR_LAUNCH_TIMEOUT", "the launch timed out and was terminated"),
    ("cudaErrorECCUncorrectable", "CUDA_ERROR_ECC_UNCORRECTABLE", "uncorrectable ECC error encountered"),
)


def _messages(error) -> list[str]:
    """The text of an exception and of the exceptions it was raised from (or a message as is)."""
    if isinstance(error, str):
        return [error]
    texts, seen = [], set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        texts.append(f"{type(error).__name__}: {error}")
        error = error.__cause__ or error.__context__
    return texts


def sticky_cuda_error(error) -> str | None:
    """The runtime name of the sticky CUDA error in `error` (an exception or a message), else None.

    'cudaErrorIllegalAddress' for "CUDA error: an illegal memory access was encountered" and
    its cupy, driver, Triton and XLA spellings; None for an error that leaves the context
    usable (out of memory, invalid argument, a Python exception).
    """
    for text in _messages(error):
        low = text.lower()
        for runtime, driver, message in STICKY:
            if runtime.lower() in low or driver.lower() in low or message in low:
                return runtime
    return None
