"""ELFES: training runs that survive preemption bitwise-exactly.

This package stays light on purpose: login-node tools import it without torch.
The training engine lives in :mod:`elfes.engine`.
"""

__version__ = "0.1.0"
