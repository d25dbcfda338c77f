"""The conformance suite: the collective contract, proved for any strategy.

The contract of `plait.core` as Hypothesis properties, run on a persistent
multi-process rank pool against any strategy, ours or a third party's.

This distribution ships no property yet: it installs and imports on its own.
"""
