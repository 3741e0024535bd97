# gq puts this directory on the PYTHONPATH of jobs its worker does not run (a shell
# script's Python, the ranks torchrun starts), so that their lowest rank's steps are
# counted (gq.exec.rank_steps). It then loads the sitecustomize this one hides, if any.
# Nothing here may stop a job: every failure is silent.


def _count_steps():
    try:
        import os

        if os.environ.get("GQ_PROGRESS_FILE"):
            from gq.exec import rank_steps

            rank_steps.install()
    except Exception:  # noqa: BLE001 - an old or odd Python: it counts no steps
        pass


def _load_the_hidden_one():
    try:
        import importlib.machinery
        import importlib.util
        import os
        import sys

        here = os.path.dirname(os.path.abspath(__file__))
        rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
        if spec is None or spec.loader is None:
            return
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except Exception:  # noqa: BLE001 - as Python treats a failing sitecustomize
        pass


_count_steps()
_load_the_hidden_one()
