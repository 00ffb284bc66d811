"""Scores that explain themselves: failure attribution and the context-budget curve of a finished run.

Nothing here calls the participant again: each analysis reuses the run's stored evidence (the memories
every Search returned) and runs the run's locked answer model and judge on it (:mod:`.reanswer`).
"""
