"""gradoracle harness: registries, comparison against the oracle, runner, CLI."""
