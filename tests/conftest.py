"""Shared pytest setup for the whole suite.

pytest's default (prepend) import mode puts this file's directory on ``sys.path``, which
is what lets test modules ``import helpers`` (tests/ is deliberately not a package).
"""
