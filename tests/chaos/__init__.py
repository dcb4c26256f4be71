"""Long fault runs, by hand (``python -m tests.chaos.…``); pytest collects none of them."""
