"""Coverage-guided fuzzing of Icefloe's parsers of untrusted input, one parser at a time.

``targets.py`` holds one function per parser that feeds it bytes as production code does and
lets through only its documented refusals; ``corpus/<target>/`` the inputs kept for each (the
seeds of ``seeds.py``, what fuzz runs found interesting, and the regressions of defects
found); ``test_corpus_replay.py`` replays every corpus file in the suite. ``python -m
tests.fuzz TARGET`` runs atheris (libFuzzer) on a target and grows its corpus.
"""
