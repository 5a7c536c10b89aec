"""The looped model (``looped.py``) over a parent decoder (``backbones.py``), and loading a trained one.

``load_trained(path)`` reads the final export of any run (or any checkpoint directory), whatever the strategy that
wrote it, into a plain ``LoopedLM`` on the CPU: see :mod:`par_ray.train.checkpoint`.
"""


def load_trained(path: str):
    """The trained model at ``path`` (a run directory or a checkpoint directory): ``par_ray.train.checkpoint.Trained``
    with ``model``, ``config``, ``step`` and ``format``. See :func:`par_ray.train.checkpoint.load_trained`."""
    from par_ray.train.checkpoint import load_trained as _load

    return _load(path)
