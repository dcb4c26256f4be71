"""Long fault runs, by hand (``python -m tests.chaos --help``, ``python -m tests.chaos.…``);
pytest collects none of them."""
