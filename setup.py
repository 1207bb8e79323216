"""Build of kcli's one compiled module; everything else is in pyproject.toml.

The extension is optional: where it cannot be compiled, kcli installs anyway and dump-log falls
back to its pure-Python loop (same output, slower). The test suite checks it was built.
"""

from Cython.Build import cythonize
from setuptools import Extension, setup

setup(
    ext_modules=cythonize(
        [Extension("kcli.dumplog._fastlines", ["kcli/dumplog/_fastlines.pyx"], optional=True)],
        compiler_directives={"language_level": "3"},
    ),
)
