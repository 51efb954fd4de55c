"""pytest plugin (loaded by pyproject's `addopts = -p terra_nb_kernel.nbval`): nbval's notebook
kernels start in `reproduce.kernel_environment()` with `reproduce.KERNEL_ARGUMENTS`, like the
kernels of `python -m terra_nb.workbook.reproduce`.

Here rather than in `terra_nb.workbook`: every pytest process loads it, pytest-xdist's controller
included, which runs no test; importing it from `terra_nb` would import torch and transformers
there (see the package docstring). `reproduce` is imported when nbval starts a kernel.

nbval starts its kernels with the environment of the pytest process, `PYTEST_CURRENT_TEST`
included, and has no option for a kernel environment; this plugin passes one to its
`start_new_kernel` (see `reproduce.NOT_FOR_KERNELS` for why it matters).
"""
from __future__ import annotations

import functools


def pytest_configure(config) -> None:
    try:
        import nbval.kernel
    except ImportError:  # nbval not installed: nothing to configure
        return
    start = nbval.kernel.start_new_kernel
    if getattr(start, "terra_nb_environment", False):
        return

    @functools.wraps(start)
    def start_new_kernel(*args, **kwargs):
        from terra_nb.workbook.reproduce import kernel_start_arguments

        return start(*args, **kernel_start_arguments(kwargs))

    start_new_kernel.terra_nb_environment = True
    nbval.kernel.start_new_kernel = start_new_kernel
