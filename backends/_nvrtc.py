"""NVRTC helpers for the CUDA sources in backends/cuda/: find headers, read sources, compile.

The cupy backend compiles through cupy.RawModule at run time; this module gives it (and any
later raw-CUDA backend) the include folders and source text, and gives CI a way to compile
every kernel instantiation to a cubin on a machine with no GPU (NVRTC needs no device).

Nothing here imports cupy at module import; `compile_cubin` imports cupy.cuda.nvrtc lazily.
"""
from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

CUDA_DIR = Path(__file__).resolve().parent / "cuda"
# NVRTC options every kernel here wants: C++17, IEEE math (no --use_fast_math: accuracy
# is what the harness measures), and line info for profilers.
BASE_OPTIONS = ("-std=c++17", "--generate-line-info")


def _has_fp16_header(path: Path) -> bool:
    return (path / "cuda_fp16.h").is_file() and (path / "cuda_bf16.h").is_file()


@lru_cache(maxsize=None)
def include_dirs() -> tuple[str, ...]:
    """Folders holding cuda_fp16.h / cuda_bf16.h, most specific first.

    CUDA_PATH / CUDA_HOME, then /usr/local/cuda, then the `nvidia` pip wheels (the
    nvidia-cuda-runtime wheel ships the headers for machines with no CUDA toolkit).
    """
    candidates = []
    for var in ("CUDA_PATH", "CUDA_HOME"):
        if os.environ.get(var):
            candidates.append(Path(os.environ[var]) / "include")
    candidates.append(Path("/usr/local/cuda/include"))
    try:
        import nvidia  # namespace package of the pip CUDA wheels

        for root in getattr(nvidia, "__path__", []):
            root = Path(root)
            candidates += sorted(root.glob("cu*/include")) + sorted(root.glob("cuda_runtime/include"))
    except ImportError:
        pass
    found, seen = [], set()
    for path in candidates:
        key = str(path.resolve()) if path.exists() else str(path)
        if key not in seen and _has_fp16_header(path):
            seen.add(key)
            found.append(str(path))
    return tuple(found)


def include_options() -> tuple[str, ...]:
    """-I options for the first folder with the fp16/bf16 headers (mixing CUDA versions is unsafe)."""
    dirs = include_dirs()
    return (f"-I{dirs[0]}",) if dirs else ()


def read_source(name: str) -> str:
    """Text of backends/cuda/<name> (e.g. 'binary_backward.cuh')."""
    path = CUDA_DIR / name
    if not path.is_file():
        raise FileNotFoundError(f"CUDA source {path} not found")
    return path.read_text()


def compile_options(extra=()) -> tuple[str, ...]:
    return BASE_OPTIONS + include_options() + tuple(extra)


class NvrtcError(RuntimeError):
    pass


def compile_cubin(source: str, arch: str = "sm_90", name_expressions=(), options=(),
                  program_name: str = "gradoracle.cu") -> tuple[bytes, dict[str, str]]:
    """Compile `source` for `arch` with NVRTC; returns (cubin, {name expression: lowered name}).

    `name_expressions` instantiates templates (e.g. 'bb_fast<float, 2>'); each must appear in
    the cubin.  Raises NvrtcError with the compiler log on failure.
    """
    from cupy.cuda import nvrtc

    opts = list(compile_options(options) + (f"-arch={arch}",))
    prog = nvrtc.createProgram(source, program_name, [], [])
    try:
        for expr in name_expressions:
            nvrtc.addNameExpression(prog, expr)
        try:
            nvrtc.compileProgram(prog, opts)
        except nvrtc.NVRTCError as exc:
            log = nvrtc.getProgramLog(prog)
            raise NvrtcError(f"NVRTC failed for {program_name} ({arch}): {exc}\n{log}") from None
        lowered = {expr: nvrtc.getLoweredName(prog, expr) for expr in name_expressions}
        return nvrtc.getCUBIN(prog), lowered
    finally:
        nvrtc.destroyProgram(prog)
