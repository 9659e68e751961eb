"""NVRTC helpers for the CUDA sources in backends/cuda/: find headers, read sources, compile.

The cupy backend compiles through cupy.RawModule at run time; this module gives it the
include folders and the source text, and gives CI a way to compile every kernel
instantiation to a cubin on a machine with no GPU (NVRTC needs no device;
tests/test_cuda_compile.py).  `read_source` inlines the sources' own headers
(`#include "x.h"` of a file in backends/cuda/), so the text cupy compiles, and keys its disk
cache on, is all of the code: an edited header recompiles.

Nothing here imports cupy at module import; `compile_cubin` imports cupy.cuda.nvrtc lazily.
"""
from __future__ import annotations

import os
import re
from functools import lru_cache
from pathlib import Path

CUDA_DIR = Path(__file__).resolve().parent.parent / "cuda"
# NVRTC options every kernel here wants: C++17, IEEE math (no --use_fast_math: accuracy
# is what the harness measures), and line info for profilers.
BASE_OPTIONS = ("-std=c++17", "--generate-line-info")


def _has_fp16_header(path: Path) -> bool:
    return (path / "cuda_fp16.h").is_file() and (path / "cuda_bf16.h").is_file()


def header_version(path: Path) -> int | None:
    """CUDA_VERSION (e.g. 13000) of the toolkit headers in `path`, from cuda.h."""
    try:
        for line in (Path(path) / "cuda.h").read_text(errors="replace").splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[:2] == ["#define", "CUDA_VERSION"] and parts[2].isdigit():
                return int(parts[2])
    except OSError:
        pass
    return None


def nvrtc_version() -> int | None:
    """NVRTC's version as CUDA_VERSION spells it (13.0 -> 13000), or None if NVRTC is unusable."""
    try:
        from cupy.cuda import nvrtc

        major, minor = nvrtc.getVersion()
        return major * 1000 + minor * 10
    except Exception:  # noqa: BLE001 - no cupy or no libnvrtc
        return None


@lru_cache(maxsize=None)
def include_dirs() -> tuple[str, ...]:
    """Folders holding cuda_fp16.h / cuda_bf16.h, best first.

    Candidates: CUDA_PATH / CUDA_HOME, the `nvidia` pip wheels (nvidia-cuda-runtime ships the
    headers for machines with no toolkit), /usr/local/cuda.  Headers of NVRTC's own version
    come first, then those of its major version, then the rest in that order: headers newer
    than the compiler may not parse.
    """
    candidates = []
    for var in ("CUDA_PATH", "CUDA_HOME"):
        if os.environ.get(var):
            candidates.append(Path(os.environ[var]) / "include")
    try:
        import nvidia  # namespace package of the pip CUDA wheels

        for root in getattr(nvidia, "__path__", []):
            root = Path(root)
            candidates += sorted(root.glob("cu*/include")) + sorted(root.glob("cuda_runtime/include"))
    except ImportError:
        pass
    candidates.append(Path("/usr/local/cuda/include"))
    found, seen = [], set()
    for path in candidates:
        key = str(path.resolve())
        if key not in seen and _has_fp16_header(path):
            seen.add(key)
            found.append(path)
    want = nvrtc_version()

    def rank(path: Path) -> int:
        have = header_version(path)
        if want is None or have is None:
            return 2
        return 0 if have == want else 1 if have // 1000 == want // 1000 else 2

    return tuple(str(p) for p in sorted(found, key=rank))  # sorted() is stable


def include_options() -> tuple[str, ...]:
    """-I for the best header folder only: mixing headers of two CUDA versions is unsafe."""
    dirs = include_dirs()
    return (f"-I{dirs[0]}",) if dirs else ()


_LOCAL_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"[^\n]*$', re.M)


def read_source(name: str) -> str:
    """Text of backends/cuda/<name> (e.g. 'binary_backward.cuh'), each `#include "x.h"` of a file in
    backends/cuda/ replaced by that file's text (once per file, as #pragma once would), with #line
    markers so compiler messages name the right file and line."""
    return _expand(name, set())


def _expand(name: str, seen: set) -> str:
    path = CUDA_DIR / name
    if not path.is_file():
        raise FileNotFoundError(f"CUDA source {path} not found")
    seen.add(name)
    text = path.read_text()
    out, pos, line = [f'#line 1 "{name}"\n'], 0, 1
    for m in _LOCAL_INCLUDE.finditer(text):
        inc = m.group(1)
        if not (CUDA_DIR / inc).is_file():
            continue  # not ours: left for the compiler's include path
        out.append(text[pos:m.start()])
        line += text.count("\n", pos, m.end()) + 1
        if inc not in seen:
            out.append(_expand(inc, seen))
        out.append(f'\n#line {line} "{name}"\n')
        pos = m.end() + 1
    out.append(text[pos:])
    return "".join(out)


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
