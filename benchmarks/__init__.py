"""Scripts that print figures (speed goals live here, never in timed unit tests); a package so that
mypy and the tests import them under one name (benchmarks.<script>)."""
