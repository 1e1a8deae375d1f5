"""Self-test of the tb models on a port-only Verilog top (run by tests/system/test_tb_models.py)."""
