"""The looped model (``looped.py``) over a parent decoder (``backbones.py``), and the backbone registry
(``registry.py``). A trained model is loaded with ``par_ray.train.checkpoint.load_trained(path)``, whatever the
strategy that wrote it."""
