"""Package discovery for the one layout pyproject.toml cannot express.

server/, clients/, keyholder/, consortium/, flower/, transport/ and cli/ sit at the top of the
repository but are installed as secure_afl.server, secure_afl.clients,
secure_afl.keyholder, secure_afl.consortium, secure_afl.flower, secure_afl.transport and secure_afl.cli:
generic top-level names such as ``server`` must never land in site-packages.
Every package under each root is found by walking it, so a new subpackage (or
a data directory such as flower/project) ships without anyone
editing a list. tools/ is not here: it is its own distribution (tools/pyproject.toml), kept out of
every party's install.
"""

from setuptools import find_namespace_packages, setup

# installed name -> directory in the repository
ROOTS = {"secure_afl": "secure_afl", "secure_afl.server": "server",
         "secure_afl.clients": "clients", "secure_afl.keyholder": "keyholder",
         "secure_afl.consortium": "consortium", "secure_afl.flower": "flower", "secure_afl.transport": "transport",
         "secure_afl.cli": "cli"}

packages, package_dir = [], {}
for name, root in ROOTS.items():
    package_dir[name] = root
    packages.append(name)
    # namespace discovery also takes directories without __init__.py (the Flower project's data)
    packages += [f"{name}.{sub}" for sub in find_namespace_packages(root, exclude=["*__pycache__*"])]

setup(packages=packages, package_dir=package_dir)
