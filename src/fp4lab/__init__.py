"""fp4lab: an investigation book for FP4 Mixture-of-Experts GEMMs.

Modules are imported lazily by their users; importing fp4lab itself costs nothing.
"""

__version__ = "0.1.0"
