"""Single source of truth for formats, constants and default parameters.

Shared by the gateware (``rtl``), the golden model (``model``) and the
testbenches (``tb``): nothing here imports Amaranth or cocotb.
"""
