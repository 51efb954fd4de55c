"""pytest plugin (loaded by pyproject's `addopts = -p terra_nb_kernel.nbval`): nbval's notebook
kernels start in `reproduce.kernel_environment()` with `reproduce.KERNEL_ARGUMENTS`, like the
kernels of `python -m terra_nb.workbook.reproduce`.

Here rather than in `terra_nb.workbook`: every pytest process loads it, pytest-xdist's controller
included, which runs no test; importing it from `terra_nb` would import torch and transformers
there (~9 s of CPU on the 2-core machine; see the package docstring). `reproduce` is imported when
nbval starts a kernel, in a worker that has imported terra_nb anyway.

nbval starts its kernels with the environment of the pytest process, `PYTEST_CURRENT_TEST`
included, and has no option for a kernel environment; this plugin passes one to its
`start_new_kernel` (see `reproduce.NOT_FOR_KERNELS` for why it matters). The kernels are forked
from a zygote that has imported torch and transformers where it serves their environment, as
reproduce's are (`terra_nb_kernel.zygote`).
"""
from __future__ import annotations

import functools


def pytest_configure(config) -> None:
    try:
        import nbval.kernel
    except ImportError:  # nbval not installed: nothing to configure
        return
    from terra_nb_kernel import zygote

    start = nbval.kernel.start_new_kernel
    if getattr(start, "terra_nb_environment", False):
        return

    class KernelSpecs(nbval.kernel.NbvalKernelspecManager):
        """nbval's specs, with the workbook's kernel command (`zygote.kernel_argv`)."""

        def get_kernel_spec(self, kernel_name):
            spec = super().get_kernel_spec(kernel_name)
            spec.argv = zygote.kernel_argv(spec.argv)
            return spec

    @functools.wraps(start)
    def start_new_kernel(*args, **kwargs):
        from terra_nb.workbook.reproduce import kernel_start_arguments

        return start(*args, **kernel_start_arguments(kwargs))

    start_new_kernel.terra_nb_environment = True
    nbval.kernel.start_new_kernel = start_new_kernel
    nbval.kernel.NbvalKernelspecManager = KernelSpecs
