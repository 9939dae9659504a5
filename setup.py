"""Build hook for the one C extension; all metadata lives in pyproject.toml.

`tracelab.ingest._kineto` is the fast path of tracelab.ingest.decode. It is optional: where no C compiler is
available the install still succeeds and the reference decoder (msgspec) does all the work.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "tracelab.ingest._kineto",
            ["tracelab/ingest/_kineto.c"],
            extra_compile_args=["-O2", "-std=c99", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,
        )
    ]
)
