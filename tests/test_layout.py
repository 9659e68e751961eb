"""The backends/ layout holds: every package is packaged, each shared piece is defined once,
baselines sit together under names that do not shadow the libraries they wrap, and every package
folder says what lives there."""
from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from fnmatch import fnmatch
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOP = ("oracle", "cases", "harness", "backends")


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _packages() -> set[str]:
    """Every folder with an __init__.py under the top-level packages, plus backends/cuda (data only)."""
    found = {".".join(p.parent.relative_to(ROOT).parts) for top in TOP for p in (ROOT / top).rglob("__init__.py")}
    return found | {"backends.cuda"}


def test_pyproject_lists_every_package_and_its_sources():
    config = _pyproject()["tool"]["setuptools"]
    assert set(config["packages"]) == _packages()
    data = config["package-data"]
    for package in _packages():
        folder = ROOT.joinpath(*package.split("."))
        for path in folder.iterdir():
            if path.is_file() and path.suffix in (".cpp", ".cu", ".h", ".cuh", ".json", ".yaml"):
                assert any(fnmatch(path.name, pat) for pat in data.get(package, ())), f"{path} not in package-data"


def _definitions(pattern: str, files: str = "*") -> list[str]:
    """Files under backends/ (Python and C++) named like `files` with a line matching `pattern`."""
    hits = []
    for path in sorted((ROOT / "backends").rglob(files)):
        if path.suffix in (".py", ".h", ".cuh", ".cu", ".cpp") and "__pycache__" not in path.parts:
            if re.search(pattern, path.read_text(), re.M):
                hits.append(str(path.relative_to(ROOT)))
    return hits


def test_shared_pieces_are_defined_once():
    # One byte-span helper for every array type and every backend.
    assert _definitions(r"^def byte_span\b") == ["backends/_buffers.py"]
    # binary_backward: one broadcast plan and one launch plan of its CUDA kernels, in Python, for
    # every backend (cupy launches it, torch_ext's C++ receives it).
    assert _definitions(r"^def make_plan\b|BcastPlan make_plan", "binary_backward*") == [
        "backends/_plans/binary_backward.py"]
    assert _definitions(r"^def plan_launch\b|Launch plan_launch\(", "binary_backward*") == [
        "backends/_plans/binary_backward_cuda.py"]
    assert _definitions(r"split_chunks\(int64_t|^def split_chunks\b", "binary_backward*") == [
        "backends/_plans/binary_backward_cuda.py"]
    # One list of fns: in Python the oracle's FNS (imported, never spelled out), in C++ one X-macro.
    assert _definitions(r"^FNS = |\"add\", \"sub\", \"mul\"") == []
    assert _definitions(r"#define BB_FNS\(X\)") == ["backends/cuda/binary_backward_defs.h"]
    assert _definitions(r"enum[^\n]*\bBB_ADD\b|enum class BinaryFn") == []  # the enum comes from BB_FNS
    # The partial derivatives once in C++, for the CPU and the GPU kernels.
    assert _definitions(r"^\S.*\bbb_partials\(A a, A b") == ["backends/cuda/binary_backward_defs.h"]


def test_backend_modules_are_named_for_their_backends():
    code = ("import sys; from harness.registry import discover, BACKENDS, is_baseline; discover(); "
            "print('\\n'.join(f'{b.name} {b.origin} {is_baseline(b)}' for b in BACKENDS.values())); "
            "import torch, jax; print(torch.__file__); print(jax.__file__)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    *rows, torch_file, jax_file = out.stdout.strip().splitlines()
    origins = {name: (origin, baseline == "True") for name, origin, baseline in (r.split() for r in rows)}
    for name in ("torch", "torch_compile", "jax", "flash_attn", "liger"):
        assert origins[name] == (f"backends.baselines.{name}", True)
    for name in ("sdpa_flash", "sdpa_cudnn", "sdpa_efficient"):
        assert origins[name] == ("backends.baselines.sdpa", True)
    for name in ("cupy", "torch_ext", "triton"):
        assert origins[name] == (f"backends.{name}", False)
    # backends/baselines/torch.py and jax.py do not shadow the libraries they wrap.
    assert "site-packages" in torch_file or "dist-packages" in torch_file, torch_file
    assert "baselines" not in torch_file and "baselines" not in jax_file


def test_every_backends_package_says_what_lives_there():
    for package in sorted(_packages()):
        if package.startswith("backends"):
            folder = ROOT.joinpath(*package.split("."))
            init = folder / "__init__.py"
            text = init.read_text() if init.exists() else (folder / "README.md").read_text()
            assert len(text.split()) > 40, f"{folder}: no word on what lives there"
            if not package.startswith("backends.baselines._"):
                assert "touch" in text, f"{folder}: says nothing about what may be touched"
