"""The testbench: GPU, memory, wire and network models around the generated Verilog."""
import gc

# A simulation allocates millions of short-lived objects (values, triggers, frames)
# and few that live long; the collector's default thresholds spend a few per cent of a
# Python-bound run scanning the long-lived ones. Move what is imported so far out of
# its reach and scan the young generation less often.
gc.freeze()
gc.set_threshold(20_000, 20, 20)
