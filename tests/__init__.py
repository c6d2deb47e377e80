"""gpushift's tests (importable as a package so that tests.support can be shared)."""
