# Macros available in every BUILD file (see [GLOBAL] build_file_prelude_globs).


def plait_wheel(package):
    """The wheel of packages/<package>, built by hatchling from its own pyproject.toml."""
    resource(name="pyproject", source="pyproject.toml")
    python_distribution(
        name="wheel",
        dependencies=[":pyproject", f"./src/plait/{package}", f"./src/plait/{package}:py_typed"],
        provides=python_artifact(name="plait-" + package.replace("_", "-")),
        generate_setup=False,
        sdist=False,
    )
