"""brmcp's tests, one folder per package (docs/architecture.md)."""
