"""Case registry: shapes, broadcast patterns and layouts for every op (see cases.registry)."""
from cases.registry import TAGS, Case, CaseFileError, add, all_cases, load_file, select

__all__ = ["TAGS", "Case", "CaseFileError", "add", "all_cases", "load_file", "select"]
