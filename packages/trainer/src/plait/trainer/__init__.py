"""The Trainer: the composition root that runs the loops.

It resolves an accelerator, precision, checkpoint I/O, cluster environment and
strategy by name or instance, and runs the fit, validate, test and predict loops.

This distribution ships no trainer yet: it installs and imports on its own.
"""
