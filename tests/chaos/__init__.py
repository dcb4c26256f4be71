"""Long chaos runs, run by hand (not collected by pytest): ``python -m tests.chaos --help``."""
