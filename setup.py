"""Builds the compiled record kernel (``rmqstore.kernel._native``) with Cython. Everything
else is in pyproject.toml. The extension is optional: where it cannot be compiled the install
still succeeds and rmqstore runs its pure-Python reference kernel (``rmqstore --version``
says which one runs). ``RMQSTORE_REQUIRE_NATIVE=1`` makes a failed compile fail the install
(``make`` sets it)."""

import os

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

REQUIRED = bool(os.environ.get("RMQSTORE_REQUIRE_NATIVE"))


class OptionalBuildExt(build_ext):
    """Builds the kernel when it can; otherwise says so and goes on without it."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:
            if REQUIRED:
                raise
            self.warn(f"the compiled record kernel was not built ({exc}); the pure-Python one runs")

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            if REQUIRED:
                raise
            self.warn(f"the compiled record kernel was not built ({exc}); the pure-Python one runs")


try:
    from Cython.Build import cythonize
except ImportError:  # no Cython: install without the compiled kernel
    if REQUIRED:
        raise
    extensions = []
else:
    extensions = cythonize(
        [
            Extension(
                "rmqstore.kernel._native",
                ["rmqstore/kernel/_native.pyx"],
                # -g0: Python's own flags ask for debug information, which took a third
                # of the compile (28 s against 18 s) and is of no use to a user's install;
                # tests/kernel_fuzz.py builds its sanitized copy with -g for its reports
                extra_compile_args=["-O3", "-g0"],
            )
        ],
        compiler_directives={"language_level": "3"},
    )

setup(ext_modules=extensions, cmdclass={"build_ext": OptionalBuildExt})
