"""dlm-fast's Triton kernels, each beside a plain-torch reference.

Name clash: Hugging Face publishes an unrelated top-level ``kernels`` package on PyPI. We keep the
name (it is the project layout) and mark ours with ``__dlm_fast__``; code that imports it calls
:func:`check_ours` so that, if the other package shadows this one on ``sys.path``, the failure is a
clear ImportError instead of an AttributeError deep inside a model. See docs/kernels.md.
"""

__dlm_fast__ = True


def check_ours(module) -> None:
    """Raise ImportError if ``module`` (an imported ``kernels``) is not dlm-fast's package."""
    if not getattr(module, "__dlm_fast__", False):
        raise ImportError(
            "the imported top-level 'kernels' package is not dlm-fast's (found "
            f"{getattr(module, '__file__', '?')}); Hugging Face's 'kernels' package shadows it. "
            "Put dlm-fast earlier on sys.path or uninstall the other package (see docs/kernels.md)."
        )
