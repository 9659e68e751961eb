"""Fuzzing with shrinking: the generic machinery around each op's hypothesis strategy.

    cases(op, tiny=False)        the op's strategy of Cases (registered by its case module with
                                 @cases.registry.strategy(op); each drawn case passes the op's
                                 validate and survives Case.to_json / from_json with the same id)
    strategies()                 op -> strategy builder, for every op that has one
    check(impl, case, device)    run_case; raise AssertionError (report + repro line) unless PASS
    fuzz_settings(profile, n)    hypothesis settings: 'ci' (derandomized) or 'deep' (random)

The building blocks below are what the strategies share.  Every strategy is built from
integers, booleans and sampled_from, whose first choice is the simplest (f32, fn add,
contiguous, defaults), so hypothesis shrinks a failure toward a small, plain case: fewer
dims, sizes 1, the default of every flag the failure does not need.  Sizes stay small (an
example runs in milliseconds on a CPU), except that one dim is sometimes wide (`wide`: up to
8193, at most MAX_ELEMENTS in all) so that kernels' block tails, vector widths and work
splitting run too; `tiny=True` never widens and shrinks sizes further, for slow
implementations (Triton's interpreter).  Optional params are written only when they differ
from the op's default, so a shrunk case's JSON is as short as a registry case's.
"""
from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from cases.registry import Case
from cases.registry import strategies as _registered
from harness import status
from harness.registry import get_op

DTYPES = ("f32", "f64", "f16", "bf16")  # f32 first: shrinking moves toward it
SOURCE = "fuzz"
WIDE = 8193  # a wide dim's largest size (one case in five has one)
MAX_ELEMENTS = 1 << 17  # a widened case's largest tensor stays under this


def strategies() -> dict:
    """op -> its strategy builder (fn(tiny=False) -> strategy), for every op whose case module registers one."""
    return _registered()


def cases(op: str, tiny: bool = False) -> st.SearchStrategy:
    """The strategy of valid Cases of `op`; LookupError naming where it would come from if there is none."""
    found = strategies()
    if op not in found:
        get_op(op)  # an unknown op says so, naming the registered ones
        raise LookupError(f"no fuzz strategy for op {op!r}: its case module registers none "
                          f"(@cases.registry.strategy({op!r})); ops with one: {', '.join(sorted(found)) or 'none'}")
    return found[op](tiny=tiny)


# ----------------------------------------------------------------------------- building blocks of strategies


def valid_case(op: str, dtype: str, params: dict) -> Case:
    """A Case checked by its op's validate, so a strategy bug fails where it is made."""
    case = Case(op, dtype, params, frozenset(), SOURCE)
    get_op(op).validate(case)
    return case


def layout(draw, rank: int) -> str:
    """contig, sliced (rank >= 1: stride 2 on the last dim) or transposed (rank >= 2)."""
    options = ("contig",) + (("sliced",) if rank >= 1 else ()) + (("transposed",) if rank >= 2 else ())
    return draw(st.sampled_from(options))


def set_layouts(draw, params: dict, ranks: dict) -> None:
    """Add each `<key>: layout` whose drawn layout is not contig (the default)."""
    for key, rank in ranks.items():
        drawn = layout(draw, rank)
        if drawn != "contig":
            params[key] = drawn


def wide(draw, tiny: bool, others: int = 1) -> int | None:
    """None (usually), or a wide size for one dim: 2 to WIDE, capped so that with `others`
    elements in the other dims the tensor stays under MAX_ELEMENTS.  An integer range, not a
    list of sizes, so that a failure found wide shrinks its size smoothly down toward 2."""
    if tiny or draw(st.integers(0, 4)) < 4:  # shrinks to 0: not wide
        return None
    return draw(st.integers(2, max(2, min(WIDE, MAX_ELEMENTS // max(others, 1)))))


def maybe_empty(draw, shape: list[int], dims: range) -> list[int]:
    """Sometimes set one of `dims` to 0 (size-0 edges); shrinks to not doing it."""
    if dims and draw(st.booleans()):
        shape = list(shape)
        shape[draw(st.sampled_from(list(dims)))] = 0
    return shape


# ----------------------------------------------------------------------------- running and settings


def check(impl, case: Case, device: str, run_seed: int = 0):
    """run_case(impl, case); return the result if its status does not fail a run (status.OK: PASS, SKIP,
    and XFAIL/XPASS of a declared deviation, as `run` and pytest count them; the caller decides on SKIP).

    Otherwise raise AssertionError whose message is the result's report followed by the
    one-line `python -m harness run ... --case '<json>'` command that reproduces it.  An
    exception escaping run_case (a crash the runner does not catch) is reported the same
    way, so hypothesis shrinks crashes too and the repro line is never lost.
    """
    from harness.runner import repro_command, run_case

    try:
        result = run_case(impl, case, device, run_seed)
    except Exception as exc:  # noqa: BLE001 - any crash is a finding, with its repro line
        raise AssertionError(f"{case.op} {impl.id} {case.id} [{device}, seed={run_seed}]: CRASH "
                             f"{type(exc).__name__}: {exc}\n  reproduce: "
                             f"{repro_command(impl, case, run_seed, device)}") from exc
    if result.status not in status.OK:
        report = result.report()
        if "reproduce:" not in report:
            report += f"\n  reproduce: {result.repro}"
        raise AssertionError(report)
    return result


def repro_line(message: str) -> str:
    """The `python -m harness run ...` command in a check() failure message."""
    for line in message.splitlines():
        if line.strip().startswith("reproduce:"):
            return line.split("reproduce:", 1)[1].strip()
    raise ValueError(f"no 'reproduce:' line in {message!r}")


PROFILES = {
    # CI: the same examples every run (no randomness, no example database written to the tree).
    "ci": dict(derandomize=True, database=None),
    # Asked for (pytest -m fuzz, --fuzz-examples): fresh random examples each run.
    "deep": dict(derandomize=False, database=None),
}
_COMMON = dict(deadline=None,  # XLA compiles and the Triton interpreter vary far beyond any deadline
               print_blob=False,  # the repro line, not a hypothesis blob, is how a failure is replayed
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                      HealthCheck.filter_too_much])
for _name, _values in PROFILES.items():
    settings.register_profile(f"gradoracle-{_name}", **_values, **_COMMON)


def fuzz_settings(profile: str, max_examples: int, **overrides) -> settings:
    """The registered gradoracle-<profile> settings with `max_examples` (and any overrides)."""
    return settings(settings.get_profile(f"gradoracle-{profile}"), max_examples=max_examples, **overrides)
