"""skippy benchmark harness library (see bench/README.md)."""
