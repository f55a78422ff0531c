"""Builds the compiled record kernel (``rmqstore.kernel._native``) with Cython. Everything
else is in pyproject.toml. The extension is optional: where it cannot be compiled the install
still succeeds and rmqstore runs its pure-Python reference kernel (``rmqstore --version``
says which one runs)."""

import os

from setuptools import Extension, setup

try:
    from Cython.Build import cythonize
except ImportError:  # no Cython: install without the compiled kernel
    extensions = []
else:
    flags = ["-O3"]
    link_flags = []
    sanitize = os.environ.get("RMQSTORE_SANITIZE")  # make fuzz-native: "address,undefined"
    if sanitize:
        flags = ["-O1", "-g", "-fno-omit-frame-pointer", f"-fsanitize={sanitize}"]
        link_flags = [f"-fsanitize={sanitize}"]
    extensions = cythonize(
        [
            Extension(
                "rmqstore.kernel._native",
                ["rmqstore/kernel/_native.pyx"],
                extra_compile_args=flags,
                extra_link_args=link_flags,
                optional=not os.environ.get("RMQSTORE_REQUIRE_NATIVE"),
            )
        ],
        compiler_directives={"language_level": "3"},
    )

setup(ext_modules=extensions)
