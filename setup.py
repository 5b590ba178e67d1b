"""Package discovery for the wheel (everything else is in pyproject.toml).

`passes/` and `runtime/` sit at the top of the repository but install as `liac.passes` and `liac.runtime`, so the
wheel puts no generic top-level names in site-packages. setuptools' `packages.find` cannot rename a folder, so the
packages are discovered here and mapped through `package_dir`: a new subpackage in any of the three trees is in the
wheel without editing a list (tests/test_wheel.py checks the built wheel against the source tree).
"""

from setuptools import find_namespace_packages, setup

MAPPED = {"liac.passes": "passes", "liac.runtime": "runtime"}  # installed name → folder in the repository


def _packages() -> list[str]:
    # Namespace discovery: data folders (liac/profiles, liac/schema, liac/templates) are packages too, so their
    # files ship through package-data in pyproject.toml.
    skip = ["*__pycache__*"]
    packages = find_namespace_packages(include=["liac", "liac.*"], exclude=skip)
    for name, folder in MAPPED.items():
        packages += [name] + [f"{name}.{sub}" for sub in find_namespace_packages(where=folder, exclude=skip)]
    return sorted(packages)


setup(packages=_packages(), package_dir=dict(MAPPED))
