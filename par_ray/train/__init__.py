"""Training: one step function (``step.py``), one loop for one rank or many (``loop.py``), strategies."""
