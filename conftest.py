"""Settings shared by every test in the repository.

Hypothesis profiles: ``default`` is fast, for the edit-test loop; ``ci`` is thorough,
and ``tools/check`` selects it when the CI variable is set. Choose one with
``pytest --hypothesis-profile=ci``. Neither sets a deadline: on shared machines a
per-example time limit fails tests for the machine's load, not for the code.
"""

from hypothesis import HealthCheck, settings

settings.register_profile("default", max_examples=60, deadline=None)
settings.register_profile(
    "ci",
    max_examples=600,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("default")
