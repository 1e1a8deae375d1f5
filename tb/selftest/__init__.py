"""Self-test of the tb models on a port-only Verilog top (run by tests/test_tb_models.py)."""
